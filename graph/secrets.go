package graph

import (
	"context"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/pg"
)

// manageSecrets runs fn in a secrets:manage tenant transaction, with the
// principal's audit name, and returns what it produced.
func manageSecrets[T any](ctx context.Context, r *Resolver, fn func(ctx context.Context, tx *pg.Tx, by string) (T, error)) (*T, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	var out T
	err = r.inTenant(ctx, auth.ActionSecretsManage, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		out, err = fn(ctx, tx, string(p.Kind)+":"+p.Subject)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}
