// Package secrets is a tenant's store of named values that HTTP steps
// read as secrets.NAME (engine/dag's request templates).
//
// Values are write-only: Create and Update take one, nothing returns it.
// Every set adds a version (the latest KeptVersions are kept) and steps
// read the current one when they execute. Each value is sealed at rest
// with the webhooks' Keyring (AES-256-GCM under COMPOSER_WEBHOOK_SECRET_KEY,
// the tenant, secret and version ids as additional data). The app role may
// write sealed values but not read them; ForLease, as the system role,
// opens the current values of the secrets a leased task's stored request
// names, for the platform worker holding that lease and no one else.
// Every create, update and delete writes a secret_audit row in its own
// transaction.
package secrets
