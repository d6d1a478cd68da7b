package audit_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver for goose
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/audit"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/migrations"
	"github.com/composer-dev/composer/tenants"
)

type world struct {
	t    *testing.T
	env  *testenv.Env
	db   *pg.DB
	keys *audit.Keyring
}

func newWorld(t *testing.T) *world {
	t.Helper()
	env := testenv.NewPG(t)
	return &world{t: t, env: env, db: pg.New(env.App, env.System, false), keys: newKeyring(t)}
}

func newKey(t *testing.T) string {
	t.Helper()
	raw := make([]byte, audit.KeySize)
	_, err := rand.Read(raw)
	require.NoError(t, err)
	return base64.StdEncoding.EncodeToString(raw)
}

func newKeyring(t *testing.T, keys ...string) *audit.Keyring {
	t.Helper()
	if len(keys) == 0 {
		keys = []string{newKey(t)}
	}
	k, err := audit.ParseKeyring(keys)
	require.NoError(t, err)
	return k
}

func (w *world) tenant() uuid.UUID {
	w.t.Helper()
	tn, err := tenants.Create(context.Background(), w.db, tenants.CreateParams{Name: "audited"})
	require.NoError(w.t, err)
	return tn.ID
}

// appendN appends n records under keys, as the API's gate would.
func (w *world) appendN(tenant uuid.UUID, keys *audit.Keyring, n int) {
	w.t.Helper()
	for i := range n {
		require.NoError(w.t, w.db.WithTenant(context.Background(), tenant, func(ctx context.Context, tx *pg.Tx) error {
			return audit.Append(ctx, tx, keys, audit.Record{PrincipalKind: "user", PrincipalID: "someone", Action: "pauseQueue",
				TargetType: "queue", TargetID: fmt.Sprintf("q%d", i), Outcome: audit.OK, Detail: audit.Detail(map[string]any{"i": i})})
		}))
	}
}

func (w *world) verify(tenant uuid.UUID, keys *audit.Keyring, anchor *audit.Anchor) audit.Verification {
	w.t.Helper()
	var v audit.Verification
	require.NoError(w.t, w.db.WithTenant(context.Background(), tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		v, err = audit.Verify(ctx, tx, keys, anchor)
		return err
	}))
	return v
}

// ownerTx begins a transaction as composer_owner, the tables' owner — an
// attacker with write access to every audit table (bound by FORCE ROW
// LEVEL SECURITY to the tenant it names, like everyone but the system
// role). It is rolled back at the test's end unless committed.
func (w *world) ownerTx(tenant uuid.UUID) pgx.Tx {
	w.t.Helper()
	ctx := context.Background()
	tx, err := w.env.Owner(w.t).Begin(ctx)
	require.NoError(w.t, err)
	w.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, "SELECT set_config('app.tenant_id', $1, true)", tenant.String())
	require.NoError(w.t, err)
	return tx
}

// asOwner runs sql in an ownerTx and commits.
func (w *world) asOwner(tenant uuid.UUID, sql ...string) {
	w.t.Helper()
	tx := w.ownerTx(tenant)
	for _, s := range sql {
		_, err := tx.Exec(context.Background(), s)
		require.NoError(w.t, err, s)
	}
	require.NoError(w.t, tx.Commit(context.Background()))
}

// brokenAt asserts v is not valid, broken at seq with a problem saying
// what.
func brokenAt(t *testing.T, v audit.Verification, seq int64, what string, msg ...any) {
	t.Helper()
	assert.False(t, v.Valid, msg...)
	assert.Equal(t, seq, v.BrokenAt, append(msg, v.Problem)...)
	if what != "" {
		assert.Contains(t, v.Problem, what, msg...)
	}
}

func (w *world) records(tenant uuid.UUID) []audit.Record {
	w.t.Helper()
	var out []audit.Record
	require.NoError(w.t, w.db.WithTenant(context.Background(), tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		out, err = audit.List(ctx, tx, audit.Filter{}, 0, 1000)
		return err
	}))
	return out
}

