// Package schedules is the tenant's schedules: cron expressions (in an IANA
// time zone) or intervals that start runs of a workflow. Service manages
// them in the caller's tenant transaction; Firer is the loop on every
// server replica that starts their fires; engine/schedule decides the fire
// times.
//
// Each fire is an idempotent start whose key is derived from the schedule
// and the fire time ("schedule:<id>:<RFC 3339 time>"), so any number of
// replicas — and a replica retrying after a crash — start it once.
package schedules

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/composer-dev/composer/engine/dag"
	"github.com/composer-dev/composer/engine/schedule"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/jsoncheck"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

// Bounds on what a schedule stores.
const (
	MaxInputBytes = 64 << 10
	// Metadata is bounded like a run's (engine/dag).
	MaxMetadataKeys       = dag.MaxMetadataKeys
	MaxMetadataValueChars = dag.MaxMetadataValueChars
	MaxExternalIDChars    = 255
	MaxDescriptionChars   = 500
	// MaxSchedules applies when the plan says nothing.
	MaxSchedules = 100
	// DefaultCatchupWindow is how far back fires missed while no server
	// ran are still started.
	DefaultCatchupWindow = time.Minute
	MaxCatchupWindow     = 366 * 24 * time.Hour
	// MaxNextFireTimes bounds Schedule.nextFireTimes.
	MaxNextFireTimes = 100
	// MaxBackfill bounds the fires of one backfill.
	MaxBackfill = 100
	// KeptFires is how many recent fires are kept per schedule.
	KeptFires = 100
)

// Overlap is what a fire does while runs of the schedule's earlier fires
// are still going.
type Overlap string

const (
	// OverlapSkip drops the fire (the default).
	OverlapSkip Overlap = "skip"
	// OverlapBufferOne keeps one fire (the latest skipped ones are
	// dropped) and starts it when the running one ends.
	OverlapBufferOne Overlap = "buffer_one"
	// OverlapAllowAll starts every fire.
	OverlapAllowAll Overlap = "allow_all"
	// OverlapCancelPrevious cancels the running ones and starts the fire.
	OverlapCancelPrevious Overlap = "cancel_previous"
)

// MarshalGQL writes the GraphQL enum value (SKIP, BUFFER_ONE, ...).
func (o Overlap) MarshalGQL(w io.Writer) {
	_, _ = io.WriteString(w, strconv.Quote(strings.ToUpper(string(o))))
}

// UnmarshalGQL reads the GraphQL enum value.
func (o *Overlap) UnmarshalGQL(v any) error {
	s, ok := v.(string)
	if !ok {
		return fmt.Errorf("overlap policy must be a string")
	}
	switch x := Overlap(strings.ToLower(s)); x {
	case OverlapSkip, OverlapBufferOne, OverlapAllowAll, OverlapCancelPrevious:
		*o = x
		return nil
	}
	return fmt.Errorf("%q is not an overlap policy", s)
}

// Outcome is what became of one fire.
type Outcome string

// Outcomes.
const (
	OutcomeStarted  Outcome = "started"
	OutcomeSkipped  Outcome = "skipped"  // a run of the schedule was still going (skip, or a buffer already full)
	OutcomeBuffered Outcome = "buffered" // waits for the running one (buffer_one)
	OutcomeRefused  Outcome = "refused"  // admission refused it (rate, queued-task limit, spend cap) or the start was invalid
	OutcomeMissed   Outcome = "missed"   // older than the catch-up window when a server looked (counted, not listed)
)

// MarshalGQL writes the GraphQL enum value.
func (o Outcome) MarshalGQL(w io.Writer) {
	_, _ = io.WriteString(w, strconv.Quote(strings.ToUpper(string(o))))
}

// UnmarshalGQL reads the GraphQL enum value.
func (o *Outcome) UnmarshalGQL(v any) error {
	s, ok := v.(string)
	if !ok {
		return fmt.Errorf("outcome must be a string")
	}
	*o = Outcome(strings.ToLower(s))
	return nil
}

