package audit

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/internal/pg"
)

// Prune deletes records past their tenant's retention (the plan's
// audit_retention_days), oldest first, in batches, as the system role,
// and marks each cut with a MAC under keys (the head's pruned_mac), so
// that records deleted from the front of a chain by anyone else are found
// by Verify. Returns how many tenants' chains were pruned.
func Prune(ctx context.Context, db *pg.DB, keys *Keyring) (int64, error) {
	if keys == nil {
		return 0, ErrNoKeyring
	}
	var total int64
	for {
		var n int64
		err := db.WithSystem(ctx, func(ctx context.Context, tx *pg.Tx) error {
			n = 0
			type cut struct {
				tenant uuid.UUID
				seq    int64
				hash   []byte
			}
			var cuts []cut
			var c cut
			rows, err := tx.Query(ctx, qPrune, pruneBatch)
			if err != nil {
				return err
			}
			if _, err := pgx.ForEachRow(rows, []any{&c.tenant, &c.seq, &c.hash}, func() error {
				cuts = append(cuts, c)
				return nil
			}); err != nil {
				return err
			}
			if len(cuts) == 0 {
				return nil
			}
			id := keys.SigningKeyID()
			b := &pgx.Batch{}
			for _, c := range cuts {
				mark, _ := keys.prunedMAC(id, c.tenant, c.seq, c.hash)
				b.Queue(qPrunedMark, c.tenant, c.seq, id, mark)
			}
			n = int64(len(cuts))
			return tx.SendBatch(ctx, b).Close()
		})
		if err != nil {
			return total, fmt.Errorf("prune the audit log: %w", err)
		}
		total += n
		if n == 0 || ctx.Err() != nil {
			return total, nil
		}
	}
}

const pruneBatch = 10000
