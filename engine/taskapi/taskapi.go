// Package taskapi is the contract between workers and `composer server`:
// versioned HTTP/JSON messages to acquire, renew and report task leases,
// and a client for them. It imports nothing of the engine, so a worker
// binary links no database code.
//
// Every report is fenced by its attempt number and answered
// "acknowledged"; Ignored says the server dropped it as stale or
// duplicate, so the worker stops retrying. A renewal answers Held=false
// when the lease is gone (expired and taken over, task finished, run
// cancelled): the worker must stop that execution.
//
// A tenant's own worker (an API key of the worker scope) holds its leases
// under that key: the worker_id it sends names the worker within its key,
// and a lease — like a poll's kept answer — is renewed, reported and
// recovered only with the key it was taken with. Such a worker reports
// only task nodes; a report on any other node of its tenant (an http
// step, say) is FORBIDDEN.
package taskapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// Paths of the task API.
const (
	PathAcquire  = "/v1/tasks/acquire"
	PathRenew    = "/v1/tasks/renew"
	PathComplete = "/v1/tasks/complete"
	PathFail     = "/v1/tasks/fail"
	// PathPoll is how a tenant's own worker asks for work: the server reads
	// the tenant's handler streams on its behalf and answers with leases.
	PathPoll = "/v1/tasks/poll"
	// PathSecrets is how a platform worker reads the secrets of an http
	// task it holds the lease of, when it executes it.
	PathSecrets = "/v1/tasks/secrets"
)

// Ref names one attempt of one task.
type Ref struct {
	Tenant  uuid.UUID `json:"tenant_id"`
	Run     uuid.UUID `json:"run_id"`
	Task    uuid.UUID `json:"task_id"`
	Attempt int       `json:"attempt"`
}

// AcquireRequest asks for leases on a batch of tasks.
type AcquireRequest struct {
	WorkerID  string `json:"worker_id"`
	TTLMillis int64  `json:"ttl_ms"`
	Leases    []Ref  `json:"leases"`
}

// Lease answers one acquire. Input and Config come from the database with
// the lease: they are what the worker runs.
type Lease struct {
	Ref
	Acquired        bool            `json:"acquired"`
	ExpiresAt       time.Time       `json:"expires_at,omitempty"`
	NodeID          string          `json:"node_id,omitempty"`
	NodeType        string          `json:"node_type,omitempty"`
	Input           json.RawMessage `json:"input,omitempty"`
	Config          json.RawMessage `json:"config,omitempty"`
	WorkflowID      uuid.UUID       `json:"workflow_id,omitempty"`
	WorkflowVersion int             `json:"workflow_version,omitempty"`
	MaxAttempts     int             `json:"max_attempts,omitempty"`
	// Queue and TraceParent come with an eager lease (ReportResponse.Next),
	// which no stream message announced.
	Queue       string `json:"queue,omitempty"`
	TraceParent string `json:"traceparent,omitempty"`
}

// AcquireResponse lists one Lease per requested Ref, in order, and the
// running-task quota of each tenant involved as the call left it.
type AcquireResponse struct {
	Leases []Lease       `json:"leases"`
	Quotas []TenantQuota `json:"quotas,omitempty"`
}

// TenantQuota is a tenant's running-task quota: Limit 0 means unlimited.
// A worker holds (does not drop) messages of a tenant whose quota is full.
type TenantQuota struct {
	Tenant  uuid.UUID `json:"tenant_id"`
	Limit   int       `json:"limit"`
	Running int       `json:"running"`
}

// Full reports whether the tenant has no free slot.
func (q TenantQuota) Full() bool { return q.Limit > 0 && q.Running >= q.Limit }

// RenewRequest extends leases the worker holds.
type RenewRequest struct {
	WorkerID  string `json:"worker_id"`
	TTLMillis int64  `json:"ttl_ms"`
	Leases    []Ref  `json:"leases"`
}

// Renewal answers one renewal.
type Renewal struct {
	Ref
	Held      bool      `json:"held"`
	ExpiresAt time.Time `json:"expires_at,omitempty"`
}

// RenewResponse lists one Renewal per requested Ref, in order.
type RenewResponse struct {
	Leases []Renewal `json:"leases"`
}

// CompleteRequest reports a successful attempt. Eager, when set, offers
// the slot the attempt frees to the run's next task.
type CompleteRequest struct {
	Ref
	NodeID   string          `json:"node_id"`
	WorkerID string          `json:"worker_id"`
	Output   json.RawMessage `json:"output,omitempty"`
	Eager    *EagerOffer     `json:"eager,omitempty"`
}

