package billing

import (
	"errors"
	"fmt"
	"math/bits"
	"sort"
	"time"
)

// Price is what a plan charges for one meter.
type Price struct {
	Meter string
	// Included units are covered by the base fee each period.
	Included int64
	// UnitPriceMicros is the price of each further unit in millionths of
	// the currency unit (1 cent = 10,000).
	UnitPriceMicros int64
	// HardCap, when above zero, is the units per period at which new runs
	// are refused.
	HardCap int64
}

// Plan is a plan's pricing.
type Plan struct {
	Name         string
	Currency     string
	BaseFeeCents int64
	Prices       []Price
}

// LineItem is one meter's charge.
type LineItem struct {
	Meter string
	// Quantity is the period's usage in billed units (step_seconds in whole
	// seconds, rounded up over the period's total).
	Quantity int64
	Included int64
	// Billable is the quantity beyond the included units.
	Billable        int64
	UnitPriceMicros int64
	// AmountCents is Billable × UnitPriceMicros, rounded half up to cents.
	AmountCents int64
	HardCap     int64
	// CapReached reports Quantity at or beyond a hard cap.
	CapReached bool
}

// Invoice is a period's charges.
type Invoice struct {
	Period       Period
	Plan         string
	Currency     string
	BaseFeeCents int64
	Lines        []LineItem
	TotalCents   int64
	// SpendCapCents, when above zero, is the most the tenant will spend in
	// a period: at it, new runs are refused.
	SpendCapCents int64
}

// CapsReached lists what stops new runs: meters at their hard cap, and
// "spend_cap" when the total reached the spend cap.
func (inv Invoice) CapsReached() []string {
	var out []string
	for _, l := range inv.Lines {
		if l.CapReached {
			out = append(out, l.Meter)
		}
	}
	if inv.SpendCapCents > 0 && inv.TotalCents >= inv.SpendCapCents {
		out = append(out, "spend_cap")
	}
	return out
}

// ErrOverflow reports an amount beyond int64 minor units.
var ErrOverflow = errors.New("billing: amount out of range")

// Compute prices recorded usage (meter → recorded units,
// see Unit) under plan. Meters the plan does not price are listed at zero.
func Compute(plan Plan, period Period, recorded map[string]int64, spendCapCents int64) (Invoice, error) {
	inv := Invoice{Period: period, Plan: plan.Name, Currency: plan.Currency, BaseFeeCents: plan.BaseFeeCents, SpendCapCents: spendCapCents}
	prices := map[string]Price{}
	for _, p := range plan.Prices {
		prices[p.Meter] = p
	}
	total := plan.BaseFeeCents
	for _, m := range orderedMeters(plan, recorded) {
		p := prices[m]
		r := recorded[m]
		if r < 0 || p.Included < 0 || p.UnitPriceMicros < 0 {
			return Invoice{}, fmt.Errorf("billing: negative quantity or price for %s", m)
		}
		unit := Unit(m)
		q := r / unit
		if r%unit != 0 {
			q++
		}
		l := LineItem{Meter: m, Quantity: q, Included: p.Included, UnitPriceMicros: p.UnitPriceMicros, HardCap: p.HardCap}
		l.Billable = max(q-p.Included, 0)
		hi, lo := bits.Mul64(uint64(l.Billable), uint64(p.UnitPriceMicros))
		if hi != 0 || lo > 1<<63-1-5_000 {
			return Invoice{}, fmt.Errorf("%w: %s", ErrOverflow, m)
		}
		l.AmountCents = (int64(lo) + 5_000) / 10_000
		l.CapReached = p.HardCap > 0 && q >= p.HardCap
		if total > 1<<63-1-l.AmountCents {
			return Invoice{}, fmt.Errorf("%w: total", ErrOverflow)
		}
		total += l.AmountCents
		inv.Lines = append(inv.Lines, l)
	}
	inv.TotalCents = total
	return inv, nil
}

// orderedMeters lists the known meters first, then any other the plan
// prices or the usage names, each once.
func orderedMeters(plan Plan, recorded map[string]int64) []string {
	seen := map[string]bool{}
	var out []string
	add := func(m string) {
		if !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	for _, m := range Meters {
		add(m)
	}
	for _, p := range plan.Prices {
		add(p.Meter)
	}
	var extra []string
	for m := range recorded {
		if !seen[m] {
			extra = append(extra, m)
		}
	}
	sort.Strings(extra)
	for _, m := range extra {
		add(m)
	}
	return out
}

// Period is a calendar month in UTC.
type Period struct {
	Start time.Time
}

// End is the first instant after the period.
func (p Period) End() time.Time { return p.Start.AddDate(0, 1, 0) }

func (p Period) String() string { return p.Start.Format("2006-01") }

// PeriodOf returns the month holding t.
func PeriodOf(t time.Time) Period {
	t = t.UTC()
	return Period{Start: time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)}
}

// ParsePeriod reads "YYYY-MM"; "" is the month holding now.
func ParsePeriod(s string, now time.Time) (Period, error) {
	if s == "" {
		return PeriodOf(now), nil
	}
	t, err := time.Parse("2006-01", s)
	if err != nil || t.Year() < 2000 || t.Year() > 9999 {
		return Period{}, fmt.Errorf("period %q is not a month like 2026-11", s)
	}
	return Period{Start: t.UTC()}, nil
}
