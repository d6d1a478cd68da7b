package schedule

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

// TestDaylightSavingRule: a wall time skipped by a spring-forward fires
// once at the first instant after the gap; one repeated by a fall-back
// fires once, at its first occurrence.
func TestDaylightSavingRule(t *testing.T) {
	cases := []struct {
		name, zone, cron, after string
		want                    []string
	}{
		// America/New_York 2024: 02:00 EST → 03:00 EDT on 10 March, 02:00 EDT → 01:00 EST on 3 November.
		{"NY daily 02:30 over spring-forward", "America/New_York", "30 2 * * *", "2024-03-09T12:00:00-05:00",
			[]string{"2024-03-10T03:00:00-04:00", "2024-03-11T02:30:00-04:00"}},
		{"NY daily 01:30 over fall-back", "America/New_York", "30 1 * * *", "2024-11-02T12:00:00-04:00",
			[]string{"2024-11-03T01:30:00-04:00", "2024-11-04T01:30:00-05:00"}},
		{"NY half-hourly over spring-forward", "America/New_York", "*/30 * * * *", "2024-03-10T01:00:00-05:00",
			[]string{"2024-03-10T01:30:00-05:00", "2024-03-10T03:00:00-04:00", "2024-03-10T03:30:00-04:00"}},
		{"NY half-hourly over fall-back", "America/New_York", "*/30 * * * *", "2024-11-03T00:00:00-04:00",
			[]string{"2024-11-03T00:30:00-04:00", "2024-11-03T01:00:00-04:00", "2024-11-03T01:30:00-04:00", "2024-11-03T02:00:00-05:00"}},
		{"NY from inside the repeated hour", "America/New_York", "30 1 * * *", "2024-11-03T01:10:00-05:00",
			[]string{"2024-11-04T01:30:00-05:00"}},
		{"NY 03:00 coincides with the gap's fire", "America/New_York", "30 2,3 * * *", "2024-03-10T00:00:00-05:00",
			[]string{"2024-03-10T03:00:00-04:00", "2024-03-10T03:30:00-04:00", "2024-03-11T02:30:00-04:00"}},
		// Europe/London 2024: 01:00 GMT → 02:00 BST on 31 March, 02:00 BST → 01:00 GMT on 27 October.
		{"London daily 01:30 over spring-forward", "Europe/London", "30 1 * * *", "2024-03-30T12:00:00Z",
			[]string{"2024-03-31T02:00:00+01:00", "2024-04-01T01:30:00+01:00"}},
		{"London daily 01:30 over fall-back", "Europe/London", "30 1 * * *", "2024-10-26T12:00:00+01:00",
			[]string{"2024-10-27T01:30:00+01:00", "2024-10-28T01:30:00Z"}},
		{"London weekly Sunday 01:15 over spring-forward", "Europe/London", "15 1 * * 0", "2024-03-25T00:00:00Z",
			[]string{"2024-03-31T02:00:00+01:00", "2024-04-07T01:15:00+01:00"}},
		// Australia/Lord_Howe: +10:30 standard, +11:00 in summer, a 30-minute shift.
		// 02:00 → 02:30 on 6 October 2024; 02:00 → 01:30 on 7 April 2024.
		{"Lord Howe 02:15 over spring-forward", "Australia/Lord_Howe", "15 2 * * *", "2024-10-05T12:00:00+10:30",
			[]string{"2024-10-06T02:30:00+11:00", "2024-10-07T02:15:00+11:00"}},
		{"Lord Howe 01:45 over fall-back", "Australia/Lord_Howe", "45 1 * * *", "2024-04-06T12:00:00+11:00",
			[]string{"2024-04-07T01:45:00+11:00", "2024-04-08T01:45:00+10:30"}},
		{"Lord Howe every 15 minutes over fall-back", "Australia/Lord_Howe", "*/15 1-2 * * *", "2024-04-07T01:20:00+11:00",
			[]string{"2024-04-07T01:30:00+11:00", "2024-04-07T01:45:00+11:00", "2024-04-07T02:00:00+10:30", "2024-04-07T02:15:00+10:30"}},
		{"Lord Howe every 15 minutes over spring-forward", "Australia/Lord_Howe", "*/15 1-2 * * *", "2024-10-06T01:40:00+10:30",
			[]string{"2024-10-06T01:45:00+10:30", "2024-10-06T02:30:00+11:00", "2024-10-06T02:45:00+11:00", "2024-10-07T01:00:00+11:00"}},
		// Plain cases.
		{"UTC hourly", "UTC", "@hourly", "2024-01-01T10:59:59Z", []string{"2024-01-01T11:00:00Z", "2024-01-01T12:00:00Z"}},
		{"monthly on the 31st skips short months", "Europe/London", "0 9 31 * *", "2024-01-31T09:00:00Z",
			[]string{"2024-03-31T09:00:00+01:00", "2024-05-31T09:00:00+01:00"}},
		{"weekdays", "America/New_York", "0 9 * * MON-FRI", "2024-03-08T10:00:00-05:00",
			[]string{"2024-03-11T09:00:00-04:00", "2024-03-12T09:00:00-04:00"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := Parse(Spec{Cron: c.cron, Zone: c.zone})
			require.NoError(t, err)
			got := s.NextN(utc(c.after), len(c.want))
			var want []time.Time
			for _, w := range c.want {
				want = append(want, utc(w))
			}
			assert.Equal(t, want, got)
		})
	}
}

