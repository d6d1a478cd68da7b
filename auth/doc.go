// Package auth resolves every request to exactly one principal — a tenant,
// a subject and what it may do — from a user JWT or a tenant API key, and
// answers one question: may this principal perform this action in this
// tenant's transaction? There is no anonymous principal and no default
// tenant: a request without valid credentials never reaches a handler.
//
// # Use
//
//	authn := &auth.Authenticator{DB: db, JWT: verifier, Logger: log}
//	authz, err := auth.NewAuthorizer() // one per process
//	...
//	mux.Handle("/graphql", authn.Middleware(handler))
//
//	// in a resolver:
//	p, _ := auth.FromContext(ctx)
//	err := db.WithTenant(ctx, p.TenantID, func(ctx context.Context, tx *pg.Tx) error {
//		if err := authz.Allowed(ctx, tx, p, auth.ActionRunsWrite); err != nil {
//			return err // errs.Forbidden
//		}
//		...
//	})
//
// Authenticator.Authenticate does the same for a header value arriving
// elsewhere (a websocket init payload).
//
// # Users
//
// A user presents a JWT (golang-jwt) checked by a JWTVerifier: HS256 with a
// shared secret for development (MintDevToken, `composer token`), RS256 and
// ES256 with public keys given as PEM or as a JWKS document, matched by kid.
// The accepted algorithms are exactly those of the configured keys, so
// `alg: none` and an HS256 token "signed" with the RSA public key are
// rejected before any key is looked up. exp is required; nbf, iat, iss and
// aud are checked with 30 s of leeway. The token names the tenant
// (tenant_id claim) and the role; the subject must be a member of that
// tenant with that very role, read as composer_app in the tenant's scope,
// so the token of a demoted or removed member stops working at once.
//
// Members (owner, admin, developer, viewer) are rows of memberships; a
// tenant's last owner can be neither demoted nor removed.
//
// # API keys
//
// A key looks like
//
//	cmp_<key id: 12 base62>_<secret: 40 base62><checksum: 6 base62>
//
// and matches APIKeyPattern, `\bcmp_[0-9A-Za-z]{12}_[0-9A-Za-z]{46}\b`,
// for secret scanners. The checksum (CRC32 of the rest) rejects typos and
// random strings without touching the database and lets a scanner confirm
// a match. The key id is public and names the key in listings and logs;
// the secret (238 random bits) is shown once, at creation, and stored only
// as a SHA-256 hash. A presented key names no tenant, so it is looked up by
// key id through composer_api_key_lookup, a security-definer function that
// composer_app may execute; the gateway never uses composer_system. The
// hash is compared in constant time, then revocation and expiry are
// checked; last_used_at is written at most once a minute. Keys are
// authorized by their scopes (AllScopes; admin grants everything).
//
// Secrets and tokens never appear in logs, error messages or the database:
// every failure is a generic Unauthenticated error, logged with its reason
// and at most the public key id.
//
// # Authorization and replicas
//
// Users are authorized by casbin (RBAC with domains, the tenant being the
// domain) from a model and role→permission policy embedded in the binary;
// role assignments come from the memberships table through the package's
// own read-only adapter, loaded per tenant on first use into one
// SyncedEnforcer.
//
// A membership change must deny the very next request on every replica,
// with no message bus to lose or delay an invalidation. So the database
// carries the truth about freshness: a trigger bumps
// tenants.membership_version in the same transaction as any change of a
// tenant's memberships, and Allowed reads that version in the request's
// own transaction (one primary-key lookup) and compares it with the
// version of the rules it holds. Stale rules are reloaded from memberships
// together with their version in one statement and swapped in under the
// enforcer's write lock. A replica can therefore be behind only until its
// next authorization in that tenant, and that authorization catches up
// before it answers. Rejected alternatives: casbin's cached enforcer (known
// stale-cache bugs), timed reloads (a window where revoked access works),
// and LISTEN/NOTIFY watchers (a notification missed during a reconnect
// leaves a replica stale indefinitely).
//
// Authorizer and Authenticator are safe for concurrent use.
package auth
