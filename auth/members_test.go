package auth_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

func TestMembersAddGetListChangeRemove(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	m := auth.Members{}
	do := func(fn func(ctx context.Context, tx *pg.Tx) error) error { return f.db.WithTenant(ctx, f.a, fn) }

	require.NoError(t, do(func(ctx context.Context, tx *pg.Tx) error {
		added, err := m.Add(ctx, tx, "alice", auth.RoleOwner, "alice@example.test")
		assert.Equal(t, "alice@example.test", added.Email)
		return err
	}))
	f.member(t, f.a, "bob", auth.RoleViewer)

	err := do(func(ctx context.Context, tx *pg.Tx) error {
		_, err := m.Add(ctx, tx, "bob", auth.RoleAdmin, "")
		return err
	})
	assert.Equal(t, errs.Conflict, errs.KindOf(err), "adding a member twice")
	for name, add := range map[string]func(ctx context.Context, tx *pg.Tx) error{
		"unknown role": func(ctx context.Context, tx *pg.Tx) error { _, err := m.Add(ctx, tx, "c", "root", ""); return err },
		"empty subject": func(ctx context.Context, tx *pg.Tx) error {
			_, err := m.Add(ctx, tx, "", auth.RoleViewer, "")
			return err
		},
		"bad email": func(ctx context.Context, tx *pg.Tx) error {
			_, err := m.Add(ctx, tx, "c", auth.RoleViewer, "nope")
			return err
		},
	} {
		assert.Equal(t, errs.Invalid, errs.KindOf(do(add)), name)
	}

	require.NoError(t, do(func(ctx context.Context, tx *pg.Tx) error {
		changed, err := m.ChangeRole(ctx, tx, "bob", auth.RoleDeveloper)
		assert.Equal(t, auth.RoleDeveloper, changed.Role)
		return err
	}))
	require.NoError(t, do(func(ctx context.Context, tx *pg.Tx) error {
		got, err := m.Get(ctx, tx, "bob")
		assert.Equal(t, auth.RoleDeveloper, got.Role)
		return err
	}))
	require.NoError(t, do(func(ctx context.Context, tx *pg.Tx) error {
		list, err := m.List(ctx, tx)
		require.Len(t, list, 2)
		assert.Equal(t, "alice", list[0].Subject)
		assert.Equal(t, "bob", list[1].Subject)
		return err
	}))
	require.NoError(t, do(func(ctx context.Context, tx *pg.Tx) error { return m.Remove(ctx, tx, "bob") }))

	for name, op := range map[string]func(ctx context.Context, tx *pg.Tx) error{
		"get": func(ctx context.Context, tx *pg.Tx) error { _, err := m.Get(ctx, tx, "bob"); return err },
		"change": func(ctx context.Context, tx *pg.Tx) error {
			_, err := m.ChangeRole(ctx, tx, "bob", auth.RoleViewer)
			return err
		},
		"remove": func(ctx context.Context, tx *pg.Tx) error { return m.Remove(ctx, tx, "bob") },
	} {
		assert.Equal(t, errs.NotFound, errs.KindOf(do(op)), "%s of a removed member", name)
	}
	// Another tenant does not see tenant A's members.
	require.NoError(t, f.db.WithTenant(ctx, f.b, func(ctx context.Context, tx *pg.Tx) error {
		_, err := m.Get(ctx, tx, "alice")
		assert.Equal(t, errs.NotFound, errs.KindOf(err))
		list, err := m.List(ctx, tx)
		assert.Empty(t, list)
		return err
	}))
}

func TestLastOwnerIsProtected(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	m := auth.Members{}
	f.member(t, f.a, "olivia", auth.RoleOwner)
	f.member(t, f.a, "vic", auth.RoleViewer)
	do := func(fn func(ctx context.Context, tx *pg.Tx) error) error { return f.db.WithTenant(ctx, f.a, fn) }
	demote := func(subject string) error {
		return do(func(ctx context.Context, tx *pg.Tx) error {
			_, err := m.ChangeRole(ctx, tx, subject, auth.RoleAdmin)
			return err
		})
	}
	remove := func(subject string) error {
		return do(func(ctx context.Context, tx *pg.Tx) error { return m.Remove(ctx, tx, subject) })
	}

	assert.Equal(t, errs.Conflict, errs.KindOf(demote("olivia")), "demoting the only owner")
	assert.Equal(t, errs.Conflict, errs.KindOf(remove("olivia")), "removing the only owner")
	require.NoError(t, do(func(ctx context.Context, tx *pg.Tx) error {
		_, err := m.ChangeRole(ctx, tx, "olivia", auth.RoleOwner)
		return err
	}), "confirming the owner's role is no demotion")
	require.NoError(t, remove("vic"), "other members come and go")

	f.member(t, f.a, "oscar", auth.RoleOwner)
	require.NoError(t, demote("olivia"), "with a second owner, the first may step down")
	assert.Equal(t, errs.Conflict, errs.KindOf(remove("oscar")), "oscar is now the last owner")
	require.NoError(t, remove("olivia"))
	require.NoError(t, do(func(ctx context.Context, tx *pg.Tx) error {
		got, err := m.Get(ctx, tx, "oscar")
		assert.Equal(t, auth.RoleOwner, got.Role)
		return err
	}))
}

// TestConcurrentOwnerRemovalsKeepAnOwner removes two owners at once, one
// per transaction: the row locks make exactly one of them win every time.
func TestConcurrentOwnerRemovalsKeepAnOwner(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	m := auth.Members{}
	for round := range 8 {
		f.member(t, f.a, "o1", auth.RoleOwner)
		f.member(t, f.a, "o2", auth.RoleOwner)
		start := make(chan struct{})
		results := make([]error, 2)
		var wg sync.WaitGroup
		for i, subject := range []string{"o1", "o2"} {
			wg.Go(func() {
				<-start
				results[i] = f.db.WithTenant(ctx, f.a, func(ctx context.Context, tx *pg.Tx) error {
					if round%2 == 0 {
						return m.Remove(ctx, tx, subject)
					}
					_, err := m.ChangeRole(ctx, tx, subject, auth.RoleViewer)
					return err
				})
			})
		}
		close(start)
		wg.Wait()
		var won, refused int
		for _, err := range results {
			switch {
			case err == nil:
				won++
			case errs.KindOf(err) == errs.Conflict:
				refused++
			default:
				t.Fatalf("round %d: unexpected error %v", round, err)
			}
		}
		assert.Equal(t, 1, won, "round %d", round)
		assert.Equal(t, 1, refused, "round %d", round)
		var owners []string
		f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error {
			list, err := m.List(ctx, tx)
			for _, x := range list {
				if x.Role == auth.RoleOwner {
					owners = append(owners, x.Subject)
				}
			}
			return err
		})
		require.Len(t, owners, 1, "round %d: exactly one owner is left", round)
		// Reset for the next round.
		f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error {
			_, err := tx.Exec(ctx, `DELETE FROM memberships`)
			return err
		})
	}
}
