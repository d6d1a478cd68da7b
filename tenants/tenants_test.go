package tenants_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/tenants"
)

func TestWithTenantScopesAndCommitsHooksOnlyOnCommit(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	db := pg.New(env.App, env.System, false)
	ctx := context.Background()
	a, err := tenants.Create(ctx, db, tenants.CreateParams{Name: "a"})
	require.NoError(t, err)
	b, err := tenants.Create(ctx, db, tenants.CreateParams{Name: "b", Plan: "pro", StreamShards: 8})
	require.NoError(t, err)

	var ran []string
	err = db.WithTenant(ctx, a.ID, func(ctx context.Context, tx *pg.Tx) error {
		got, err := tenants.Get(ctx, tx)
		require.NoError(t, err)
		assert.Equal(t, a.ID, got.ID)
		var setting, user string
		require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('app.tenant_id'), current_user`).Scan(&setting, &user))
		assert.Equal(t, a.ID.String(), setting)
		assert.Equal(t, "composer_app", user)
		tx.AfterCommit(func() { ran = append(ran, "committed") })
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"committed"}, ran)

	boom := errors.New("boom")
	err = db.WithTenant(ctx, b.ID, func(ctx context.Context, tx *pg.Tx) error {
		tx.AfterCommit(func() { ran = append(ran, "must not run") })
		return boom
	})
	assert.ErrorIs(t, err, boom)
	assert.Equal(t, []string{"committed"}, ran, "hooks of a rolled-back transaction never run")

	err = db.WithTenant(ctx, uuid.Nil, func(context.Context, *pg.Tx) error { return nil })
	assert.True(t, errors.Is(err, errs.Unauthenticated), "no tenant, no transaction")

	routes, err := tenants.Routes(ctx, db, []uuid.UUID{a.ID, b.ID})
	require.NoError(t, err)
	assert.Equal(t, map[uuid.UUID]tenants.Route{a.ID: {Shards: tenants.DefaultShards, Weight: 1}, b.ID: {Shards: 8, Weight: 4}}, routes,
		"weights come from the plan (free 1, pro 4)")
}

func TestCreateValidates(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	db := pg.New(env.App, env.System, false)
	for _, p := range []tenants.CreateParams{{Name: ""}, {Name: "x", Plan: "Bad Plan"}, {Name: "x", StreamShards: 999}} {
		_, err := tenants.Create(context.Background(), db, p)
		assert.True(t, errors.Is(err, errs.Invalid), "%+v: %v", p, err)
	}
}

// TestDeadlocksAreRetried makes two transactions lock two rows in opposite
// orders; PostgreSQL kills one, and WithTenant retries it to success.
func TestDeadlocksAreRetried(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	db := pg.New(env.App, env.System, false)
	ctx := context.Background()
	tn, err := tenants.Create(ctx, db, tenants.CreateParams{Name: "a"})
	require.NoError(t, err)
	ids := [2]uuid.UUID{uuid.New(), uuid.New()}
	require.NoError(t, db.WithTenant(ctx, tn.ID, func(ctx context.Context, tx *pg.Tx) error {
		for i, id := range ids {
			if _, err := tx.Exec(ctx, `INSERT INTO workflow_definitions (tenant_id, id, name) VALUES ($1, $2, $3)`, tn.ID, id, []string{"x", "y"}[i]); err != nil {
				return err
			}
		}
		return nil
	}))
	calls := [2]int{}
	var bothLocked sync.WaitGroup
	bothLocked.Add(2)
	errc := make(chan error, 2)
	for i := 0; i < 2; i++ {
		go func() {
			errc <- db.WithTenant(ctx, tn.ID, func(ctx context.Context, tx *pg.Tx) error {
				calls[i]++
				first, second := ids[i], ids[1-i]
				if _, err := tx.Exec(ctx, `UPDATE workflow_definitions SET description = 'a' WHERE id = $1`, first); err != nil {
					return err
				}
				if calls[i] == 1 {
					bothLocked.Done()
					bothLocked.Wait() // both hold their first row: the next step deadlocks
				}
				_, err := tx.Exec(ctx, `UPDATE workflow_definitions SET description = 'b' WHERE id = $1`, second)
				return err
			})
		}()
	}
	require.NoError(t, <-errc)
	require.NoError(t, <-errc)
	assert.Equal(t, 3, calls[0]+calls[1], "one of the two was retried once")
}

// TestCreateWithProvisioningIsAtomic: what is provisioned with a tenant
// commits with it; a failure leaves no tenant behind.
func TestCreateWithProvisioningIsAtomic(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	db := pg.New(env.App, env.System, false)
	ctx := context.Background()
	_, err := tenants.Create(ctx, db, tenants.CreateParams{Name: "doomed"}, func(ctx context.Context, tx *pg.Tx) error {
		assert.NotEqual(t, uuid.Nil, tx.Tenant, "the step is scoped to the new tenant")
		return errors.New("key creation failed")
	})
	require.Error(t, err)
	var n int
	require.NoError(t, env.System.QueryRow(ctx, `SELECT count(*) FROM tenants WHERE name = 'doomed'`).Scan(&n))
	assert.Zero(t, n, "no partial tenant")
}
