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
	"fmt"

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
	switch u := v.(type) {
	case uuid.UUID:
		return p.next.Encode(value(u), buf)
	case *uuid.UUID:
		if u == nil {
			return nil, nil // NULL
		}
		return p.next.Encode(value(*u), buf)
	}
	return nil, fmt.Errorf("pguuid: cannot encode %T", v)
}

// tryWrapEncode takes uuid.UUID and *uuid.UUID (the nullable columns'
// parameters: pgx does not unwrap pointers to Valuers itself). Where the
// parameter is not a uuid (a text cast, say) the uuid codec refuses the
// wrapped value and pgx goes on to the driver.Valuer, as without this.
func tryWrapEncode(v any) (pgtype.WrappedEncodePlanNextSetter, any, bool) {
	switch u := v.(type) {
	case uuid.UUID:
		return &encodePlan{}, value(u), true
	case *uuid.UUID:
		if u != nil {
			return &encodePlan{}, value(*u), true
		}
	}
	return nil, nil, false
}
