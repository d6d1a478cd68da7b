package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/pressly/goose/v3"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver for goose
	"go.uber.org/zap"

	"github.com/composer-dev/composer/migrations"
)

// runMigrate applies the embedded migrations as the owner role; `migrate
// status` lists which are applied and which pending, changing nothing.
func runMigrate(ctx context.Context, env *environment, args []string) error {
	if len(args) > 0 && args[0] == "status" {
		return migrateStatus(ctx, env, os.Stdout)
	}
	if len(args) > 0 {
		return fmt.Errorf("migrate: unknown argument %q (use `migrate` or `migrate status`)", args[0])
	}
	return migrate(ctx, env)
}

func migrateStatus(ctx context.Context, env *environment, w io.Writer) error {
	db, err := sql.Open("pgx", env.cfg.MigrateDatabaseURL)
	if err != nil {
		return fmt.Errorf("COMPOSER_MIGRATE_DATABASE_URL: %w", err)
	}
	defer db.Close()
	st, err := migrations.Status(ctx, db)
	if err != nil {
		return err
	}
	pending := 0
	for _, m := range st {
		when := ""
		if m.State == goose.StateApplied {
			when = m.AppliedAt.UTC().Format(time.RFC3339)
		} else {
			pending++
		}
		fmt.Fprintf(w, "%05d  %-8s %-20s %s\n", m.Source.Version, m.State, when, filepath.Base(m.Source.Path))
	}
	fmt.Fprintf(w, "%d migrations, %d pending; this binary expects schema %d\n", len(st), pending, migrations.Latest())
	return nil
}

func migrate(ctx context.Context, env *environment) error {
	db, err := sql.Open("pgx", env.cfg.MigrateDatabaseURL)
	if err != nil {
		return fmt.Errorf("COMPOSER_MIGRATE_DATABASE_URL: %w", err)
	}
	defer db.Close()
	res, err := migrations.Up(ctx, db)
	for _, r := range res {
		env.log.Info("migration applied", zap.String("file", r.Source.Path), zap.Duration("took", r.Duration))
	}
	if err != nil {
		return err
	}
	env.log.Info("schema is up to date", zap.Int("applied", len(res)))
	return nil
}