// EagerOffer asks the server to lease the run's next task to this worker
// with the report's answer, if the completion dispatches one now that the
// worker can run: on Queue, of one of NodeTypes. A worker offers only a
// slot its scheduler would give the same tenant anyway.
type EagerOffer struct {
	Queue     string   `json:"queue"`
	NodeTypes []string `json:"node_types"`
	// Handlers are the task handlers the worker runs; a task node is only
	// offered to a worker that has its handler.
	Handlers  []string `json:"handlers,omitempty"`
	TTLMillis int64    `json:"ttl_ms"`
}

// PollRequest asks for work. The server answers at once with up to Slots
// leases of the caller's tenant's task nodes for the named handlers on the
// named queues, or holds the request until such work arrives or WaitMillis
// passes (then it answers with no leases). A poll whose answer did not
// arrive is sent again with the same PollID and Retry set: the server then
// answers with the leases the lost answer carried, if they are still held.
type PollRequest struct {
	WorkerID string `json:"worker_id"`
	PollID   string `json:"poll_id"`
	Retry    bool   `json:"retry,omitempty"`
	// Queues and Handlers name what the worker serves.
	Queues   []string `json:"queues"`
	Handlers []string `json:"handlers"`
	// Slots is how many tasks the worker can start now; Capacity and
	// InFlight describe it for the tenant's dashboard.
	Slots      int   `json:"slots"`
	Capacity   int   `json:"capacity"`
	InFlight   int   `json:"in_flight"`
	TTLMillis  int64 `json:"ttl_ms"`
	WaitMillis int64 `json:"wait_ms"`
	// Label (e.g. the host name) and Version (the SDK's) are shown to the
	// tenant in the list of its workers.
	Label   string `json:"label,omitempty"`
	Version string `json:"version,omitempty"`
}

// PollResponse carries the leases granted, each with the task's input and
// settings; the worker holds them as if it had acquired them.
type PollResponse struct {
	Leases []Lease `json:"leases"`
}

// Error describes a failed attempt.
type Error struct {
	Code    string          `json:"code"`
	Message string          `json:"message"`
	Details json.RawMessage `json:"details,omitempty"`
}

// FailRequest reports a failed attempt. Unleased marks a report for an
// attempt the worker never leased (a message delivered too many times),
// which is fenced by attempt alone.
type FailRequest struct {
	Ref
	NodeID           string `json:"node_id"`
	WorkerID         string `json:"worker_id"`
	Error            Error  `json:"error"`
	Retryable        bool   `json:"retryable"`
	RetryAfterMillis int64  `json:"retry_after_ms,omitempty"`
	Unleased         bool   `json:"unleased,omitempty"`
}

// ReportResponse acknowledges a report.
type ReportResponse struct {
	Acknowledged bool   `json:"acknowledged"`
	Ignored      bool   `json:"ignored"`
	Reason       string `json:"reason,omitempty"`
	RunStatus    string `json:"run_status,omitempty"`
	// Next is the eager lease granted for an EagerOffer: the worker holds
	// it as if it had acquired it, and must run or report it.
	Next *Lease `json:"next,omitempty"`
}

// Failure codes a worker reports (Error.Code) for what happened on its
// side; executors add their own (e.g. "http_status"), and the engine its
// own (statemachine's Code constants).
const (
	CodeTaskError        = "task_error"        // the handler returned an error
	CodePermanentError   = "permanent_error"   // the handler said not to retry
	CodeExecutionTimeout = "execution_timeout" // the attempt ran past its timeout
	CodeWorkerShutdown   = "worker_shutdown"   // the worker stopped before the task finished
	CodeMaxDeliveries    = "max_deliveries"    // the message kept coming back without running
	CodeNoHandler        = "no_handler"        // no handler of that name on the worker
	CodePanic            = "panic"             // the handler panicked
	CodeBadInput         = "bad_input"         // the input does not fit the handler's type
	CodeBadOutput        = "bad_output"        // the handler's output is not JSON
)

// CodeUnknownField is the error code of a request the server refused for
// a field it does not know (ErrorResponse's Field names it): how a worker
// newer than its server learns that a feature is not there yet.
const CodeUnknownField = "UNKNOWN_FIELD"

// ErrorResponse is the body of every non-2xx answer.
type ErrorResponse struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		// Field is the unknown field of an UNKNOWN_FIELD answer.
		Field string `json:"field,omitempty"`
	} `json:"error"`
}

// APIError is a non-2xx answer from the server.
type APIError struct {
	Status  int
	Code    string
	Message string
	Field   string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("task API: %d %s: %s", e.Status, e.Code, e.Message)
}

// Temporary reports whether retrying the same call may succeed.
func (e *APIError) Temporary() bool { return e.Status >= 500 || e.Status == http.StatusTooManyRequests }

// Client calls the task API. It is safe for concurrent use.
type Client struct {
	BaseURL string
	Token   string
	HTTP    *http.Client
	// Propagator carries the caller's trace context in each request
	// (default: the global one).
	Propagator propagation.TextMapPropagator
}

