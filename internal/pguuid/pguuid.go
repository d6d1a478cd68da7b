// Package pguuid encodes github.com/google/uuid values as PostgreSQL uuids
// directly. pgx does not know the type: it falls back to its
// driver.Valuer, which formats the uuid as text, and encodes that string
// by planning the encoding again for every value — measured as a tenth of
// the server's CPU time on the step path (each transition sends a dozen
// uuids). Registered, a uuid.UUID is handed to pgx's own uuid codec as its
// 16 bytes.
package pguuid

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Register makes m encode uuid.UUID values as binary uuids.
func Register(m *pgtype.Map) {
	m.TryWrapEncodePlanFuncs = append([]pgtype.TryWrapEncodePlanFunc{tryWrapEncode}, m.TryWrapEncodePlanFuncs...)
}

// AfterConnect registers the encoding on a new connection (for
// pgxpool.Config.AfterConnect).
func AfterConnect(_ context.Context, c *pgx.Conn) error {
	Register(c.TypeMap())
	return nil
}

// value is a uuid.UUID as pgx's uuid codec takes it.
type value uuid.UUID

func (v value) UUIDValue() (pgtype.UUID, error) { return pgtype.UUID{Bytes: v, Valid: true}, nil }

type encodePlan struct{ next pgtype.EncodePlan }

func (p *encodePlan) SetNext(next pgtype.EncodePlan) { p.next = next }

func (p *encodePlan) Encode(v any, buf []byte) ([]byte, error) {
	return p.next.Encode(value(v.(uuid.UUID)), buf)
}

func tryWrapEncode(v any) (pgtype.WrappedEncodePlanNextSetter, any, bool) {
	if u, ok := v.(uuid.UUID); ok {
		return &encodePlan{}, value(u), true
	}
	return nil, nil, false
}
