// Package migrations holds Composer's schema as ordered goose SQL files,
// embedded in the binary. Apply them with Up as the owner role
// (composer_owner); the roles themselves are cluster objects created by the
// operator (scripts/services.sh does it locally).
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// FS returns the embedded migration files.
func FS() embed.FS { return files }

func provider(db *sql.DB, opts ...goose.ProviderOption) (*goose.Provider, error) {
	p, err := goose.NewProvider(goose.DialectPostgres, db, files, append(opts, goose.WithDisableGlobalRegistry(true))...)
	if err != nil {
		return nil, fmt.Errorf("migration provider: %w", err)
	}
	return p, nil
}

// Up applies every pending migration. A session advisory lock makes
// concurrent callers (several replicas starting at once) apply them once.
func Up(ctx context.Context, db *sql.DB) ([]*goose.MigrationResult, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("migration lock: %w", err)
	}
	p, err := provider(db, goose.WithSessionLocker(locker))
	if err != nil {
		return nil, err
	}
	res, err := p.Up(ctx)
	if err != nil {
		return res, fmt.Errorf("apply migrations: %w", err)
	}
	return res, nil
}

// Latest is the version of the newest embedded migration: the schema
// version this binary expects.
func Latest() int64 {
	entries, err := files.ReadDir(".")
	if err != nil {
		return 0
	}
	var v int64
	for _, e := range entries {
		if n, err := goose.NumericComponent(e.Name()); err == nil {
			v = max(v, n)
		}
	}
	return v
}

// Status reads, without changing anything, which embedded migrations the
// database has applied (and when) and which are pending, oldest first.
func Status(ctx context.Context, db *sql.DB) ([]*goose.MigrationStatus, error) {
	p, err := provider(db)
	if err != nil {
		return nil, err
	}
	st, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration status: %w", err)
	}
	return st, nil
}
