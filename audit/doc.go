// Package audit is the tenants' audit log: who did what to which object,
// when, and how it ended — recorded if and only if the action's
// transaction commits, as a tamper-evident chain per tenant, keyed by the
// operator's audit key (Keyring, COMPOSER_AUDIT_KEY).
//
// The API creates an Entry for each action and carries it in the
// request's context; the authorization gate of the transaction that does
// the work seals it in:
//
//	e := audit.NewEntry(keys, tenant, "user", subject, "revokeApiKey", "api_key", id, nil)
//	ctx = audit.With(ctx, e)
//	err := db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
//		// … authorize, then:
//		audit.Seal(ctx, tx) // the record is appended at the end, with COMMIT
//		return revoke(ctx, tx, id)
//	})
//	audit.Finish(ctx, db, e, err) // records a refusal or failure on its own
//
// Each record's hash is an HMAC-SHA256, under the key its key id names, of
// the tenant, its seq, its time, the previous record's hash and its fields
// (Body), so Verify finds a modified, deleted or reordered record, and a
// chain rewritten by anyone without the key. The head carries a MAC of its
// own (cutting off the newest records needs a head the server once
// wrote), and retention marks its cut (Prune). The key never reaches the
// database: appends of one tenant serialise on its chain head row, locked
// and read with the transaction's last statements, and the record, its
// MAC computed in Go, is written with the COMMIT.
//
// Refusals and failures coalesce: of one principal's, action's and
// outcome's in a RefusalWindow, the first is appended and the rest only
// counted into it (Record.Repeats), so hammering a mutation one may not
// call writes one record per window.
//
// Entries are safe for concurrent use; the package keeps no other state.
package audit
