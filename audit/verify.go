package audit

import (
	"bytes"
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/internal/pg"
)

// genesis is the prev hash of a chain's first record.
var genesis = make([]byte, 32)

// Verification is the result of checking a tenant's chain.
type Verification struct {
	// Valid: every kept record is authenticated — its MAC under the key
	// its key id names (or, for a record written without the key, its
	// hash and a keyed record after it) — follows the one before it, the
	// chain starts where retention's keyed mark says, and it ends at a
	// head the server signed.
	Valid bool
	// Checked is how many records were read; FirstSeq and LastSeq the
	// kept range (0 when there is none). Legacy is how many of them were
	// written without the key (plain sha256 hashes: before migration
	// 00028, or by an older binary since).
	Checked           int
	FirstSeq, LastSeq int64
	Legacy            int
	// HeadSeq and HeadHash are the chain's head: what to anchor outside
	// the database (Anchor) to find a later truncation.
	HeadSeq  int64
	HeadHash []byte
	// AnchorPruned: the anchor passed to Verify names a record retention
	// has since deleted, so it could not be checked.
	AnchorPruned bool
	// BrokenAt is the first seq at which the chain does not hold, and
	// Problem says how (empty when valid).
	BrokenAt int64
	Problem  string
}

// Anchor is a chain head recorded outside the database (HeadSeq and
// HeadHash of an earlier Verification): the record at Seq must still
// exist with Hash, so neither it nor what precedes it was rewritten and
// the chain was not cut back before it.
type Anchor struct {
	Seq  int64
	Hash []byte
}

