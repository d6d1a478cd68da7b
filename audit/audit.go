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
}

// Entry is the record an action in progress will write: created by the
// API for each audited request, carried in its context, appended by the
// first transaction that passes the request's authorization and commits
// (Seal), or on its own once the action ended without one (Finish).
// Safe for concurrent use.
type Entry struct {
	mu     sync.Mutex
	tenant uuid.UUID
	rec    Record
	done   bool
	skip   bool
}

// NewEntry starts the record of action by a principal of tenant.
func NewEntry(tenant uuid.UUID, kind, id, action, targetType, targetID string, detail map[string]any) *Entry {
	return &Entry{tenant: tenant, rec: Record{PrincipalKind: kind, PrincipalID: clip(id, maxString),
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

// Seal makes tx carry ctx's entry: its record is appended as the last
// statement before tx's COMMIT, unless another transaction of the action
// committed it first. Called by the API's authorization gate in the
// transaction the action runs in; no-op without an entry.
func Seal(ctx context.Context, tx *pg.Tx) {
	e := From(ctx)
	if e == nil || tx.Tenant != e.tenant {
		return
	}
	e.mu.Lock()
	if e.done {
		e.mu.Unlock()
		return
	}
	e.mu.Unlock()
	tx.BeforeCommit(func(b *pgx.Batch) {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.done || e.skip {
			return
		}
		r := e.rec
		r.Outcome = OK
		queueAppend(b, e.tenant, r)
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
// it left nothing). Returns whether it wrote a record.
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
	werr := db.WithTenant(ctx, e.tenant, func(ctx context.Context, tx *pg.Tx) error {
		b := &pgx.Batch{}
		queueAppend(b, e.tenant, r)
		return tx.SendBatch(ctx, b).Close()
	})
	if werr != nil {
		return false, fmt.Errorf("record %s (%s): %w", r.Action, r.Outcome, werr)
	}
	e.mu.Lock()
	e.done = true
	e.mu.Unlock()
	return true, nil
}

func queueAppend(b *pgx.Batch, tenant uuid.UUID, r Record) {
	b.Queue(qAppend, tenant, r.PrincipalKind, r.PrincipalID, r.Action, r.TargetType, r.TargetID, r.Outcome,
		string(r.Detail), Body(r))
}

// Append writes r in tx now (for callers outside the API: r.Outcome must
// be set). The tenant's chain head stays locked until tx ends.
func Append(ctx context.Context, tx *pg.Tx, r Record) error {
	if r.Detail == nil {
		r.Detail = Detail(nil)
	}
	b := &pgx.Batch{}
	queueAppend(b, tx.Tenant, r)
	return tx.SendBatch(ctx, b).Close()
}

// Body is the canonical encoding of a record's fields other than its
// seq, time and chain: each field as a 4-byte big-endian length and its
// bytes, in a fixed order. A record's hash is
// sha256(prev_hash || int64 seq || int64 unix microseconds || Body).
func Body(r Record) []byte {
	var out []byte
	for _, f := range []string{r.PrincipalKind, r.PrincipalID, r.Action, r.TargetType, r.TargetID, r.Outcome, string(r.Detail)} {
		out = binary.BigEndian.AppendUint32(out, uint32(len(f)))
		out = append(out, f...)
	}
	return out
}

// Hash is a record's hash after prev.
func Hash(prev []byte, r Record) []byte {
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
