// Package schedule computes when a schedule fires: a 5-field cron
// expression evaluated in an IANA time zone, or a fixed interval. It is
// pure — no I/O, no clock: every answer is a function of its arguments —
// so the rules are tested exhaustively without a database.
//
// # Cron in a time zone, and daylight saving time
//
// A cron expression names wall-clock times (minute, hour, day of month,
// month, day of week; the descriptors @yearly, @monthly, @weekly, @daily,
// @hourly) in the schedule's zone. Two wall times need a rule:
//
//   - A wall time that does not exist (the clocks spring forward over it,
//     e.g. 02:30 in America/New_York on the second Sunday of March) fires
//     once, at the first instant after the gap (03:00 EDT, the transition
//     itself). Several matching wall times inside one gap fire once
//     together, and a fire at the gap's end coincides with them.
//   - A wall time that occurs twice (the clocks fall back over it, e.g.
//     01:30 on the first Sunday of November) fires once, at its first
//     occurrence (01:30 EDT); the repeated hour does not fire again.
//
// So a daily 02:30 job runs exactly once on every day of the year, and fire
// times strictly increase. Australia/Lord_Howe's half-hour shift follows
// the same rule (02:15 on its spring-forward day fires at 02:30 +11:00).
//
// # Intervals
//
// An interval (a whole number of seconds, or "@every 90s" style) fires at
// the instants that are multiples of the interval since the Unix epoch,
// whatever the zone: replicas agree on the fire times without sharing
// state, and a daylight-saving change neither shortens nor lengthens one.
package schedule

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// MaxCronLength bounds a cron expression's text.
const MaxCronLength = 200

// MaxInterval bounds an interval (a year).
const MaxInterval = 366 * 24 * time.Hour

// Spec is what a schedule says: exactly one of Cron and Interval, and the
// zone a cron expression is read in (empty means UTC).
type Spec struct {
	Cron     string
	Interval time.Duration
	Zone     string
}

// Schedule is a parsed Spec.
type Schedule struct {
	spec     *cron.SpecSchedule // in UTC: it matches wall times, not instants
	interval time.Duration
	loc      *time.Location
}

// Error is a Spec that does not parse; Field names what is wrong ("cron",
// "interval" or "timeZone").
type Error struct {
	Field   string
	Message string
}

func (e *Error) Error() string { return e.Field + ": " + e.Message }

var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Parse checks a spec and returns its schedule.
func Parse(s Spec) (*Schedule, error) {
	zone := s.Zone
	if zone == "" {
		zone = "UTC"
	}
	if len(zone) > 64 || strings.EqualFold(zone, "local") {
		return nil, &Error{Field: "timeZone", Message: fmt.Sprintf("%q is not an IANA time zone", zone)}
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, &Error{Field: "timeZone", Message: fmt.Sprintf("%q is not an IANA time zone", zone)}
	}
	cronText := strings.TrimSpace(s.Cron)
	switch {
	case cronText != "" && s.Interval != 0:
		return nil, &Error{Field: "cron", Message: "give a cron expression or an interval, not both"}
	case cronText == "" && s.Interval == 0:
		return nil, &Error{Field: "cron", Message: "give a cron expression or an interval"}
	}
	if cronText == "" {
		if s.Interval < time.Second || s.Interval%time.Second != 0 || s.Interval > MaxInterval {
			return nil, &Error{Field: "interval", Message: "must be a whole number of seconds between 1 second and 366 days"}
		}
		return &Schedule{interval: s.Interval, loc: loc}, nil
	}
	if len(cronText) > MaxCronLength {
		return nil, &Error{Field: "cron", Message: fmt.Sprintf("is longer than %d characters", MaxCronLength)}
	}
	if strings.HasPrefix(cronText, "@every ") {
		d, err := time.ParseDuration(strings.TrimSpace(strings.TrimPrefix(cronText, "@every ")))
		if err != nil {
			return nil, &Error{Field: "cron", Message: fmt.Sprintf("%q: not a duration", cronText)}
		}
		return Parse(Spec{Interval: d, Zone: zone})
	}
	if strings.HasPrefix(cronText, "TZ=") || strings.HasPrefix(cronText, "CRON_TZ=") {
		return nil, &Error{Field: "cron", Message: "give the time zone in timeZone, not in the expression"}
	}
	parsed, err := parser.Parse(cronText)
	if err != nil {
		return nil, &Error{Field: "cron", Message: fmt.Sprintf("%q: %v", cronText, err)}
	}
	spec, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return nil, &Error{Field: "cron", Message: fmt.Sprintf("%q is not a calendar expression", cronText)}
	}
	spec.Location = time.UTC
	sch := &Schedule{spec: spec, loc: loc}
	// An expression that never matches (31 February) is refused.
	if sch.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).IsZero() {
		return nil, &Error{Field: "cron", Message: fmt.Sprintf("%q never fires", cronText)}
	}
	return sch, nil
}

