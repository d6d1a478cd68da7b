package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/internal/app"
)

// runCredentials is `composer credentials`: lists the stored workflow
// versions that write a credential into an http step literally (published
// before publishing refused them), one line each, so their tenants can move
// each into a secret and publish a new version. It exits 1 when it finds
// any. Versions are immutable and a migration has no key to seal them with,
// so they stay stored as published (and masked for those who may not change
// the workflow).
func runCredentials(ctx context.Context, env *environment, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("credentials: takes no arguments")
	}
	d, err := app.Open(ctx, env.cfg, env.log, true)
	if err != nil {
		return err
	}
	defer d.Close()
	n := 0
	err = engine.StoredCredentials(ctx, d.DB, func(c engine.StoredCredential) {
		n++
		fmt.Fprintf(os.Stdout, "tenant %s workflow %s version %d: %s\n", c.Tenant, c.Workflow, c.Version, strings.Join(c.Fields, ", "))
	})
	if err != nil {
		return err
	}
	if n > 0 {
		return fmt.Errorf("%d stored versions write credentials literally: move each into a secret ({{ secrets.NAME }}) and publish a new version", n)
	}
	fmt.Fprintln(os.Stdout, "no stored version writes a credential literally")
	return nil
}
