package client

import (
	"context"
	"time"
)

// Schedule is a schedule as the API answers it.
type Schedule struct {
	ScheduleFields
	// NextFireTimes and RecentFires are filled by GetSchedule.
	NextFireTimes []time.Time
	RecentFires   []ScheduleFire
}

// ScheduleFire is one fire of a schedule: the run it started, or why not.
type ScheduleFire = ScheduleFireFields

// ScheduleSpec is a new schedule: a workflow (by name or id), a cron
// expression or an interval, and how it fires.
type ScheduleSpec struct {
	Workflow   string
	WorkflowID string
	// Version pins a version (default: the latest at each fire).
	Version int
	// Cron is read in TimeZone (an IANA zone, default UTC). A wall time the
	// clocks skip fires once at the end of the gap; one they repeat fires
	// once, at its first occurrence.
	Cron     string
	Interval time.Duration
	TimeZone string
	// Input is every run's input (a value encoded as JSON, or json.RawMessage).
	Input       any
	Metadata    map[string]string
	ExternalID  string
	Description string
	// Overlap is what a fire does while a run of the schedule still goes
	// (default ScheduleOverlapPolicySkip).
	Overlap ScheduleOverlapPolicy
	// Priority is the priority of the runs it starts, -2..2 (default 0).
	Priority int
	// CatchupWindow: after downtime, fires older than this are not
	// started (nil: the server's default, a minute).
	CatchupWindow *time.Duration
	Paused        bool
}

func seconds(d time.Duration) *int { return ptr(int(d / time.Second)) }

// CreateSchedule adds a schedule.
func (c *Client) CreateSchedule(ctx context.Context, s ScheduleSpec) (*Schedule, error) {
	in, err := jsonOf(s.Input)
	if err != nil {
		return nil, err
	}
	var meta any
	if s.Metadata != nil {
		meta = s.Metadata
	}
	m, err := jsonOf(meta)
	if err != nil {
		return nil, err
	}
	input := CreateScheduleInput{WorkflowId: ptr(s.WorkflowID), WorkflowName: ptr(s.Workflow), WorkflowVersion: ptr(s.Version),
		Cron: ptr(s.Cron), IntervalSeconds: seconds(s.Interval), TimeZone: ptr(s.TimeZone), Input: in, Metadata: m,
		ExternalId: ptr(s.ExternalID), Description: ptr(s.Description), Overlap: ptr(s.Overlap), Priority: ptr(s.Priority), Paused: ptr(s.Paused)}
	if s.CatchupWindow != nil {
		w := int(*s.CatchupWindow / time.Second)
		input.CatchupWindowSeconds = &w
	}
	res, err := createSchedule(ctx, c.gql, input)
	if err != nil {
		return nil, apiError(err)
	}
	return &Schedule{ScheduleFields: res.CreateSchedule.ScheduleFields}, nil
}

// ScheduleUpdate changes a schedule; nil fields are left as they are.
// Setting Cron clears the interval and the other way round; an empty
// ExternalID clears it.
type ScheduleUpdate struct {
	Version       *int
	Cron          *string
	Interval      *time.Duration
	TimeZone      *string
	Input         any
	Metadata      map[string]string
	ExternalID    *string
	Description   *string
	Overlap       *ScheduleOverlapPolicy
	Priority      *int
	CatchupWindow *time.Duration
}

// UpdateSchedule changes a schedule; a new timing takes effect from its
// first fire after now.
func (c *Client) UpdateSchedule(ctx context.Context, id string, u ScheduleUpdate) (*Schedule, error) {
	in, err := jsonOf(u.Input)
	if err != nil {
		return nil, err
	}
	var meta any
	if u.Metadata != nil {
		meta = u.Metadata
	}
	m, err := jsonOf(meta)
	if err != nil {
		return nil, err
	}
	input := UpdateScheduleInput{WorkflowVersion: u.Version, Cron: u.Cron, TimeZone: u.TimeZone, Input: in, Metadata: m,
		ExternalId: u.ExternalID, Description: u.Description, Overlap: u.Overlap, Priority: u.Priority}
	if u.Interval != nil {
		input.IntervalSeconds = seconds(*u.Interval)
	}
	if u.CatchupWindow != nil {
		w := int(*u.CatchupWindow / time.Second)
		input.CatchupWindowSeconds = &w
	}
	res, err := updateSchedule(ctx, c.gql, id, input)
	if err != nil {
		return nil, apiError(err)
	}
	return &Schedule{ScheduleFields: res.UpdateSchedule.ScheduleFields}, nil
}

// PauseSchedule stops a schedule's fires.
func (c *Client) PauseSchedule(ctx context.Context, id string) (*Schedule, error) {
	res, err := pauseSchedule(ctx, c.gql, id)
	if err != nil {
		return nil, apiError(err)
	}
	return &Schedule{ScheduleFields: res.PauseSchedule.ScheduleFields}, nil
}

// ResumeSchedule fires a paused schedule again from its first fire after
// now (fires while paused are not made up: BackfillSchedule them).
func (c *Client) ResumeSchedule(ctx context.Context, id string) (*Schedule, error) {
	res, err := resumeSchedule(ctx, c.gql, id)
	if err != nil {
		return nil, apiError(err)
	}
	return &Schedule{ScheduleFields: res.ResumeSchedule.ScheduleFields}, nil
}

// DeleteSchedule deletes a schedule; the runs it started stay.
func (c *Client) DeleteSchedule(ctx context.Context, id string) error {
	if _, err := deleteSchedule(ctx, c.gql, id); err != nil {
		return apiError(err)
	}
	return nil
}

// BackfillSchedule starts the schedule's fire times in [from, to) (at
// most 100, none in the future) as if they had fired then; a time already
// fired is not started again.
func (c *Client) BackfillSchedule(ctx context.Context, id string, from, to time.Time) ([]ScheduleFire, error) {
	res, err := backfillSchedule(ctx, c.gql, id, from, to)
	if err != nil {
		return nil, apiError(err)
	}
	out := make([]ScheduleFire, len(res.BackfillSchedule))
	for i, f := range res.BackfillSchedule {
		out[i] = f.ScheduleFireFields
	}
	return out, nil
}

// GetSchedule reads a schedule with its next fire times (at most 100) and
// its latest 20 fires.
func (c *Client) GetSchedule(ctx context.Context, id string, nextFireTimes int) (*Schedule, error) {
	res, err := getSchedule(ctx, c.gql, id, nextFireTimes, 20)
	if err != nil {
		return nil, apiError(err)
	}
	s := &Schedule{ScheduleFields: res.Schedule.ScheduleFields, NextFireTimes: res.Schedule.NextFireTimes}
	for _, f := range res.Schedule.RecentFires {
		s.RecentFires = append(s.RecentFires, f.ScheduleFireFields)
	}
	return s, nil
}

// ListSchedules reads a page of the tenant's schedules (of one workflow
// when workflowID is set) after the cursor after; next is the cursor of
// the following page ("" at the end).
func (c *Client) ListSchedules(ctx context.Context, workflowID string, first int, after string) (list []Schedule, next string, err error) {
	res, err := listSchedules(ctx, c.gql, ptr(workflowID), ptr(first), ptr(after))
	if err != nil {
		return nil, "", apiError(err)
	}
	for _, e := range res.Schedules.Edges {
		list = append(list, Schedule{ScheduleFields: e.Node.ScheduleFields})
	}
	if res.Schedules.PageInfo.HasNextPage {
		next = str(res.Schedules.PageInfo.EndCursor)
	}
	return list, next, nil
}
