package migrations_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/migrations"
)

// TestEveryTenantTableIsProtected reads the catalog: every table with a
// tenant_id column (partitions included) must have ENABLE and FORCE row
// level security and a policy; its primary key and every index must lead
// with tenant_id, except indexes named *_sweep that serve the system
// role's cross-tenant loops and *_lookup ones that resolve a credential to
// its tenant (the API key id). A new table that forgets any of this fails here.
func TestEveryTenantTableIsProtected(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	ctx := context.Background()
	owner := env.Owner(t)

	rows, err := owner.Query(ctx, `
		SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,
		       (SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid)
		  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		 WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
		   AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped)`)
	require.NoError(t, err)
	type table struct {
		name            string
		enabled, forced bool
		policies        int
	}
	var tables []table
	var tb table
	_, err = pgx.ForEachRow(rows, []any{&tb.name, &tb.enabled, &tb.forced, &tb.policies}, func() error { tables = append(tables, tb); return nil })
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(tables), 10, "the core tables should be found")
	for _, tb := range tables {
		assert.True(t, tb.enabled, "%s: row level security not enabled", tb.name)
		assert.True(t, tb.forced, "%s: row level security not forced", tb.name)
		assert.Positive(t, tb.policies, "%s: no policy", tb.name)
	}

	// Every policy fails closed on the transaction-local tenant setting.
	prow, err := owner.Query(ctx, `SELECT tablename, qual FROM pg_policies WHERE schemaname = 'public'`)
	require.NoError(t, err)
	var pname, qual string
	_, err = pgx.ForEachRow(prow, []any{&pname, &qual}, func() error {
		assert.Contains(t, qual, "NULLIF(current_setting('app.tenant_id'::text, true), ''::text)", "policy on %s", pname)
		return nil
	})
	require.NoError(t, err)

	irows, err := owner.Query(ctx, `
		SELECT c.relname, coalesce(pg_partition_root(x.indexrelid), x.indexrelid)::regclass::text, a.attname
		  FROM pg_index x
		  JOIN pg_class c ON c.oid = x.indrelid
		  JOIN pg_class i ON i.oid = x.indexrelid
		  JOIN pg_namespace n ON n.oid = c.relnamespace
		  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = x.indkey[0]
		 WHERE n.nspname = 'public'
		   AND EXISTS (SELECT 1 FROM pg_attribute t WHERE t.attrelid = c.oid AND t.attname = 'tenant_id')`)
	require.NoError(t, err)
	var tname, iname, first string
	_, err = pgx.ForEachRow(irows, []any{&tname, &iname, &first}, func() error {
		if !strings.Contains(iname, "_sweep") && !strings.Contains(iname, "_lookup") {
			assert.Equal(t, "tenant_id", first, "index %s on %s must lead with tenant_id", iname, tname)
		}
		return nil
	})
	require.NoError(t, err)
}

// TestRowLevelSecurityScopesEveryQuery checks the policies from the app
// role's side: a tenant sees only its rows, no tenant sees nothing, rows
// for another tenant cannot be written, and partitions cannot be read
// directly.
func TestRowLevelSecurityScopesEveryQuery(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	ctx := context.Background()
	a, b := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	seed(t, env, a, 3)
	seed(t, env, b, 2)

	count := func(tenant *uuid.UUID, query string) (int, error) {
		tx, err := env.App.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		if tenant != nil {
			_, err := tx.Exec(ctx, "SELECT set_config('app.tenant_id', $1, true)", tenant.String())
			require.NoError(t, err)
		}
		var n int
		err = tx.QueryRow(ctx, query).Scan(&n)
		return n, err
	}
	n, err := count(&a, `SELECT count(*) FROM (SELECT * FROM workflow_runs) r`)
	require.NoError(t, err)
	assert.Equal(t, 3, n, "tenant A sees its own runs only")
	n, err = count(&a, `SELECT count(*) FROM workflow_runs WHERE tenant_id <> NULLIF(current_setting('app.tenant_id', true), '')::uuid`)
	require.NoError(t, err)
	assert.Zero(t, n)
	n, err = count(&b, `SELECT count(*) FROM workflow_runs`)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	for _, table := range []string{"workflow_runs", "workflow_definitions", "workflow_versions", "tenants", "task_instances", "run_events", "timers"} {
		n, err = count(nil, `SELECT count(*) FROM `+table)
		require.NoError(t, err, table)
		assert.Zero(t, n, "without a tenant, %s shows nothing", table)
	}
	n, err = count(&a, `SELECT count(*) FROM tenants`)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "a tenant sees only itself")

	// Writing a row for another tenant is rejected by the policy.
	tx, err := env.App.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT set_config('app.tenant_id', $1, true)", a.String())
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO workflow_definitions (tenant_id, id, name) VALUES ($1, $2, 'sneaky')`, b, uuid.New())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "row-level security")
	require.NoError(t, tx.Rollback(ctx))

	// A session-level leak is impossible: the setting is transaction-local.
	conn, err := env.App.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	tx, err = conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT set_config('app.tenant_id', $1, true)", a.String())
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM workflow_runs`).Scan(&n))
	assert.Zero(t, n, "the next use of a pooled connection carries no tenant")

	// Partitions are not reachable directly by the app role.
	var part string
	require.NoError(t, env.Owner(t).QueryRow(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'workflow_runs' LIMIT 1`).Scan(&part))
	_, err = count(&a, `SELECT count(*) FROM `+part)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "permission denied")
}

// seed creates a tenant with one workflow and n runs, as the owner.
func seed(t *testing.T, env *testenv.Env, tenant uuid.UUID, n int) {
	ctx := context.Background()
	owner := env.Owner(t)
	_, err := owner.Exec(ctx, `ALTER TABLE tenants NO FORCE ROW LEVEL SECURITY`)
	require.NoError(t, err)
	// The owner is bound by FORCE RLS too; seed each row under its tenant.
	tx, err := owner.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, "SELECT set_config('app.tenant_id', $1, true)", tenant.String())
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO tenants (id, name) VALUES ($1, 't')`, tenant)
	require.NoError(t, err)
	wf := uuid.Must(uuid.NewV7())
	_, err = tx.Exec(ctx, `INSERT INTO workflow_definitions (tenant_id, id, name, latest_version) VALUES ($1, $2, 'wf', 1)`, tenant, wf)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO workflow_versions (tenant_id, workflow_id, version, definition) VALUES ($1, $2, 1, '{}')`, tenant, wf)
	require.NoError(t, err)
	for i := 0; i < n; i++ {
		_, err = tx.Exec(ctx, `INSERT INTO workflow_runs (tenant_id, id, workflow_id, workflow_version, status) VALUES ($1, $2, $3, 1, 'running')`,
			tenant, uuid.Must(uuid.NewV7()), wf)
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit(ctx))
	_, err = owner.Exec(ctx, `ALTER TABLE tenants FORCE ROW LEVEL SECURITY`)
	require.NoError(t, err)
}

// TestVersionsAreImmutable checks the trigger and the grants.
func TestVersionsAreImmutable(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	ctx := context.Background()
	a := uuid.Must(uuid.NewV7())
	seed(t, env, a, 0)
	tx, err := env.App.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, "SELECT set_config('app.tenant_id', $1, true)", a.String())
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE workflow_versions SET definition = '{"x":1}'`)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "permission denied")
}

