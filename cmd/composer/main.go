// Command composer is Composer's single binary: the server, the worker, the
// migrator and an all-in-one development mode. Run `composer help` for the
// subcommands; configuration comes from COMPOSER_* environment variables
// (see README.md).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/composer-dev/composer/internal/config"
	"github.com/composer-dev/composer/internal/telemetry"
)

type command struct {
	name, summary string
	run           func(ctx context.Context, env *environment, args []string) error
}

// environment is what every subcommand gets: configuration and logging,
// set up once.
type environment struct {
	cfg config.Config
	log *zap.Logger
	out io.Writer // what a command prints (os.Stdout)
}

func commands() []command {
	return []command{
		{"server", "run the GraphQL gateway, the task API and the background loops", runServer},
		{"worker", "run a worker pool: read task streams, lease, execute, report", runWorker},
		{"migrate", "apply the database migrations as the owner role; `migrate status` lists applied and pending ones", runMigrate},
		{"dev", "run everything in one process with a demo tenant (development)", runDev},
		{"bench", "run the end-to-end benchmarks against local PostgreSQL and Redis", runBench},
		{"tenants", "administer tenants: `tenants create --name N --plan P` prints its id and first API key", runTenants},
		{"token", "mint a development user token: `token --tenant ID --role ROLE`", runToken},
		{"audit", "check a tenant's audit chain: `audit verify --tenant ID [--anchor SEQ:HASH]` (exit 1 when broken)", runAudit},
		{"credentials", "list stored workflow versions that write credentials literally (exit 1 when any): move each into a secret", runCredentials},
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: composer <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(os.Stderr, "  %-11s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(os.Stderr, "  %-11s %s\n", "version", "print the build (module version, commit, Go) and the schema version it expects")
	fmt.Fprintln(os.Stderr, "\nConfiguration is read from COMPOSER_* environment variables; see README.md.")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "help" || os.Args[1] == "-h" || os.Args[1] == "--help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	name, args := os.Args[1], os.Args[2:]
	if name == "version" || name == "--version" {
		fmt.Println(versionLine())
		return
	}
	for _, c := range commands() {
		if c.name != name {
			continue
		}
		os.Exit(execute(c, args))
	}
	fmt.Fprintf(os.Stderr, "composer: unknown command %q\n\n", name)
	usage()
	os.Exit(2)
}

func execute(c command, args []string) int {
	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintf(os.Stderr, "composer: configuration: %v\n", err)
		return 2
	}
	if c.name == "dev" {
		cfg.Dev = true
	}
	log, err := telemetry.NewLogger(cfg.Dev, cfg.LogLevel)
	if err != nil {
		fmt.Fprintf(os.Stderr, "composer: logger: %v\n", err)
		return 2
	}
	defer log.Sync() //nolint:errcheck // stderr sync errors are not actionable

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	shutdown, err := telemetry.Setup(ctx, telemetry.Options{ServiceName: "composer-" + c.name, OTLPEndpoint: cfg.OTLPEndpoint})
	if err != nil {
		log.Error("telemetry setup failed", zap.Error(err))
		return 1
	}
	defer shutdown(context.Background()) //nolint:errcheck

	if err := c.run(ctx, &environment{cfg: cfg, log: log.Named(c.name), out: os.Stdout}, args); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("composer "+c.name+" failed", zap.Error(err))
		return 1
	}
	return 0
}
