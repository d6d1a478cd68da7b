package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/workers"
)

// ChainsK16Scraped is chains-k16 with /metrics scraped 100 times a second,
// against a tenant holding a million runs.
const ChainsK16Scraped = "chains-k16-scraped"

// scrapeRate is the scrapes per second of a scraped round.
const scrapeRate = 100

// runChainsScraped seeds the bench tenant with runs (generate_series),
// then alternates rounds of chains-k16 — plain and scraped, ABBAABBA —
// on one system, and reports the scraped rounds' throughput as a ratio of
// the plain rounds' (same run, same database). A scrape reads the
// process's /metrics on its operator listener, as Prometheus does.
func runChainsScraped(ctx context.Context, o Options, rep *Report, seedRuns, steps int) (Result, error) {
	e, err := setup(ctx, o, func(c *workers.Config) { c.Concurrency = 16 }, nil)
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	if rep.Machine.CPUs == 0 {
		rep.Machine = machine(ctx, e)
	}
	const length = 20
	wf, err := e.workflow(ctx, chainDef(length, noopStep))
	if err != nil {
		return Result{}, err
	}
	seedStart := time.Now()
	err = e.deps.DB.WithTenant(ctx, e.tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO workflow_runs (tenant_id, id, workflow_id, workflow_version, status, input, created_at, finished_at)
			SELECT $1, composer_uuidv7(now() - make_interval(secs => ($2 - g) * 0.01)), $3, 1,
			       CASE WHEN g % 100 = 0 THEN 'failed' ELSE 'completed' END, '{}'::jsonb, now(), now()
			  FROM generate_series(1, $2) g`, e.tenant, seedRuns, wf)
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("seed runs: %w", err)
	}
	seed := time.Since(seedStart)
	owner, err := pgx.Connect(ctx, e.cfg.MigrateDatabaseURL)
	if err != nil {
		return Result{}, err
	}
	// Vacuumed and analysed now, so autovacuum does not visit the million
	// new rows during a round.
	_, err = owner.Exec(ctx, `VACUUM ANALYZE workflow_runs`)
	owner.Close(ctx)
	if err != nil {
		return Result{}, err
	}
	metricsURL := "http://" + e.server.AdminAddr + "/metrics"
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 8}}
	if _, _, err := e.drive(ctx, wf, 16, 16); err != nil { // warm up
		return Result{}, err
	}
	runs := max(1, steps/length)
	var plain, scraped []float64
	var scrapes, scrapeErrs atomic.Int64
	var scrapeTime atomic.Int64
	// ABBAABBA: drift over the run (the machine is shared, the seed's
	// pages are still being written out) weighs on both; each adjacent
	// pair gives a ratio, and the report has their median.
	order := []bool{false, true, true, false, false, true, true, false}
	var rounds []float64
	for _, withScrapes := range order {
		sctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		if withScrapes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(time.Second / scrapeRate)
				defer tick.Stop()
				for {
					select {
					case <-sctx.Done():
						return
					case <-tick.C:
					}
					t0 := time.Now()
					resp, err := client.Get(metricsURL)
					if err != nil {
						scrapeErrs.Add(1)
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						scrapeErrs.Add(1)
					}
					scrapes.Add(1)
					scrapeTime.Add(int64(time.Since(t0)))
				}
			}()
		}
		_, took, err := e.drive(ctx, wf, 16, runs)
		stop()
		wg.Wait()
		if err != nil {
			return Result{}, err
		}
		sps := float64(runs*length) / took.Seconds()
		rounds = append(rounds, sps)
		if withScrapes {
			scraped = append(scraped, sps)
		} else {
			plain = append(plain, sps)
		}
	}
	mean := func(xs []float64) float64 {
		var s float64
		for _, x := range xs {
			s += x
		}
		return s / float64(len(xs))
	}
	var ratios []float64
	for i := 0; i+1 < len(order); i += 2 {
		a, b := rounds[i], rounds[i+1]
		if order[i] {
			a, b = b, a
		}
		ratios = append(ratios, b/a) // scraped ÷ plain
	}
	sort.Float64s(ratios)
	median := (ratios[len(ratios)/2-1] + ratios[len(ratios)/2]) / 2
	r := Result{Scenario: ChainsK16Scraped, Steps: len(scraped) * runs * length, Runs: len(scraped) * runs, StepsPerSec: mean(scraped)}
	r.Seconds = float64(r.Steps) / r.StepsPerSec
	n := max(scrapes.Load(), 1)
	r.Extra = map[string]any{
		"seeded_runs": seedRuns, "seed_seconds": seed.Seconds(),
		"plain_steps_per_sec": plain, "scraped_steps_per_sec": scraped,
		"scraped_vs_plain": fmt.Sprintf("%.3f", mean(scraped)/mean(plain)),
		"pair_ratios":      ratios, "median_pair_ratio": fmt.Sprintf("%.3f", median),
		"scrapes": scrapes.Load(), "scrape_errors": scrapeErrs.Load(),
		"scrape_mean_ms": float64(scrapeTime.Load()) / float64(n) / 1e6,
	}
	return r, nil
}
