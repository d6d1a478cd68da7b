// Package jsoncheck refuses JSON that PostgreSQL cannot store or that is
// pathological: invalid text, nesting beyond a depth, a NUL character in
// any string (jsonb and text reject \u0000). It checks by streaming tokens,
// so a deeply nested document is refused without being built.
package jsoncheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
)

// MaxDepth is the nesting a document may have.
const MaxDepth = 64

// Check returns "" for an acceptable document, else what is wrong with it
// in words for the sender.
func Check(b []byte) string {
	if !json.Valid(b) {
		return "is not valid JSON"
	}
	d := json.NewDecoder(bytes.NewReader(b))
	depth := 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			return ""
		}
		if err != nil {
			return "is not valid JSON"
		}
		switch t := tok.(type) {
		case json.Delim:
			if t == '{' || t == '[' {
				if depth++; depth > MaxDepth {
					return "is nested too deeply"
				}
			} else {
				depth--
			}
		case string:
			if strings.IndexByte(t, 0) >= 0 {
				return "contains a NUL character (\\u0000), which cannot be stored"
			}
		}
	}
}