// rechainUnkeyed is what an attacker without the key can do after
// changing a record: recompute every hash from seq from on with the
// chain's public, unkeyed formula (migration 00023's sha256), mark those
// records unkeyed and move the head along, all in SQL. Run over a
// whole chain that was not changed, it is also exactly what the records
// written before the chain was keyed look like.
func rechainUnkeyed(from int64) string { return rechainUnkeyedThrough(from, 1<<62) }

// rechainUnkeyedThrough is rechainUnkeyed of the records from..through
// only (the head moves only when through reaches it).
func rechainUnkeyedThrough(from, through int64) string {
	field := func(f string) string {
		return fmt.Sprintf("int4send(octet_length(r.%[1]s)) || convert_to(r.%[1]s, 'UTF8')", f)
	}
	body := field("principal_kind") + " || " + field("principal_id") + " || " + field("action") + " || " +
		field("target_type") + " || " + field("target_id") + " || " + field("outcome") + " || " + field("detail")
	return fmt.Sprintf(`DO $$
DECLARE r audit_log; prev bytea;
BEGIN
	prev := coalesce((SELECT hash FROM audit_log WHERE seq = %[1]d - 1), '\x%[2]s'::bytea);
	FOR r IN SELECT * FROM audit_log WHERE seq BETWEEN %[1]d AND %[4]d ORDER BY seq LOOP
		UPDATE audit_log SET key_id = '', prev_hash = prev,
			hash = sha256(prev || int8send(r.seq) || int8send((extract(epoch FROM r.at) * 1000000)::bigint) || %[3]s)
		WHERE seq = r.seq RETURNING hash INTO prev;
	END LOOP;
	UPDATE audit_heads SET hash = prev, key_id = '', head_mac = NULL WHERE seq <= %[4]d;
END $$`, from, fmt.Sprintf("%064d", 0), body, through)
}

// TestAConsistentRewriteWithoutTheKeyIsDetected: whoever can write the
// audit tables but lacks the key changes a record and rewrites the rest
// of the chain consistently — with the unkeyed formula, under a key of
// their own (claiming the server's key id or their own), or turning the
// whole chain into one that looks older than the key — and verification
// fails, naming the first record that does not hold.
func TestAConsistentRewriteWithoutTheKeyIsDetected(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	attacker := newKeyring(t)
	cases := []struct {
		name    string
		tamper  func(tenant uuid.UUID)
		at      int64
		problem string
	}{
		{"rehashed unkeyed from the change on", func(tn uuid.UUID) {
			w.asOwner(tn, `UPDATE audit_log SET detail = '{"i":99}' WHERE seq = 3`, rechainUnkeyed(3))
		}, 3, "not keyed"},
		{"every record rehashed unkeyed", func(tn uuid.UUID) {
			w.asOwner(tn, `UPDATE audit_log SET outcome = 'FORBIDDEN' WHERE seq = 2`, rechainUnkeyed(1))
		}, 1, "not keyed"},
		{"rehashed under another key, claiming the server's key id", func(tn uuid.UUID) {
			w.remac(tn, attacker, w.keys.SigningKeyID(), 3)
		}, 3, "modified"},
		{"rehashed under another key, naming it", func(tn uuid.UUID) {
			w.remac(tn, attacker, attacker.SigningKeyID(), 3)
		}, 3, "does not have"},
		{"a record's key id cleared alone", func(tn uuid.UUID) {
			w.asOwner(tn, `UPDATE audit_log SET key_id = '' WHERE seq = 4`)
		}, 4, "modified"},
	}
	for _, c := range cases {
		tn := w.tenant()
		w.appendN(tn, w.keys, 6)
		v := w.verify(tn, w.keys, nil)
		require.True(t, v.Valid, "%s: %s", c.name, v.Problem)
		require.Equal(t, 6, v.Checked)
		require.Zero(t, v.Legacy)
		c.tamper(tn)
		v = w.verify(tn, w.keys, nil)
		brokenAt(t, v, c.at, c.problem, c.name)
		assert.ErrorContains(t, v.Err(), fmt.Sprintf("at seq %d", c.at), c.name)
	}
}

