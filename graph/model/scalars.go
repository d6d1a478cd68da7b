// Package model holds the GraphQL gateway's generated models and its custom
// scalars.
package model

import (
	"encoding/json"
	"io"
	"strconv"

	"github.com/99designs/gqlgen/graphql"
	"github.com/google/uuid"

	"github.com/composer-dev/composer/internal/errs"
)

// MarshalJSON writes a raw JSON value as the JSON scalar (null when empty).
func MarshalJSON(v json.RawMessage) graphql.Marshaler {
	return graphql.WriterFunc(func(w io.Writer) {
		if len(v) == 0 {
			_, _ = io.WriteString(w, "null")
			return
		}
		_, _ = w.Write(v)
	})
}

// UnmarshalJSON reads the JSON scalar (any JSON value) into raw JSON.
func UnmarshalJSON(v any) (json.RawMessage, error) {
	if s, ok := v.(json.RawMessage); ok {
		return s, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, errs.E(errs.Invalid, "not a JSON value")
	}
	return b, nil
}

// MarshalUUID writes an id.
func MarshalUUID(id uuid.UUID) graphql.Marshaler {
	return graphql.WriterFunc(func(w io.Writer) { _, _ = io.WriteString(w, strconv.Quote(id.String())) })
}

// UnmarshalUUID reads an id.
func UnmarshalUUID(v any) (uuid.UUID, error) {
	s, ok := v.(string)
	if !ok {
		return uuid.Nil, errs.E(errs.Invalid, "an id must be a string")
	}
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, errs.E(errs.Invalid, "%q is not a valid id", s)
	}
	return id, nil
}
