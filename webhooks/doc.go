// Package webhooks calls tenants back when their runs finish.
//
// Endpoints are per tenant (row-level security), each with signing secrets
// sealed at rest (Keyring). The transaction that makes a run terminal
// inserts one delivery per subscribed endpoint (Hook), so a delivery exists
// if and only if the terminal state committed. The Relay, on every
// replica, claims due deliveries with FOR UPDATE SKIP LOCKED and POSTs them
// with the Standard Webhooks headers (webhook-id, webhook-timestamp,
// webhook-signature) through the SSRF-safe transport, retrying failures on
// a schedule with jitter until it is spent.
//
// Signing lives in sdk/webhook, which receivers use to verify a request
// without linking the server.
package webhooks
