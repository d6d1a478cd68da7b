package engine

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/composer-dev/composer/engine/dag"
	"github.com/composer-dev/composer/internal/errs"
)

// MaxMetadataFilters bounds the metadata pairs one run listing filters by.
const MaxMetadataFilters = 4

// checkMetadata validates run metadata: at most dag.MaxMetadataKeys keys
// shaped like dag.MetadataKey, values of at most dag.MaxMetadataValueChars
// printable characters, dag.MaxMetadataBytes of JSON in all. field names
// the argument in errors ("metadata", "filter.metadata").
func checkMetadata(field string, m map[string]string, maxKeys int) error {
	if len(m) > maxKeys {
		return invalid(field, "has %d keys; at most %d", len(m), maxKeys)
	}
	size := 2
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := m[k]
		if !dag.MetadataKey.MatchString(k) {
			return invalid(field, "key %q must be 1-64 letters, digits, '_', '.' or '-', starting with a letter", k)
		}
		if !utf8.ValidString(v) || strings.ContainsFunc(v, func(r rune) bool { return unicode.IsControl(r) }) {
			return invalid(field+"."+k, "must be printable text")
		}
		if n := utf8.RuneCountInString(v); n > dag.MaxMetadataValueChars {
			return invalid(field+"."+k, "is %d characters; at most %d", n, dag.MaxMetadataValueChars)
		}
		size += len(k) + len(v) + 6
	}
	if size > dag.MaxMetadataBytes {
		return invalid(field, "is %d bytes; at most %d", size, dag.MaxMetadataBytes)
	}
	return nil
}

// metadataJSON is the stored form of run metadata (always an object).
func metadataJSON(m map[string]string) []byte {
	if len(m) == 0 {
		return []byte(`{}`)
	}
	b, _ := json.Marshal(m)
	return b
}

// invalid is a BAD_USER_INPUT naming its field.
func invalid(field, format string, args ...any) error {
	e := errs.E(errs.Invalid, field+": "+format, args...)
	e.Fields = []errs.Field{{Field: field, Message: e.Message}}
	return e
}
