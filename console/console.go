// Package console serves Composer's web console: a build-free single-page
// application (standard ES modules, no bundler) embedded in the binary.
//
// The console is a client of the public API only — GraphQL over HTTP and
// graphql-transport-ws — so whatever it shows, a tenant's own dashboard
// can show too. The handler is safe for concurrent use: every asset is
// read, hashed and gzipped once, when the package is initialised.
package console

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"
)

//go:embed assets
var embedded embed.FS

// asset is one file, ready to serve.
type asset struct {
	body, gz    []byte // gz is nil when compression does not pay
	contentType string
	etag        string
}

var assets = func() map[string]*asset {
	sub, err := fs.Sub(embedded, "assets")
	if err != nil {
		panic(err)
	}
	out := map[string]*asset{}
	err = fs.WalkDir(sub, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := fs.ReadFile(sub, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		a := &asset{body: body, contentType: contentType(p), etag: `"` + base64.RawURLEncoding.EncodeToString(sum[:12]) + `"`}
		if compressible(a.contentType) {
			var buf bytes.Buffer
			zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
			_, _ = zw.Write(body)
			_ = zw.Close()
			if buf.Len() < len(body) {
				a.gz = buf.Bytes()
			}
		}
		out["/"+p] = a
		return nil
	})
	if err != nil {
		panic(err)
	}
	return out
}()

func contentType(p string) string {
	switch path.Ext(p) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js", ".mjs":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".svg":
		return "image/svg+xml"
	case ".json":
		return "application/json"
	case ".png":
		return "image/png"
	case ".ico":
		return "image/x-icon"
	}
	if t := mime.TypeByExtension(path.Ext(p)); t != "" {
		return t
	}
	return "application/octet-stream"
}

func compressible(ct string) bool {
	return strings.HasPrefix(ct, "text/") || strings.HasPrefix(ct, "image/svg") || strings.HasPrefix(ct, "application/json")
}

// reserved are the server's own paths: the console never answers them
// with its page, so a route that is absent (a development endpoint on a
// production server, /metrics on the public listener) stays a 404.
var reserved = []string{"/v1/", "/graphql", "/schema.graphql", "/playground", "/healthz", "/readyz", "/metrics", "/debug/"}

// hostRE is what a Host header may look like to be written into the CSP.
var hostRE = regexp.MustCompile(`^[A-Za-z0-9.\-]+(:[0-9]{1,5})?$|^\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$`)

// Handler serves the console: its assets by name, and index.html for any
// other GET of a page path (the application routes on the client).
func Handler() http.Handler { return http.HandlerFunc(serve) }

func serve(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	for _, pre := range reserved {
		if p == strings.TrimSuffix(pre, "/") || strings.HasPrefix(p, pre) {
			http.NotFound(w, r)
			return
		}
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	a, ok := assets[path.Clean(p)]
	switch {
	case ok && !strings.HasSuffix(p, "/"):
	case path.Ext(p) != "" || strings.HasSuffix(p, "/") && p != "/":
		// A missing asset, or a folder: no listing, no page in its place.
		http.NotFound(w, r)
		return
	default:
		a = assets["/index.html"]
	}
	h := w.Header()
	setSecurityHeaders(h, r.Host)
	h.Set("Content-Type", a.contentType)
	h.Set("Cache-Control", "no-cache")
	h.Set("ETag", a.etag)
	h.Add("Vary", "Accept-Encoding")
	if match := r.Header.Get("If-None-Match"); match != "" && strings.Contains(match, a.etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	body := a.body
	if a.gz != nil && acceptsGzip(r) {
		h.Set("Content-Encoding", "gzip")
		body = a.gz
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		_, _ = w.Write(body)
	}
}

// setSecurityHeaders sets a strict policy: scripts and styles from this
// origin only (none inline), connections to this origin's HTTP and
// websocket endpoints only, and never in a frame.
func setSecurityHeaders(h http.Header, host string) {
	connect := "'self'"
	if hostRE.MatchString(host) {
		connect += " ws://" + host + " wss://" + host
	}
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"font-src 'self'; connect-src "+connect+"; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}

func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		name, q, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(name), "gzip") {
			return strings.ReplaceAll(strings.TrimSpace(q), " ", "") != "q=0"
		}
	}
	return false
}
