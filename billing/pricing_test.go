package billing

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var pro = Plan{Name: "pro", Currency: "USD", BaseFeeCents: 4900, Prices: []Price{
	{Meter: RunsStarted, Included: 100, UnitPriceMicros: 200},           // $0.0002 per run
	{Meter: StepsExecuted, Included: 1000, UnitPriceMicros: 50},         // $0.00005 per step
	{Meter: StepSeconds, Included: 3600, UnitPriceMicros: 10},           // $0.00001 per second
	{Meter: WebhookDeliveries, Included: 0, UnitPriceMicros: 1_000_000}, // $1 per delivery
}}

func line(inv Invoice, meter string) LineItem {
	for _, l := range inv.Lines {
		if l.Meter == meter {
			return l
		}
	}
	return LineItem{}
}

func TestInvoiceArithmetic(t *testing.T) {
	nov := Period{Start: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}
	for _, tc := range []struct {
		name     string
		plan     Plan
		usage    map[string]int64
		spendCap int64
		// want: meter → {quantity, billable, amount cents}; total cents.
		want  map[string][3]int64
		total int64
		caps  []string
	}{
		{name: "zero usage is the base fee", plan: pro, usage: nil,
			want: map[string][3]int64{RunsStarted: {0, 0, 0}, StepSeconds: {0, 0, 0}}, total: 4900},
		{name: "within the included units", plan: pro, usage: map[string]int64{RunsStarted: 100, StepsExecuted: 999},
			want: map[string][3]int64{RunsStarted: {100, 0, 0}, StepsExecuted: {999, 0, 0}}, total: 4900},
		{name: "one unit over", plan: pro, usage: map[string]int64{RunsStarted: 101},
			// 1 × 200 µ$ = 0.02 cents: rounds to 0.
			want: map[string][3]int64{RunsStarted: {101, 1, 0}}, total: 4900},
		{name: "half a cent rounds up", plan: pro, usage: map[string]int64{RunsStarted: 125},
			// 25 × 200 = 5,000 µ$ = 0.5 cent → 1 cent.
			want: map[string][3]int64{RunsStarted: {125, 25, 1}}, total: 4901},
		{name: "just under half a cent rounds down", plan: pro, usage: map[string]int64{RunsStarted: 124},
			want: map[string][3]int64{RunsStarted: {124, 24, 0}}, total: 4900},
		{name: "step milliseconds round up to whole seconds over the period", plan: pro,
			usage: map[string]int64{StepSeconds: 3_600_001 + 1_000_000*1000},
			// 1,003,600.001 s → 1,003,601 s; 1,000,001 billable × 10 µ$ = 10,000,010 µ$ = 1,000.001 cents → 1,000.
			want: map[string][3]int64{StepSeconds: {1_003_601, 1_000_001, 1000}}, total: 5900},
		{name: "every meter", plan: pro, usage: map[string]int64{RunsStarted: 10_100, StepsExecuted: 201_000, StepSeconds: 3_600_000, WebhookDeliveries: 3},
			// runs 10,000 × 200 = 2,000,000 µ$ = 200 c; steps 200,000 × 50 = 10,000,000 µ$ = 1,000 c; webhooks 3 × $1 = 300 c.
			want:  map[string][3]int64{RunsStarted: {10_100, 10_000, 200}, StepsExecuted: {201_000, 200_000, 1000}, StepSeconds: {3600, 0, 0}, WebhookDeliveries: {3, 3, 300}},
			total: 4900 + 200 + 1000 + 300},
		{name: "a free plan with hard caps", plan: Plan{Name: "free", Currency: "USD", Prices: []Price{{Meter: RunsStarted, Included: 1000, HardCap: 1000}}},
			usage: map[string]int64{RunsStarted: 1000},
			want:  map[string][3]int64{RunsStarted: {1000, 0, 0}}, total: 0, caps: []string{RunsStarted}},
		{name: "below the hard cap", plan: Plan{Name: "free", Currency: "USD", Prices: []Price{{Meter: RunsStarted, Included: 1000, HardCap: 1000}}},
			usage: map[string]int64{RunsStarted: 999}, want: map[string][3]int64{RunsStarted: {999, 0, 0}}, total: 0},
		{name: "spend cap reached", plan: pro, usage: map[string]int64{WebhookDeliveries: 51}, spendCap: 10_000,
			want: map[string][3]int64{WebhookDeliveries: {51, 51, 5100}}, total: 10_000, caps: []string{"spend_cap"}},
		{name: "spend cap not reached", plan: pro, usage: map[string]int64{WebhookDeliveries: 50}, spendCap: 10_000,
			want: map[string][3]int64{WebhookDeliveries: {50, 50, 5000}}, total: 9_900},
		{name: "a meter the plan does not price is listed at zero", plan: pro, usage: map[string]int64{"gpu_seconds": 7},
			want: map[string][3]int64{"gpu_seconds": {7, 7, 0}}, total: 4900},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv, err := Compute(tc.plan, nov, tc.usage, tc.spendCap)
			require.NoError(t, err)
			for m, w := range tc.want {
				l := line(inv, m)
				assert.Equal(t, m, l.Meter, "line for %s", m)
				assert.Equal(t, w, [3]int64{l.Quantity, l.Billable, l.AmountCents}, m)
			}
			assert.Equal(t, tc.total, inv.TotalCents)
			assert.Equal(t, tc.caps, inv.CapsReached())
			assert.Equal(t, "2026-11", inv.Period.String())
			assert.Equal(t, Meters, func() []string {
				var ms []string
				for _, l := range inv.Lines[:len(Meters)] {
					ms = append(ms, l.Meter)
				}
				return ms
			}(), "every known meter, in order")
		})
	}
}

func TestInvoiceRefusesOverflowAndNegatives(t *testing.T) {
	huge := Plan{Name: "x", Prices: []Price{{Meter: RunsStarted, UnitPriceMicros: 1 << 40}}}
	_, err := Compute(huge, PeriodOf(time.Now()), map[string]int64{RunsStarted: 1 << 40}, 0)
	assert.True(t, errors.Is(err, ErrOverflow))
	_, err = Compute(pro, PeriodOf(time.Now()), map[string]int64{RunsStarted: -1}, 0)
	assert.Error(t, err)
}

func TestParsePeriod(t *testing.T) {
	now := time.Date(2026, 11, 30, 23, 59, 0, 0, time.FixedZone("x", -5*3600)) // already December in UTC
	p, err := ParsePeriod("", now)
	require.NoError(t, err)
	assert.Equal(t, "2026-12", p.String())
	p, err = ParsePeriod("2026-02", now)
	require.NoError(t, err)
	assert.Equal(t, time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), p.End())
	for _, bad := range []string{"2026-13", "26-01", "2026/01", "november", "1999-12"} {
		_, err := ParsePeriod(bad, now)
		assert.Error(t, err, bad)
	}
}