// NewClient returns a client for the server at baseURL.
func NewClient(baseURL, token string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Token: token, HTTP: &http.Client{Timeout: 15 * time.Second,
		Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}}}
}

// Acquire asks for leases.
func (c *Client) Acquire(ctx context.Context, r AcquireRequest) (AcquireResponse, error) {
	var out AcquireResponse
	return out, c.call(ctx, PathAcquire, r, &out)
}

// Renew extends leases.
func (c *Client) Renew(ctx context.Context, r RenewRequest) (RenewResponse, error) {
	var out RenewResponse
	return out, c.call(ctx, PathRenew, r, &out)
}

// Complete reports success.
func (c *Client) Complete(ctx context.Context, r CompleteRequest) (ReportResponse, error) {
	var out ReportResponse
	return out, c.call(ctx, PathComplete, r, &out)
}

// Poll asks for work (see PollRequest).
func (c *Client) Poll(ctx context.Context, r PollRequest) (PollResponse, error) {
	var out PollResponse
	return out, c.call(ctx, PathPoll, r, &out)
}

// Secrets reads the secrets of a leased task's request.
func (c *Client) Secrets(ctx context.Context, r SecretsRequest) (SecretsResponse, error) {
	var out SecretsResponse
	return out, c.call(ctx, PathSecrets, r, &out)
}

// Fail reports failure.
func (c *Client) Fail(ctx context.Context, r FailRequest) (ReportResponse, error) {
	var out ReportResponse
	return out, c.call(ctx, PathFail, r, &out)
}

func (c *Client) call(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("task API %s: %w", path, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.BaseURL+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("task API %s: %w", path, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.Token)
	prop := c.Propagator
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	prop.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("task API %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("task API %s: read answer: %w", path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e ErrorResponse
		_ = json.Unmarshal(data, &e)
		return &APIError{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message, Field: e.Error.Field}
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("task API %s: decode answer: %w", path, err)
	}
	return nil
}

// TaskConfig is what a worker needs to execute a node, stored with the task
// when it is created and handed out with its lease.
type TaskConfig struct {
	HTTP *HTTPSpec `json:"http,omitempty"`
	Task *TaskSpec `json:"task,omitempty"`
	// TimeoutMS bounds one attempt's execution (0 = no limit of its own).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Priority is the task's priority (0 when absent), kept so a re-dispatch
	// goes to the same priority stream.
	Priority int `json:"priority,omitempty"`
	// RateLimit is the tenant's rate limit the task takes a token of
	// before it runs, with the key its node's expression gave.
	RateLimit *RateLimitRef `json:"rate_limit,omitempty"`
}

// RateLimitRef names a rate limit and the key of its bucket.
type RateLimitRef struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

// HTTPSpec is an http node's request, rendered for its task. With no
// Body, POST, PUT and PATCH send the task input as JSON; other methods
// send no body.
//
// Values that read secrets are not rendered: URLParts, a Param's Parts and
// SecretHeaders hold literal text and expressions over secrets, which the
// executor evaluates with the values it reads for its lease
// (PathSecrets), so a secret's value never enters the task.
type HTTPSpec struct {
	Method string `json:"method"`
	URL    string `json:"url"`
	// URLParts, when set, is the URL (URL is then empty).
	URLParts []Part `json:"url_parts,omitempty"`
	// Query parameters are added to the URL, in order.
	Query         []Param           `json:"query,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	SecretHeaders map[string][]Part `json:"secret_headers,omitempty"`
	// Secrets names the secrets the parts read: the server opens only
	// these, for the worker holding the task's lease.
	Secrets   []string        `json:"secrets,omitempty"`
	Body      json.RawMessage `json:"body,omitempty"`
	TimeoutMS int64           `json:"timeout_ms,omitempty"`
}

// Param is a query parameter: Value, or Parts when it reads secrets.
type Param struct {
	Name  string `json:"name"`
	Value string `json:"value,omitempty"`
	Parts []Part `json:"parts,omitempty"`
}

// Part is a piece of a value that reads secrets: literal Text, or Secret,
// a CEL expression over secrets, whose result is escaped as Escape says
// ("path", "query" or "" for none).
type Part struct {
	Text   string `json:"text,omitempty"`
	Secret string `json:"secret,omitempty"`
	Escape string `json:"escape,omitempty"`
}

// SecretsRequest asks for the secrets a leased http task reads. Only the
// platform's workers may ask, and only for a task whose lease they hold.
type SecretsRequest struct {
	Ref
	WorkerID string `json:"worker_id"`
}

// SecretsResponse holds the current values of the secrets the task's
// request names. It is never stored or logged.
type SecretsResponse struct {
	Secrets map[string]string `json:"secrets"`
}

// TaskSpec names the handler of a task node.
type TaskSpec struct {
	Handler string `json:"handler"`
}
