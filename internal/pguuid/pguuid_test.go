package pguuid_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/pguuid"
	"github.com/composer-dev/composer/internal/testenv"
)

// TestUUIDsRoundTrip: with the encoding registered (testenv's pools do as
// the server's), uuids, pointers to them, NULLs and arrays of them reach
// PostgreSQL as the same uuids.
func TestUUIDsRoundTrip(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	ctx := context.Background()
	u, v := uuid.New(), uuid.Must(uuid.NewV7())

	var text string
	require.NoError(t, env.System.QueryRow(ctx, `SELECT $1::uuid::text`, u).Scan(&text))
	assert.Equal(t, u.String(), text)

	var back uuid.UUID
	require.NoError(t, env.System.QueryRow(ctx, `SELECT $1::uuid`, &v).Scan(&back))
	assert.Equal(t, v, back)

	var isNull bool
	require.NoError(t, env.System.QueryRow(ctx, `SELECT $1::uuid IS NULL`, (*uuid.UUID)(nil)).Scan(&isNull))
	assert.True(t, isNull)

	var arr []uuid.UUID
	require.NoError(t, env.System.QueryRow(ctx, `SELECT $1::uuid[]`, []uuid.UUID{u, v}).Scan(&arr))
	assert.Equal(t, []uuid.UUID{u, v}, arr)

	var eq bool
	require.NoError(t, env.System.QueryRow(ctx, `SELECT $1::uuid = $2::text::uuid`, u, u.String()).Scan(&eq))
	assert.True(t, eq)
	require.NoError(t, env.System.QueryRow(ctx, `SELECT $1::text`, u).Scan(&text))
	assert.Equal(t, u.String(), text, "a uuid given to a text parameter is still its text")

	// And the pools really use the registered plan (the round trips above
	// pass through pgx's fallback as well).
	conn, err := env.System.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for _, v := range []any{u, &u} {
		plan := conn.Conn().TypeMap().PlanEncode(pgtype.UUIDOID, pgtype.BinaryFormatCode, v)
		assert.Equal(t, "*pguuid.encodePlan", fmt.Sprintf("%T", plan), "%T", v)
	}
}

// BenchmarkEncodeUUID: a uuid parameter, encoded through the registered
// plan and through pgx's fallback (driver.Valuer, as text).
func BenchmarkEncodeUUID(b *testing.B) {
	u := uuid.New()
	for _, registered := range []bool{false, true} {
		m := pgtype.NewMap()
		name := "valuer"
		if registered {
			pguuid.Register(m)
			name = "registered"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, 64)
			for b.Loop() {
				var err error
				if buf, err = m.Encode(pgtype.UUIDOID, pgtype.BinaryFormatCode, u, buf[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