// Schedule is one schedule as stored.
type Schedule struct {
	ID         uuid.UUID
	WorkflowID uuid.UUID
	// WorkflowVersion is 0 when each fire starts the latest version.
	WorkflowVersion int
	Cron            *string
	IntervalSeconds *int
	TimeZone        string
	Input           json.RawMessage
	Metadata        json.RawMessage // an object of strings
	ExternalID      *string
	Description     string
	Overlap         Overlap
	// Priority is the priority of the runs it starts (-2..2).
	Priority int
	// CatchupWindowSeconds: after downtime, fires older than now minus
	// this are not started (counted as missed).
	CatchupWindowSeconds int
	Paused               bool
	// NextFireAt is the next fire not yet handled (nil while paused).
	NextFireAt     *time.Time
	BufferedFireAt *time.Time
	LastFireAt     *time.Time
	LastRunID      *uuid.UUID
	LastOutcome    *Outcome
	LastError      *string
	StartedCount   int64
	SkippedCount   int64
	RefusedCount   int64
	MissedCount    int64
	CreatedBy      string
	CreatedAt      time.Time
	UpdatedAt      time.Time

	sched *schedule.Schedule
}

// Fire is one fire of a schedule: the run it started or why not.
type Fire struct {
	FireAt       time.Time
	RunID        *uuid.UUID
	Outcome      Outcome
	Backfill     bool
	ErrorCode    *string
	ErrorMessage *string
	RecordedAt   time.Time
}

// Spec is the schedule's parsed timing.
func (s *Schedule) Spec() (*schedule.Schedule, error) {
	if s.sched != nil {
		return s.sched, nil
	}
	sp := schedule.Spec{Zone: s.TimeZone}
	if s.Cron != nil {
		sp.Cron = *s.Cron
	}
	if s.IntervalSeconds != nil {
		sp.Interval = time.Duration(*s.IntervalSeconds) * time.Second
	}
	sch, err := schedule.Parse(sp)
	if err != nil {
		return nil, err
	}
	s.sched = sch
	return sch, nil
}

// IdempotencyKey is the start key of the schedule's fire at t.
func IdempotencyKey(schedule uuid.UUID, t time.Time) string {
	return "schedule:" + schedule.String() + ":" + t.UTC().Format(time.RFC3339Nano)
}

// Service manages schedules inside the caller's tenant transaction.
type Service struct{}

// CreateParams are a new schedule's settings. Exactly one of WorkflowID and
// WorkflowName, and of Cron and IntervalSeconds.
type CreateParams struct {
	WorkflowID           uuid.UUID
	WorkflowName         string
	WorkflowVersion      int
	Cron                 string
	IntervalSeconds      int
	TimeZone             string
	Input                json.RawMessage
	Metadata             map[string]string
	ExternalID           string
	Description          string
	Overlap              Overlap
	Priority             int
	CatchupWindowSeconds *int
	Paused               bool
	CreatedBy            string
}

// UpdateParams are the changes Update makes; nil fields change nothing.
// Setting Cron clears the interval and the other way round.
type UpdateParams struct {
	WorkflowVersion      *int
	Cron                 *string
	IntervalSeconds      *int
	TimeZone             *string
	Input                json.RawMessage
	Metadata             map[string]string
	ExternalID           *string // "" clears it
	Description          *string
	Overlap              *Overlap
	Priority             *int
	CatchupWindowSeconds *int
}

func invalid(field, format string, args ...any) *errs.Error {
	msg := fmt.Sprintf(format, args...)
	e := errs.E(errs.Invalid, "%s: %s", field, msg)
	e.Fields = []errs.Field{{Field: field, Message: msg}}
	return e
}

func specError(err error) error {
	var se *schedule.Error
	if errors.As(err, &se) {
		return invalid(se.Field, "%s", se.Message)
	}
	return err
}

