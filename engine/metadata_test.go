package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

// TestRunMetadataIsKeptDerivedAndFiltered: a start's metadata is kept with
// the run, merged over what the workflow's mapping derives from the input;
// runs are listed by metadata equality, newest first, page by page, and
// never across tenants.
func TestRunMetadataIsKeptDerivedAndFiltered(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(`{"metadata":{"customer":"input.customer","region":"'eu'"},"nodes":[{"id":"a","type":"wait","wait":{"signal":"go"}}]}`)
	var runs []uuid.UUID
	for i := range 7 {
		res, err := f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: wf, Input: json.RawMessage(fmt.Sprintf(`{"customer":"c%d"}`, i%2)),
			Metadata: map[string]string{"order": fmt.Sprintf("o-%d", i)}})
		require.NoError(t, err)
		runs = append(runs, res.RunID)
	}
	var got RunView
	require.NoError(t, f.db.WithTenant(ctx, f.tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		got, err = GetRun(ctx, tx, runs[3])
		return err
	}))
	assert.Equal(t, map[string]string{"customer": "c1", "region": "eu", "order": "o-3"}, got.Metadata)

	list := func(tenant uuid.UUID, filter map[string]string, first int, after *uuid.UUID) ([]uuid.UUID, bool) {
		var ids []uuid.UUID
		var more bool
		require.NoError(t, f.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
			rs, m, err := ListRuns(ctx, tx, RunFilter{Metadata: filter}, first, after)
			for _, r := range rs {
				ids = append(ids, r.ID)
			}
			more = m
			return err
		}))
		return ids, more
	}
	page, more := list(f.tenant, map[string]string{"customer": "c0"}, 2, nil)
	assert.Equal(t, []uuid.UUID{runs[6], runs[4]}, page, "newest first")
	assert.True(t, more)
	page, more = list(f.tenant, map[string]string{"customer": "c0"}, 2, &page[1])
	assert.Equal(t, []uuid.UUID{runs[2], runs[0]}, page)
	assert.False(t, more)
	page, _ = list(f.tenant, map[string]string{"customer": "c1", "order": "o-5"}, 10, nil)
	assert.Equal(t, []uuid.UUID{runs[5]}, page, "every pair must match")
	page, _ = list(f.tenant, map[string]string{"customer": "nobody"}, 10, nil)
	assert.Empty(t, page)

	other, err := tenants.Create(ctx, f.db, tenants.CreateParams{Name: "globex"})
	require.NoError(t, err)
	page, _ = list(other.ID, map[string]string{"customer": "c0"}, 10, nil)
	assert.Empty(t, page, "another tenant's runs are never listed")

	// The same idempotency key with other metadata is another request.
	_, err = f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: wf, Input: json.RawMessage(`{"customer":"x"}`), IdempotencyKey: "k",
		Metadata: map[string]string{"order": "1"}})
	require.NoError(t, err)
	_, err = f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: wf, Input: json.RawMessage(`{"customer":"x"}`), IdempotencyKey: "k",
		Metadata: map[string]string{"order": "2"}})
	assert.Equal(t, errs.Conflict, errs.KindOf(err))
}

// TestBadMetadataIsRefusedAndWritesNothing: bounds and shapes of metadata,
// given or derived, are BAD_USER_INPUT naming the field; nothing is written.
func TestBadMetadataIsRefusedAndWritesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"a","type":"noop"}]}`)
	derived := f.workflow(`{"metadata":{"customer":"input.customer"},"nodes":[{"id":"a","type":"noop"}]}`)
	many := map[string]string{}
	for i := range 17 {
		many[fmt.Sprintf("k%d", i)] = "v"
	}
	long := make([]byte, 257)
	for i := range long {
		long[i] = 'x'
	}
	for name, c := range map[string]struct {
		wf    uuid.UUID
		input string
		meta  map[string]string
		field string
	}{
		"too many keys":       {wf, `{}`, many, "metadata"},
		"bad key":             {wf, `{}`, map[string]string{"9lives": "x"}, "metadata"},
		"long value":          {wf, `{}`, map[string]string{"k": string(long)}, "metadata.k"},
		"control character":   {wf, `{}`, map[string]string{"k": "a\nb"}, "metadata.k"},
		"derived not scalar":  {derived, `{"customer":{"id":1}}`, nil, "metadata"},
		"derived from absent": {derived, `{}`, nil, "metadata"},
	} {
		_, err := f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: c.wf, Input: json.RawMessage(c.input), Metadata: c.meta})
		require.Error(t, err, name)
		var e *errs.Error
		require.ErrorAs(t, err, &e, name)
		assert.Equal(t, errs.Invalid, e.Kind, name)
		require.NotEmpty(t, e.Fields, name)
		assert.Equal(t, c.field, e.Fields[0].Field, name)
	}
	assert.Zero(t, f.count(`SELECT count(*) FROM workflow_runs`), "nothing was started")
	assert.Zero(t, f.count(`SELECT count(*) FROM run_metadata`))

	// Definitions: a mapping that reads nodes, or a bad key, is refused at creation.
	for _, def := range []string{
		`{"metadata":{"x":"nodes.a.output.y"},"nodes":[{"id":"a","type":"noop"}]}`,
		`{"metadata":{"bad key":"input.x"},"nodes":[{"id":"a","type":"noop"}]}`,
	} {
		_, _, err := f.c.CreateWorkflow(ctx, f.tenant, "bad-"+uuid.NewString()[:6], "", []byte(def))
		assert.Equal(t, errs.Invalid, errs.KindOf(err), def)
	}
}
