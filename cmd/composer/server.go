package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/app"
)

func runServer(ctx context.Context, env *environment, args []string) error {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	d, err := app.Open(ctx, env.cfg, env.log, true)
	if err != nil {
		return err
	}
	defer d.Close()
	s, err := app.NewServer(d, app.ServerOptions{})
	if err != nil {
		return err
	}
	return s.Run(ctx, env.cfg.HTTPAddr, nil)
}

func runWorker(ctx context.Context, env *environment, args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	queues := fs.String("queues", strings.Join(env.cfg.WorkerQueues, ","), "comma-separated queues to serve")
	concurrency := fs.Int("concurrency", env.cfg.WorkerConcurrency, "execution slots")
	if err := fs.Parse(args); err != nil {
		return err
	}
	env.cfg.WorkerQueues = splitList(*queues)
	env.cfg.WorkerConcurrency = *concurrency
	if env.cfg.WorkerToken == "" {
		return fmt.Errorf("COMPOSER_WORKER_TOKEN must be set to the platform worker token")
	}
	d, err := app.Open(ctx, env.cfg, env.log, false)
	if err != nil {
		return err
	}
	defer d.Close()
	w, err := app.NewWorker(d, env.cfg.ServerURL)
	if err != nil {
		return err
	}
	if env.cfg.AdminAddr != "" {
		addr, err := app.ServeAdmin(ctx, env.cfg.AdminAddr, app.WorkerAdmin(d))
		if err != nil {
			return err
		}
		env.log.Info("admin listening", zap.String("addr", addr))
	}
	return w.Run(ctx)
}

// runDev runs migrations, the server, a worker and a demo tenant in one
// process.
func runDev(ctx context.Context, env *environment, args []string) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := &env.cfg
	if cfg.WorkerToken == "" {
		cfg.WorkerToken = "composer-dev-worker-token"
	}
	if cfg.JWTHS256Secret == "" {
		cfg.JWTHS256Secret = app.DevJWTSecret
	}
	if len(cfg.AllowPrivateNetworks) == 0 {
		cfg.AllowPrivateNetworks = []string{"127.0.0.0/8", "::1/128"}
	}
	if len(cfg.WebhookSecretKeys) == 0 {
		cfg.WebhookSecretKeys = []string{app.DevWebhookKey}
	}
	if len(cfg.AuditKeys) == 0 {
		cfg.AuditKeys = []string{app.DevAuditKey}
	}
	if cfg.SweepInterval > time.Second {
		cfg.SweepInterval = time.Second
	}
	if err := migrate(ctx, env); err != nil {
		return err
	}
	d, err := app.Open(ctx, *cfg, env.log, true)
	if err != nil {
		return err
	}
	defer d.Close()
	s, err := app.NewServer(d, app.ServerOptions{})
	if err != nil {
		return err
	}
	tenant, firstKey, err := app.EnsureDemoTenant(ctx, d)
	if err != nil {
		return err
	}
	token, err := app.DevToken(ctx, d, tenant, app.DemoOwner, auth.RoleOwner, 30*24*time.Hour)
	if err != nil {
		return err
	}
	// Credentials go to stdout for the person at the terminal, never to logs.
	fmt.Printf("\ncomposer dev: demo tenant %s\n", tenant)
	if firstKey != "" {
		fmt.Printf("  first owner API key (shown once): %s\n", firstKey)
	}
	fmt.Printf("  owner token (30 days): %s\n\n", token)
	base := "http://" + cfg.HTTPAddr
	if err := app.EnsureDemoWorkflow(ctx, s.Coordinator, tenant, base); err != nil {
		return err
	}
	s.MountDev(tenant)
	w, err := app.NewWorker(d, base)
	if err != nil {
		return err
	}
	env.log.Info("composer dev is up", zap.Stringer("demo_tenant", tenant), zap.String("url", base),
		zap.String("try", `curl -s -X POST `+base+`/v1/dev/runs -d '{"workflow":"hello","input":{"name":"Ada","loud":true}}'`))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = w.Run(ctx) }()
	err = s.Run(ctx, cfg.HTTPAddr, nil)
	wg.Wait()
	return err
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