// Create adds a schedule. Its first fire is the first fire time after now.
func (Service) Create(ctx context.Context, tx *pg.Tx, p CreateParams) (Schedule, error) {
	s := Schedule{ID: uuid.Must(uuid.NewV7()), WorkflowVersion: p.WorkflowVersion, TimeZone: p.TimeZone,
		Description: p.Description, Overlap: p.Overlap, Priority: p.Priority, Paused: p.Paused, CreatedBy: p.CreatedBy}
	if s.TimeZone == "" {
		s.TimeZone = "UTC"
	}
	if s.Overlap == "" {
		s.Overlap = OverlapSkip
	}
	s.CatchupWindowSeconds = int(DefaultCatchupWindow / time.Second)
	if p.CatchupWindowSeconds != nil {
		s.CatchupWindowSeconds = *p.CatchupWindowSeconds
	}
	if p.Cron != "" {
		s.Cron = &p.Cron
	}
	if p.IntervalSeconds != 0 {
		s.IntervalSeconds = &p.IntervalSeconds
	}
	if p.ExternalID != "" {
		s.ExternalID = &p.ExternalID
	}
	var err error
	if s.Input, err = checkInput(p.Input); err != nil {
		return Schedule{}, err
	}
	if s.Metadata, err = checkMetadata(p.Metadata); err != nil {
		return Schedule{}, err
	}
	if err := validate(&s); err != nil {
		return Schedule{}, err
	}
	if p.CreatedBy == "" || len(p.CreatedBy) > 255 {
		return Schedule{}, errs.E(errs.Invalid, "a schedule needs its creator")
	}
	if (p.WorkflowID == uuid.Nil) == (p.WorkflowName == "") {
		return Schedule{}, invalid("workflowId", "name the workflow by id or by name")
	}
	var wid *uuid.UUID
	if p.WorkflowID != uuid.Nil {
		wid = &p.WorkflowID
	}
	var latest int
	err = tx.QueryRow(ctx, qResolveWorkflow, tx.Tenant, wid, p.WorkflowName).Scan(&s.WorkflowID, &latest)
	if errors.Is(err, pgx.ErrNoRows) {
		return Schedule{}, errs.E(errs.NotFound, "workflow not found")
	}
	if err != nil {
		return Schedule{}, fmt.Errorf("resolve workflow: %w", err)
	}
	if s.WorkflowVersion > latest {
		return Schedule{}, errs.E(errs.NotFound, "workflow version %d not found (latest is %d)", s.WorkflowVersion, latest)
	}
	l, err := tenants.EffectiveLimits(ctx, tx)
	if err != nil {
		return Schedule{}, err
	}
	if err := withinPlan(&s, l); err != nil {
		return Schedule{}, err
	}
	// Serialise creates per tenant so the limit holds.
	if _, err := tx.Exec(ctx, qLockTenantSchedules, tx.Tenant); err != nil {
		return Schedule{}, fmt.Errorf("lock schedules: %w", err)
	}
	var n int
	if err := tx.QueryRow(ctx, qCountSchedules, tx.Tenant).Scan(&n); err != nil {
		return Schedule{}, fmt.Errorf("count schedules: %w", err)
	}
	if max := cmpOr(l.MaxSchedules, MaxSchedules); n >= max {
		e := errs.E(errs.QuotaExceeded, "a tenant may have at most %d schedules on its plan", max)
		e.Fields = []errs.Field{{Field: "maxSchedules", Message: fmt.Sprintf("at most %d", max)}}
		return Schedule{}, e
	}
	now, err := dbNow(ctx, tx)
	if err != nil {
		return Schedule{}, err
	}
	next := s.nextAfter(now)
	_, err = tx.Exec(ctx, qInsertSchedule, tx.Tenant, s.ID, s.WorkflowID, s.WorkflowVersion, s.Cron, s.IntervalSeconds,
		s.TimeZone, s.Input, s.Metadata, s.ExternalID, s.Description, string(s.Overlap), s.CatchupWindowSeconds, s.Paused, next, s.CreatedBy,
		s.Priority)
	if isUnique(err) {
		return Schedule{}, externalIDTaken(*s.ExternalID)
	}
	if err != nil {
		return Schedule{}, fmt.Errorf("insert schedule: %w", err)
	}
	return get(ctx, tx, s.ID, false)
}

func externalIDTaken(id string) error {
	e := errs.E(errs.Conflict, "externalId: another schedule has the external id %q", id)
	e.Fields = []errs.Field{{Field: "externalId", Message: "already used by another schedule"}}
	return e
}

// nextAfter is the schedule's first fire after now, or nil when paused or
// never again.
func (s *Schedule) nextAfter(now time.Time) *time.Time {
	if s.Paused {
		return nil
	}
	sch, err := s.Spec()
	if err != nil {
		return nil
	}
	t := sch.Next(now)
	if t.IsZero() {
		return nil
	}
	return &t
}