// Interval is the schedule's interval (0 for a cron schedule).
func (s *Schedule) Interval() time.Duration { return s.interval }

// MinGap is the shortest time between two fires the schedule can have
// outside daylight-saving changes: the interval, or for a cron expression
// the smallest distance between matching minutes of one hour (an hour if
// only one minute matches, longer is not distinguished). Plans bound it.
func (s *Schedule) MinGap() time.Duration {
	if s.spec == nil {
		return s.interval
	}
	var mins []int
	for m := 0; m < 60; m++ {
		if s.spec.Minute&(1<<uint(m)) != 0 {
			mins = append(mins, m)
		}
	}
	gap := 60 // one matching minute an hour: at least an hour apart
	for i, m := range mins {
		if d := (mins[(i+1)%len(mins)] - m + 60) % 60; d > 0 {
			gap = min(gap, d)
		}
	}
	return time.Duration(gap) * time.Minute
}

// Next is the first fire time strictly after after (the zero time if the
// schedule never fires again within five years).
func (s *Schedule) Next(after time.Time) time.Time {
	if s.spec == nil {
		step := int64(s.interval / time.Second)
		sec := after.Unix()
		n := sec/step + 1
		if sec < 0 && sec%step != 0 {
			n = sec / step
		}
		return time.Unix(n*step, 0).UTC()
	}
	// Scan matching wall times from after's own wall time; map each to
	// its instant (gap → the transition, repeated → first occurrence).
	// The map is monotonic, so the first instant past after is the answer.
	wall := wallOf(after.In(s.loc))
	limit := wall.AddDate(5, 0, 0)
	w := s.spec.Next(wall.Add(-time.Minute))
	for !w.IsZero() && !w.After(limit) {
		if at := instantOf(w, s.loc); at.After(after) {
			return at.UTC()
		}
		w = s.spec.Next(w)
	}
	return time.Time{}
}

// NextN lists the next n fire times strictly after after.
func (s *Schedule) NextN(after time.Time, n int) []time.Time {
	out := make([]time.Time, 0, n)
	for len(out) < n {
		t := s.Next(after)
		if t.IsZero() {
			break
		}
		out = append(out, t)
		after = t
	}
	return out
}

// Between lists the fire times in [from, to), at most limit of them; more
// reports whether there were others in the range.
func (s *Schedule) Between(from, to time.Time, limit int) (times []time.Time, more bool) {
	t := s.Next(from.Add(-time.Nanosecond))
	for !t.IsZero() && t.Before(to) {
		if len(times) == limit {
			return times, true
		}
		times = append(times, t)
		t = s.Next(t)
	}
	return times, false
}

// wallOf is t's wall clock as a UTC time (seconds kept, below dropped).
func wallOf(t time.Time) time.Time {
	y, mo, d := t.Date()
	h, mi, sec := t.Clock()
	return time.Date(y, mo, d, h, mi, sec, 0, time.UTC)
}

// instantOf maps a wall time (as UTC) in loc to the instant it fires at:
// its only occurrence, its first when it occurs twice, or the first
// instant after the gap when it does not occur.
func instantOf(wall time.Time, loc *time.Location) time.Time {
	u := wall.Unix()
	// Walk the zone periods in effect within 14 hours (the largest
	// offset) either side; a wall time occurs in a period whose offset
	// maps it inside the period.
	const span = 15 * 3600
	t := time.Unix(u-span, 0).In(loc)
	prevEnd, prevOff := time.Time{}, 0
	for i := 0; i < 8; i++ {
		_, off := t.Zone()
		start, end := t.ZoneBounds()
		x := time.Unix(u-int64(off), 0)
		if (start.IsZero() || !x.Before(start)) && (end.IsZero() || x.Before(end)) {
			return x // periods are walked in order: the first hit is the first occurrence
		}
		// A gap between the previous period and this one: the wall time
		// falls in it when the clock jumped over it at start.
		if !prevEnd.IsZero() && prevEnd.Equal(start) &&
			prevEnd.Unix()+int64(prevOff) <= u && u < start.Unix()+int64(off) {
			return start
		}
		if end.IsZero() || end.Unix() > u+span {
			break
		}
		prevEnd, prevOff = end, off
		t = end.In(loc)
	}
	// Not found (no transitions near: cannot happen for a valid zone).
	return time.Date(wall.Year(), wall.Month(), wall.Day(), wall.Hour(), wall.Minute(), wall.Second(), 0, loc)
}
