package graph

import (
	"context"
	"strings"

	"github.com/google/uuid"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/engine/dag"
	"github.com/composer-dev/composer/graph/model"
)

// approvals describes the run's approval waits for the principal asking:
// who may answer each, and whether it may (the server's own check, made
// again when it answers).
func (r *Resolver) approvals(ctx context.Context, run *engine.RunView) ([]model.Approval, error) {
	p, err := principal(ctx)
	if err != nil || run.WorkflowID == uuid.Nil {
		return []model.Approval{}, err // (a bare view of a mutation's answer)
	}
	wf, err := r.definition(ctx, run)
	if err != nil {
		return nil, err
	}
	nodes := wf.Approvals()
	if len(nodes) == 0 {
		return []model.Approval{}, nil
	}
	var tasks []engine.TaskView
	if run.Snapshot != nil {
		tasks = run.Snapshot.Tasks
	} else if tasks, err = r.loaders(ctx).tasks.Load(ctx, run.ID); err != nil {
		return nil, err
	}
	waiting := map[string]bool{}
	for _, t := range tasks {
		waiting[t.NodeID] = t.State == "waiting"
	}
	var starter dag.Principal
	if run.StartedBy != nil {
		starter = dag.ParsePrincipal(*run.StartedBy)
	}
	writes := auth.PowerOf(p).Can(auth.ActionRunsWrite)
	out := make([]model.Approval, 0, len(nodes))
	for _, n := range nodes {
		a := model.Approval{Node: n.ID, Signal: n.Wait.Signal, Waiting: waiting[n.ID], Who: n.Wait.Approvers.Who(), MayApprove: true}
		if pol := n.Wait.Approvers; pol != nil {
			a.Policy = &model.ApprovalPolicy{Members: append([]string{}, pol.Members...), APIKeys: append([]string{}, pol.APIKeys...),
				NotStarter: pol.NotStarter, Roles: []model.Role{}}
			for _, role := range pol.Roles {
				a.Policy.Roles = append(a.Policy.Roles, model.Role(strings.ToUpper(role)))
			}
		}
		why := ""
		if !writes {
			why = "you may not write runs (runs:write), so you cannot answer approvals"
		} else {
			// Every approval of the signal's name must allow the sender,
			// as when it answers.
			why = wf.ApprovalRefusal(n.Wait.Signal, Actor(p), starter)
		}
		if why != "" {
			a.MayApprove, a.Reason = false, &why
		}
		out = append(out, a)
	}
	return out, nil
}
