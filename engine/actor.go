package engine

import (
	"context"

	"github.com/composer-dev/composer/engine/dag"
)

// actorKey carries who makes the changes made with a context.
type actorKey struct{}

// WithActor returns ctx carrying who makes the changes made with it: the
// principal the API authenticated (never a value a client sent). A run
// started with it (a start, a rerun as a new run, a publish's runs)
// records it as its starter; a signal sent with it records it as its
// sender, the approver an approval wait names and whom its policy must
// allow.
func WithActor(ctx context.Context, p dag.Principal) context.Context {
	return context.WithValue(ctx, actorKey{}, p)
}

// actorOf is the principal WithActor set (the zero Principal when none).
func actorOf(ctx context.Context) dag.Principal {
	p, _ := ctx.Value(actorKey{}).(dag.Principal)
	return p
}
