package pg_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRoleBoundaries: the system role (BYPASSRLS) is reachable only from
// the cross-tenant loops and operator paths listed here, and the app role
// without a tenant only from API-key authentication, and one transaction
// over several tenants only from the platform's lease path. A request-path
// package that reached for either would fail this test before review.
func TestRoleBoundaries(t *testing.T) {
	system := map[string]bool{ // files whose statements span tenants
		"engine/sweeper.go": true, "engine/outbox/enqueuer.go": true, "engine/metrics.go": true,
		"tenants/tenants.go": true, "tenants/limits.go": true, "internal/app/dev.go": true,
		// claims due schedules across tenants; each fire runs in its tenant's own transactions
		"schedules/firer.go": true,
		// claims a due bulk job across tenants and expires finished ones;
		// each batch runs in the job's tenant's own transactions
		"engine/bulk.go": true,
		// the task server opening a leased task's sealed secrets (the app
		// role cannot read them) for the platform worker holding the lease,
		// fenced by tenant, run, task, attempt and owner in the one query
		"secrets/lease.go": true,
		// the sweeper's audit retention: deletes every tenant's expired
		// records (the app role may never delete one)
		"audit/retention.go": true,
	}
	unscoped := map[string]bool{"auth/authenticate.go": true}
	// One transaction over several tenants' statements: the platform's lease
	// path only (a worker's fill), never a tenant's request.
	multi := map[string]bool{"engine/leases.go": true,
		// the lease path's second half: gives back, per tenant, the fresh
		// leases of rate-limited steps it just granted
		"engine/ratelimit.go": true}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	call := regexp.MustCompile(`\.(System\(\)|Unscoped\(\)|PipelineTenants\()`)
	seen := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if strings.HasPrefix(rel, ".") && rel != "." || rel == "internal/bench" || rel == "internal/pg" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range call.FindAllStringSubmatch(string(src), -1) {
			seen++
			switch m[1] {
			case "PipelineTenants(":
				assert.True(t, multi[rel], "%s runs several tenants' statements in one transaction; only the platform's lease path may", rel)
			case "System()":
				assert.True(t, system[rel], "%s uses the system role; only the cross-tenant loops may", rel)
			case "Unscoped()":
				assert.True(t, unscoped[rel], "%s uses the app role without a tenant; only API-key authentication may", rel)
			}
		}
		return nil
	})
	require.NoError(t, err)
	assert.Positive(t, seen, "the scan found the known uses")
}
