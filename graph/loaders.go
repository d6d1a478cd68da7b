package graph

import (
	"context"
	"net/http"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/google/uuid"
	"github.com/vikstrous/dataloadgen"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

// loaders batch the per-item fields of lists, so listing 100 runs with
// their tasks and workflows costs a constant number of queries. They are
// created per request: a batch runs with the context (and principal) of
// the request that made it.
type loaders struct {
	tasks     *dataloadgen.Loader[uuid.UUID, []engine.TaskView]
	workflows *dataloadgen.Loader[uuid.UUID, engine.Workflow]
}

type loadersKey struct{}

func (r *Resolver) newLoaders() *loaders {
	wait := dataloadgen.WithWait(500 * time.Microsecond)
	return &loaders{
		tasks: dataloadgen.NewLoader(func(ctx context.Context, runs []uuid.UUID) ([][]engine.TaskView, []error) {
			out := make([][]engine.TaskView, len(runs))
			err := r.inTenant(ctx, auth.ActionRunsRead, func(ctx context.Context, tx *pg.Tx) error {
				tasks, err := engine.TasksOfRuns(ctx, tx, runs)
				if err != nil {
					return err
				}
				idx := make(map[uuid.UUID]int, len(runs))
				for i, id := range runs {
					idx[id] = i
					out[i] = []engine.TaskView{}
				}
				for _, t := range tasks {
					out[idx[t.RunID]] = append(out[idx[t.RunID]], t)
				}
				return nil
			})
			if err != nil {
				return nil, fill(len(runs), err)
			}
			return out, nil
		}, wait),
		workflows: dataloadgen.NewLoader(func(ctx context.Context, ids []uuid.UUID) ([]engine.Workflow, []error) {
			out := make([]engine.Workflow, len(ids))
			var found map[uuid.UUID]engine.Workflow
			err := r.inTenant(ctx, auth.ActionWorkflowsRead, func(ctx context.Context, tx *pg.Tx) error {
				var err error
				found, err = engine.WorkflowsByID(ctx, tx, ids)
				return err
			})
			if err != nil {
				return nil, fill(len(ids), err)
			}
			errsOut := make([]error, len(ids))
			for i, id := range ids {
				w, ok := found[id]
				if !ok {
					errsOut[i] = errs.E(errs.NotFound, "workflow %s not found", id)
					continue
				}
				out[i] = w
			}
			return out, errsOut
		}, wait),
	}
}

func fill(n int, err error) []error {
	out := make([]error, n)
	for i := range out {
		out[i] = err
	}
	return out
}

func (r *Resolver) withLoaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		next.ServeHTTP(w, req.WithContext(context.WithValue(req.Context(), loadersKey{}, r.newLoaders())))
	})
}

func (r *Resolver) loaders(ctx context.Context) *loaders {
	if l, ok := ctx.Value(loadersKey{}).(*loaders); ok {
		return l
	}
	return r.newLoaders() // subscriptions: one set per event
}

// preload fills the request's loaders for a page of runs, so their tasks
// and workflows cost one query each for the whole page.
func (r *Resolver) preload(ctx context.Context, tx *pg.Tx, runs []engine.RunView, tasks, workflows bool) error {
	l := r.loaders(ctx)
	if tasks && len(runs) > 0 {
		ids := make([]uuid.UUID, len(runs))
		byRun := make(map[uuid.UUID][]engine.TaskView, len(runs))
		for i, run := range runs {
			ids[i] = run.ID
			byRun[run.ID] = []engine.TaskView{}
		}
		list, err := engine.TasksOfRuns(ctx, tx, ids)
		if err != nil {
			return err
		}
		for _, t := range list {
			byRun[t.RunID] = append(byRun[t.RunID], t)
		}
		for id, ts := range byRun {
			l.tasks.Prime(id, ts)
		}
	}
	if workflows && len(runs) > 0 {
		seen := map[uuid.UUID]bool{}
		var ids []uuid.UUID
		for _, run := range runs {
			if !seen[run.WorkflowID] {
				seen[run.WorkflowID] = true
				ids = append(ids, run.WorkflowID)
			}
		}
		found, err := engine.WorkflowsByID(ctx, tx, ids)
		if err != nil {
			return err
		}
		for id, w := range found {
			l.workflows.Prime(id, w)
		}
	}
	return nil
}

// requested reports whether the current field's selection reaches the
// given path of fields (e.g. edges → node → tasks).
func requested(ctx context.Context, path ...string) bool {
	oc := graphql.GetOperationContext(ctx)
	fields := graphql.CollectFieldsCtx(ctx, nil)
	for i, name := range path {
		var next *graphql.CollectedField
		for j := range fields {
			if fields[j].Name == name {
				next = &fields[j]
				break
			}
		}
		if next == nil {
			return false
		}
		if i == len(path)-1 {
			return true
		}
		fields = graphql.CollectFields(oc, next.Selections, nil)
	}
	return false
}
