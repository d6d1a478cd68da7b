// Package client is the Go client for Composer's API, for a tenant's own
// backend: create workflows, start runs (idempotently), signal and approve
// them, cancel them, read them and wait for their result.
//
// A backend's API key needs runs:write and runs:read; every call asks only
// for what those scopes may read, so a mutation's success always reaches
// the caller.
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
//
// Calls that are safe to repeat are repeated when the server answers
// UNAVAILABLE (a store could not be reached) or OUTCOME_UNKNOWN (the
// commit's answer was lost) or the connection fails, with backoff and
// jitter within their context (Options.Retries): reads, and the writes
// that carry a key the server deduplicates by. StartRun always sends an
// idempotency key (a new UUID when Start has none) and Signal and Approve
// a signal id, kept across the repeats, so a repeat never starts a second
// run or delivers a signal twice.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/Khan/genqlient/graphql"
	"github.com/google/uuid"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// Client calls the API as one principal (an API key or a user token).
type Client struct {
	gql     graphql.Client
	retries int
}

// Options configure a Client.
type Options struct {
	// HTTPClient reaches the server (default: http.DefaultClient's
	// transport with a 30 s timeout per request).
	HTTPClient *http.Client
	// Retries is how many times a call that is safe to repeat is repeated
	// after UNAVAILABLE, OUTCOME_UNKNOWN or a failed connection (default
	// DefaultRetries; a negative value turns repeats off). The waits grow
	// from 100 ms to 5 s with jitter, never shorter than the server's
	// retryAfterSeconds, and end with the call's context.
	Retries int
}

// DefaultRetries is Options.Retries' default.
const DefaultRetries = 5

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
	retries := DefaultRetries
	if len(opts) > 0 && opts[0].Retries != 0 {
		retries = max(opts[0].Retries, 0)
	}
	return &Client{gql: graphql.NewClient(strings.TrimRight(serverURL, "/")+"/graphql", &hc), retries: retries}, nil
}