// remac changes record from's detail and recomputes the MACs from it on,
// and the head's, under attacker's key, storing them under key id.
func (w *world) remac(tenant uuid.UUID, attacker *audit.Keyring, id string, from int64) {
	w.t.Helper()
	w.asOwner(tenant, fmt.Sprintf(`UPDATE audit_log SET detail = '{"i":77}' WHERE seq = %d`, from))
	ctx := context.Background()
	tx := w.ownerTx(tenant)
	var prev []byte
	require.NoError(w.t, tx.QueryRow(ctx, `SELECT hash FROM audit_log WHERE seq = $1`, from-1).Scan(&prev))
	rows, err := tx.Query(ctx, `SELECT seq, at, principal_kind, principal_id, action, target_type, target_id, outcome, detail
		FROM audit_log WHERE seq >= $1 ORDER BY seq`, from)
	require.NoError(w.t, err)
	var recs []audit.Record
	for rows.Next() {
		var r audit.Record
		var detail string
		require.NoError(w.t, rows.Scan(&r.Seq, &r.At, &r.PrincipalKind, &r.PrincipalID, &r.Action, &r.TargetType, &r.TargetID, &r.Outcome, &detail))
		r.Detail = []byte(detail)
		recs = append(recs, r)
	}
	require.NoError(w.t, rows.Err())
	for _, r := range recs {
		mac := audit.RecordMAC(attacker, attacker.SigningKeyID(), tenant, prev, r)
		_, err := tx.Exec(ctx, `UPDATE audit_log SET prev_hash = $1, hash = $2, key_id = $3 WHERE seq = $4`, prev, mac, id, r.Seq)
		require.NoError(w.t, err)
		prev = mac
	}
	_, err = tx.Exec(ctx, `UPDATE audit_heads SET hash = $1, key_id = $2, head_mac = $3`, prev, id, prev)
	require.NoError(w.t, err)
	require.NoError(w.t, tx.Commit(ctx))
}

// TestRecordsBeforeTheKeyVerifyAsLegacy: a chain written before the key
// (unkeyed sha256 hashes) is not valid alone — nothing authenticates it —
// and becomes valid with the tenant's next record, whose MAC covers it;
// changing one of those records afterwards is still found.
func TestRecordsBeforeTheKeyVerifyAsLegacy(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	tn := w.tenant()
	w.appendN(tn, w.keys, 4)
	w.asOwner(tn, rechainUnkeyed(1)) // as migration 00023 wrote them
	v := w.verify(tn, w.keys, nil)
	brokenAt(t, v, 1, "no keyed record follows them")
	assert.Equal(t, 4, v.Legacy)

	w.appendN(tn, w.keys, 2)
	v = w.verify(tn, w.keys, nil)
	require.True(t, v.Valid, v.Problem)
	assert.Equal(t, 6, v.Checked)
	assert.Equal(t, 4, v.Legacy)

	w.asOwner(tn, `UPDATE audit_log SET target_id = 'other' WHERE seq = 2`, rechainUnkeyedThrough(2, 4))
	v = w.verify(tn, w.keys, nil)
	brokenAt(t, v, 5, "does not follow record 4")
}

// legacyAppend is migration 00023's append, as the binaries before the
// keyed chain ran it: the hash computed by PostgreSQL, unkeyed.
const legacyAppend = `WITH head AS (
	INSERT INTO audit_heads AS h (tenant_id, seq, prev_hash, hash, at)
	VALUES ($1, 1, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea,
		sha256('\x0000000000000000000000000000000000000000000000000000000000000000'::bytea
			|| int8send(1::bigint) || int8send((extract(epoch FROM now()) * 1000000)::bigint) || $9::bytea),
		now())
	ON CONFLICT (tenant_id) DO UPDATE SET
		seq = h.seq + 1,
		prev_hash = h.hash,
		at = greatest(h.at, EXCLUDED.at),
		hash = sha256(h.hash || int8send(h.seq + 1)
			|| int8send((extract(epoch FROM greatest(h.at, EXCLUDED.at)) * 1000000)::bigint) || $9::bytea)
	RETURNING tenant_id, seq, prev_hash, hash, at
)
INSERT INTO audit_log (tenant_id, seq, at, principal_kind, principal_id, action, target_type, target_id, outcome, detail, prev_hash, hash)
SELECT tenant_id, seq, at, $2, $3, $4, $5, $6, $7, $8, prev_hash, hash FROM head`

