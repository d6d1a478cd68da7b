// Package audit is the tenants' audit log: who did what to which object,
// when, and how it ended — recorded if and only if the action's
// transaction commits, as a tamper-evident hash chain per tenant.
//
// The API creates an Entry for each action and carries it in the
// request's context; the authorization gate of the transaction that does
// the work seals it in:
//
//	e := audit.NewEntry(tenant, "user", subject, "revokeApiKey", "api_key", id, nil)
//	ctx = audit.With(ctx, e)
//	err := db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
//		// … authorize, then:
//		audit.Seal(ctx, tx) // the record is appended last, before COMMIT
//		return revoke(ctx, tx, id)
//	})
//	audit.Finish(ctx, db, e, err) // records a refusal or failure on its own
//
// Each record's hash covers the previous record's hash, its seq, its time
// and its fields (Body, Hash), so Verify finds a modified, deleted or
// reordered record. Appends of one tenant serialise on its chain head row,
// locked by the append statement itself in the commit's round trip. Prune
// (the sweeper) deletes records past the plan's retention, oldest first.
//
// Entries are safe for concurrent use; the package keeps no other state.
package audit
