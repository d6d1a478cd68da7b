package audit

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

// Outcomes other than an error code.
const (
	// OK: the action committed, with its record in the same transaction.
	OK = "ok"
	// Unchanged: the action succeeded without committing a change (an
	// ignored signal, a replayed idempotent request); recorded on its own.
	Unchanged = "unchanged"
)

// Bounds of a record's fields.
const (
	MaxDetail   = 2048
	maxString   = 255
	maxDetailSt = 200 // a string inside the detail
)

// Record is one audited action.
type Record struct {
	Seq           int64
	At            time.Time
	PrincipalKind string // "user" or "api_key"
	PrincipalID   string // the user's subject or the key's id
	Action        string // the mutation's name
	TargetType    string
	TargetID      string
	Outcome       string // OK, Unchanged or an error code
	Detail        json.RawMessage
	// Repeats counts the refusals coalesced into this one (see
	// RefusalWindow), and LastRepeatAt is the newest of them (nil without
	// any). Not covered by the chain: the count grows after the record.
	Repeats      int64
	LastRepeatAt *time.Time
}

// RefusalWindow is how long refusals coalesce: of the refusals and
// failures of one principal, action and outcome in one such window (fixed
// windows: :00, :10, … UTC), the first is recorded in the chain and the rest
// only counted into it, so a principal hammering a mutation it may not
// call writes one record per window, not one per call.
const RefusalWindow = 10 * time.Minute

// Entry is the record an action in progress will write: created by the
// API for each audited request, carried in its context, appended by the
// first transaction that passes the request's authorization and commits
// (Seal), or on its own once the action ended without one (Finish).
// Safe for concurrent use.
type Entry struct {
	mu       sync.Mutex
	keys     *Keyring
	tenant   uuid.UUID
	rec      Record
	done     bool
	skip     bool
	sealedIn *pg.Tx // the transaction that carries the record (one append each)
}

// NewEntry starts the record of action by a principal of tenant, to be
// signed under keys.
func NewEntry(keys *Keyring, tenant uuid.UUID, kind, id, action, targetType, targetID string, detail map[string]any) *Entry {
	return &Entry{keys: keys, tenant: tenant, rec: Record{PrincipalKind: kind, PrincipalID: clip(id, maxString),
		Action: action, TargetType: clip(targetType, 64), TargetID: clip(targetID, maxString), Detail: Detail(detail)}}
}

type entryKey struct{}

// With returns ctx carrying e.
func With(ctx context.Context, e *Entry) context.Context {
	return context.WithValue(ctx, entryKey{}, e)
}

// From returns the entry ctx carries, or nil.
func From(ctx context.Context) *Entry {
	e, _ := ctx.Value(entryKey{}).(*Entry)
	return e
}

// Identify sets the target id of the action in ctx once it is known (an
// object the action creates), before its transaction commits. No-op
// without an entry.
func Identify(ctx context.Context, id string) {
	if e := From(ctx); e != nil {
		e.mu.Lock()
		e.rec.TargetID = clip(id, maxString)
		e.mu.Unlock()
	}
}

// Skip says that the action in ctx, should it succeed, is not one to
// record: it changed nothing an audit log is for (an event that resumed
// and cancelled no run). Called in the action's transaction before it
// commits; a failure is still recorded. No-op without an entry.
func Skip(ctx context.Context) {
	if e := From(ctx); e != nil {
		e.mu.Lock()
		e.skip = true
		e.mu.Unlock()
	}
}

// Seal makes tx carry ctx's entry: its record is appended at the end of
// tx, unless another transaction of the action committed it first — the
// chain head locked and read with tx's last statements, the record (its
// MAC computed here) written with COMMIT. Called by the API's
// authorization gate in the transaction the action runs in; no-op without
// an entry. A transaction sealed without a key fails.
func Seal(ctx context.Context, tx *pg.Tx) {
	e := From(ctx)
	if e == nil || tx.Tenant != e.tenant {
		return
	}
	e.mu.Lock()
	if e.done || e.sealedIn == tx {
		e.mu.Unlock()
		return
	}
	e.sealedIn = tx
	e.mu.Unlock()
	var a *appender
	tx.BeforeCommitRead(func(b *pgx.Batch) {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.done || e.skip {
			return
		}
		r := e.rec
		r.Outcome = OK
		a = &appender{keys: e.keys, tenant: e.tenant, rec: r}
		a.queueRead(b)
	}, func(b *pgx.Batch) {
		if a != nil {
			a.queueWrite(b)
		}
	})
	tx.AfterCommit(func() {
		e.mu.Lock()
		e.done = true
		e.mu.Unlock()
	})
}

