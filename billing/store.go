package billing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

// Preview prices the period's usage so far, reading the tenant's plan,
// prices, spend cap and daily usage totals in one round trip. asOf is
// the instant the totals are complete up to (the last rollup).
func Preview(ctx context.Context, tx *pg.Tx, period Period) (inv Invoice, asOf time.Time, err error) {
	var plan Plan
	var spendCap int64
	usage := map[string]int64{}
	b := &pgx.Batch{}
	b.Queue(qPricedPlan, tx.Tenant).
		QueryRow(func(r pgx.Row) error { return r.Scan(&plan.Name, &plan.Currency, &plan.BaseFeeCents, &spendCap) })
	b.Queue(qPlanPrices, tx.Tenant).
		Query(func(rows pgx.Rows) error {
			var pr Price
			_, err := pgx.ForEachRow(rows, []any{&pr.Meter, &pr.Included, &pr.UnitPriceMicros, &pr.HardCap}, func() error {
				plan.Prices = append(plan.Prices, pr)
				return nil
			})
			return err
		})
	b.Queue(qRollupThrough).QueryRow(func(r pgx.Row) error { return r.Scan(&asOf) })
	// Daily totals are as current as hourly ones (each rollup recomputes
	// both) and a month has 31 of them, not 744.
	b.Queue(qDailyUsage,
		tx.Tenant, period.Start.Format(time.DateOnly), period.End().Format(time.DateOnly)).
		Query(func(rows pgx.Rows) error {
			var m string
			var q int64
			_, err := pgx.ForEachRow(rows, []any{&m, &q}, func() error { usage[m] = q; return nil })
			return err
		})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return Invoice{}, time.Time{}, errs.E(errs.NotFound, "tenant not found")
		}
		return Invoice{}, time.Time{}, fmt.Errorf("usage and pricing: %w", err)
	}
	inv, err = Compute(plan, period, usage, spendCap)
	return inv, asOf, err
}

// checkCaps refuses a new run when the tenant's usage this month reached a
// hard cap of its plan or its spend cap (QUOTA_EXCEEDED). Usage is as of
// the last rollup (returned), so a cap may be overrun by what one rollup
// interval adds; runs already started always finish.
func checkCaps(ctx context.Context, tx *pg.Tx, now time.Time) (time.Time, error) {
	inv, asOf, err := Preview(ctx, tx, PeriodOf(now))
	if err != nil {
		return time.Time{}, err
	}
	caps := inv.CapsReached()
	if len(caps) == 0 {
		return asOf, nil
	}
	var what []string
	for _, c := range caps {
		if c == "spend_cap" {
			what = append(what, fmt.Sprintf("the spend cap of %s %s", formatCents(inv.SpendCapCents), inv.Currency))
			continue
		}
		for _, l := range inv.Lines {
			if l.Meter == c {
				what = append(what, fmt.Sprintf("the %s plan's cap of %d %s", inv.Plan, l.HardCap, c))
			}
		}
	}
	return asOf, errs.E(errs.QuotaExceeded, "this month's usage reached %s; runs already started continue, new ones start again next month or after a plan change",
		strings.Join(what, " and "))
}

// CapCache remembers that a tenant was under every cap, so that run starts
// do not price the month each time (that costs about as much as the rest
// of a start). A remembered pass holds until the next rollup (usage only
// moves when a rollup commits, so a pass is re-checked as soon as one
// does) or for TTL, whichever ends first (TTL bounds how late a lowered
// spend cap or a downgrade takes effect). A tenant at a cap is checked on
// every start, so a plan change or a raised cap admits it at once.
type CapCache struct {
	TTL time.Duration
	mu  sync.Mutex
	ok  map[uuid.UUID]capPass
}

type capPass struct {
	through, until time.Time
}

// Check refuses a new run at a cap (see checkCaps), skipping the check
// while a pass is remembered.
func (c *CapCache) Check(ctx context.Context, tx *pg.Tx, now time.Time) error {
	var through time.Time
	if err := tx.QueryRow(ctx, qRollupThrough).Scan(&through); err != nil {
		return fmt.Errorf("rollup state: %w", err)
	}
	c.mu.Lock()
	p, hit := c.ok[tx.Tenant]
	c.mu.Unlock()
	if hit && p.through.Equal(through) && now.Before(p.until) {
		return nil
	}
	// The pass is remembered under the rollup its usage came from.
	asOf, err := checkCaps(ctx, tx, now)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		delete(c.ok, tx.Tenant)
		return err
	}
	if c.ok == nil || len(c.ok) > 100_000 { // bound memory: forget everyone
		c.ok = map[uuid.UUID]capPass{}
	}
	c.ok[tx.Tenant] = capPass{through: asOf, until: now.Add(c.TTL)}
	return nil
}

func formatCents(c int64) string { return fmt.Sprintf("%d.%02d", c/100, c%100) }
