// Package client is the Go client for Composer's API, for a tenant's own
// backend: create workflows, start runs (idempotently), signal and approve
// them, cancel them, read them and wait for their result.
//
//	c, err := client.New(os.Getenv("COMPOSER_URL"), os.Getenv("COMPOSER_API_KEY"))
//	run, created, err := c.StartRun(ctx, client.Start{Workflow: "order", Input: order, IdempotencyKey: order.ID})
//	run, err = c.WaitRun(ctx, run.ID)
//
// The GraphQL operations are generated from the published schema
// (sdk/schema.graphql, also served at GET /schema.graphql) by genqlient;
// generate your own client from the same file for other languages. Errors
// carry the API's stable code (ErrorCode). The package links nothing of
// the server. A Client is safe for concurrent use.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/Khan/genqlient/graphql"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// Client calls the API as one principal (an API key or a user token).
type Client struct {
	gql graphql.Client
}

// Options configure a Client.
type Options struct {
	// HTTPClient reaches the server (default: http.DefaultClient's
	// transport with a 30 s timeout per request).
	HTTPClient *http.Client
}

// New returns a client of the server at serverURL authenticating with
// credential: an API key (cmp_…) or a user token.
func New(serverURL, credential string, opts ...Options) (*Client, error) {
	if !strings.HasPrefix(serverURL, "http://") && !strings.HasPrefix(serverURL, "https://") {
		return nil, fmt.Errorf("composer client: the server URL %q must start with https:// (or http:// for a local server)", serverURL)
	}
	if credential == "" {
		return nil, errors.New("composer client: a credential (API key or user token) is required")
	}
	base := &http.Client{Timeout: 30 * time.Second}
	if len(opts) > 0 && opts[0].HTTPClient != nil {
		base = opts[0].HTTPClient
	}
	rt := base.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	hc := *base
	hc.Transport = bearer{token: credential, next: rt}
	return &Client{gql: graphql.NewClient(strings.TrimRight(serverURL, "/")+"/graphql", &hc)}, nil
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// Run is a workflow run as the API shows it.
type Run struct {
	ID              string
	WorkflowID      string
	Workflow        string
	WorkflowVersion int
	// Status is QUEUED, RUNNING, COMPLETED, FAILED or CANCELLED.
	Status         string
	Input          json.RawMessage
	Output         json.RawMessage
	Error          json.RawMessage
	IdempotencyKey string
	CreatedAt      time.Time
	UpdatedAt      time.Time
	FinishedAt     *time.Time
	// ParentRunID and ParentNode name the run and node that started a
	// child run ("" for a run started otherwise).
	ParentRunID string
	ParentNode  string
	// ConcurrencyKey is the run's key under its workflow's concurrency
	// limit ("" without one).
	ConcurrencyKey string
	Tasks          []Task
}

// Done reports whether the run reached a terminal status.
func (r *Run) Done() bool { return r.Status != "RUNNING" && r.Status != "QUEUED" }

// Task is one node's task in a run.
type Task struct {
	ID          string
	NodeID      string
	NodeType    string
	Queue       string
	Handler     string
	State       string
	Attempt     int
	MaxAttempts int
	Output      json.RawMessage
	LastError   json.RawMessage
	StartedAt   *time.Time
	FinishedAt  *time.Time
	// ChildRunID is the child run a workflow node (or map element) started.
	ChildRunID string
}

func runOf(f RunFields) *Run {
	r := &Run{ID: f.Id, WorkflowID: f.Workflow.Id, Workflow: f.Workflow.Name, WorkflowVersion: f.WorkflowVersion, Status: string(f.Status),
		Input: f.Input, Output: raw(f.Output), Error: raw(f.Error), IdempotencyKey: str(f.IdempotencyKey), CreatedAt: f.CreatedAt,
		UpdatedAt: f.UpdatedAt, FinishedAt: f.FinishedAt, ParentRunID: str(f.ParentRunId), ParentNode: str(f.ParentNode),
		ConcurrencyKey: str(f.ConcurrencyKey)}
	for _, t := range f.Tasks {
		r.Tasks = append(r.Tasks, Task{ID: t.Id, NodeID: t.NodeId, NodeType: t.NodeType, Queue: str(t.Queue), Handler: str(t.Handler),
			State: string(t.State), Attempt: t.Attempt, MaxAttempts: t.MaxAttempts, Output: raw(t.Output), LastError: raw(t.LastError),
			StartedAt: t.StartedAt, FinishedAt: t.FinishedAt, ChildRunID: str(t.ChildRunId)})
	}
	return r
}

func raw(p *json.RawMessage) json.RawMessage {
	if p == nil {
		return nil
	}
	return *p
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func ptr[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

func jsonOf(v any) (*json.RawMessage, error) {
	if v == nil {
		return nil, nil
	}
	if r, ok := v.(json.RawMessage); ok {
		return &r, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("composer client: encode: %w", err)
	}
	r := json.RawMessage(b)
	return &r, nil
}

// CreateWorkflow creates a workflow from a definition (a value encoded as
// JSON, or json.RawMessage) and returns its id and first version.
// Problems with the definition come back as an *Error of code
// BAD_USER_INPUT whose Problems name each node and field.
func (c *Client) CreateWorkflow(ctx context.Context, name string, definition any) (id string, version int, err error) {
	def, err := jsonOf(definition)
	if err != nil {
		return "", 0, err
	}
	if def == nil {
		return "", 0, errors.New("composer client: a definition is required")
	}
	res, err := createWorkflow(ctx, c.gql, CreateWorkflowInput{Name: name, Definition: *def})
	if err != nil {
		return "", 0, apiError(err)
	}
	return res.CreateWorkflow.Workflow.Id, res.CreateWorkflow.Version.Version, nil
}

// PublishVersion publishes the next version of a workflow.
func (c *Client) PublishVersion(ctx context.Context, workflowID string, definition any) (int, error) {
	def, err := jsonOf(definition)
	if err != nil {
		return 0, err
	}
	if def == nil {
		return 0, errors.New("composer client: a definition is required")
	}
	res, err := publishWorkflowVersion(ctx, c.gql, workflowID, *def)
	if err != nil {
		return 0, apiError(err)
	}
	return res.PublishWorkflowVersion.Version, nil
}

// Start says which run to start.
type Start struct {
	// Workflow names the workflow; WorkflowID may be given instead.
	Workflow   string
	WorkflowID string
	// Version pins a version (default: the latest).
	Version int
	// Input is the run's input (a value encoded as JSON, or json.RawMessage).
	Input any
	// IdempotencyKey makes the start safe to retry: a repeat with the same
	// key (and the same parameters) returns the run the first created.
	IdempotencyKey string
}

// StartRun starts a run; created is false when the idempotency key named
// an existing run.
func (c *Client) StartRun(ctx context.Context, s Start) (run *Run, created bool, err error) {
	in, err := jsonOf(s.Input)
	if err != nil {
		return nil, false, err
	}
	res, err := startRun(ctx, c.gql, StartRunInput{WorkflowId: ptr(s.WorkflowID), WorkflowName: ptr(s.Workflow), Version: ptr(s.Version),
		Input: in, IdempotencyKey: ptr(s.IdempotencyKey)})
	if err != nil {
		return nil, false, apiError(err)
	}
	return runOf(res.StartRun.Run.RunFields), res.StartRun.Created, nil
}

// GetRun reads a run with its tasks.
func (c *Client) GetRun(ctx context.Context, id string) (*Run, error) {
	res, err := getRun(ctx, c.gql, id)
	if err != nil {
		return nil, apiError(err)
	}
	return runOf(res.Run.RunFields), nil
}

// Signal sends a named signal to a run (a wait node for that name takes
// it). signalID, when set, makes it idempotent. ignored is true when the
// run did not take it (it had finished, or the id was seen).
func (c *Client) Signal(ctx context.Context, runID, name string, payload any, signalID string) (ignored bool, err error) {
	p, err := jsonOf(payload)
	if err != nil {
		return false, err
	}
	res, err := signalRun(ctx, c.gql, runID, name, p, ptr(signalID))
	if err != nil {
		return false, apiError(err)
	}
	return res.SignalRun.Ignored, nil
}

// Approve answers a run's approval wait (signal "approval" unless the
// definition names another).
func (c *Client) Approve(ctx context.Context, runID string, approved bool, comment string) (ignored bool, err error) {
	res, err := approve(ctx, c.gql, runID, nil, approved, ptr(comment), nil)
	if err != nil {
		return false, apiError(err)
	}
	return res.Approve.Ignored, nil
}

// CancelRun cancels a run; finished work is kept.
func (c *Client) CancelRun(ctx context.Context, runID, reason string) (*Run, error) {
	res, err := cancelRun(ctx, c.gql, runID, ptr(reason))
	if err != nil {
		return nil, apiError(err)
	}
	return runOf(res.CancelRun.RunFields), nil
}

// WaitRun waits until the run is terminal and returns it, polling its
// status (every 50 ms at first, backing off to every 2 s); ctx bounds
// the wait.
func (c *Client) WaitRun(ctx context.Context, id string) (*Run, error) {
	delay := 50 * time.Millisecond
	for {
		res, err := runStatus(ctx, c.gql, id)
		if err != nil {
			if e := apiError(err); !IsTemporary(e) {
				return nil, e
			}
		} else if res.Run.Status != RunStatusRunning {
			return c.GetRun(ctx, id)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*2, 2*time.Second)
	}
}

// Worker is one of the tenant's connected workers.
type Worker struct {
	ID          string
	Label       string
	Version     string
	Queues      []string
	Handlers    []string
	Slots       int
	InFlight    int
	APIKeyID    string
	ConnectedAt time.Time
	LastSeenAt  time.Time
}

// Workers lists the tenant's connected workers.
func (c *Client) Workers(ctx context.Context) ([]Worker, error) {
	res, err := workers(ctx, c.gql)
	if err != nil {
		return nil, apiError(err)
	}
	out := make([]Worker, len(res.Workers))
	for i, w := range res.Workers {
		out[i] = Worker{ID: w.Id, Label: w.Label, Version: w.Version, Queues: w.Queues, Handlers: w.Handlers, Slots: w.Slots,
			InFlight: w.InFlight, APIKeyID: str(w.ApiKeyId), ConnectedAt: w.ConnectedAt, LastSeenAt: w.LastSeenAt}
	}
	return out, nil
}

// Error is an error the API answered, with its stable code
// (UNAUTHENTICATED, FORBIDDEN, NOT_FOUND, BAD_USER_INPUT, CONFLICT,
// RATE_LIMITED, QUOTA_EXCEEDED, UNAVAILABLE, INTERNAL, …).
type Error struct {
	Code    string
	Message string
	// Problems name the node and field of each problem of an invalid
	// workflow definition.
	Problems []Problem
	// RetryAfter is set on RATE_LIMITED.
	RetryAfter time.Duration
	// Status is the HTTP status when the request was refused before
	// GraphQL ran (e.g. 401).
	Status int
}

// Problem is one problem of an invalid definition.
type Problem struct {
	Node    string `json:"node"`
	Field   string `json:"field"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return "composer: " + e.Code + ": " + e.Message }

// ErrorCode returns the API's code of err ("" when err is not an API error).
func ErrorCode(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// IsTemporary reports whether the same call may succeed later.
func IsTemporary(err error) bool {
	switch ErrorCode(err) {
	case "RATE_LIMITED", "UNAVAILABLE", "INTERNAL":
		return true
	case "":
		return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
	}
	return false
}

func apiError(err error) error {
	var list gqlerror.List
	var httpErr *graphql.HTTPError
	switch {
	case errors.As(err, &httpErr):
		e := &Error{Status: httpErr.StatusCode, Code: statusCode(httpErr.StatusCode), Message: http.StatusText(httpErr.StatusCode)}
		if len(httpErr.Response.Errors) > 0 {
			fill(e, httpErr.Response.Errors[0])
		}
		return e
	case errors.As(err, &list) && len(list) > 0:
		e := &Error{Status: http.StatusOK}
		fill(e, list[0])
		return e
	}
	return err
}

func fill(e *Error, g *gqlerror.Error) {
	if g.Message != "" {
		e.Message = g.Message
	}
	if c, ok := g.Extensions["code"].(string); ok {
		e.Code = c
	}
	if s, ok := g.Extensions["retryAfterSeconds"].(float64); ok {
		e.RetryAfter = time.Duration(s * float64(time.Second))
	}
	if ps, ok := g.Extensions["problems"]; ok {
		b, _ := json.Marshal(ps)
		_ = json.Unmarshal(b, &e.Problems)
	}
	if e.Code == "" {
		e.Code = "INTERNAL"
	}
}

func statusCode(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "UNAUTHENTICATED"
	case status == http.StatusForbidden:
		return "FORBIDDEN"
	case status == http.StatusTooManyRequests:
		return "RATE_LIMITED"
	case status == http.StatusRequestEntityTooLarge || status == http.StatusBadRequest:
		return "BAD_USER_INPUT"
	case status >= 500:
		return "UNAVAILABLE"
	}
	return "INTERNAL"
}