// TestDailyJobRunsOnceEveryDay: a 02:30 job in New York fires exactly
// once on every local day of a year that has both changes.
func TestDailyJobRunsOnceEveryDay(t *testing.T) {
	for _, c := range []struct{ zone, cron string }{
		{"America/New_York", "30 2 * * *"}, {"America/New_York", "30 1 * * *"},
		{"Europe/London", "30 1 * * *"}, {"Australia/Lord_Howe", "45 1 * * *"}, {"Australia/Lord_Howe", "15 2 * * *"},
	} {
		s, err := Parse(Spec{Cron: c.cron, Zone: c.zone})
		require.NoError(t, err)
		loc, _ := time.LoadLocation(c.zone)
		from := time.Date(2024, 1, 1, 0, 0, 0, 0, loc)
		times, more := s.Between(from, from.AddDate(1, 0, 0), 1000)
		require.False(t, more)
		days := map[string]int{}
		for _, tm := range times {
			days[tm.In(loc).Format("2006-01-02")]++
		}
		assert.Len(t, days, 366, "%s %s: one fire on each day of 2024", c.zone, c.cron)
		for d, n := range days {
			assert.Equal(t, 1, n, "%s %s on %s", c.zone, c.cron, d)
		}
	}
}

func TestIntervals(t *testing.T) {
	s, err := Parse(Spec{Interval: 90 * time.Second, Zone: "America/New_York"})
	require.NoError(t, err)
	assert.Equal(t, []time.Time{time.Unix(90, 0).UTC(), time.Unix(180, 0).UTC()}, s.NextN(time.Unix(0, 0), 2))
	assert.Equal(t, time.Unix(90, 0).UTC(), s.Next(time.Unix(89, 999_999_999)))
	assert.Equal(t, time.Unix(0, 0).UTC(), s.Next(time.Unix(-1, 0)))
	e, err := Parse(Spec{Cron: "@every 1m30s"})
	require.NoError(t, err)
	assert.Equal(t, 90*time.Second, e.Interval())
	assert.Equal(t, 90*time.Second, e.MinGap())
	c, err := Parse(Spec{Cron: "*/5 * * * *"})
	require.NoError(t, err)
	assert.Equal(t, 5*time.Minute, c.MinGap())
	c, err = Parse(Spec{Cron: "0,10,11 * * * *"})
	require.NoError(t, err)
	assert.Equal(t, time.Minute, c.MinGap())
	c, err = Parse(Spec{Cron: "0 9 * * *"})
	require.NoError(t, err)
	assert.Equal(t, time.Hour, c.MinGap())
}

func TestParseNamesTheField(t *testing.T) {
	for _, c := range []struct {
		spec  Spec
		field string
	}{
		{Spec{Cron: "61 * * * *"}, "cron"},
		{Spec{Cron: "* * * *"}, "cron"},
		{Spec{Cron: "0 0 30 2 *"}, "cron"},
		{Spec{Cron: "TZ=UTC 0 * * * *"}, "cron"},
		{Spec{Cron: "@every nonsense"}, "cron"},
		{Spec{Cron: strings.Repeat("1,", 150) + "1 * * * *"}, "cron"},
		{Spec{}, "cron"},
		{Spec{Cron: "* * * * *", Interval: time.Minute}, "cron"},
		{Spec{Interval: 500 * time.Millisecond}, "interval"},
		{Spec{Interval: 1500 * time.Millisecond}, "interval"},
		{Spec{Interval: 400 * 24 * time.Hour}, "interval"},
		{Spec{Cron: "@every 1ms"}, "interval"},
		{Spec{Cron: "* * * * *", Zone: "Mars/Olympus"}, "timeZone"},
		{Spec{Cron: "* * * * *", Zone: "Local"}, "timeZone"},
		{Spec{Cron: "* * * * *", Zone: "../../etc/passwd"}, "timeZone"},
	} {
		_, err := Parse(c.spec)
		var e *Error
		require.ErrorAs(t, err, &e, "%+v", c.spec)
		assert.Equal(t, c.field, e.Field, "%+v: %v", c.spec, err)
	}
}

