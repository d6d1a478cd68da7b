package main

import (
	"context"
	"database/sql"
	"fmt"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver for goose
	"go.uber.org/zap"

	"github.com/composer-dev/composer/migrations"
)

// runMigrate applies the embedded migrations as the owner role.
func runMigrate(ctx context.Context, env *environment, _ []string) error {
	return migrate(ctx, env)
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
