package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/internal/pg"
)

// genesis is the prev hash of a chain's first record.
var genesis = make([]byte, 32)

// Verification is the result of checking a tenant's chain.
type Verification struct {
	// Valid: every kept record hashes to what it stores, follows the one
	// before it, and the chain ends at the head.
	Valid bool
	// Checked is how many records were read; FirstSeq and LastSeq the
	// kept range (0 when there is none).
	Checked           int
	FirstSeq, LastSeq int64
	// BrokenAt is the first seq at which the chain does not hold, and
	// Problem says how (empty when valid).
	BrokenAt int64
	Problem  string
}

// Verify checks the chain of tx's tenant from its oldest kept record
// (seq pruned_seq + 1, whose stored prev hash is trusted: the records
// before it were deleted by retention) to the head: it detects a record
// modified (its hash), deleted (a gap in seq, or the head beyond the last
// record) and reordered (seq or prev hash out of place). The head and the
// records are read in one statement, so appends and pruning running
// meanwhile cannot make a valid chain look broken.
func Verify(ctx context.Context, tx *pg.Tx) (Verification, error) {
	rows, err := tx.Query(ctx, qVerify, tx.Tenant)
	if err != nil {
		return Verification{}, fmt.Errorf("read the audit chain: %w", err)
	}
	defer rows.Close()
	var (
		v                  Verification
		headSeq, prunedSeq int64
		headHash, prev     []byte
		sawHead, broken    bool
		want               int64
	)
	fail := func(seq int64, format string, args ...any) {
		if !broken {
			broken, v.BrokenAt, v.Problem = true, seq, fmt.Sprintf(format, args...)
		}
	}
	for rows.Next() {
		var (
			seq                                            *int64
			at                                             *time.Time
			kind, pid, action, ttype, tid, outcome, detail *string
			rowPrev, rowHash                               []byte
		)
		if err := rows.Scan(&headSeq, &headHash, &prunedSeq, &seq, &at, &kind, &pid, &action, &ttype, &tid, &outcome, &detail, &rowPrev, &rowHash); err != nil {
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
		}
		v.LastSeq = *seq
		r := Record{Seq: *seq, At: *at, PrincipalKind: *kind, PrincipalID: *pid, Action: *action,
			TargetType: *ttype, TargetID: *tid, Outcome: *outcome, Detail: []byte(*detail)}
		switch {
		case *seq != want:
			fail(want, "record %d is missing (found %d in its place)", want, *seq)
		case !bytes.Equal(rowPrev, prev):
			fail(*seq, "record %d does not follow record %d", *seq, *seq-1)
		case !bytes.Equal(Hash(rowPrev, r), rowHash):
			fail(*seq, "record %d was modified", *seq)
		}
		prev, want = rowHash, *seq+1
	}
	if err := rows.Err(); err != nil {
		return Verification{}, fmt.Errorf("read the audit chain: %w", err)
	}
	if !sawHead {
		return Verification{Valid: true}, nil // nothing was ever recorded
	}
	if v.LastSeq != headSeq {
		fail(v.LastSeq+1, "records after %d are missing (the head is at %d)", v.LastSeq, headSeq)
	} else if !bytes.Equal(prev, headHash) {
		fail(headSeq, "record %d is not the head's", headSeq)
	}
	v.Valid = !broken
	return v, nil
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
		add("seq < $%d", before)
	}
	if f.Action != "" {
		add("action = $%d", f.Action)
	}
	if f.PrincipalKind != "" {
		add("principal_kind = $%d", f.PrincipalKind)
	}
	if f.PrincipalID != "" {
		add("principal_id = $%d", f.PrincipalID)
	}
	if f.TargetType != "" {
		add("target_type = $%d", f.TargetType)
	}
	if f.TargetID != "" {
		add("target_id = $%d", f.TargetID)
	}
	if f.Since != nil {
		add("at >= $%d", *f.Since)
	}
	if f.Until != nil {
		add("at < $%d", *f.Until)
	}
	args = append(args, n)
	sql += fmt.Sprintf(" ORDER BY seq DESC LIMIT $%d", len(args))
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list audit records: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var r Record
		var detail string
		err := row.Scan(&r.Seq, &r.At, &r.PrincipalKind, &r.PrincipalID, &r.Action, &r.TargetType, &r.TargetID, &r.Outcome, &detail)
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