// validate checks everything that needs no database.
func validate(s *Schedule) error {
	if _, err := s.Spec(); err != nil {
		return specError(err)
	}
	switch s.Overlap {
	case OverlapSkip, OverlapBufferOne, OverlapAllowAll, OverlapCancelPrevious:
	default:
		return invalid("overlap", "%q is not an overlap policy", s.Overlap)
	}
	if s.Priority < dag.MinPriority || s.Priority > dag.MaxPriority {
		return invalid("priority", "must be between %d and %d", dag.MinPriority, dag.MaxPriority)
	}
	if s.CatchupWindowSeconds < 0 || time.Duration(s.CatchupWindowSeconds)*time.Second > MaxCatchupWindow {
		return invalid("catchupWindowSeconds", "must be between 0 and %d", int(MaxCatchupWindow/time.Second))
	}
	if s.WorkflowVersion < 0 {
		return invalid("workflowVersion", "must not be negative")
	}
	if s.ExternalID != nil {
		if msg := checkText(*s.ExternalID, MaxExternalIDChars); msg != "" || *s.ExternalID == "" {
			return invalid("externalId", "must be 1 to %d printable characters", MaxExternalIDChars)
		}
	}
	if msg := checkText(s.Description, MaxDescriptionChars); msg != "" {
		return invalid("description", "%s", msg)
	}
	return nil
}

// withinPlan checks the plan's shortest interval.
func withinPlan(s *Schedule, l tenants.Limits) error {
	sch, err := s.Spec()
	if err != nil {
		return specError(err)
	}
	if l.MinScheduleIntervalSeconds > 0 && sch.MinGap() < time.Duration(l.MinScheduleIntervalSeconds)*time.Second {
		field := "intervalSeconds"
		if s.Cron != nil {
			field = "cron"
		}
		return invalid(field, "fires every %s; the plan's shortest interval is %d seconds", sch.MinGap(), l.MinScheduleIntervalSeconds)
	}
	return nil
}

func checkText(s string, max int) string {
	if len([]rune(s)) > max {
		return fmt.Sprintf("is longer than %d characters", max)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || unicode.Is(unicode.Bidi_Control, r) {
			return "may hold only printable characters"
		}
	}
	return ""
}

