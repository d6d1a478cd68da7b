package telemetry

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkScrape measures one /metrics scrape over loopback HTTP, served
// from the cached rendering (as all but one scrape a second are).
func BenchmarkScrape(b *testing.B) {
	shutdown, err := Setup(context.Background(), Options{ServiceName: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer shutdown(context.Background()) //nolint:errcheck
	srv := httptest.NewServer(MetricsHandler())
	defer srv.Close()
	b.ReportAllocs()
	for b.Loop() {
		resp, err := http.Get(srv.URL)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// BenchmarkRender measures one rendering (what happens once a second).
func BenchmarkRender(b *testing.B) {
	shutdown, err := Setup(context.Background(), Options{ServiceName: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer shutdown(context.Background()) //nolint:errcheck
	next := MetricsHandler().(*cachedMetrics).next
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	}
}
