// Package auth resolves every request to one principal — a tenant, a
// subject and its permissions — from a JWT or a per-tenant API key, and
// answers whether that principal may perform an action (casbin RBAC with
// the tenant as the domain).
package auth