// TestAChainFromBeforeTheUpgradeVerifiesAsLegacy: records written by the
// unkeyed binaries, before migration 00028, keep their hashes through it;
// the chain is authenticated from the tenant's first keyed record on.
func TestAChainFromBeforeTheUpgradeVerifiesAsLegacy(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	tn := w.tenant()
	db, err := sql.Open("pgx", w.env.OwnerURL)
	require.NoError(t, err)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS(), goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	_, err = p.ApplyVersion(ctx, 28, false)
	require.NoError(t, err)
	tx := w.ownerTx(tn)
	for i := range 3 {
		r := audit.Record{PrincipalKind: "user", PrincipalID: "old@x", Action: "pauseQueue", TargetType: "queue",
			TargetID: fmt.Sprint(i), Outcome: audit.OK, Detail: audit.Detail(map[string]any{"i": i})}
		_, err = tx.Exec(ctx, legacyAppend, tn, r.PrincipalKind, r.PrincipalID, r.Action, r.TargetType, r.TargetID, r.Outcome,
			string(r.Detail), audit.Body(r))
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit(ctx))
	_, err = p.ApplyVersion(ctx, 28, true)
	require.NoError(t, err)

	v := w.verify(tn, w.keys, nil)
	assert.False(t, v.Valid, "nothing authenticates an unkeyed chain alone")
	assert.Equal(t, 3, v.Legacy)
	w.appendN(tn, w.keys, 1)
	v = w.verify(tn, w.keys, nil)
	assert.True(t, v.Valid, v.Problem)
	assert.Equal(t, 4, v.Checked)
	assert.Equal(t, 3, v.Legacy)
}

// legacyPrune is migration 00023's retention statement, as the binaries
// before the keyed chain ran it.
const legacyPrune = `WITH cut AS (
	SELECT h.tenant_id, (SELECT max(a.seq) FROM audit_log a
		WHERE a.tenant_id = h.tenant_id AND a.seq <= h.pruned_seq + $1
		  AND a.at < now() - make_interval(days => composer_tenant_limit(h.tenant_id, 'audit_retention_days')::int)) AS seq
	FROM audit_heads h
	WHERE composer_tenant_limit(h.tenant_id, 'audit_retention_days') > 0
), del AS (
	DELETE FROM audit_log a USING cut
	WHERE a.tenant_id = cut.tenant_id AND cut.seq IS NOT NULL AND a.seq <= cut.seq
	RETURNING a.tenant_id
)
UPDATE audit_heads h SET pruned_seq = cut.seq
FROM cut WHERE h.tenant_id = cut.tenant_id AND cut.seq IS NOT NULL AND cut.seq > h.pruned_seq`

// TestAnOlderBinaryDuringARollingUpgrade: while old pods still serve (or
// after a rollback) they append unkeyed records between keyed ones — the
// chain is not valid while one ends it and valid again once a keyed
// record follows — and their retention cannot cut a chain without a mark:
// its statement fails and deletes nothing.
func TestAnOlderBinaryDuringARollingUpgrade(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	tn := w.tenant()
	w.appendN(tn, w.keys, 2)
	tx := w.ownerTx(tn)
	r := audit.Record{PrincipalKind: "user", PrincipalID: "old@x", Action: "pauseQueue", TargetType: "queue", TargetID: "old",
		Outcome: audit.OK, Detail: audit.Detail(nil)}
	_, err := tx.Exec(ctx, legacyAppend, tn, r.PrincipalKind, r.PrincipalID, r.Action, r.TargetType, r.TargetID, r.Outcome,
		string(r.Detail), audit.Body(r))
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	v := w.verify(tn, w.keys, nil)
	brokenAt(t, v, 3, "no keyed record follows")
	w.appendN(tn, w.keys, 1)
	v = w.verify(tn, w.keys, nil)
	assert.True(t, v.Valid, v.Problem)
	assert.Equal(t, 1, v.Legacy)

	w.asOwner(tn, `UPDATE audit_log SET at = at - interval '400 days' WHERE seq <= 2`)
	_, err = w.env.System.Exec(ctx, legacyPrune, 10000)
	require.ErrorContains(t, err, "audit_heads_cut_marked")
	assert.Len(t, w.records(tn), 4, "the old statement deleted nothing")
}

