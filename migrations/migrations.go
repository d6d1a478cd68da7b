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

// Up applies every pending migration. A session advisory lock makes
// concurrent callers (several replicas starting at once) apply them once.
func Up(ctx context.Context, db *sql.DB) ([]*goose.MigrationResult, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files,
		goose.WithSessionLocker(locker), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return nil, fmt.Errorf("migration provider: %w", err)
	}
	res, err := p.Up(ctx)
	if err != nil {
		return res, fmt.Errorf("apply migrations: %w", err)
	}
	return res, nil
}
