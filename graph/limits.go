package graph

import (
	"context"

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
	depth := measure(oc.Operation.SelectionSet, oc.Doc.Fragments, 1, &aliases, map[string]bool{})
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

// measure returns the depth of a selection set, counting aliased fields
// (fragments expanded once each).
func measure(set ast.SelectionSet, frags ast.FragmentDefinitionList, level int, aliases *int, seen map[string]bool) int {
	deepest := level - 1
	for _, sel := range set {
		switch s := sel.(type) {
		case *ast.Field:
			if s.Alias != "" && s.Alias != s.Name {
				*aliases++
			}
			d := level
			if len(s.SelectionSet) > 0 {
				d = measure(s.SelectionSet, frags, level+1, aliases, seen)
			}
			deepest = max(deepest, d)
		case *ast.InlineFragment:
			deepest = max(deepest, measure(s.SelectionSet, frags, level, aliases, seen))
		case *ast.FragmentSpread:
			if seen[s.Name] {
				continue
			}
			seen[s.Name] = true
			if f := frags.ForName(s.Name); f != nil {
				deepest = max(deepest, measure(f.SelectionSet, frags, level, aliases, seen))
			}
		}
	}
	return deepest
}
