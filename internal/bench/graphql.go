package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/app"
	"github.com/composer-dev/composer/internal/pg"
)

// GraphQLRuns is the dashboard-listing scenario.
const GraphQLRuns = "graphql-runs-1m"

// runGraphQLRuns seeds a tenant with n runs (most completed, some failed
// or running, over two workflows) and measures the runs list a dashboard
// asks for, through the real HTTP endpoint and authentication: the first
// page, a filtered page and a page deep in the keyset.
func runGraphQLRuns(ctx context.Context, o Options, rep *Report, n, requests int) (Result, error) {
	o.Config.JWTHS256Secret = app.DevJWTSecret
	e, err := setupWith(ctx, o, nil, nil, true)
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	if rep.Machine.CPUs == 0 {
		rep.Machine = machine(ctx, e)
	}
	wfA, err := e.workflow(ctx, chainDef(1, noopStep))
	if err != nil {
		return Result{}, err
	}
	wfB, err := e.workflow(ctx, chainDef(2, noopStep))
	if err != nil {
		return Result{}, err
	}
	seedStart := time.Now()
	err = e.deps.DB.WithTenant(ctx, e.tenant, func(ctx context.Context, tx *pg.Tx) error {
		// Every run has a customer (1,000 runs each) in its metadata.
		_, err := tx.Exec(ctx, `INSERT INTO workflow_runs (tenant_id, id, workflow_id, workflow_version, status, input, created_at, finished_at, metadata)
			SELECT $1, composer_uuidv7(now() - make_interval(secs => ($2 - g) * 0.01)),
			       CASE WHEN g % 3 = 0 THEN $4::uuid ELSE $3::uuid END, 1,
			       CASE WHEN g % 100 = 0 THEN 'running' WHEN g % 37 = 0 THEN 'failed' ELSE 'completed' END,
			       jsonb_build_object('n', g), now(), now(), jsonb_build_object('customer', 'c' || (g % 1000))
			  FROM generate_series(1, $2) g`, e.tenant, n, wfA, wfB)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO run_metadata (tenant_id, run_id, key, value)
			SELECT tenant_id, id, 'customer', metadata->>'customer' FROM workflow_runs WHERE tenant_id = $1`, e.tenant)
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("seed runs: %w", err)
	}
	seed := time.Since(seedStart)
	// Statistics, as autovacuum would leave them (only the owner may).
	owner, err := pgx.Connect(ctx, e.cfg.MigrateDatabaseURL)
	if err != nil {
		return Result{}, err
	}
	_, err = owner.Exec(ctx, `ANALYZE workflow_runs; ANALYZE run_metadata`)
	owner.Close(ctx)
	if err != nil {
		return Result{}, err
	}
	token, err := app.DevToken(ctx, e.deps, e.tenant, "bench@composer.local", auth.RoleViewer, time.Hour)
	if err != nil {
		return Result{}, err
	}
	client := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 4}}
	ask := func(query string, vars map[string]any) (time.Duration, json.RawMessage, error) {
		body, _ := json.Marshal(map[string]any{"query": query, "variables": vars})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/graphql", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		t0 := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil, err
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(t0)
		if err != nil {
			return 0, nil, err
		}
		var out struct {
			Data   json.RawMessage
			Errors []any
		}
		if err := json.Unmarshal(data, &out); err != nil || len(out.Errors) > 0 || resp.StatusCode != 200 {
			return 0, nil, fmt.Errorf("graphql answered %d: %s", resp.StatusCode, data)
		}
		return took, out.Data, nil
	}
	const page = `query($after: String, $filter: RunFilter) { runs(first: 50, after: $after, filter: $filter) {
		edges { cursor node { id status createdAt finishedAt workflow { name } } } pageInfo { hasNextPage endCursor } } }`
	// A cursor deep in the list: 10 pages in.
	var deep string
	for i := 0; i < 10; i++ {
		_, data, err := ask(page, map[string]any{"after": nilIfEmpty(deep)})
		if err != nil {
			return Result{}, err
		}
		var p struct {
			Runs struct{ PageInfo struct{ EndCursor string } }
		}
		_ = json.Unmarshal(data, &p)
		deep = p.Runs.PageInfo.EndCursor
	}
	variants := []struct {
		name string
		vars map[string]any
	}{
		{"first_page", map[string]any{}},
		{"failed_only", map[string]any{"filter": map[string]any{"status": []string{"FAILED"}}}},
		{"page_11", map[string]any{"after": deep}},
		{"metadata_customer", map[string]any{"filter": map[string]any{"metadata": map[string]string{"customer": "c7"}}}},
		{"metadata_customer_failed", map[string]any{"filter": map[string]any{"metadata": map[string]string{"customer": "c7"}, "status": []string{"FAILED"}}}},
	}
	extra := map[string]any{"runs_in_tenant": n, "seed_seconds": seed.Seconds()}
	var firstPage []time.Duration
	for _, v := range variants {
		var lat []time.Duration
		for i := 0; i < requests; i++ {
			took, _, err := ask(page, v.vars)
			if err != nil {
				return Result{}, err
			}
			lat = append(lat, took)
		}
		extra[v.name] = percentiles(lat)
		if v.name == "first_page" {
			firstPage = lat
		}
	}
	return Result{Scenario: GraphQLRuns, Runs: n, RunLatency: percentiles(firstPage),
		Extra: map[string]any{"note": "run latency = HTTP round trip of runs(first: 50) with workflow names, first page", "variants": extra}}, nil
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}
