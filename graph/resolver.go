// Package graph is Composer's GraphQL gateway for tenant dashboards:
// schema-first with gqlgen (graph/*.graphqls), thin resolvers over the
// tenants, engine, auth and billing packages.
package graph

// Resolver is the root resolver; it carries the gateway's dependencies.
type Resolver struct{}
