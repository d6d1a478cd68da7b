package dag

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzParse feeds arbitrary bytes to Parse: it must never panic, must return
// either a workflow or a *ValidationError, and whatever it accepts must
// survive a round trip through its canonical form. The seed corpus lives in
// testdata/fuzz/FuzzParse; run `go test -fuzz=FuzzParse ./engine/dag` to grow it.
func FuzzParse(f *testing.F) {
	f.Add([]byte(forkJoin))
	f.Add([]byte(`{"nodes":[{"id":"a","type":"sleep","sleep":{"duration":"1d"}}]}`))
	f.Add([]byte("nodes:\n  - {id: a, type: wait, wait: {signal: go, timeout: 2h, approval: true}}\n"))
	f.Add([]byte(`{"nodes":[{"id":"a","type":"noop","depends_on":["a"]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := Parse(data)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) || len(ve.Problems) == 0 {
				t.Fatalf("error is not a *ValidationError with problems: %v", err)
			}
			return
		}
		if len(w.Order()) != len(w.Nodes) {
			t.Fatalf("order covers %d of %d nodes", len(w.Order()), len(w.Nodes))
		}
		c := w.Canonical()
		if !json.Valid(c) {
			t.Fatalf("canonical form is not JSON: %s", c)
		}
		again, err := Parse(c)
		if err != nil {
			t.Fatalf("canonical form of an accepted definition is rejected: %v\n%s", err, c)
		}
		if string(again.Canonical()) != string(c) {
			t.Fatalf("canonical form is not stable:\n%s\n%s", c, again.Canonical())
		}
	})
}