var zones = []string{"America/New_York", "Europe/London", "Australia/Lord_Howe", "UTC", "Asia/Kolkata", "America/Sao_Paulo"}

// TestFireTimesIncreaseAndMatchTheSpec: for random cron expressions and
// starting points around the changes of random zones, fire times strictly
// increase and are exactly what a minute-by-minute walk over real instants
// finds: instants whose wall time matches and occurs there for the first
// time, and the ends of gaps that swallowed a matching wall time.
func TestFireTimesIncreaseAndMatchTheSpec(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		zone := rapid.SampledFrom(zones).Draw(t, "zone")
		loc, _ := time.LoadLocation(zone)
		minutes := rapid.SliceOfNDistinct(rapid.IntRange(0, 59), 1, 4, rapid.ID[int]).Draw(t, "minutes")
		hours := "*"
		if rapid.Bool().Draw(t, "someHours") {
			hs := rapid.SliceOfNDistinct(rapid.IntRange(0, 23), 1, 6, rapid.ID[int]).Draw(t, "hours")
			hours = join(hs)
		}
		cronText := join(minutes) + " " + hours + " * * *"
		s, err := Parse(Spec{Cron: cronText, Zone: zone})
		require.NoError(t, err)
		// Start near a DST change of 2024 or 2025 (or anywhere).
		base := []time.Time{utc("2024-03-10T06:00:00Z"), utc("2024-11-03T05:00:00Z"), utc("2024-03-31T00:00:00Z"),
			utc("2024-10-27T00:00:00Z"), utc("2024-04-06T14:00:00Z"), utc("2024-10-05T15:00:00Z"), utc("2025-02-22T02:00:00Z")}
		start := rapid.SampledFrom(base).Draw(t, "base").Add(time.Duration(rapid.IntRange(-36*3600, 36*3600).Draw(t, "offset")) * time.Second)
		fires := s.NextN(start, 8)
		require.Len(t, fires, 8)
		for i := 1; i < len(fires); i++ {
			require.True(t, fires[i].After(fires[i-1]), "%s in %s: %v then %v", cronText, zone, fires[i-1], fires[i])
		}
		matches := func(w time.Time) bool {
			return s.spec.Minute&(1<<uint(w.Minute())) != 0 && s.spec.Hour&(1<<uint(w.Hour())) != 0
		}
		var want []time.Time
		m := start.Truncate(time.Minute)
		for !m.After(fires[len(fires)-1]) {
			if m.After(start) {
				w := wallOf(m.In(loc))
				first := true
				for _, d := range []time.Duration{30 * time.Minute, time.Hour, 2 * time.Hour} {
					if wallOf(m.Add(-d).In(loc)).Equal(w) {
						first = false
					}
				}
				fire := matches(w) && first
				prevEnd := wallOf(m.Add(-time.Second).In(loc)).Add(time.Second)
				for g := prevEnd; g.Before(w); g = g.Add(time.Minute) { // a gap ends at m
					if matches(g) {
						fire = true
					}
				}
				if fire {
					want = append(want, m)
				}
			}
			m = m.Add(time.Minute)
		}
		require.Equal(t, want, fires, "%s in %s after %v", cronText, zone, start)
	})
}

func TestIntervalFiresAreMultiples(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sec := rapid.Int64Range(1, 7*24*3600).Draw(t, "seconds")
		s, err := Parse(Spec{Interval: time.Duration(sec) * time.Second, Zone: rapid.SampledFrom(zones).Draw(t, "zone")})
		require.NoError(t, err)
		after := time.Unix(rapid.Int64Range(-1e9, 4e9).Draw(t, "after"), rapid.Int64Range(0, 999_999_999).Draw(t, "nanos"))
		fires := s.NextN(after, 5)
		require.True(t, fires[0].After(after))
		require.False(t, fires[0].Add(-time.Duration(sec)*time.Second).After(after), "no multiple skipped")
		for i, f := range fires {
			require.Zero(t, f.Unix()%sec)
			if i > 0 {
				require.Equal(t, time.Duration(sec)*time.Second, f.Sub(fires[i-1]))
			}
		}
	})
}

func join(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, ",")
}