// Finish records the action's end when no transaction of it committed
// the record: outcome Unchanged for a success (err nil), else the error's
// code, in a transaction of its own (the action's own was rolled back, so
// it left nothing). A refusal or failure is coalesced: the first of its
// principal, action and outcome in a RefusalWindow is appended, later ones
// only counted into it (Record.Repeats). Returns whether it appended a
// record.
func Finish(ctx context.Context, db *pg.DB, e *Entry, err error) (bool, error) {
	e.mu.Lock()
	if e.done || err == nil && e.skip {
		e.mu.Unlock()
		return false, nil
	}
	r := e.rec
	e.mu.Unlock()
	r.Outcome = Unchanged
	if err != nil {
		r.Outcome = string(errs.KindOf(err))
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var appended bool
	werr := db.WithTenant(ctx, e.tenant, func(ctx context.Context, tx *pg.Tx) error {
		appended = false
		a := &appender{keys: e.keys, tenant: e.tenant, rec: r}
		if err != nil {
			first, err := a.coalesce(ctx, tx)
			if err != nil || !first {
				return err
			}
		}
		appended = true
		return a.run(ctx, tx)
	})
	if werr != nil {
		return false, fmt.Errorf("record %s (%s): %w", r.Action, r.Outcome, werr)
	}
	e.mu.Lock()
	e.done = true
	e.mu.Unlock()
	return appended, nil
}

// Append writes r in tx now, signed under keys (for callers outside the
// API: r.Outcome must be set). The tenant's chain head stays locked until
// tx ends.
func Append(ctx context.Context, tx *pg.Tx, keys *Keyring, r Record) error {
	if r.Detail == nil {
		r.Detail = Detail(nil)
	}
	a := &appender{keys: keys, tenant: tx.Tenant, rec: r}
	return a.run(ctx, tx)
}

// appender appends one record in two steps: lock and read the tenant's
// chain head, then write the record and the head, with the MACs computed
// in between (in Go: the key never reaches the database).
type appender struct {
	keys   *Keyring
	tenant uuid.UUID
	rec    Record
	// read from the head: its seq and hash, and the new record's time
	// (the transaction's, never before the head's)
	seq  int64
	prev []byte
	at   time.Time
	// the refusal row whose first record this is (coalesce)
	window *time.Time
}

// queueRead queues the head's lock and read; with no key it queues a
// statement that fails instead, so the transaction rolls back rather than
// commit without its record.
func (a *appender) queueRead(b *pgx.Batch) {
	if a.keys == nil {
		b.Queue(qFailNoKey)
		return
	}
	b.Queue(qEnsureHead, a.tenant)
	b.Queue(qLockHead, a.tenant).QueryRow(func(row pgx.Row) error { return row.Scan(&a.seq, &a.prev, &a.at) })
}

// queueWrite queues the record's insert and the head's update (after a
// successful queueRead).
func (a *appender) queueWrite(b *pgx.Batch) {
	r := a.rec
	r.Seq, r.At = a.seq+1, a.at
	id := a.keys.SigningKeyID()
	hash, _ := a.keys.recordMAC(id, a.tenant, a.prev, r)
	head, _ := a.keys.headMAC(id, a.tenant, r.Seq, hash)
	b.Queue(qAppend, a.tenant, r.Seq, a.prev, hash, r.At, id, head,
		r.PrincipalKind, r.PrincipalID, r.Action, r.TargetType, r.TargetID, r.Outcome, string(r.Detail))
	if a.window != nil {
		b.Queue(qRefusalRecorded, a.tenant, r.PrincipalKind, r.PrincipalID, r.Action, r.Outcome, *a.window, r.Seq)
	}
}

// run appends in tx now: one round trip to lock and read the head, one to
// write.
func (a *appender) run(ctx context.Context, tx *pg.Tx) error {
	if a.keys == nil {
		return ErrNoKeyring
	}
	b := &pgx.Batch{}
	a.queueRead(b)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("lock the audit chain head: %w", err)
	}
	b = &pgx.Batch{}
	a.queueWrite(b)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("append to the audit chain: %w", err)
	}
	return nil
}

// coalesce counts a refusal into its principal's, action's and outcome's
// current window, and says whether it is the window's first (then it is
// to be appended). The window's row is locked until tx ends, so of
// concurrent refusals exactly one is the first.
func (a *appender) coalesce(ctx context.Context, tx *pg.Tx) (bool, error) {
	r := a.rec
	var window time.Time
	var repeats int64
	if err := tx.QueryRow(ctx, qCoalesceRefusal, a.tenant, r.PrincipalKind, r.PrincipalID, r.Action, r.Outcome,
		RefusalWindow.Seconds()).Scan(&window, &repeats); err != nil {
		return false, fmt.Errorf("count the refusal: %w", err)
	}
	a.window = &window
	return repeats == 0, nil
}

// Body is the canonical encoding of a record's fields other than its
// seq, time and chain: each field as a 4-byte big-endian length and its
// bytes, in a fixed order.
func Body(r Record) []byte {
	var out []byte
	for _, f := range []string{r.PrincipalKind, r.PrincipalID, r.Action, r.TargetType, r.TargetID, r.Outcome, string(r.Detail)} {
		out = binary.BigEndian.AppendUint32(out, uint32(len(f)))
		out = append(out, f...)
	}
	return out
}

// legacyHash is the unkeyed hash of a record written before the chain was
// keyed: sha256(prev_hash || int64 seq || int64 unix microseconds || Body).
func legacyHash(prev []byte, r Record) []byte {
	h := sha256.New()
	h.Write(prev)
	var n [16]byte
	binary.BigEndian.PutUint64(n[:8], uint64(r.Seq))
	binary.BigEndian.PutUint64(n[8:], uint64(r.At.UnixMicro()))
	h.Write(n[:])
	h.Write(Body(r))
	return h.Sum(nil)
}

// Detail encodes a record's detail: d's values as JSON with strings cut
// to 200 characters, and the whole dropped to {"truncated": true} past
// MaxDetail bytes. Callers pass only what may be kept (never a secret).
func Detail(d map[string]any) json.RawMessage {
	if len(d) == 0 {
		return json.RawMessage(`{}`)
	}
	bounded := make(map[string]any, len(d))
	for k, v := range d {
		bounded[k] = bound(v)
	}
	b, err := json.Marshal(bounded) // map keys sorted: canonical
	if err != nil || len(b) > MaxDetail {
		return json.RawMessage(`{"truncated":true}`)
	}
	return b
}

func bound(v any) any {
	switch x := v.(type) {
	case string:
		return clip(x, maxDetailSt)
	case []string:
		out := make([]string, 0, min(len(x), 32))
		for i, s := range x {
			if i == 32 {
				break
			}
			out = append(out, clip(s, maxDetailSt))
		}
		return out
	}
	return v
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return strings.ToValidUTF8(s, "")
}