// TestPartitionMaintenance creates partitions ahead and drops whole old
// months, children before parents.
func TestPartitionMaintenance(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	ctx := context.Background()
	var made int
	require.NoError(t, env.System.QueryRow(ctx, `SELECT composer_ensure_partitions(6)`).Scan(&made))
	assert.Equal(t, 5*3, made, "three more months for each of the five tables")
	require.NoError(t, env.System.QueryRow(ctx, `SELECT composer_ensure_partitions(6)`).Scan(&made))
	assert.Zero(t, made, "idempotent")

	owner := env.Owner(t)
	// A partition of an old month, with data, as retention would find it.
	for _, tbl := range []string{"workflow_runs", "task_instances", "run_signals", "run_events", "run_metadata"} {
		var ddl string
		require.NoError(t, owner.QueryRow(ctx, `SELECT format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)', $1::text || '_202001', $1::text,
			composer_uuid_floor('2020-01-01Z'), composer_uuid_floor('2020-02-01Z'))`, tbl).Scan(&ddl))
		_, err := owner.Exec(ctx, ddl)
		require.NoError(t, err)
	}
	var dropped int
	require.NoError(t, env.System.QueryRow(ctx, `SELECT composer_drop_partitions(3)`).Scan(&dropped))
	assert.Equal(t, 5, dropped)
	var left int
	require.NoError(t, owner.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname LIKE '%\_202001'`).Scan(&left))
	assert.Zero(t, left)

	_, err := env.App.Exec(ctx, `SELECT composer_drop_partitions(1)`)
	assert.ErrorContains(t, err, "permission denied", "the app role cannot drop data")
}

// TestStatusListsEveryMigrationApplied: on a migrated database every
// embedded migration is applied, in order, up to Latest; on an empty one
// every migration is pending, and reading the status changes nothing.
func TestStatusListsEveryMigrationApplied(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	ctx := context.Background()
	db, err := sql.Open("pgx", env.OwnerURL)
	require.NoError(t, err)
	defer db.Close()
	st, err := migrations.Status(ctx, db)
	require.NoError(t, err)
	entries, err := migrations.FS().ReadDir(".")
	require.NoError(t, err)
	sqlFiles := 0
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".sql") {
			sqlFiles++
		}
	}
	require.Len(t, st, sqlFiles)
	for i, m := range st {
		assert.Equal(t, goose.StateApplied, m.State, m.Source.Path)
		if i > 0 {
			assert.Less(t, st[i-1].Source.Version, m.Source.Version)
		}
	}
	assert.Equal(t, migrations.Latest(), st[len(st)-1].Source.Version)

	// An empty database: all pending (goose's own table is created by the read).
	admin, err := sql.Open("pgx", strings.Replace(env.OwnerURL, "/"+env.DBName, "/postgres", 1))
	require.NoError(t, err)
	defer admin.Close()
	empty := "status_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	_, err = admin.ExecContext(ctx, "CREATE DATABASE "+empty)
	require.NoError(t, err)
	defer admin.ExecContext(context.Background(), "DROP DATABASE "+empty) //nolint:errcheck
	edb, err := sql.Open("pgx", strings.Replace(env.OwnerURL, "/"+env.DBName, "/"+empty, 1))
	require.NoError(t, err)
	defer edb.Close()
	st, err = migrations.Status(ctx, edb)
	require.NoError(t, err)
	require.Len(t, st, sqlFiles)
	for _, m := range st {
		assert.Equal(t, goose.StatePending, m.State)
	}
}
