package audit

import (
	"context"
	"fmt"

	"github.com/composer-dev/composer/internal/pg"
)

// Prune deletes records past their tenant's retention (the plan's
// audit_retention_days), oldest first, in batches, as the system role.
// Returns how many tenants' chains were pruned.
func Prune(ctx context.Context, db *pg.DB) (int64, error) {
	var total int64
	for {
		tag, err := db.System().Exec(ctx, qPrune, pruneBatch)
		if err != nil {
			return total, fmt.Errorf("prune the audit log: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() == 0 || ctx.Err() != nil {
			return total, nil
		}
	}
}

const pruneBatch = 10000
