package graph

import (
	"context"
	"encoding/json"
	"sync/atomic"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// shapeLimit rejects operations that are too deep or carry too many aliases
// before they execute (gqlgen has a complexity limit but no depth limit).
type shapeLimit struct {
	maxDepth, maxAliases int
}

var _ interface {
	graphql.HandlerExtension
	graphql.OperationContextMutator
} = shapeLimit{}

func (shapeLimit) ExtensionName() string                   { return "ShapeLimit" }
func (shapeLimit) Validate(graphql.ExecutableSchema) error { return nil }

func (l shapeLimit) MutateOperationContext(ctx context.Context, oc *graphql.OperationContext) *gqlerror.Error {
	if oc.Operation == nil {
		return nil
	}
	aliases := 0
	depth := measure(oc.Operation.SelectionSet, oc.Doc.Fragments, 1, &aliases, map[string]fragStats{})
	if depth > l.maxDepth {
		return &gqlerror.Error{Message: "the operation is nested too deeply", Extensions: map[string]any{
			"code": "DEPTH_LIMIT_EXCEEDED", "depth": depth, "limit": l.maxDepth}}
	}
	if aliases > l.maxAliases {
		return &gqlerror.Error{Message: "the operation uses too many aliases", Extensions: map[string]any{
			"code": "ALIAS_LIMIT_EXCEEDED", "aliases": aliases, "limit": l.maxAliases}}
	}
	return nil
}

// measure returns the depth of a selection set and adds its aliased
// fields to aliases, counting a fragment's aliases every time it is spread
// (each spread executes it again). counts memoizes each fragment's alias
// count, so nested spreads cost nothing to measure however they multiply.
func measure(set ast.SelectionSet, frags ast.FragmentDefinitionList, level int, aliases *int, counts map[string]fragStats) int {
	deepest := level - 1
	for _, sel := range set {
		switch s := sel.(type) {
		case *ast.Field:
			if s.Alias != "" && s.Alias != s.Name {
				*aliases++
			}
			d := level
			if len(s.SelectionSet) > 0 {
				d = measure(s.SelectionSet, frags, level+1, aliases, counts)
			}
			deepest = max(deepest, d)
		case *ast.InlineFragment:
			deepest = max(deepest, measure(s.SelectionSet, frags, level, aliases, counts))
		case *ast.FragmentSpread:
			st, ok := counts[s.Name]
			if !ok {
				counts[s.Name] = fragStats{} // validation forbids cycles; this guards anyway
				if f := frags.ForName(s.Name); f != nil {
					n := 0
					st.depth = measure(f.SelectionSet, frags, 1, &n, counts)
					st.aliases = n
				}
				counts[s.Name] = st
			}
			*aliases += st.aliases
			if *aliases > 1<<20 {
				*aliases = 1 << 20 // beyond any limit; keeps the count from overflowing
			}
			deepest = max(deepest, level-1+st.depth)
		}
	}
	return deepest
}

type fragStats struct{ depth, aliases int }

// responseBudget bounds the size of one response: JSON values (run inputs
// and outputs, task outputs, definitions…) are charged as their fields are
// resolved, and past the bound the whole response is replaced by one
// RESPONSE_TOO_LARGE error — a small query cannot make the server build
// hundreds of megabytes. Each response of a subscription has its own
// budget.
type responseBudget struct{ max int64 }

var _ interface {
	graphql.HandlerExtension
	graphql.ResponseInterceptor
	graphql.FieldInterceptor
} = responseBudget{}

type budgetKey struct{}

type spent struct {
	left     atomic.Int64
	exceeded atomic.Bool
}

func (responseBudget) ExtensionName() string                   { return "ResponseBudget" }
func (responseBudget) Validate(graphql.ExecutableSchema) error { return nil }

func (b responseBudget) InterceptResponse(ctx context.Context, next graphql.ResponseHandler) *graphql.Response {
	sp := &spent{}
	sp.left.Store(b.max)
	resp := next(context.WithValue(ctx, budgetKey{}, sp))
	if resp != nil && (sp.exceeded.Load() || int64(len(resp.Data)) > b.max) {
		return &graphql.Response{Errors: gqlerror.List{{Message: "the response would be larger than the limit; ask for fewer items or fields",
			Extensions: map[string]any{"code": "RESPONSE_TOO_LARGE", "limit": b.max}}}}
	}
	return resp
}

func (b responseBudget) InterceptField(ctx context.Context, next graphql.Resolver) (any, error) {
	res, err := next(ctx)
	sp, _ := ctx.Value(budgetKey{}).(*spent)
	if err != nil || sp == nil {
		return res, err
	}
	n := 0
	switch v := res.(type) {
	case json.RawMessage:
		n = len(v)
	case *json.RawMessage:
		if v != nil {
			n = len(*v)
		}
	case string:
		n = len(v)
	case *string:
		if v != nil {
			n = len(*v)
		}
	}
	if n > 0 && sp.left.Add(-int64(n)) < 0 {
		sp.exceeded.Store(true)
		return nil, &gqlerror.Error{Message: "the response is too large", Extensions: map[string]any{"code": "RESPONSE_TOO_LARGE"}}
	}
	return res, nil
}