func checkInput(in json.RawMessage) (json.RawMessage, error) {
	if len(strings.TrimSpace(string(in))) == 0 || string(in) == "null" {
		return json.RawMessage(`{}`), nil
	}
	if len(in) > MaxInputBytes {
		return nil, invalid("input", "is %d bytes; the limit is %d", len(in), MaxInputBytes)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(in, &obj); err != nil || obj == nil {
		return nil, invalid("input", "must be a JSON object")
	}
	if msg := jsoncheck.Check(in); msg != "" {
		return nil, invalid("input", "%s", msg)
	}
	return in, nil
}

func checkMetadata(m map[string]string) (json.RawMessage, error) {
	if len(m) > MaxMetadataKeys {
		return nil, invalid("metadata", "has %d keys; at most %d", len(m), MaxMetadataKeys)
	}
	for k, v := range m {
		if !dag.MetadataKey.MatchString(k) {
			return nil, invalid("metadata", "key %q must be 1-64 letters, digits, '_', '.' or '-', starting with a letter", k)
		}
		if msg := checkText(v, MaxMetadataValueChars); msg != "" {
			return nil, invalid("metadata", "value of %q %s", k, msg)
		}
	}
	if m == nil {
		return json.RawMessage(`{}`), nil
	}
	b, _ := json.Marshal(m)
	if len(b) > dag.MaxMetadataBytes {
		return nil, invalid("metadata", "is %d bytes; at most %d", len(b), dag.MaxMetadataBytes)
	}
	return b, nil
}

// MetadataMap is the schedule's metadata as a map.
func (s *Schedule) MetadataMap() map[string]string {
	var m map[string]string
	_ = json.Unmarshal(s.Metadata, &m)
	return m
}

// Get reads one schedule (NOT_FOUND for one of another tenant: row-level
// security hides it).
func (Service) Get(ctx context.Context, tx *pg.Tx, id uuid.UUID) (Schedule, error) {
	return get(ctx, tx, id, false)
}

func get(ctx context.Context, tx *pg.Tx, id uuid.UUID, lock bool) (Schedule, error) {
	q := qGetSchedule
	if lock {
		q = qGetScheduleLocked
	}
	rows, err := tx.Query(ctx, q, tx.Tenant, id)
	if err != nil {
		return Schedule{}, fmt.Errorf("read schedule: %w", err)
	}
	list, err := scanSchedules(rows)
	if err != nil {
		return Schedule{}, err
	}
	if len(list) == 0 {
		return Schedule{}, errs.E(errs.NotFound, "schedule not found")
	}
	return list[0], nil
}

func scanSchedules(rows pgx.Rows) ([]Schedule, error) {
	var out []Schedule
	var s Schedule
	var overlap string
	var outcome *string
	_, err := pgx.ForEachRow(rows, []any{&s.ID, &s.WorkflowID, &s.WorkflowVersion, &s.Cron, &s.IntervalSeconds, &s.TimeZone,
		&s.Input, &s.Metadata, &s.ExternalID, &s.Description, &overlap, &s.CatchupWindowSeconds, &s.Paused, &s.NextFireAt,
		&s.BufferedFireAt, &s.LastFireAt, &s.LastRunID, &outcome, &s.LastError, &s.StartedCount, &s.SkippedCount,
		&s.RefusedCount, &s.MissedCount, &s.CreatedBy, &s.CreatedAt, &s.UpdatedAt, &s.Priority}, func() error {
		c := s
		c.Overlap = Overlap(overlap)
		if outcome != nil {
			o := Outcome(*outcome)
			c.LastOutcome = &o
		}
		c.Input = append(json.RawMessage(nil), s.Input...)
		c.Metadata = append(json.RawMessage(nil), s.Metadata...)
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read schedules: %w", err)
	}
	return out, nil
}

// List reads a page of the tenant's schedules in creation order, after the
// schedule with id after (uuid.Nil: from the first), optionally of one
// workflow; more reports whether there are others.
func (Service) List(ctx context.Context, tx *pg.Tx, workflow, after uuid.UUID, first int) (list []Schedule, more bool, err error) {
	var a, w *uuid.UUID
	if after != uuid.Nil {
		a = &after
	}
	if workflow != uuid.Nil {
		w = &workflow
	}
	rows, err := tx.Query(ctx, qListSchedules, tx.Tenant, a, w, first+1)
	if err != nil {
		return nil, false, fmt.Errorf("list schedules: %w", err)
	}
	list, err = scanSchedules(rows)
	if err != nil {
		return nil, false, err
	}
	if len(list) > first {
		return list[:first], true, nil
	}
	return list, false, nil
}

// Update changes a schedule. A change of its timing (cron, interval, zone)
// moves its next fire to the new timing's first fire after now.
func (Service) Update(ctx context.Context, tx *pg.Tx, id uuid.UUID, p UpdateParams) (Schedule, error) {
	s, err := get(ctx, tx, id, true)
	if err != nil {
		return Schedule{}, err
	}
	timing := false
	if p.Cron != nil {
		s.Cron, s.IntervalSeconds, timing = p.Cron, nil, true
	}
	if p.IntervalSeconds != nil {
		if p.Cron != nil {
			return Schedule{}, invalid("cron", "give a cron expression or an interval, not both")
		}
		s.IntervalSeconds, s.Cron, timing = p.IntervalSeconds, nil, true
	}
	if p.TimeZone != nil {
		s.TimeZone, timing = *p.TimeZone, true
	}
	if p.WorkflowVersion != nil {
		s.WorkflowVersion = *p.WorkflowVersion
	}
	if p.Input != nil {
		if s.Input, err = checkInput(p.Input); err != nil {
			return Schedule{}, err
		}
	}
	if p.Metadata != nil {
		if s.Metadata, err = checkMetadata(p.Metadata); err != nil {
			return Schedule{}, err
		}
	}
	if p.ExternalID != nil {
		s.ExternalID = p.ExternalID
		if *p.ExternalID == "" {
			s.ExternalID = nil
		}
	}
	if p.Description != nil {
		s.Description = *p.Description
	}
	if p.Overlap != nil {
		s.Overlap = *p.Overlap
	}
	if p.Priority != nil {
		s.Priority = *p.Priority
	}
	if p.CatchupWindowSeconds != nil {
		s.CatchupWindowSeconds = *p.CatchupWindowSeconds
	}
	s.sched = nil
	if err := validate(&s); err != nil {
		return Schedule{}, err
	}
	if p.WorkflowVersion != nil {
		var latest int
		if err := tx.QueryRow(ctx, qResolveWorkflow, tx.Tenant, s.WorkflowID, "").Scan(new(uuid.UUID), &latest); err != nil {
			return Schedule{}, fmt.Errorf("resolve workflow: %w", err)
		}
		if s.WorkflowVersion > latest {
			return Schedule{}, errs.E(errs.NotFound, "workflow version %d not found (latest is %d)", s.WorkflowVersion, latest)
		}
	}
	if timing {
		l, err := tenants.EffectiveLimits(ctx, tx)
		if err != nil {
			return Schedule{}, err
		}
		if err := withinPlan(&s, l); err != nil {
			return Schedule{}, err
		}
		now, err := dbNow(ctx, tx)
		if err != nil {
			return Schedule{}, err
		}
		s.NextFireAt = s.nextAfter(now)
	}
	return write(ctx, tx, s)
}

func write(ctx context.Context, tx *pg.Tx, s Schedule) (Schedule, error) {
	_, err := tx.Exec(ctx, qUpdateSchedule, tx.Tenant, s.ID, s.WorkflowVersion, s.Cron, s.IntervalSeconds, s.TimeZone, s.Input,
		s.Metadata, s.ExternalID, s.Description, string(s.Overlap), s.CatchupWindowSeconds, s.Paused, s.NextFireAt, s.BufferedFireAt,
		s.Priority)
	if isUnique(err) {
		return Schedule{}, externalIDTaken(*s.ExternalID)
	}
	if err != nil {
		return Schedule{}, fmt.Errorf("update schedule: %w", err)
	}
	return get(ctx, tx, s.ID, false)
}

// Pause stops a schedule's fires (a buffered one is dropped).
func (Service) Pause(ctx context.Context, tx *pg.Tx, id uuid.UUID) (Schedule, error) {
	s, err := get(ctx, tx, id, true)
	if err != nil {
		return Schedule{}, err
	}
	s.Paused, s.NextFireAt, s.BufferedFireAt = true, nil, nil
	return write(ctx, tx, s)
}

// Resume starts a paused schedule again from its first fire after now:
// fires while it was paused are not made up (backfill them if wanted).
func (Service) Resume(ctx context.Context, tx *pg.Tx, id uuid.UUID) (Schedule, error) {
	s, err := get(ctx, tx, id, true)
	if err != nil {
		return Schedule{}, err
	}
	if !s.Paused {
		return s, nil
	}
	now, err := dbNow(ctx, tx)
	if err != nil {
		return Schedule{}, err
	}
	s.Paused = false
	s.NextFireAt = s.nextAfter(now)
	return write(ctx, tx, s)
}

// Delete removes a schedule and its fire history; runs it started stay.
func (Service) Delete(ctx context.Context, tx *pg.Tx, id uuid.UUID) error {
	tag, err := tx.Exec(ctx, qDeleteSchedule, tx.Tenant, id)
	if err != nil {
		return fmt.Errorf("delete schedule: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errs.E(errs.NotFound, "schedule not found")
	}
	return nil
}

// RecentFires lists the schedule's latest fires, newest first.
func (Service) RecentFires(ctx context.Context, tx *pg.Tx, id uuid.UUID, first int) ([]Fire, error) {
	rows, err := tx.Query(ctx, qRecentFires, tx.Tenant, id, first)
	if err != nil {
		return nil, fmt.Errorf("read fires: %w", err)
	}
	var out []Fire
	var f Fire
	var outcome string
	_, err = pgx.ForEachRow(rows, []any{&f.FireAt, &f.RunID, &outcome, &f.Backfill, &f.ErrorCode, &f.ErrorMessage, &f.RecordedAt}, func() error {
		c := f
		c.Outcome = Outcome(outcome)
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read fires: %w", err)
	}
	return out, nil
}

// NextFireTimes lists the schedule's next count fire times: from its next
// fire not yet handled (which may be due now). Empty while paused.
func (s *Schedule) NextFireTimes(count int) ([]time.Time, error) {
	if count < 0 || count > MaxNextFireTimes {
		return nil, invalid("count", "must be between 0 and %d", MaxNextFireTimes)
	}
	if s.Paused || s.NextFireAt == nil || count == 0 {
		return []time.Time{}, nil
	}
	sch, err := s.Spec()
	if err != nil {
		return nil, err
	}
	out := append([]time.Time{*s.NextFireAt}, sch.NextN(*s.NextFireAt, count-1)...)
	return out, nil
}

func dbNow(ctx context.Context, tx *pg.Tx) (time.Time, error) {
	var now time.Time
	if err := tx.QueryRow(ctx, qNow).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("read the clock: %w", err)
	}
	return now, nil
}

func isUnique(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

func cmpOr(a, b int) int {
	if a > 0 {
		return a
	}
	return b
}
