-- Usage metering and billing.
--
-- usage_records are the meters: one row per measured fact, written in the
-- transaction of the transition it measures, under a deterministic key
-- ("<meter>:<identity of the fact>") unique per tenant, so a replayed
-- event cannot count twice (ON CONFLICT DO NOTHING). It is not
-- partitioned: the key's uniqueness must hold across all time, and rows
-- leave by a retention DELETE once rolled up and exported.
--
-- The rollup loop (system role, one at a time under the state row lock)
-- recomputes usage_hourly and usage_daily for recent hours from the raw
-- rows: it sets totals rather than adding to them, so running it twice,
-- or on two replicas, gives the same totals.
--
-- Prices are per plan and meter, in micro-units of the plan's currency per
-- unit (integers: no floats anywhere near money); amounts are rounded to
-- minor units (cents) per line.

-- +goose Up
CREATE TABLE usage_records (
    tenant_id       uuid NOT NULL REFERENCES tenants (id),
    key             text NOT NULL CHECK (length(key) BETWEEN 1 AND 300),
    meter           text NOT NULL CHECK (meter ~ '^[a-z][a-z0-9_]{0,39}$'),
    quantity        bigint NOT NULL CHECK (quantity >= 0),
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    -- Export to the billing endpoint: 'none' when export is off at write
    -- time, then 'pending' → 'sent' or 'dead'.
    export_state    text NOT NULL DEFAULT 'none' CHECK (export_state IN ('none', 'pending', 'sent', 'dead')),
    export_attempts int NOT NULL DEFAULT 0,
    export_next_at  timestamptz,
    export_error    text,
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX usage_records_rollup_sweep ON usage_records (recorded_at);
CREATE INDEX usage_records_export_sweep ON usage_records (export_next_at) WHERE export_state = 'pending';

CREATE TABLE usage_hourly (
    tenant_id  uuid NOT NULL REFERENCES tenants (id),
    meter      text NOT NULL,
    hour       timestamptz NOT NULL CHECK (hour = date_trunc('hour', hour, 'UTC')),
    quantity   bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, meter, hour)
);

CREATE TABLE usage_daily (
    tenant_id  uuid NOT NULL REFERENCES tenants (id),
    meter      text NOT NULL,
    day        date NOT NULL,
    quantity   bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, meter, day)
);

-- The rollup's progress: the next pass recomputes from a little before it.
CREATE TABLE usage_rollup_state (
    id      int PRIMARY KEY CHECK (id = 1),
    through timestamptz NOT NULL
);
INSERT INTO usage_rollup_state (id, through) VALUES (1, '2000-01-01');

ALTER TABLE plans ADD COLUMN currency text NOT NULL DEFAULT 'USD' CHECK (currency ~ '^[A-Z]{3}$');
ALTER TABLE plans ADD COLUMN base_fee_cents bigint NOT NULL DEFAULT 0 CHECK (base_fee_cents >= 0);

CREATE TABLE plan_prices (
    plan              text NOT NULL REFERENCES plans (name),
    meter             text NOT NULL CHECK (meter ~ '^[a-z][a-z0-9_]{0,39}$'),
    -- Units included in the base fee each month.
    included          bigint NOT NULL DEFAULT 0 CHECK (included >= 0),
    -- Price of each unit beyond the included ones, in millionths of the
    -- currency unit (1 cent = 10,000).
    unit_price_micros bigint NOT NULL DEFAULT 0 CHECK (unit_price_micros >= 0),
    -- A hard cap: at this many units in a month, new runs are refused.
    hard_cap          bigint CHECK (hard_cap > 0),
    PRIMARY KEY (plan, meter)
);
UPDATE plans SET base_fee_cents = 0 WHERE name = 'free';
UPDATE plans SET base_fee_cents = 4900 WHERE name = 'pro';
UPDATE plans SET base_fee_cents = 99900 WHERE name = 'enterprise';
INSERT INTO plan_prices (plan, meter, included, unit_price_micros, hard_cap) VALUES
    ('free',       'runs_started',       1000,      0,    1000),
    ('free',       'steps_executed',     10000,     0,    10000),
    ('free',       'step_seconds',       36000,     0,    36000),
    ('free',       'webhook_deliveries', 1000,      0,    1000),
    ('pro',        'runs_started',       50000,     200,  NULL),
    ('pro',        'steps_executed',     500000,    50,   NULL),
    ('pro',        'step_seconds',       1000000,   10,   NULL),
    ('pro',        'webhook_deliveries', 50000,     20,   NULL),
    ('enterprise', 'runs_started',       2000000,   100,  NULL),
    ('enterprise', 'steps_executed',     20000000,  25,   NULL),
    ('enterprise', 'step_seconds',       50000000,  5,    NULL),
    ('enterprise', 'webhook_deliveries', 2000000,   10,   NULL);

ALTER TABLE usage_records ENABLE ROW LEVEL SECURITY;
ALTER TABLE usage_records FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON usage_records
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);
ALTER TABLE usage_hourly ENABLE ROW LEVEL SECURITY;
ALTER TABLE usage_hourly FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON usage_hourly
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);
ALTER TABLE usage_daily ENABLE ROW LEVEL SECURITY;
ALTER TABLE usage_daily FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON usage_daily
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);

-- The app role writes meters inside tenant transactions and reads its own
-- usage; totals, export and retention belong to the system role.
GRANT SELECT, INSERT ON usage_records TO composer_app;
GRANT SELECT ON usage_hourly, usage_daily, plan_prices, usage_rollup_state TO composer_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON usage_records TO composer_system;
GRANT SELECT, INSERT, UPDATE, DELETE ON usage_hourly, usage_daily TO composer_system;
GRANT SELECT, UPDATE ON usage_rollup_state TO composer_system;
GRANT SELECT ON plan_prices TO composer_system;

-- +goose Down
DROP TABLE plan_prices;
ALTER TABLE plans DROP COLUMN base_fee_cents;
ALTER TABLE plans DROP COLUMN currency;
DROP TABLE usage_rollup_state;
DROP TABLE usage_daily;
DROP TABLE usage_hourly;
DROP TABLE usage_records;
