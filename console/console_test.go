package console

import (
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func get(t *testing.T, method, path string, header ...string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	req.Host = "console.example:8080"
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	Handler().ServeHTTP(rec, req)
	return rec.Result()
}

func body(t *testing.T, r *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	return string(b)
}

func TestAssetsHaveTheirContentTypes(t *testing.T) {
	for path, ct := range map[string]string{
		"/":            "text/html; charset=utf-8",
		"/index.html":  "text/html; charset=utf-8",
		"/app.css":     "text/css; charset=utf-8",
		"/js/main.js":  "text/javascript; charset=utf-8",
		"/js/dag.js":   "text/javascript; charset=utf-8",
		"/favicon.svg": "image/svg+xml",
	} {
		r := get(t, http.MethodGet, path)
		assert.Equal(t, http.StatusOK, r.StatusCode, path)
		assert.Equal(t, ct, r.Header.Get("Content-Type"), path)
		assert.Equal(t, "nosniff", r.Header.Get("X-Content-Type-Options"), path)
		assert.NotEmpty(t, r.Header.Get("ETag"), path)
	}
}

func TestEveryAnswerHasAStrictPolicy(t *testing.T) {
	for _, path := range []string{"/", "/runs/123", "/js/main.js"} {
		r := get(t, http.MethodGet, path)
		csp := r.Header.Get("Content-Security-Policy")
		assert.Contains(t, csp, "default-src 'none'", path)
		assert.Contains(t, csp, "script-src 'self';", path, "no inline scripts, no other origin")
		assert.Contains(t, csp, "connect-src 'self' ws://console.example:8080 wss://console.example:8080;", path)
		assert.Contains(t, csp, "frame-ancestors 'none'", path)
		assert.NotContains(t, csp, "unsafe-inline", path)
		assert.NotContains(t, csp, "unsafe-eval", path)
		assert.Equal(t, "DENY", r.Header.Get("X-Frame-Options"), path)
	}
	// A forged Host header is not written into the policy.
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Host = "evil.example; script-src *"
	rec := httptest.NewRecorder()
	Handler().ServeHTTP(rec, req)
	assert.Equal(t, "'self'", regexp.MustCompile(`connect-src ([^;]*);`).FindStringSubmatch(rec.Header().Get("Content-Security-Policy"))[1])
}

func TestIndexHasNoInlineScriptOrStyle(t *testing.T) {
	html := body(t, get(t, http.MethodGet, "/"))
	for _, m := range regexp.MustCompile(`<script[^>]*>`).FindAllString(html, -1) {
		assert.Contains(t, m, `src="/`, "every script is a file of the console: %s", m)
	}
	assert.NotContains(t, html, "<style")
	assert.NotContains(t, html, "style=")
	assert.NotRegexp(t, ` on[a-z]+=`, html, "no inline handlers")
}

func TestGzipWhenAccepted(t *testing.T) {
	plain := get(t, http.MethodGet, "/js/run.js")
	raw := body(t, plain)
	assert.Empty(t, plain.Header.Get("Content-Encoding"))
	zipped := get(t, http.MethodGet, "/js/run.js", "Accept-Encoding", "br, gzip")
	assert.Equal(t, "gzip", zipped.Header.Get("Content-Encoding"))
	assert.Contains(t, zipped.Header.Values("Vary"), "Accept-Encoding")
	zr, err := gzip.NewReader(zipped.Body)
	require.NoError(t, err)
	unzipped, err := io.ReadAll(zr)
	require.NoError(t, err)
	assert.Equal(t, raw, string(unzipped))
	refused := get(t, http.MethodGet, "/js/run.js", "Accept-Encoding", "gzip;q=0")
	assert.Empty(t, refused.Header.Get("Content-Encoding"))
}

func TestETagAnswersNotModified(t *testing.T) {
	first := get(t, http.MethodGet, "/app.css")
	again := get(t, http.MethodGet, "/app.css", "If-None-Match", first.Header.Get("ETag"))
	assert.Equal(t, http.StatusNotModified, again.StatusCode)
	assert.Empty(t, body(t, again))
	assert.Equal(t, "no-cache", first.Header.Get("Cache-Control"), "revalidated every time: names are not hashed")
}

func TestPagePathsFallBackToIndexAndNothingElseDoes(t *testing.T) {
	index := body(t, get(t, http.MethodGet, "/"))
	for _, path := range []string{"/runs", "/runs/0190a1b2-c3d4", "/workflows/new", "/admin/keys", "/signin"} {
		r := get(t, http.MethodGet, path)
		assert.Equal(t, http.StatusOK, r.StatusCode, path)
		assert.Equal(t, index, body(t, r), path)
	}
	for _, path := range []string{"/js/", "/js", "/js/missing.js", "/nope.png", "/assets/index.html", "/../console.go",
		"/v1/dev/session", "/v1/anything", "/graphql", "/metrics", "/healthz", "/debug/pprof/"} {
		r := get(t, http.MethodGet, path)
		if path == "/js" {
			// A folder's name without the slash is a page path: the page, never a listing.
			assert.Equal(t, index, body(t, r), path)
			continue
		}
		assert.Equal(t, http.StatusNotFound, r.StatusCode, path)
		assert.NotContains(t, body(t, r), "main.js", "%s: no listing", path)
	}
	assert.Equal(t, http.StatusMethodNotAllowed, get(t, http.MethodPost, "/runs").StatusCode)
	assert.Equal(t, http.StatusNotFound, get(t, http.MethodPost, "/v1/dev/session").StatusCode)
	head := get(t, http.MethodHead, "/")
	assert.Equal(t, http.StatusOK, head.StatusCode)
	assert.Empty(t, body(t, head))
}

// TestFirstLoadFitsTheBudget: everything index.html loads — its scripts
// and styles and every module they import, recursively — is under 300 KB
// gzipped.
func TestFirstLoadFitsTheBudget(t *testing.T) {
	seen := map[string]bool{}
	total := 0
	ref := regexp.MustCompile(`(?:src|href)="(/[^"]+)"`)
	imp := regexp.MustCompile(`(?:import\s*(?:[^'"]*?from\s*)?|import\()\s*['"](\./[^'"]+|/[^'"]+)['"]`)
	var visit func(path string)
	visit = func(path string) {
		if seen[path] {
			return
		}
		seen[path] = true
		a, ok := assets[path]
		require.True(t, ok, "index.html loads %s, which is not embedded", path)
		if a.gz != nil {
			total += len(a.gz)
		} else {
			total += len(a.body)
		}
		var refs []string
		if strings.HasSuffix(path, ".html") {
			for _, m := range ref.FindAllStringSubmatch(string(a.body), -1) {
				refs = append(refs, m[1])
			}
		}
		if strings.HasSuffix(path, ".js") {
			for _, m := range imp.FindAllStringSubmatch(string(a.body), -1) {
				r := m[1]
				if strings.HasPrefix(r, "./") {
					r = path[:strings.LastIndex(path, "/")+1] + r[2:]
				}
				refs = append(refs, r)
			}
		}
		for _, r := range refs {
			visit(r)
		}
	}
	visit("/index.html")
	assert.True(t, seen["/js/run.js"] && seen["/js/admin.js"], "the pages loaded on demand count too: %v", seen)
	t.Logf("first load: %d files, %d bytes gzipped", len(seen), total)
	assert.Less(t, total, 300*1024)
}
