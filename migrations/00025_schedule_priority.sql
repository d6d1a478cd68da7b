-- The priority of the runs a schedule starts (createSchedule(priority:)),
-- -2..2 like startRun's, 0 by default.

-- +goose Up
ALTER TABLE schedules ADD COLUMN priority smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN -2 AND 2);

-- +goose Down
ALTER TABLE schedules DROP COLUMN priority;
