package taskserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/engine/taskserver"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/testenv"
)

func TestWorkerCredentialIsRequired(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	db := pg.New(env.App, env.System, false)
	srv := httptest.NewServer(taskserver.New(engine.NewCoordinator(db, engine.Options{}), nil, taskserver.PlatformToken("s3cret"), nil))
	defer srv.Close()
	ctx := context.Background()
	ref := taskapi.Ref{Tenant: uuid.New(), Run: uuid.New(), Task: uuid.New(), Attempt: 1}

	for _, token := range []string{"", "wrong", "S3CRET", "s3cret2"} {
		_, err := taskapi.NewClient(srv.URL, token).Complete(ctx, taskapi.CompleteRequest{Ref: ref, NodeID: "a", WorkerID: "w"})
		var apiErr *taskapi.APIError
		require.True(t, errors.As(err, &apiErr), "token %q: %v", token, err)
		assert.Equal(t, http.StatusUnauthorized, apiErr.Status)
		assert.Equal(t, "UNAUTHENTICATED", apiErr.Code)
	}

	ok := taskapi.NewClient(srv.URL, "s3cret")
	res, err := ok.Complete(ctx, taskapi.CompleteRequest{Ref: ref, NodeID: "a", WorkerID: "w"})
	require.NoError(t, err)
	assert.True(t, res.Acknowledged && res.Ignored, "a report for an unknown run is acknowledged and ignored")

	_, err = ok.Acquire(ctx, taskapi.AcquireRequest{WorkerID: "", TTLMillis: 1000, Leases: []taskapi.Ref{ref}})
	var apiErr *taskapi.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, http.StatusBadRequest, apiErr.Status)

	req, _ := http.NewRequest(http.MethodPost, srv.URL+taskapi.PathFail, strings.NewReader(`{"bogus": 1}`))
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var body taskapi.ErrorResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "unknown fields are rejected")
	assert.Equal(t, taskapi.CodeUnknownField, body.Error.Code, "with a code a newer client can act on")
	assert.Equal(t, "bogus", body.Error.Field, "naming the field")
}