// Verify checks the chain of tx's tenant under keys from its oldest kept
// record to the head: it detects a record modified (its MAC), deleted (a
// gap in seq; from the front, a cut retention did not mark; from the end,
// a head the server did not sign) and reordered (seq or prev hash out of
// place), and a record rewritten without the key as an unkeyed one. The
// head and the records are read in one statement, so appends and pruning
// running meanwhile cannot make a valid chain look broken. A non-nil
// anchor is checked too.
//
// Records without a key id — written before the chain was keyed, or by
// such a binary during a rolling upgrade or after a rollback — are
// verified by their sha256 hashes, and count only when a keyed record
// follows them: its MAC covers its prev hash, which covers all before it.
// Unkeyed records at the end of a chain are not valid (nothing
// authenticates them until the tenant's next keyed record): that is what a
// chain rewritten without the key looks like.
func Verify(ctx context.Context, tx *pg.Tx, keys *Keyring, anchor *Anchor) (Verification, error) {
	if keys == nil {
		return Verification{}, ErrNoKeyring
	}
	rows, err := tx.Query(ctx, qVerify, tx.Tenant)
	if err != nil {
		return Verification{}, fmt.Errorf("read the audit chain: %w", err)
	}
	defer rows.Close()
	var (
		v                    Verification
		prunedSeq            int64
		headKeyID, prunedKey string
		headMAC, prunedMAC   []byte
		prev                 []byte
		sawHead, broken      bool
		lastKeyed            bool  // the newest record read is keyed
		unvouched            int64 // the first of the unkeyed records since the last keyed one (0: none)
		want                 int64
	)
	fail := func(seq int64, format string, args ...any) {
		if !broken {
			broken, v.BrokenAt, v.Problem = true, seq, fmt.Sprintf(format, args...)
		}
	}
	checkAnchor := func(seq int64, hash []byte) {
		if anchor != nil && anchor.Seq == seq && !bytes.Equal(hash, anchor.Hash) {
			fail(seq, "record %d does not have the anchored hash: it or a record before it was rewritten", seq)
		}
	}
	for rows.Next() {
		var (
			seq                                            *int64
			at                                             *time.Time
			kind, pid, action, ttype, tid, outcome, detail *string
			rowPrev, rowHash                               []byte
			keyID                                          *string
		)
		if err := rows.Scan(&v.HeadSeq, &v.HeadHash, &headKeyID, &headMAC, &prunedSeq, &prunedKey, &prunedMAC,
			&seq, &at, &kind, &pid, &action, &ttype, &tid, &outcome, &detail, &rowPrev, &rowHash, &keyID); err != nil {
			return Verification{}, fmt.Errorf("read the audit chain: %w", err)
		}
		if !sawHead {
			sawHead, want = true, prunedSeq+1
		}
		if seq == nil { // a head without records
			break
		}
		v.Checked++
		if v.FirstSeq == 0 {
			v.FirstSeq = *seq
			prev = rowPrev
			if *seq == 1 && !bytes.Equal(rowPrev, genesis) {
				fail(1, "the first record does not start the chain")
			}
			if *seq == prunedSeq+1 {
				checkCut(keys, tx.Tenant, prunedSeq, prunedKey, prunedMAC, rowPrev, *keyID != "", fail)
				checkAnchor(prunedSeq, rowPrev)
			}
		}
		v.LastSeq = *seq
		r := Record{Seq: *seq, At: *at, PrincipalKind: *kind, PrincipalID: *pid, Action: *action,
			TargetType: *ttype, TargetID: *tid, Outcome: *outcome, Detail: []byte(*detail)}
		switch {
		case *seq != want:
			fail(want, "record %d is missing (found %d in its place)", want, *seq)
		case !bytes.Equal(rowPrev, prev):
			fail(*seq, "record %d does not follow record %d", *seq, *seq-1)
		case *keyID == "":
			v.Legacy++
			if !bytes.Equal(legacyHash(rowPrev, r), rowHash) {
				fail(*seq, "record %d was modified", *seq)
			}
		default:
			mac, ok := keys.recordMAC(*keyID, tx.Tenant, rowPrev, r)
			switch {
			case !ok:
				fail(*seq, "record %d is signed under audit key %s, which this server does not have (COMPOSER_AUDIT_KEY)", *seq, *keyID)
			case !hmac.Equal(mac, rowHash):
				fail(*seq, "record %d was modified", *seq)
			}
		}
		lastKeyed = *keyID != ""
		switch {
		case lastKeyed:
			unvouched = 0
		case unvouched == 0:
			unvouched = *seq
		}
		checkAnchor(*seq, rowHash)
		prev, want = rowHash, *seq+1
	}
	if err := rows.Err(); err != nil {
		return Verification{}, fmt.Errorf("read the audit chain: %w", err)
	}
	if !sawHead || v.HeadSeq == 0 && v.Checked == 0 {
		return Verification{Valid: true}, nil // nothing was ever recorded
	}
	switch {
	case v.Checked == 0 && v.HeadSeq != prunedSeq:
		fail(prunedSeq+1, "records after %d are missing (the head is at %d)", prunedSeq, v.HeadSeq)
	case v.Checked == 0:
		// Retention deleted every record: its mark vouches for the head.
		checkCut(keys, tx.Tenant, prunedSeq, prunedKey, prunedMAC, v.HeadHash, headKeyID != "", fail)
		checkAnchor(prunedSeq, v.HeadHash)
	case v.LastSeq != v.HeadSeq:
		fail(v.LastSeq+1, "records after %d are missing (the head is at %d)", v.LastSeq, v.HeadSeq)
	case !bytes.Equal(prev, v.HeadHash):
		fail(v.HeadSeq, "record %d is not the head's", v.HeadSeq)
	case !lastKeyed:
		fail(unvouched, "records %d to %d are not keyed, and no keyed record follows them: nothing authenticates them "+
			"(records written by a binary without the audit key are vouched for by the tenant's next record; records rewritten without the key stay so)",
			unvouched, v.LastSeq)
	}
	if v.Checked > 0 && lastKeyed || v.Checked == 0 && headKeyID != "" {
		mac, ok := keys.headMAC(headKeyID, tx.Tenant, v.HeadSeq, v.HeadHash)
		if !ok || headMAC == nil || !hmac.Equal(mac, headMAC) {
			fail(v.HeadSeq+1, "the chain's head (seq %d) is not one the server wrote: records after %d may have been deleted", v.HeadSeq, v.HeadSeq)
		}
	}
	if anchor != nil {
		switch {
		case anchor.Seq > v.HeadSeq:
			fail(v.HeadSeq+1, "the chain ends at %d, before the anchored record %d: records were deleted", v.HeadSeq, anchor.Seq)
		case anchor.Seq < prunedSeq:
			v.AnchorPruned = true
		}
	}
	v.Valid = !broken
	return v, nil
}

