package app_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/app"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/config"
)

func fetch(t *testing.T, method, url string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, string(b)
}

// TestDevSessionIsAbsentOutsideDev: the console's one-click sign-in
// endpoint exists only under `composer dev` (MountDev); a server that is
// not — here with development mode off — answers 404 to both methods, and
// the console's fallback page does not stand in for it.
func TestDevSessionIsAbsentOutsideDev(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t, func(c *config.Config) { c.Dev = false })
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		status, _, body := fetch(t, method, sys.URL+app.PathDevSession)
		assert.Equal(t, http.StatusNotFound, status, method)
		assert.NotContains(t, body, "token", method)
		assert.NotContains(t, body, "<html", method)
	}
}

// TestConsoleIsMountedWithoutShadowingTheAPI: "/" serves the console's
// page, and the server's own paths keep their handlers.
func TestConsoleIsMountedWithoutShadowingTheAPI(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t, func(c *config.Config) { c.Dev = false })
	status, h, body := fetch(t, http.MethodGet, sys.URL+"/")
	assert.Equal(t, http.StatusOK, status)
	assert.Contains(t, body, `<script type="module" src="/js/main.js">`)
	assert.Contains(t, h.Get("Content-Security-Policy"), "frame-ancestors 'none'")
	status, _, body = fetch(t, http.MethodGet, sys.URL+"/runs/some-run")
	assert.Equal(t, http.StatusOK, status, "client-side routes get the page")
	assert.Contains(t, body, "/js/main.js")

	status, _, body = fetch(t, http.MethodGet, sys.URL+"/graphql")
	assert.Equal(t, http.StatusMethodNotAllowed, status, "GET /graphql is the API's own answer")
	assert.Contains(t, body, "use POST")
	status, _, body = fetch(t, http.MethodGet, sys.URL+"/healthz")
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, "ok\n", body)
	status, _, body = fetch(t, http.MethodGet, sys.URL+"/schema.graphql")
	assert.Equal(t, http.StatusOK, status)
	assert.True(t, strings.Contains(body, "type Query"))
	status, _, _ = fetch(t, http.MethodPost, sys.URL+"/v1/tasks/poll")
	assert.Equal(t, http.StatusUnauthorized, status, "the task API keeps its prefix")
	for _, path := range []string{"/metrics", "/playground", "/v1/unknown", "/v1/events"} {
		status, _, body = fetch(t, http.MethodGet, sys.URL+path)
		assert.Equal(t, http.StatusNotFound, status, path)
		assert.NotContains(t, body, "<html", path)
	}
}