// repeat runs call (which returns an API error, see apiError) until it
// succeeds or fails in a way a repeat cannot fix, its repeats are spent,
// or ctx would end before the next. Only calls safe to repeat use it.
func (c *Client) repeat(ctx context.Context, call func() error) error {
	backoff := 100 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := call()
		if err == nil || attempt >= c.retries || !repeatable(err) || ctx.Err() != nil {
			return err
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		var e *Error
		if errors.As(err, &e) && e.RetryAfter > wait {
			wait = e.RetryAfter
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// repeatable reports an answer a repeat of the same call may change: the
// server could not reach a store, lost its commit's answer, or the
// connection to it failed.
func repeatable(err error) bool {
	switch ErrorCode(err) {
	case "UNAVAILABLE", "OUTCOME_UNKNOWN":
		return true
	case "":
		return transient(err)
	}
	return false
}

// transient reports a failure of the connection to the server (not of the
// call's context, nor the client's own mistake).
func transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

// newKey returns a key for a write the server deduplicates by, for a call
// given none: a UUID (time-ordered).
func newKey() (string, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("composer client: make an idempotency key: %w", err)
	}
	return id.String(), nil
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
	ID         string
	WorkflowID string
	// Workflow is the workflow's name as StartRun was given it ("" when
	// the start named the workflow by id, and for runs read: reading a
	// workflow needs workflows:read, which a backend's key lacks).
	Workflow        string
	WorkflowVersion int
	// Status is QUEUED or RUNNING (not finished), or COMPLETED, FAILED or
	// CANCELLED (terminal, see Done).
	Status         string
	Input          json.RawMessage
	Output         json.RawMessage
	Error          json.RawMessage
	IdempotencyKey string
	// Priority is the run's priority, -2..2 (Start.Priority).
	Priority   int
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt *time.Time
	// ParentRunID and ParentNode name the run and node that started a
	// child run ("" for a run started otherwise).
	ParentRunID string
	ParentNode  string
	// ConcurrencyKey is the run's key under its workflow's concurrency
	// limit ("" without one).
	ConcurrencyKey string
	// Tasks are the run's tasks (GetRun, WaitRun); a mutation's answer
	// has none — reading them needs runs:read.
	Tasks []Task
}

// Done reports whether the run reached a terminal status.
func (r *Run) Done() bool { return terminal(RunStatus(r.Status)) }

// terminal reports a status a run never leaves: COMPLETED, FAILED,
// CANCELLED. Any other (QUEUED, RUNNING, and a status this client does not
// know yet) may still change.
func terminal(s RunStatus) bool {
	switch s {
	case RunStatusCompleted, RunStatusFailed, RunStatusCancelled:
		return true
	}
	return false
}

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

func runOf(f RunWritten) *Run {
	return &Run{ID: f.Id, WorkflowID: f.WorkflowId, WorkflowVersion: f.WorkflowVersion, Status: string(f.Status),
		Input: f.Input, Output: raw(f.Output), Error: raw(f.Error), IdempotencyKey: str(f.IdempotencyKey), Priority: f.Priority, CreatedAt: f.CreatedAt,
		UpdatedAt: f.UpdatedAt, FinishedAt: f.FinishedAt, ParentRunID: str(f.ParentRunId), ParentNode: str(f.ParentNode),
		ConcurrencyKey: str(f.ConcurrencyKey)}
}

func runWithTasks(f RunFields) *Run {
	r := runOf(f.RunWritten)
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
	// When empty, StartRun makes one (a UUID) for its own repeats; the run
	// shows it as its IdempotencyKey.
	IdempotencyKey string
	// Priority is the run's priority, -2 (lowest) to 2 (highest), 0 by
	// default: within the tenant's share of the workers its steps start
	// before lower-priority steps queued less than a minute per level
	// earlier (a node's own priority, if its definition sets one, wins).
	Priority int
}

// StartRun starts a run; created is false when the idempotency key named
// an existing run (one this call's own earlier attempt started counts as
// created when the key was StartRun's own). It is repeated as the package
// documentation says, with the same key. The run has no Tasks (GetRun).
func (c *Client) StartRun(ctx context.Context, s Start) (run *Run, created bool, err error) {
	in, err := jsonOf(s.Input)
	if err != nil {
		return nil, false, err
	}
	key, own := s.IdempotencyKey, false
	if key == "" {
		if key, err = newKey(); err != nil {
			return nil, false, err
		}
		own = true
	}
	input := StartRunInput{WorkflowId: ptr(s.WorkflowID), WorkflowName: ptr(s.Workflow), Version: ptr(s.Version),
		Input: in, IdempotencyKey: &key, Priority: ptr(s.Priority)}
	var res *startRunResponse
	err = c.repeat(ctx, func() (err error) {
		res, err = startRun(ctx, c.gql, input)
		return apiError(err)
	})
	if err != nil {
		return nil, false, err
	}
	run = runOf(res.StartRun.Run.RunWritten)
	run.Workflow = s.Workflow
	// A key of StartRun's own names no run but this call's.
	return run, res.StartRun.Created || own, nil
}

// GetRun reads a run with its tasks.
func (c *Client) GetRun(ctx context.Context, id string) (*Run, error) {
	var res *getRunResponse
	err := c.repeat(ctx, func() (err error) {
		res, err = getRun(ctx, c.gql, id)
		return apiError(err)
	})
	if err != nil {
		return nil, err
	}
	return runWithTasks(res.Run.RunFields), nil
}

// Signal sends a named signal to a run (a wait node for that name takes
// it). signalID makes it idempotent; when empty, Signal makes one for its
// own repeats. ignored is true when the run did not take it (it had
// finished, or the id was seen).
func (c *Client) Signal(ctx context.Context, runID, name string, payload any, signalID string) (ignored bool, err error) {
	p, err := jsonOf(payload)
	if err != nil {
		return false, err
	}
	if signalID == "" {
		if signalID, err = newKey(); err != nil {
			return false, err
		}
	}
	var res *signalRunResponse
	err = c.repeat(ctx, func() (err error) {
		res, err = signalRun(ctx, c.gql, runID, name, p, &signalID)
		return apiError(err)
	})
	if err != nil {
		return false, err
	}
	return res.SignalRun.Ignored, nil
}

// Approve answers a run's approval wait (signal "approval" unless the
// definition names another), once however often it is repeated.
func (c *Client) Approve(ctx context.Context, runID string, approved bool, comment string) (ignored bool, err error) {
	signalID, err := newKey()
	if err != nil {
		return false, err
	}
	var res *approveResponse
	err = c.repeat(ctx, func() (err error) {
		res, err = approve(ctx, c.gql, runID, nil, approved, ptr(comment), &signalID)
		return apiError(err)
	})
	if err != nil {
		return false, err
	}
	return res.Approve.Ignored, nil
}

// CancelRun cancels a run; finished work is kept. Cancelling a cancelled
// run changes nothing, so it is repeated like a read. The run has no
// Tasks (GetRun).
func (c *Client) CancelRun(ctx context.Context, runID, reason string) (*Run, error) {
	var res *cancelRunResponse
	err := c.repeat(ctx, func() (err error) {
		res, err = cancelRun(ctx, c.gql, runID, ptr(reason))
		return apiError(err)
	})
	if err != nil {
		return nil, err
	}
	return runOf(res.CancelRun.RunWritten), nil
}

// WaitRun waits until the run is terminal (COMPLETED, FAILED or
// CANCELLED; not QUEUED or RUNNING) and returns it, polling its status
// (every 50 ms at first, backing off to every 2 s) through answers a
// repeat may change; ctx bounds the wait.
func (c *Client) WaitRun(ctx context.Context, id string) (*Run, error) {
	delay := 50 * time.Millisecond
	for {
		res, err := runStatus(ctx, c.gql, id)
		if err != nil {
			if e := apiError(err); !IsTemporary(e) {
				return nil, e
			}
		} else if terminal(res.Run.Status) {
			return c.GetRun(ctx, id)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
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
	var res *workersResponse
	err := c.repeat(ctx, func() (err error) {
		res, err = workers(ctx, c.gql)
		return apiError(err)
	})
	if err != nil {
		return nil, err
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
// RATE_LIMITED, QUOTA_EXCEEDED, UNAVAILABLE, OUTCOME_UNKNOWN, INTERNAL, …).
type Error struct {
	Code    string
	Message string
	// Problems name the node and field of each problem of an invalid
	// workflow definition.
	Problems []Problem
	// RetryAfter is the server's hint of when to try again (RATE_LIMITED,
	// UNAVAILABLE, OUTCOME_UNKNOWN).
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

// IsTemporary reports whether the same call may succeed later: the API
// answered RATE_LIMITED, UNAVAILABLE, OUTCOME_UNKNOWN (repeat it with the
// same idempotency key) or INTERNAL, or the connection to it failed. It
// is false for nil, for the call's own context ending, and for the
// client's refusals of bad arguments.
func IsTemporary(err error) bool {
	switch ErrorCode(err) {
	case "RATE_LIMITED", "UNAVAILABLE", "OUTCOME_UNKNOWN", "INTERNAL":
		return true
	case "":
		return transient(err)
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
