package secrets_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/secrets"
	"github.com/composer-dev/composer/tenants"
)

func tx(t *testing.T, sys *apptest.System, tenant uuid.UUID, fn func(ctx context.Context, tx *pg.Tx) error) error {
	t.Helper()
	return sys.Deps.DB.WithTenant(context.Background(), tenant, fn)
}

func TestSecretsAreVersionedAuditedAndBounded(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	svc := sys.Server.Secrets
	var created secrets.Secret
	require.NoError(t, tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		created, err = svc.Create(ctx, tx, "API_TOKEN", "v1-value", "user:alice")
		return err
	}))
	assert.Equal(t, 1, created.Version)
	assert.Equal(t, "user:alice", created.CreatedBy)

	err := tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := svc.Create(ctx, tx, "API_TOKEN", "again", "user:alice")
		return err
	})
	assert.Equal(t, errs.Conflict, errs.KindOf(err))

	// Twelve more sets: the version grows, ten are kept.
	for i := 2; i <= 13; i++ {
		require.NoError(t, tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
			s, err := svc.Update(ctx, tx, "API_TOKEN", "value-"+strings.Repeat("x", i), "api_key:k1")
			assert.Equal(t, i, s.Version)
			return err
		}))
	}
	var got secrets.Secret
	require.NoError(t, tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		got, err = secrets.Get(ctx, tx, "API_TOKEN")
		return err
	}))
	assert.Equal(t, 13, got.Version)
	require.Len(t, got.Versions, secrets.KeptVersions)
	assert.Equal(t, 13, got.Versions[0].Version)
	assert.Equal(t, 4, got.Versions[9].Version)
	assert.Equal(t, "api_key:k1", got.Versions[0].CreatedBy)

	require.NoError(t, tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		return secrets.Delete(ctx, tx, "API_TOKEN", "user:bob")
	}))
	err = tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error { return secrets.Delete(ctx, tx, "API_TOKEN", "user:bob") })
	assert.Equal(t, errs.NotFound, errs.KindOf(err))
	err = tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := svc.Update(ctx, tx, "API_TOKEN", "x", "user:bob")
		return err
	})
	assert.Equal(t, errs.NotFound, errs.KindOf(err))

	// The audit log: every change, newest first, and it outlives the secret.
	var log []secrets.AuditEntry
	require.NoError(t, tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		log, err = secrets.Audit(ctx, tx, "API_TOKEN", 100, nil)
		return err
	}))
	require.Len(t, log, 14)
	assert.Equal(t, secrets.AuditEntry{ID: log[0].ID, At: log[0].At, Principal: "user:bob", Action: "delete", SecretName: "API_TOKEN", Version: 13}, log[0])
	assert.Equal(t, "update", log[1].Action)
	assert.Equal(t, secrets.AuditEntry{ID: log[13].ID, At: log[13].At, Principal: "user:alice", Action: "create", SecretName: "API_TOKEN", Version: 1}, log[13])
	var page []secrets.AuditEntry
	require.NoError(t, tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		page, err = secrets.Audit(ctx, tx, "", 5, &log[10].ID)
		return err
	}))
	require.Len(t, page, 3)
	assert.Equal(t, log[11].ID, page[0].ID)

	// A change that fails writes no audit row: it is the same transaction.
	_ = tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		if _, err := svc.Create(ctx, tx, "ROLLED_BACK", "v", "user:alice"); err != nil {
			return err
		}
		return errs.E(errs.Invalid, "abort")
	})
	require.NoError(t, tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		l, err := secrets.Audit(ctx, tx, "ROLLED_BACK", 10, nil)
		assert.Empty(t, l)
		return err
	}))

	// Bounds: names, values, count.
	for _, c := range []struct{ name, value, field string }{
		{"1BAD", "v", "name"}, {"a-b", "v", "name"}, {"", "v", "name"}, {strings.Repeat("A", 65), "v", "name"},
		{"OK", "", "value"}, {"OK", strings.Repeat("v", secrets.MaxValueBytes+1), "value"}, {"OK", "a\x00b", "value"}, {"OK", "\xff", "value"},
	} {
		err := tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
			_, err := svc.Create(ctx, tx, c.name, c.value, "user:alice")
			return err
		})
		require.Equal(t, errs.Invalid, errs.KindOf(err), c.name)
		var e *errs.Error
		require.ErrorAs(t, err, &e)
		require.Len(t, e.Fields, 1)
		assert.Equal(t, c.field, e.Fields[0].Field)
		if c.value != "" && c.value != "v" {
			assert.NotContains(t, err.Error(), c.value, "the message never repeats the value")
		}
	}
	require.NoError(t, tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := svc.Create(ctx, tx, "BIG", strings.Repeat("v", secrets.MaxValueBytes), "user:alice")
		return err
	}))
	var n int
	require.NoError(t, tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		l, err := secrets.List(ctx, tx)
		n = len(l)
		return err
	}))
	for ; n < secrets.MaxSecrets; n++ {
		require.NoError(t, tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
			_, err := svc.Create(ctx, tx, "FILL_"+strings.ReplaceAll(uuid.NewString(), "-", "_"), "v", "user:alice")
			return err
		}))
	}
	err = tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := svc.Create(ctx, tx, "ONE_TOO_MANY", "v", "user:alice")
		return err
	})
	assert.Equal(t, errs.QuotaExceeded, errs.KindOf(err))
}

