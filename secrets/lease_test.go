package secrets_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/pg"
)

// recordingAPI is the worker's task API client, remembering its secret reads.
type recordingAPI struct {
	*taskapi.Client
	mu    sync.Mutex
	reads []taskapi.SecretsRequest
}

func (r *recordingAPI) Secrets(ctx context.Context, req taskapi.SecretsRequest) (taskapi.SecretsResponse, error) {
	r.mu.Lock()
	r.reads = append(r.reads, req)
	r.mu.Unlock()
	return r.Client.Secrets(ctx, req)
}

// TestSecretsAreReadOnlyForTheLeaseHolder: PathSecrets answers the
// platform worker that holds the task's live lease, for that attempt, and
// nobody else: not another worker id, another attempt or tenant, a tenant's
// worker key, nor the holder once the task finished.
func TestSecretsAreReadOnlyForTheLeaseHolder(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	require.NoError(t, sys.Deps.DB.WithTenant(context.Background(), sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := sys.Server.Secrets.Create(ctx, tx, "T", "the-lease-holders-value", "test")
		return err
	}))
	release := make(chan struct{})
	var once sync.Once
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(func() { once.Do(func() { close(release) }); sink.Close() })
	api := &recordingAPI{Client: taskapi.NewClient(sys.URL, sys.Cfg.WorkerToken)}
	sys.StartWorker(apptest.WorkerOptions{API: api})
	wf := sys.Workflow(`{"nodes": [{"id": "call", "type": "http", "http": {"url": "` + sink.URL + `/x",
		"headers": {"Authorization": "Bearer {{ secrets.T }}"}}}]}`)
	run := sys.StartRun(wf, `{}`)
	var read taskapi.SecretsRequest
	apptest.Eventually(t, "the worker to read the secrets", 10*time.Second, func() bool {
		api.mu.Lock()
		defer api.mu.Unlock()
		if len(api.reads) > 0 {
			read = api.reads[0]
		}
		return len(api.reads) > 0
	})
	platform := taskapi.NewClient(sys.URL, sys.Cfg.WorkerToken)
	ctx := context.Background()
	got, err := platform.Secrets(ctx, read)
	require.NoError(t, err, "the holder, while its lease lives")
	assert.Equal(t, map[string]string{"T": "the-lease-holders-value"}, got.Secrets)

	code := func(err error) string {
		var e *taskapi.APIError
		if errors.As(err, &e) {
			return e.Code
		}
		return ""
	}
	other := read
	other.WorkerID = "someone-else"
	_, err = platform.Secrets(ctx, other)
	assert.Equal(t, "NOT_FOUND", code(err), "another worker id")
	other = read
	other.Attempt++
	_, err = platform.Secrets(ctx, other)
	assert.Equal(t, "NOT_FOUND", code(err), "another attempt")
	other = read
	other.Tenant = uuid.New()
	_, err = platform.Secrets(ctx, other)
	assert.Equal(t, "NOT_FOUND", code(err), "another tenant")
	_, err = taskapi.NewClient(sys.URL, sys.APIKey(auth.ScopeWorker)).Secrets(ctx, read)
	assert.Equal(t, "FORBIDDEN", code(err), "a tenant's worker key")
	_, err = taskapi.NewClient(sys.URL, "wrong").Secrets(ctx, read)
	assert.Equal(t, "UNAUTHENTICATED", code(err))

	once.Do(func() { close(release) })
	r, _ := sys.WaitRun(run, 10*time.Second)
	require.Equal(t, "completed", r.Status)
	_, err = platform.Secrets(ctx, read)
	assert.Equal(t, "NOT_FOUND", code(err), "the holder, once the task finished")
}

// TestAMissingSecretFailsTheStep: a step naming a secret the tenant does
// not have fails for good, saying which.
func TestAMissingSecretFailsTheStep(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	sys.StartWorker(apptest.WorkerOptions{})
	wf := sys.Workflow(`{"nodes": [{"id": "call", "type": "http", "retry": {"max_attempts": 3},
		"http": {"url": "http://127.0.0.1:1/x", "query": {"k": "{{ secrets.GONE }}"}}}]}`)
	r, tasks := sys.WaitRun(sys.StartRun(wf, `{}`), 10*time.Second)
	require.Equal(t, "failed", r.Status)
	assert.Equal(t, 1, tasks["call"].Attempt, "not retried")
	assert.True(t, strings.Contains(string(tasks["call"].LastError), "secret_not_found"), string(tasks["call"].LastError))
	assert.Contains(t, string(tasks["call"].LastError), "secrets.GONE does not exist")
}

// TestAMapsStepsReadSecrets: each element of a map whose http step is
// templated sends its own rendered URL with the current secret.
func TestAMapsStepsReadSecrets(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	require.NoError(t, sys.Deps.DB.WithTenant(context.Background(), sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := sys.Server.Secrets.Create(ctx, tx, "T", "map-secret-value", "test")
		return err
	}))
	var mu sync.Mutex
	got := map[string]string{}
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got[r.URL.RequestURI()] = r.Header.Get("Authorization")
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(sink.Close)
	sys.StartWorker(apptest.WorkerOptions{})
	wf := sys.Workflow(`{"nodes": [{"id": "fan", "type": "map", "map": {"items": "input.ids", "max_parallelism": 2, "step": {"type": "http",
		"http": {"method": "DELETE", "url": "` + sink.URL + `/items/{{ item }}", "query": {"i": "{{ index }}"},
		"headers": {"Authorization": "Bearer {{ secrets.T }}"}}}}}]}`)
	r, _ := sys.WaitRun(sys.StartRun(wf, `{"ids": ["a", "b c", "d"]}`), 20*time.Second)
	require.Equal(t, "completed", r.Status)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]string{"/items/a?i=0": "Bearer map-secret-value", "/items/b%20c?i=1": "Bearer map-secret-value",
		"/items/d?i=2": "Bearer map-secret-value"}, got)
}
