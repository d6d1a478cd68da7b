package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/app"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/tenants"
)

// runTenants administers tenants: `composer tenants create --name … --plan …`
// prints the tenant id and a first owner API key (shown once).
func runTenants(ctx context.Context, env *environment, args []string) error {
	if len(args) > 0 && args[0] == "update" {
		return runTenantsUpdate(ctx, env, args[1:])
	}
	if len(args) == 0 || args[0] != "create" {
		return fmt.Errorf("usage: composer tenants create --name NAME [--plan PLAN] [--shards N]\n" +
			"       composer tenants update --tenant ID [--plan PLAN] [--shards N] [--limits '{\"max_running_tasks\": 20}']")
	}
	fs := flag.NewFlagSet("tenants create", flag.ContinueOnError)
	name := fs.String("name", "", "tenant name (required)")
	plan := fs.String("plan", "free", "plan")
	shards := fs.Int("shards", env.cfg.DefaultStreamShards, "stream shards per queue")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	d, err := app.Open(ctx, env.cfg, env.log, true)
	if err != nil {
		return err
	}
	defer d.Close()
	p, err := app.ProvisionTenant(ctx, d, tenants.CreateParams{Name: *name, Plan: *plan, StreamShards: *shards}, "composer tenants create")
	if errs.KindOf(err) == errs.OutcomeUnknown {
		// (A lost connection before the commit is retried by the database
		// layer; this is the one case it cannot decide.)
		return fmt.Errorf("the database's answer to the commit was lost: tenant %q may or may not have been created, and its key "+
			"cannot be shown; look for it (SELECT id, created_at FROM tenants WHERE name = '…') before creating it again: %w", *name, err)
	}
	if err != nil {
		return err
	}
	enc := json.NewEncoder(env.out)
	enc.SetIndent("", "  ")
	return enc.Encode(map[string]any{"tenant_id": p.Tenant.ID, "name": p.Tenant.Name, "plan": p.Tenant.Plan,
		"stream_shards": p.Tenant.StreamShards, "api_key": p.APIKey, "api_key_id": p.KeyID,
		"note": "the API key is shown once; store it now"})
}

// runToken mints a development user token (HS256): `composer token
// --tenant … --role …`. The subject becomes a member with that role.
func runToken(ctx context.Context, env *environment, args []string) error {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	tenant := fs.String("tenant", "", "tenant id (required)")
	role := fs.String("role", "developer", "owner, admin, developer or viewer")
	subject := fs.String("subject", "dev@composer.local", "the user the token names")
	ttl := fs.Duration("ttl", 24*time.Hour, "lifetime")
	if err := fs.Parse(args); err != nil {
		return err
	}
	id, err := uuid.Parse(*tenant)
	if err != nil {
		return fmt.Errorf("--tenant: not a tenant id")
	}
	if env.cfg.JWTHS256Secret == "" && env.cfg.Dev {
		env.cfg.JWTHS256Secret = app.DevJWTSecret
	}
	d, err := app.Open(ctx, env.cfg, env.log, true)
	if err != nil {
		return err
	}
	defer d.Close()
	tok, err := app.DevToken(ctx, d, id, *subject, auth.Role(*role), *ttl)
	if err != nil {
		return err
	}
	fmt.Println(tok)
	return nil
}

// runTenantsUpdate changes a tenant's plan, limit overrides or shards.
func runTenantsUpdate(ctx context.Context, env *environment, args []string) error {
	fs := flag.NewFlagSet("tenants update", flag.ContinueOnError)
	tenant := fs.String("tenant", "", "tenant id (required)")
	plan := fs.String("plan", "", "new plan")
	limits := fs.String("limits", "", `limit overrides as JSON: max_running_tasks, starts_per_second, start_burst, max_queued_tasks, weight`)
	shards := fs.Int("shards", 0, "stream shards per queue for new tasks")
	if err := fs.Parse(args); err != nil {
		return err
	}
	id, err := uuid.Parse(*tenant)
	if err != nil {
		return fmt.Errorf("--tenant: not a tenant id")
	}
	var over *tenants.Limits
	if *limits != "" {
		over = &tenants.Limits{}
		dec := json.NewDecoder(strings.NewReader(*limits))
		dec.DisallowUnknownFields()
		if err := dec.Decode(over); err != nil {
			return fmt.Errorf("--limits: %w", err)
		}
	}
	d, err := app.Open(ctx, env.cfg, env.log, true)
	if err != nil {
		return err
	}
	defer d.Close()
	return tenants.Update(ctx, d.DB, id, tenants.UpdateParams{Plan: *plan, Limits: over, StreamShards: *shards})
}