func TestSealedValuesAreNeitherReadableByTheAppNorVisibleToOtherTenants(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	svc := sys.Server.Secrets
	b, err := tenants.Create(context.Background(), sys.Deps.DB, tenants.CreateParams{Name: "b"})
	require.NoError(t, err)
	require.NoError(t, tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := svc.Create(ctx, tx, "SHARED_NAME", "tenant-a-value-123", "user:a")
		return err
	}))
	// The same name in B is another secret.
	require.NoError(t, tx(t, sys, b.ID, func(ctx context.Context, tx *pg.Tx) error {
		l, err := secrets.List(ctx, tx)
		assert.Empty(t, l, "B lists none of A's secrets")
		_, err2 := secrets.Get(ctx, tx, "SHARED_NAME")
		assert.Equal(t, errs.NotFound, errs.KindOf(err2))
		assert.Equal(t, errs.NotFound, errs.KindOf(secrets.Delete(ctx, tx, "SHARED_NAME", "user:b")))
		_, err3 := svc.Update(ctx, tx, "SHARED_NAME", "b-overwrites", "user:b")
		assert.Equal(t, errs.NotFound, errs.KindOf(err3))
		a, err4 := secrets.Audit(ctx, tx, "", 100, nil)
		assert.Empty(t, a, "B reads none of A's audit rows")
		if err4 != nil {
			return err4
		}
		_, err = svc.Create(ctx, tx, "SHARED_NAME", "tenant-b-value-456", "user:b")
		return err
	}))
	// The app role cannot read sealed bytes at all.
	err = tx(t, sys, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		var x []byte
		return tx.QueryRow(ctx, `SELECT sealed FROM secret_versions LIMIT 1`).Scan(&x)
	})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "42501", pgErr.Code, "permission denied")
	// The sealed value is ciphertext, and opens only as its own row.
	rows, err := sys.Env.System.Query(context.Background(), `SELECT tenant_id, secret_id, id, sealed FROM secret_versions`)
	require.NoError(t, err)
	type row struct {
		tenant, secret, id uuid.UUID
		sealed             []byte
	}
	var all []row
	for rows.Next() {
		var r row
		require.NoError(t, rows.Scan(&r.tenant, &r.secret, &r.id, &r.sealed))
		all = append(all, r)
	}
	require.NoError(t, rows.Err())
	require.Len(t, all, 2)
	for _, r := range all {
		assert.NotContains(t, string(r.sealed), "value")
		_, err := svc.Keys.Open(r.sealed, r.tenant, r.secret, r.id)
		require.NoError(t, err)
		other := all[0]
		if other.id == r.id {
			other = all[1]
		}
		_, err = svc.Keys.Open(r.sealed, other.tenant, other.secret, other.id)
		require.Error(t, err, "moved to another tenant's row")
	}
}
