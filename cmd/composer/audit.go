package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/google/uuid"

	"github.com/composer-dev/composer/audit"
	"github.com/composer-dev/composer/internal/app"
	"github.com/composer-dev/composer/internal/pg"
)

// runAudit is `composer audit verify --tenant ID`: checks a tenant's audit
// hash chain (as its own tenant, through row-level security, like the
// auditVerify query) and exits non-zero when it is broken.
func runAudit(ctx context.Context, env *environment, args []string) error {
	if len(args) == 0 || args[0] != "verify" {
		return fmt.Errorf("audit: use `audit verify --tenant ID`")
	}
	fs := flag.NewFlagSet("audit verify", flag.ContinueOnError)
	tenant := fs.String("tenant", "", "tenant id (required)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	id, err := uuid.Parse(*tenant)
	if err != nil {
		return fmt.Errorf("--tenant: not a tenant id")
	}
	d, err := app.Open(ctx, env.cfg, env.log, true)
	if err != nil {
		return err
	}
	defer d.Close()
	var v audit.Verification
	if err := d.DB.WithTenant(ctx, id, func(ctx context.Context, tx *pg.Tx) error {
		v, err = audit.Verify(ctx, tx)
		return err
	}); err != nil {
		return err
	}
	if !v.Valid {
		fmt.Fprintf(os.Stdout, "audit chain of %s BROKEN at seq %d: %s (%d records checked)\n", id, v.BrokenAt, v.Problem, v.Checked)
		return v.Err()
	}
	fmt.Fprintf(os.Stdout, "audit chain of %s valid: %d records, seq %d to %d\n", id, v.Checked, v.FirstSeq, v.LastSeq)
	return nil
}
