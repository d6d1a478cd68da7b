package workers

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/url"
	"slices"
	"strings"
)

// Redacted replaces a secret's value in what an HTTP step records.
const Redacted = "[secret]"

// redactor removes secret values — each one the task read, each value
// rendered from them, and their URL- and JSON-escaped forms — from what an
// attempt records: its output, its failure's message and details, and the
// log lines it writes. A receiver that echoes a credential back therefore
// does not put it into the run as sent; one that echoes it transformed
// (hex, reversed, base64) is not caught here, which is why the API shows
// what secret-reading steps produce only to principals with
// secrets:outputs (engine/dag/secrets.go). This stays as defence in depth.
type redactor struct {
	needles []string
}

func newRedactor(values map[string]string) *redactor {
	r := &redactor{}
	for _, v := range values {
		r.add(v)
	}
	return r
}

func (r *redactor) add(v string) {
	if v == "" {
		return
	}
	enc, _ := json.Marshal(v)
	forms := []string{v, url.PathEscape(v), url.QueryEscape(v), string(enc[1 : len(enc)-1])}
	for _, f := range forms {
		if f != "" && !slices.Contains(r.needles, f) {
			r.needles = append(r.needles, f)
		}
	}
	// Longest first, so a value containing another is replaced whole.
	slices.SortFunc(r.needles, func(a, b string) int { return len(b) - len(a) })
}

func (r *redactor) any() bool { return r != nil && len(r.needles) > 0 }

// text redacts a string.
func (r *redactor) text(s string) string {
	if !r.any() {
		return s
	}
	for _, n := range r.needles {
		s = strings.ReplaceAll(s, n, Redacted)
	}
	return s
}

func (r *redactor) contains(b []byte) bool {
	for _, n := range r.needles {
		if bytes.Contains(b, []byte(n)) {
			return true
		}
	}
	return false
}

// json redacts every string (and key) of a JSON document, keeping it JSON;
// a document without any needle is returned unchanged.
func (r *redactor) json(b json.RawMessage) json.RawMessage {
	if !r.any() || len(b) == 0 || !r.contains(b) {
		return b
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		enc, _ := json.Marshal(r.text(string(b)))
		return enc
	}
	out, err := json.Marshal(r.walk(v))
	if err != nil {
		return json.RawMessage(`null`)
	}
	return out
}

func (r *redactor) walk(v any) any {
	switch x := v.(type) {
	case string:
		return r.text(x)
	case json.Number:
		if r.contains([]byte(x)) {
			return Redacted
		}
		return x
	case []any:
		for i := range x {
			x[i] = r.walk(x[i])
		}
		return x
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[r.text(k)] = r.walk(e)
		}
		return out
	}
	return v
}

// failure redacts an attempt's failure.
func (r *redactor) failure(err error) error {
	if !r.any() || err == nil {
		return err
	}
	var f *Failure
	if !errors.As(err, &f) {
		f = asFailure(err)
	}
	c := *f
	c.Message = r.text(c.Message)
	c.Details = r.json(c.Details)
	return &c
}
