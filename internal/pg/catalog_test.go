package pg_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/testenv"
)

// The catalog tests keep the schema distributable by tenant_id (see
// docs/SCALING.md): on a PostgreSQL sharded by tenant_id (Citus) a tenant's
// rows live in one shard group, so a unique index or primary key can only be
// enforced if it contains the distribution column, and a foreign key only
// between co-located tables that map tenant_id to tenant_id. Composer's
// convention is stronger than Citus's rule: tenant_id leads every such key,
// which also makes it the prefix every tenant-scoped query already uses.
//
// Row-level security (ENABLE, FORCE, a fail-closed policy on every table
// with a tenant_id, partitions included) is checked by
// migrations.TestEveryTenantTableIsProtected and not repeated here.

// globalUniqueIndexes are the unique indexes of tenant tables that are global
// on purpose, each with its reason. One is excused only on a table that
// referenceTenantTables places as a reference table, where a unique index
// holds whole on every node. Every entry must still exist and still be
// global, or the test fails: the list cannot outlive its reasons.
var globalUniqueIndexes = map[string]string{
	// A presented API key names its key id, not its tenant: the lookup
	// (composer_api_key_lookup) finds one row by key id alone, so the key id
	// is unique across tenants.
	"api_keys_key_id_lookup": "a presented API key names its key id, not its tenant",
}

// referenceTenantTables are the tables with a tenant_id that are replicated
// to every node as reference tables rather than distributed by tenant_id
// (docs/SCALING.md, "Where every table lives"), with the reason.
var referenceTenantTables = map[string]string{
	"api_keys": "its key id is unique across tenants (api_keys_key_id_lookup); small, written rarely",
}

// nonTenantTables are the tables without a tenant_id column and where each
// one lives on a distributed PostgreSQL (docs/SCALING.md, "Where every table
// lives"). A new table without tenant_id fails the test until it is placed.
var nonTenantTables = map[string]string{
	"tenants":            "reference", // read by every tenant's statements (composer_tenant_limit), written rarely
	"plans":              "reference",
	"plan_prices":        "reference",
	"usage_rollup_state": "coordinator", // the rollup's one-row mutex
	"run_rollup_state":   "coordinator", // the dashboard statistics fold's watermark
	"goose_db_version":   "coordinator", // the migration tool's own bookkeeping
}

// catalog is what the checks read from pg_catalog.
type catalog struct {
	tenantTables map[string]bool // tables with a tenant_id column, partitions included
	otherTables  []string        // the rest (not partitions)
	keys         []uniqueKey
	fkeys        []foreignKey
}

type uniqueKey struct {
	table, index, constraint, first, def string
}

type foreignKey struct {
	table, name, referenced string
	// cols and refCols are the key's columns on each side, in order.
	cols, refCols []string
	def           string
}