// checkCut checks retention's mark of a chain whose records up to pruned
// were deleted: a MAC of the cut and of the hash of the record at it (the
// first kept record's prev hash, or the head's). A chain cut before it was
// keyed has no mark; a keyed one must.
func checkCut(keys *Keyring, tenant uuid.UUID, pruned int64, keyID string, mark, hash []byte, keyed bool, fail func(int64, string, ...any)) {
	if pruned == 0 {
		return
	}
	if mark == nil {
		if keyed {
			fail(pruned+1, "records up to %d were deleted, but not by retention (no retention mark)", pruned)
		}
		return
	}
	mac, ok := keys.prunedMAC(keyID, tenant, pruned, hash)
	switch {
	case !ok:
		fail(pruned+1, "retention's mark is signed under audit key %s, which this server does not have (COMPOSER_AUDIT_KEY)", keyID)
	case !hmac.Equal(mac, mark):
		fail(pruned+1, "records up to %d were deleted, but not by retention (its mark does not match)", pruned)
	}
}

// Filter narrows List; zero fields match everything.
type Filter struct {
	Action, PrincipalKind, PrincipalID, TargetType, TargetID string
	Since, Until                                             *time.Time
}

// List returns up to n of tx's tenant's records, newest first, older
// than seq before (0: from the newest), that match f.
func List(ctx context.Context, tx *pg.Tx, f Filter, before int64, n int) ([]Record, error) {
	sql := qListColumns
	args := []any{tx.Tenant}
	add := func(cond string, v any) {
		args = append(args, v)
		sql += fmt.Sprintf(" AND "+cond, len(args))
	}
	if before > 0 {
		add("a.seq < $%d", before)
	}
	if f.Action != "" {
		add("a.action = $%d", f.Action)
	}
	if f.PrincipalKind != "" {
		add("a.principal_kind = $%d", f.PrincipalKind)
	}
	if f.PrincipalID != "" {
		add("a.principal_id = $%d", f.PrincipalID)
	}
	if f.TargetType != "" {
		add("a.target_type = $%d", f.TargetType)
	}
	if f.TargetID != "" {
		add("a.target_id = $%d", f.TargetID)
	}
	if f.Since != nil {
		add("a.at >= $%d", *f.Since)
	}
	if f.Until != nil {
		add("a.at < $%d", *f.Until)
	}
	args = append(args, n)
	sql += fmt.Sprintf(" ORDER BY a.seq DESC LIMIT $%d", len(args))
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list audit records: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var r Record
		var detail string
		err := row.Scan(&r.Seq, &r.At, &r.PrincipalKind, &r.PrincipalID, &r.Action, &r.TargetType, &r.TargetID, &r.Outcome, &detail,
			&r.Repeats, &r.LastRepeatAt)
		r.Detail = []byte(detail)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("list audit records: %w", err)
	}
	return out, nil
}

var errBroken = errors.New("audit chain broken")

// Err is nil for a valid chain, else an error naming where it breaks.
func (v Verification) Err() error {
	if v.Valid {
		return nil
	}
	return fmt.Errorf("%w at seq %d: %s", errBroken, v.BrokenAt, v.Problem)
}
