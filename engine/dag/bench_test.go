package dag

import "testing"

// BenchmarkParse measures parsing, validating and compiling a definition
// (done once per version: the coordinator caches compiled definitions).
func BenchmarkParse(b *testing.B) {
	data := []byte(forkJoin)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}
