package secrets

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/composer-dev/composer/internal/pg"
)

// Lease names the attempt whose secrets are read and the worker holding
// its lease.
type Lease struct {
	Tenant, Run, Task uuid.UUID
	Attempt           int
	Worker            string
}

// ErrNotLeased: the attempt is not running under the worker's live lease.
var ErrNotLeased = errors.New("secrets: the task is not leased to this worker")

// Missing is the error of a task that names a secret the tenant does not
// have (deleted, or never created).
type Missing struct{ Name string }

func (m *Missing) Error() string { return fmt.Sprintf("secrets.%s does not exist", m.Name) }

// ForLease opens the current value of every secret the leased task's
// stored request names (its config's http.secrets), as the system role —
// the only reader of sealed values — and only while the attempt runs
// under the worker's live lease (ErrNotLeased otherwise). A name with no
// secret is a *Missing error.
func (s Service) ForLease(ctx context.Context, db *pg.DB, l Lease) (map[string]string, error) {
	if err := s.keys(); err != nil {
		return nil, err
	}
	rows, err := db.System().Query(ctx, qForLease, l.Tenant, l.Run, l.Task, l.Attempt, l.Worker)
	if err != nil {
		return nil, fmt.Errorf("read secrets: %w", err)
	}
	defer rows.Close()
	type sealed struct {
		name           string
		secret, vid    uuid.UUID
		value          []byte
		missing, empty bool
	}
	var found []sealed
	for rows.Next() {
		var name *string
		var secret, vid *uuid.UUID
		var value []byte
		if err := rows.Scan(&name, &secret, &vid, &value); err != nil {
			return nil, fmt.Errorf("read secrets: %w", err)
		}
		switch {
		case name == nil:
			found = append(found, sealed{empty: true})
		case secret == nil || vid == nil:
			found = append(found, sealed{name: *name, missing: true})
		default:
			found = append(found, sealed{name: *name, secret: *secret, vid: *vid, value: value})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read secrets: %w", err)
	}
	if len(found) == 0 {
		return nil, ErrNotLeased
	}
	out := make(map[string]string, len(found))
	for _, f := range found {
		switch {
		case f.empty:
		case f.missing:
			return nil, &Missing{Name: f.name}
		default:
			v, err := s.Keys.Open(f.value, l.Tenant, f.secret, f.vid)
			if err != nil {
				return nil, fmt.Errorf("secret %s: %w", f.name, err)
			}
			out[f.name] = string(v)
		}
	}
	return out, nil
}