// readCatalog reads the public schema. Partitions' indexes attached to a
// partitioned index and foreign keys cloned from a parent's are the
// parent's and are checked there; anything a partition has of its own is
// checked like a table's.
func readCatalog(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) (*catalog, error) {
	c := &catalog{tenantTables: map[string]bool{}}
	rows, err := q.Query(ctx, `
		SELECT c.relname, c.relispartition,
		       EXISTS (SELECT 1 FROM pg_attribute a
		                WHERE a.attrelid = c.oid AND a.attname = 'tenant_id' AND a.attnum > 0 AND NOT a.attisdropped)
		  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		 WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
		 ORDER BY c.relname`)
	if err != nil {
		return nil, err
	}
	var name string
	var partition, tenant bool
	if _, err := pgx.ForEachRow(rows, []any{&name, &partition, &tenant}, func() error {
		switch {
		case tenant:
			c.tenantTables[name] = true
		case !partition:
			c.otherTables = append(c.otherTables, name)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("tables: %w", err)
	}

	// Every index that enforces uniqueness or exclusion (primary keys,
	// unique constraints, unique indexes, partial ones included), with the
	// column it leads with ('' for an expression).
	rows, err = q.Query(ctx, `
		SELECT t.relname, i.relname, coalesce(con.conname, ''), coalesce(a.attname, ''), pg_get_indexdef(x.indexrelid)
		  FROM pg_index x
		  JOIN pg_class t ON t.oid = x.indrelid
		  JOIN pg_namespace n ON n.oid = t.relnamespace
		  JOIN pg_class i ON i.oid = x.indexrelid
		  LEFT JOIN pg_constraint con ON con.conindid = x.indexrelid AND con.conrelid = t.oid AND con.contype IN ('p', 'u', 'x')
		  LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = x.indkey[0] AND x.indkey[0] > 0
		 WHERE n.nspname = 'public' AND t.relkind IN ('r', 'p')
		   AND (x.indisunique OR x.indisexclusion)
		   AND NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = x.indexrelid)
		 ORDER BY t.relname, i.relname`)
	if err != nil {
		return nil, err
	}
	var k uniqueKey
	if _, err := pgx.ForEachRow(rows, []any{&k.table, &k.index, &k.constraint, &k.first, &k.def}, func() error {
		c.keys = append(c.keys, k)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("unique indexes: %w", err)
	}

	// Every foreign key declared on a table (not cloned from a parent's),
	// with its columns on both sides in key order.
	rows, err = q.Query(ctx, `
		SELECT t.relname, con.conname, r.relname,
		       ARRAY(SELECT a.attname::text FROM unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord)
		               JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum ORDER BY k.ord),
		       ARRAY(SELECT a.attname::text FROM unnest(con.confkey) WITH ORDINALITY AS k(attnum, ord)
		               JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.attnum ORDER BY k.ord),
		       pg_get_constraintdef(con.oid)
		  FROM pg_constraint con
		  JOIN pg_class t ON t.oid = con.conrelid
		  JOIN pg_namespace n ON n.oid = t.relnamespace
		  JOIN pg_class r ON r.oid = con.confrelid
		 WHERE n.nspname = 'public' AND con.contype = 'f' AND con.conparentid = 0
		 ORDER BY t.relname, con.conname`)
	if err != nil {
		return nil, err
	}
	var f foreignKey
	if _, err := pgx.ForEachRow(rows, []any{&f.table, &f.name, &f.referenced, &f.cols, &f.refCols, &f.def}, func() error {
		c.fkeys = append(c.fkeys, f)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("foreign keys: %w", err)
	}
	return c, nil
}

// placement is where docs/SCALING.md puts the tables the rules do not
// cover by themselves.
type placement struct {
	global    map[string]string // globalUniqueIndexes
	reference map[string]string // referenceTenantTables
	others    map[string]string // nonTenantTables
}

var documented = placement{global: globalUniqueIndexes, reference: referenceTenantTables, others: nonTenantTables}

// violations applies the rules and returns one message per offending
// index, constraint or table, each naming it and saying why, and the
// global unique indexes that were excused (so a stale entry shows).
func (c *catalog) violations(p placement) (found []string, excused map[string]bool) {
	excused = map[string]bool{}
	for _, k := range c.keys {
		if !c.tenantTables[k.table] || k.first == "tenant_id" {
			continue
		}
		if _, ok := p.global[k.index]; ok {
			if _, ok := p.reference[k.table]; ok {
				excused[k.index] = true
				continue
			}
			found = append(found, fmt.Sprintf("%s: unique index %s is listed as global, but %s is not a reference table (referenceTenantTables)",
				k.table, k.index, k.table))
			continue
		}
		what := "unique index " + k.index
		if k.constraint != "" {
			what = fmt.Sprintf("constraint %s (index %s)", k.constraint, k.index)
		}
		lead := k.first
		if lead == "" {
			lead = "an expression"
		}
		found = append(found, fmt.Sprintf("%s: %s leads with %s, not tenant_id: sharded by tenant_id it could not be enforced across shards [%s]",
			k.table, what, lead, k.def))
	}
	for _, f := range c.fkeys {
		from, to := c.tenantTables[f.table], c.tenantTables[f.referenced]
		first := func(cols []string) string {
			if len(cols) == 0 {
				return ""
			}
			return cols[0]
		}
		switch {
		case from && f.referenced == "tenants":
			if len(f.cols) != 1 || f.cols[0] != "tenant_id" || f.refCols[0] != "id" {
				found = append(found, fmt.Sprintf("%s: foreign key %s references tenants by (%s), not (tenant_id) -> tenants (id) [%s]",
					f.table, f.name, strings.Join(f.cols, ", "), f.def))
			}
		case from && to && p.reference[f.table] != "" && p.reference[f.referenced] == "":
			found = append(found, fmt.Sprintf("%s: foreign key %s references %s, but %s is a reference table and %s is distributed: "+
				"a reference table cannot reference a distributed table [%s]", f.table, f.name, f.referenced, f.table, f.referenced, f.def))
		case from && to:
			if first(f.cols) != "tenant_id" || first(f.refCols) != "tenant_id" {
				found = append(found, fmt.Sprintf("%s: foreign key %s to %s maps (%s) to (%s), not leading tenant_id to tenant_id: "+
					"sharded by tenant_id the two rows could live on different shards [%s]",
					f.table, f.name, f.referenced, strings.Join(f.cols, ", "), strings.Join(f.refCols, ", "), f.def))
			}
		case from:
			if p.others[f.referenced] != "reference" {
				found = append(found, fmt.Sprintf("%s: foreign key %s references %s, which has no tenant_id and is not a reference table: "+
					"a distributed table can only reference co-located or reference tables [%s]", f.table, f.name, f.referenced, f.def))
			}
		case to:
			found = append(found, fmt.Sprintf("%s: foreign key %s references tenant table %s from a table without tenant_id: "+
				"reference and coordinator-local tables cannot reference a distributed table [%s]", f.table, f.name, f.referenced, f.def))
		}
	}
	for _, t := range c.otherTables {
		if _, ok := p.others[t]; !ok {
			found = append(found, fmt.Sprintf("%s: a table without tenant_id that docs/SCALING.md does not place: "+
				"give it a tenant_id, or say where it lives (reference or coordinator) there and in nonTenantTables", t))
		}
	}
	for t := range c.tenantTables {
		if _, ok := p.others[t]; ok {
			found = append(found, fmt.Sprintf("%s: has a tenant_id column but nonTenantTables places it as %s", t, p.others[t]))
		}
	}
	for t := range p.reference {
		if !c.tenantTables[t] {
			found = append(found, fmt.Sprintf("%s: referenceTenantTables lists it, but no table %s with a tenant_id exists", t, t))
		}
	}
	return found, excused
}

// TestCatalogTenantKeysLeadWithTenantID: after the migrations, every
// primary key and unique index of a tenant table leads with tenant_id,
// every foreign key between tenant tables maps tenant_id to tenant_id
// first, foreign keys to tenants are (tenant_id) -> tenants (id), and every
// other table is placed (reference or coordinator) as docs/SCALING.md says.
func TestCatalogTenantKeysLeadWithTenantID(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	ctx := context.Background()
	c, err := readCatalog(ctx, env.Owner(t))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(c.tenantTables), 19, "the tenant tables should be found")
	require.NotEmpty(t, c.keys)
	require.NotEmpty(t, c.fkeys)

	found, excused := c.violations(documented)
	for _, v := range found {
		t.Error(v)
	}
	for name, why := range globalUniqueIndexes {
		assert.True(t, excused[name], "globalUniqueIndexes lists %s (%s), but no tenant table has such a global unique index any more: remove the entry (and its paragraph in docs/SCALING.md)", name, why)
	}
	placedTables := map[string]bool{}
	for _, name := range c.otherTables {
		placedTables[name] = true
	}
	for name := range nonTenantTables {
		assert.True(t, placedTables[name], "nonTenantTables places %s, which no longer exists (or now has a tenant_id)", name)
	}

	// The partitioned run tables are checked through their parents; their
	// partitions must exist and carry the parents' keys.
	var parts int
	require.NoError(t, env.Owner(t).QueryRow(ctx, `
		SELECT count(*) FROM pg_inherits h JOIN pg_class p ON p.oid = h.inhparent
		 WHERE p.relname IN ('workflow_runs', 'task_instances', 'run_signals', 'run_events') AND p.relkind = 'p'`).Scan(&parts))
	assert.Positive(t, parts, "the run tables should have partitions")
}

// TestCatalogCheckNamesTheOffenders: the check fails on a schema that breaks
// each rule, naming the offending index, constraint or table.
func TestCatalogCheckNamesTheOffenders(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	ctx := context.Background()
	owner := env.Owner(t)
	for _, ddl := range []string{
		`CREATE TABLE bad_parent (tenant_id uuid NOT NULL, id uuid NOT NULL, code text NOT NULL,
			PRIMARY KEY (tenant_id, id), CONSTRAINT bad_parent_code_key UNIQUE (code), UNIQUE (id, tenant_id))`,
		`CREATE UNIQUE INDEX bad_parent_lower_code ON bad_parent (lower(code))`,
		`CREATE TABLE bad_child (tenant_id uuid NOT NULL, id uuid NOT NULL, parent_id uuid NOT NULL, parent_code text,
			owner_id uuid REFERENCES tenants (id),
			PRIMARY KEY (tenant_id, id),
			CONSTRAINT bad_child_parent_fkey FOREIGN KEY (parent_id, tenant_id) REFERENCES bad_parent (id, tenant_id),
			CONSTRAINT bad_child_code_fkey FOREIGN KEY (parent_code) REFERENCES bad_parent (code))`,
		`CREATE TABLE bad_global (id uuid PRIMARY KEY, parent_id uuid NOT NULL, tenant_ref uuid NOT NULL,
			CONSTRAINT bad_global_parent_fkey FOREIGN KEY (tenant_ref, parent_id) REFERENCES bad_parent (tenant_id, id))`,
		// A partitioned tenant table: the parent's keys are checked; a
		// partition's own unique index is checked too.
		`CREATE TABLE bad_parted (tenant_id uuid NOT NULL, id uuid NOT NULL, PRIMARY KEY (id, tenant_id)) PARTITION BY RANGE (id)`,
		`CREATE TABLE bad_parted_1 PARTITION OF bad_parted FOR VALUES FROM (MINVALUE) TO (MAXVALUE)`,
		`CREATE UNIQUE INDEX bad_parted_1_own ON bad_parted_1 (id)`,
		// A reference table (api_keys) referencing a distributed one.
		`ALTER TABLE api_keys ADD CONSTRAINT api_keys_parent_fkey FOREIGN KEY (tenant_id, id) REFERENCES bad_parent (tenant_id, id)`,
		// A global unique index excused on a table that is not a reference table.
		`CREATE UNIQUE INDEX bad_child_global_lookup ON bad_child (id)`,
	} {
		_, err := owner.Exec(ctx, ddl)
		require.NoError(t, err, ddl)
	}
	c, err := readCatalog(ctx, owner)
	require.NoError(t, err)
	p := documented
	p.global = map[string]string{"bad_child_global_lookup": "a test", "api_keys_key_id_lookup": globalUniqueIndexes["api_keys_key_id_lookup"]}
	found, excused := c.violations(p)
	assert.Equal(t, map[string]bool{"api_keys_key_id_lookup": true}, excused)
	all := strings.Join(found, "\n")
	for _, want := range []string{
		"bad_parent: constraint bad_parent_code_key (index bad_parent_code_key) leads with code",
		"bad_parent: constraint bad_parent_id_tenant_id_key",
		"bad_parent: unique index bad_parent_lower_code leads with an expression",
		"bad_child: foreign key bad_child_parent_fkey to bad_parent maps (parent_id, tenant_id) to (id, tenant_id)",
		"bad_child: foreign key bad_child_owner_id_fkey references tenants by (owner_id)",
		"bad_child: foreign key bad_child_code_fkey to bad_parent maps (parent_code) to (code)",
		"bad_global: foreign key bad_global_parent_fkey references tenant table bad_parent from a table without tenant_id",
		"bad_global: a table without tenant_id that docs/SCALING.md does not place",
		"bad_parted: constraint bad_parted_pkey",
		"bad_parted_1: unique index bad_parted_1_own leads with id",
		"api_keys: foreign key api_keys_parent_fkey references bad_parent, but api_keys is a reference table and bad_parent is distributed",
		"bad_child: unique index bad_child_global_lookup is listed as global, but bad_child is not a reference table",
	} {
		assert.Contains(t, all, want)
	}
	// The partition's copy of the parent's primary key is the parent's
	// (reported once, on the parent), and the real schema adds nothing.
	assert.NotContains(t, all, "bad_parted_1: constraint bad_parted_1_pkey")
	sort.Strings(found)
	assert.Len(t, found, 12, "exactly the offenders above:\n%s", strings.Join(found, "\n"))
}