// TestKeysRotate: records keep the id of the key that signed them; after
// a new key is listed first, new records are signed under it, and the
// chain verifies while the old key is still listed — not once it is
// dropped, naming the first record the server can no longer check.
func TestKeysRotate(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	tn := w.tenant()
	oldKey, newKeyS := newKey(t), newKey(t)
	before, after := newKeyring(t, oldKey), newKeyring(t, newKeyS, oldKey)
	require.Equal(t, []string{after.SigningKeyID(), before.SigningKeyID()}, after.KeyIDs())
	w.appendN(tn, before, 3)
	w.appendN(tn, after, 3)
	v := w.verify(tn, after, nil)
	require.True(t, v.Valid, v.Problem)
	assert.Equal(t, 6, v.Checked)

	var ids []string
	require.NoError(t, w.db.WithTenant(context.Background(), tn, func(ctx context.Context, tx *pg.Tx) error {
		rows, err := tx.Query(ctx, `SELECT key_id FROM audit_log ORDER BY seq`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return rows.Err()
	}))
	o, n := before.SigningKeyID(), after.SigningKeyID()
	assert.Equal(t, []string{o, o, o, n, n, n}, ids)

	v = w.verify(tn, newKeyring(t, newKeyS), nil)
	brokenAt(t, v, 1, "signed under audit key "+o)
	v = w.verify(tn, before, nil)
	brokenAt(t, v, 4, "which this server does not have")
}

// TestTheHeadCannotBeCutBack: deleting the newest records and moving the
// head back is found (the head is signed); replaying a head the server
// signed earlier is found only against an anchor kept outside the
// database — the documented limit of a chain inside the database.
func TestTheHeadCannotBeCutBack(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	tn := w.tenant()
	w.appendN(tn, w.keys, 4)
	ctx := context.Background()
	var saved struct {
		seq        int64
		hash, prev []byte
		at         time.Time
		mac        []byte
	}
	require.NoError(t, w.db.WithTenant(ctx, tn, func(ctx context.Context, tx *pg.Tx) error {
		return tx.QueryRow(ctx, `SELECT seq, hash, prev_hash, at, head_mac FROM audit_heads`).Scan(&saved.seq, &saved.hash, &saved.prev, &saved.at, &saved.mac)
	}))
	w.appendN(tn, w.keys, 1)
	v := w.verify(tn, w.keys, nil)
	require.True(t, v.Valid, v.Problem)
	anchor := &audit.Anchor{Seq: v.HeadSeq, Hash: v.HeadHash}
	require.Equal(t, int64(5), anchor.Seq)
	require.True(t, w.verify(tn, w.keys, anchor).Valid)

	// Cut back by hand: the head's MAC does not match.
	w.asOwner(tn, `DELETE FROM audit_log WHERE seq = 5`,
		`UPDATE audit_heads SET seq = 4, hash = (SELECT hash FROM audit_log WHERE seq = 4)`)
	v = w.verify(tn, w.keys, nil)
	brokenAt(t, v, 5, "not one the server wrote")

	// Cut back to a head the server signed before: only the anchor tells.
	tx := w.ownerTx(tn)
	_, err := tx.Exec(ctx, `UPDATE audit_heads SET seq = $1, hash = $2, prev_hash = $3, at = $4, head_mac = $5`,
		saved.seq, saved.hash, saved.prev, saved.at, saved.mac)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	assert.True(t, w.verify(tn, w.keys, nil).Valid, "a replayed head is not found without an anchor")
	v = w.verify(tn, w.keys, anchor)
	brokenAt(t, v, 5, "before the anchored record 5")

	// An anchor whose record was rewritten.
	w.appendN(tn, w.keys, 1)
	v = w.verify(tn, w.keys, nil)
	require.True(t, v.Valid, v.Problem)
	v = w.verify(tn, w.keys, &audit.Anchor{Seq: 3, Hash: make([]byte, 32)})
	brokenAt(t, v, 3, "anchored hash")
}

// TestRetentionMarksItsCut: retention deletes a prefix and marks the cut,
// so the kept tail verifies — also when it deleted every record — while
// a prefix deleted by hand (pruned_seq moved along) is found.
func TestRetentionMarksItsCut(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	tn, all := w.tenant(), w.tenant()
	w.appendN(tn, w.keys, 8)
	w.appendN(all, w.keys, 3)
	// Older than the free plan's 30 days (the changed times break those
	// records' MACs; retention deletes them).
	w.asOwner(tn, `UPDATE audit_log SET at = at - interval '400 days' WHERE seq <= 5`)
	w.asOwner(all, `UPDATE audit_log SET at = at - interval '400 days'`)
	_, err := audit.Prune(ctx, w.db, w.keys)
	require.NoError(t, err)
	v := w.verify(tn, w.keys, nil)
	require.True(t, v.Valid, v.Problem)
	assert.Equal(t, int64(6), v.FirstSeq)
	assert.Equal(t, 3, v.Checked)
	v = w.verify(all, w.keys, nil)
	require.True(t, v.Valid, v.Problem)
	assert.Zero(t, v.Checked)
	assert.Equal(t, int64(3), v.HeadSeq)
	v = w.verify(tn, w.keys, &audit.Anchor{Seq: 2, Hash: make([]byte, 32)})
	assert.True(t, v.Valid)
	assert.True(t, v.AnchorPruned)

	w.asOwner(tn, `DELETE FROM audit_log WHERE seq = 6`, `UPDATE audit_heads SET pruned_seq = 6, pruned_mark_seq = 6`)
	v = w.verify(tn, w.keys, nil)
	brokenAt(t, v, 7, "not by retention")

	_, err = audit.Prune(ctx, w.db, nil)
	assert.ErrorIs(t, err, audit.ErrNoKeyring)
}

// TestConcurrentFirstAppendsMakeOneChain: many transactions appending a
// fresh tenant's first records at once serialise on its placeholder head:
// seqs 1..n, one valid chain.
func TestConcurrentFirstAppendsMakeOneChain(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	tn := w.tenant()
	const n = 24
	var wg sync.WaitGroup
	errc := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc <- w.db.WithTenant(context.Background(), tn, func(ctx context.Context, tx *pg.Tx) error {
				return audit.Append(ctx, tx, w.keys, audit.Record{PrincipalKind: "user", PrincipalID: "u", Action: "pauseQueue",
					TargetType: "queue", TargetID: fmt.Sprint(i), Outcome: audit.OK})
			})
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	recs := w.records(tn)
	require.Len(t, recs, n)
	for i, r := range recs {
		assert.Equal(t, int64(n-i), r.Seq)
	}
	v := w.verify(tn, w.keys, nil)
	assert.True(t, v.Valid, v.Problem)
	assert.Equal(t, n, v.Checked)
}

// TestASealWithoutAKeyCommitsNothing: a transaction sealed with an entry
// that has no keyring fails, and neither its change nor a record commits.
func TestASealWithoutAKeyCommitsNothing(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	tn := w.tenant()
	ctx := audit.With(context.Background(), audit.NewEntry(nil, tn, "user", "u", "pauseQueue", "queue", "q", nil))
	err := w.db.WithTenant(ctx, tn, func(ctx context.Context, tx *pg.Tx) error {
		audit.Seal(ctx, tx)
		_, err := tx.Exec(ctx, `INSERT INTO queue_pauses (tenant_id, queue, reason, paused_by) VALUES ($1, 'q', '', 'u')`, tn)
		return err
	})
	require.ErrorContains(t, err, "COMPOSER_AUDIT_KEY")
	var pauses int
	require.NoError(t, w.db.WithTenant(context.Background(), tn, func(ctx context.Context, tx *pg.Tx) error {
		return tx.QueryRow(ctx, `SELECT count(*) FROM queue_pauses`).Scan(&pauses)
	}))
	assert.Zero(t, pauses)
	assert.Empty(t, w.records(tn))
	err = w.db.WithTenant(context.Background(), tn, func(ctx context.Context, tx *pg.Tx) error {
		return audit.Append(ctx, tx, nil, audit.Record{PrincipalKind: "user", PrincipalID: "u", Action: "x", Outcome: audit.OK})
	})
	assert.ErrorIs(t, err, audit.ErrNoKeyring)
}

// refuse records a refusal of action by principal in tenant, as the API
// does after a refused mutation.
func (w *world) refuse(tenant uuid.UUID, principal, action string, kind errs.Kind) (bool, error) {
	e := audit.NewEntry(w.keys, tenant, "user", principal, action, "queue", "q", nil)
	return audit.Finish(context.Background(), w.db, e, errs.E(kind, "no"))
}

// refusals sums a tenant's records of action: how many records, and how
// many refusals they stand for.
func refusals(recs []audit.Record, principal, action, outcome string) (records int, total int64) {
	for _, r := range recs {
		if r.PrincipalID == principal && r.Action == action && r.Outcome == outcome {
			records++
			total += 1 + r.Repeats
		}
	}
	return records, total
}

// TestRefusalsCoalescePerPrincipal: 300 refusals of one principal's
// mutation make one record per window (two, should the test straddle a
// window's end) that counts all 300; another action, outcome or principal
// gets a record of its own, successes are not coalesced, a new window
// starts a new record, and the chain stays valid.
func TestRefusalsCoalescePerPrincipal(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	tn := w.tenant()
	appended := 0
	for range 300 {
		ok, err := w.refuse(tn, "viewer@x", "pauseQueue", errs.Forbidden)
		require.NoError(t, err)
		if ok {
			appended++
		}
	}
	recs := w.records(tn)
	n, total := refusals(recs, "viewer@x", "pauseQueue", "FORBIDDEN")
	assert.LessOrEqual(t, n, 2)
	assert.Equal(t, n, appended)
	assert.Equal(t, int64(300), total)
	assert.Len(t, recs, n)
	for _, r := range recs {
		if r.Repeats > 0 {
			require.NotNil(t, r.LastRepeatAt)
			assert.False(t, r.LastRepeatAt.Before(r.At))
		}
	}

	for _, other := range []struct{ principal, action string }{{"viewer@x", "resumeQueue"}, {"dev@x", "pauseQueue"}} {
		_, err := w.refuse(tn, other.principal, other.action, errs.Forbidden)
		require.NoError(t, err)
		n, _ := refusals(w.records(tn), other.principal, other.action, "FORBIDDEN")
		assert.Equal(t, 1, n, other)
	}
	_, err := w.refuse(tn, "viewer@x", "pauseQueue", errs.Invalid)
	require.NoError(t, err)
	n, _ = refusals(w.records(tn), "viewer@x", "pauseQueue", "BAD_USER_INPUT")
	assert.Equal(t, 1, n)
	for range 2 {
		ok, err := audit.Finish(context.Background(), w.db, audit.NewEntry(w.keys, tn, "user", "viewer@x", "signalRun", "run", "r", nil), nil)
		require.NoError(t, err)
		assert.True(t, ok, "an unchanged success is recorded apiece")
	}

	// The window ends: the next refusal is recorded again.
	before, _ := refusals(w.records(tn), "viewer@x", "pauseQueue", "FORBIDDEN")
	w.asOwner(tn, `UPDATE audit_refusals SET window_start = window_start - interval '1 day'`)
	ok, err := w.refuse(tn, "viewer@x", "pauseQueue", errs.Forbidden)
	require.NoError(t, err)
	assert.True(t, ok)
	after, _ := refusals(w.records(tn), "viewer@x", "pauseQueue", "FORBIDDEN")
	assert.Equal(t, before+1, after)

	v := w.verify(tn, w.keys, nil)
	assert.True(t, v.Valid, v.Problem)
}

// TestConcurrentRefusalsStayBounded: refusals of one principal's mutation
// arriving all at once still make at most one record per window, and
// every one of them is counted.
func TestConcurrentRefusalsStayBounded(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	tn := w.tenant()
	const goroutines, each = 30, 10
	var wg sync.WaitGroup
	errc := make(chan error, goroutines*each)
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				_, err := w.refuse(tn, "viewer@x", "pauseQueue", errs.Forbidden)
				errc <- err
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	recs := w.records(tn)
	n, total := refusals(recs, "viewer@x", "pauseQueue", "FORBIDDEN")
	assert.GreaterOrEqual(t, n, 1)
	assert.LessOrEqual(t, n, 2, "one record per window")
	assert.Equal(t, int64(goroutines*each), total)
	v := w.verify(tn, w.keys, nil)
	assert.True(t, v.Valid, v.Problem)
}

// TestRefusalCountsAreTheTenants: the same principal id refused in two
// tenants is counted in each tenant apart; neither sees the other's
// counts (row-level security on audit_refusals).
func TestRefusalCountsAreTheTenants(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	a, b := w.tenant(), w.tenant()
	for range 5 {
		_, err := w.refuse(a, "same@x", "pauseQueue", errs.Forbidden)
		require.NoError(t, err)
	}
	ok, err := w.refuse(b, "same@x", "pauseQueue", errs.Forbidden)
	require.NoError(t, err)
	assert.True(t, ok, "B's first refusal is B's own record")
	_, totalA := refusals(w.records(a), "same@x", "pauseQueue", "FORBIDDEN")
	_, totalB := refusals(w.records(b), "same@x", "pauseQueue", "FORBIDDEN")
	assert.Equal(t, int64(5), totalA)
	assert.Equal(t, int64(1), totalB)
	var seen int
	require.NoError(t, w.db.WithTenant(context.Background(), b, func(ctx context.Context, tx *pg.Tx) error {
		return tx.QueryRow(ctx, `SELECT count(*) FROM audit_refusals WHERE tenant_id = $1`, a).Scan(&seen)
	}))
	assert.Zero(t, seen, "B reads none of A's refusal counts")
}

// TestKeyringsAreParsedStrictly: keys are 32 bytes of base64, listed once;
// their ids are stable and tell the keys apart.
func TestKeyringsAreParsedStrictly(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	for _, bad := range [][]string{nil, {"not base64!"}, {base64.StdEncoding.EncodeToString([]byte("short"))}, {k, k}} {
		_, err := audit.ParseKeyring(bad)
		assert.Error(t, err, bad)
	}
	_, err := audit.ParseKeyring(nil)
	assert.ErrorIs(t, err, audit.ErrNoKeyring)
	a, b := newKeyring(t, k), newKeyring(t, k)
	assert.Equal(t, a.SigningKeyID(), b.SigningKeyID())
	assert.Regexp(t, `^[0-9a-f]{8}$`, a.SigningKeyID())
	assert.NotEqual(t, a.SigningKeyID(), newKeyring(t).SigningKeyID())
}

// TestAnEntryIsAppendedOnce: sealed twice into one transaction, and then
// finished, an action leaves one ok record.
func TestAnEntryIsAppendedOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	tn := w.tenant()
	e := audit.NewEntry(w.keys, tn, "user", "u", "pauseQueue", "queue", "q", nil)
	ctx := audit.With(context.Background(), e)
	require.NoError(t, w.db.WithTenant(ctx, tn, func(ctx context.Context, tx *pg.Tx) error {
		audit.Seal(ctx, tx)
		audit.Seal(ctx, tx)
		_, err := tx.Exec(ctx, `SELECT 1`)
		return err
	}))
	wrote, err := audit.Finish(ctx, w.db, e, nil)
	require.NoError(t, err)
	assert.False(t, wrote)
	recs := w.records(tn)
	require.Len(t, recs, 1)
	assert.Equal(t, audit.OK, recs[0].Outcome)
	assert.True(t, w.verify(tn, w.keys, nil).Valid)
}
