package app

import (
	"context"
	"errors"

	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/engine/taskserver"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/secrets"
)

// secretReader serves PathSecrets: the values of the secrets a leased http
// task names, for the platform worker holding the lease.
func (s *Server) secretReader() taskserver.SecretReader {
	return func(ctx context.Context, ref taskapi.Ref, worker string) (map[string]string, error) {
		v, err := s.Secrets.ForLease(ctx, s.DB, secrets.Lease{Tenant: ref.Tenant, Run: ref.Run, Task: ref.Task,
			Attempt: ref.Attempt, Worker: worker})
		var missing *secrets.Missing
		switch {
		case errors.Is(err, secrets.ErrNotLeased):
			return nil, errs.E(errs.NotFound, "the task is not leased to this worker")
		case errors.As(err, &missing):
			return nil, errs.E(errs.Invalid, "%s", missing.Error())
		}
		return v, err
	}
}
