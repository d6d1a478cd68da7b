package graph

import (
	"bytes"
	"embed"
	"io/fs"
	"net/http"
	"slices"
)

//go:embed *.graphqls
var schemaFiles embed.FS

// SchemaSDL is the API's schema as one document — schema.graphqls, then
// the other files in name order — the file tenants generate clients from.
// `make generate` writes the same bytes to sdk/schema.graphql.
func SchemaSDL() []byte {
	names, _ := fs.Glob(schemaFiles, "*.graphqls")
	slices.SortFunc(names, func(a, b string) int {
		switch {
		case a == b:
			return 0
		case a == "schema.graphqls" || (b != "schema.graphqls" && a < b):
			return -1
		}
		return 1
	})
	var out bytes.Buffer
	for _, n := range names {
		b, _ := schemaFiles.ReadFile(n)
		out.Write(b)
		if !bytes.HasSuffix(b, []byte("\n")) {
			out.WriteByte('\n')
		}
	}
	return out.Bytes()
}

// SchemaHandler serves SchemaSDL (GET /schema.graphql): no credential is
// needed to read the shape of the API, only to use it.
func SchemaHandler() http.Handler {
	sdl := SchemaSDL()
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/graphql; charset=utf-8")
		w.Header().Set("Cache-Control", "public, max-age=300")
		_, _ = w.Write(sdl)
	})
}
