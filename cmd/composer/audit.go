package main

import (
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/composer-dev/composer/audit"
	"github.com/composer-dev/composer/internal/app"
	"github.com/composer-dev/composer/internal/pg"
)

// runAudit is `composer audit verify --tenant ID [--anchor SEQ:HASH]`:
// checks a tenant's audit chain under COMPOSER_AUDIT_KEY (as its own
// tenant, through row-level security, like the auditVerify query), prints
// its head to anchor outside the database, and exits non-zero when it is
// broken.
func runAudit(ctx context.Context, env *environment, args []string) error {
	if len(args) == 0 || args[0] != "verify" {
		return fmt.Errorf("audit: use `audit verify --tenant ID`")
	}
	fs := flag.NewFlagSet("audit verify", flag.ContinueOnError)
	tenant := fs.String("tenant", "", "tenant id (required)")
	anchorFlag := fs.String("anchor", "", "SEQ:HASH, a head printed by an earlier verify: that record must be unchanged and the chain not cut back before it")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	id, err := uuid.Parse(*tenant)
	if err != nil {
		return fmt.Errorf("--tenant: not a tenant id")
	}
	var anchor *audit.Anchor
	if *anchorFlag != "" {
		seq, hash, _ := strings.Cut(*anchorFlag, ":")
		n, err := strconv.ParseInt(seq, 10, 64)
		h, herr := hex.DecodeString(hash)
		if err != nil || n < 1 || herr != nil || len(h) != 32 {
			return fmt.Errorf("--anchor: want SEQ:HASH (a seq and 64 hexadecimal digits), as an earlier verify printed")
		}
		anchor = &audit.Anchor{Seq: n, Hash: h}
	}
	d, err := app.Open(ctx, env.cfg, env.log, true)
	if err != nil {
		return err
	}
	defer d.Close()
	keys, err := app.AuditKeyring(d)
	if err != nil {
		return err
	}
	var v audit.Verification
	if err := d.DB.WithTenant(ctx, id, func(ctx context.Context, tx *pg.Tx) error {
		v, err = audit.Verify(ctx, tx, keys, anchor)
		return err
	}); err != nil {
		return err
	}
	if v.HeadSeq > 0 {
		defer fmt.Fprintf(os.Stdout, "head: %d:%x (keep it outside the database; verify --anchor it later)\n", v.HeadSeq, v.HeadHash)
	}
	if v.AnchorPruned {
		fmt.Fprintf(os.Stdout, "the anchor's record was deleted by retention: it was not checked (anchor a newer head)\n")
	}
	if !v.Valid {
		fmt.Fprintf(os.Stdout, "audit chain of %s BROKEN at seq %d: %s (%d records checked)\n", id, v.BrokenAt, v.Problem, v.Checked)
		return v.Err()
	}
	fmt.Fprintf(os.Stdout, "audit chain of %s valid: %d records, seq %d to %d\n", id, v.Checked, v.FirstSeq, v.LastSeq)
	return nil
}
