package apptest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/app"
)

// GQLResponse is a GraphQL answer.
type GQLResponse struct {
	Status int
	Data   json.RawMessage `json:"data"`
	Errors []GQLError      `json:"errors"`
}

// GQLError is one GraphQL error.
type GQLError struct {
	Message    string         `json:"message"`
	Path       []any          `json:"path"`
	Extensions map[string]any `json:"extensions"`
}

// Code returns the error's extensions.code.
func (e GQLError) Code() string { s, _ := e.Extensions["code"].(string); return s }

// Codes lists the codes of a response's errors.
func (r GQLResponse) Codes() []string {
	var out []string
	for _, e := range r.Errors {
		out = append(out, e.Code())
	}
	return out
}

// Decode unmarshals the data into v.
func (r GQLResponse) Decode(t testing.TB, v any) {
	t.Helper()
	require.Empty(t, r.Errors, "unexpected errors")
	require.NoError(t, json.Unmarshal(r.Data, v))
}

// GraphQL posts a query with a bearer credential ("" sends none).
func (s *System) GraphQL(credential, query string, vars map[string]any) GQLResponse {
	s.T.Helper()
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	require.NoError(s.T, err)
	return s.PostGraphQL(credential, body)
}

// PostGraphQL posts a raw body.
func (s *System) PostGraphQL(credential string, body []byte) GQLResponse {
	s.T.Helper()
	req, err := http.NewRequest(http.MethodPost, s.URL+"/graphql", bytes.NewReader(body))
	require.NoError(s.T, err)
	req.Header.Set("Content-Type", "application/json")
	if credential != "" {
		req.Header.Set("Authorization", "Bearer "+credential)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.T, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(s.T, err)
	out := GQLResponse{Status: resp.StatusCode}
	if json.Unmarshal(data, &out) != nil || (out.Data == nil && out.Errors == nil) {
		// The auth middleware answers {"error": {...}}.
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		_ = json.Unmarshal(data, &e)
		out.Errors = []GQLError{{Message: e.Error.Message, Extensions: map[string]any{"code": e.Error.Code}}}
	}
	return out
}

// Token mints a user token for subject with role in tenant (making it a member).
func (s *System) Token(tenant uuid.UUID, subject string, role auth.Role) string {
	s.T.Helper()
	tok, err := app.DevToken(context.Background(), s.Deps, tenant, subject, role, time.Hour)
	require.NoError(s.T, err)
	return tok
}
