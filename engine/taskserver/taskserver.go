// Package taskserver serves the task API (engine/taskapi) on `composer
// server`: workers acquire, renew and report leases here. Lease times use
// the database clock. Every report is acknowledged, ignored or not, so a
// worker stops retrying it.
package taskserver

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/engine"
	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/engine/taskpoll"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/obs"
)

// Caller is an authenticated worker. A platform worker serves every tenant;
// a tenant's own worker (authenticated with a worker-scoped API key) only
// its tenant, and holds its leases under its key.
type Caller struct {
	Platform bool
	Tenant   uuid.UUID
	Name     string
	// KeyID is the API key a tenant's worker authenticated with: the
	// leases it takes are bound to it (engine.Holder).
	KeyID string
	// recheck authenticates the request again (a held poll's credential
	// may have been revoked meanwhile).
	recheck func(context.Context) error
}

// Authenticator resolves the caller of a request, or fails with an
// Unauthenticated error. fresh asks it to bypass any cache of recent
// authentications (a held poll checking its key was not revoked).
type Authenticator func(r *http.Request, fresh bool) (Caller, error)

// PlatformToken authenticates platform workers by a shared secret, compared
// in constant time against its hash (the plain token is not kept).
func PlatformToken(token string) Authenticator {
	want := sha256.Sum256([]byte(token))
	return func(r *http.Request, _ bool) (Caller, error) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			return Caller{}, errs.E(errs.Unauthenticated, "a worker credential is required (Authorization: Bearer <token>)")
		}
		sum := sha256.Sum256([]byte(got))
		if subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			return Caller{}, errs.E(errs.Unauthenticated, "invalid worker credential")
		}
		return Caller{Platform: true, Name: "platform"}, nil
	}
}

// SecretReader opens the current values of the secrets a leased task's
// request names, while the attempt runs under worker's live lease
// (secrets.Service.ForLease).
type SecretReader func(ctx context.Context, ref taskapi.Ref, worker string) (map[string]string, error)

// Server is the task API's HTTP handler.
type Server struct {
	c       *engine.Coordinator
	poll    *taskpoll.Poller
	auth    Authenticator
	log     *zap.Logger
	mux     *http.ServeMux
	secrets SecretReader
}

// WithSecrets lets platform workers read their leased tasks' secrets
// (without it PathSecrets answers UNAVAILABLE).
func (s *Server) WithSecrets(r SecretReader) *Server {
	s.secrets = r
	return s
}

// maxBody bounds a request: one output (1 MiB) plus its envelope.
const maxBody = engine.MaxInputBytes + 64<<10

// New returns the handler. poll serves tenant workers' polls (nil: the
// server takes none).
func New(c *engine.Coordinator, poll *taskpoll.Poller, auth Authenticator, log *zap.Logger) *Server {
	if log == nil {
		log = zap.NewNop()
	}
	s := &Server{c: c, poll: poll, auth: auth, log: log, mux: http.NewServeMux()}
	s.mux.HandleFunc("POST "+taskapi.PathPoll, handle(s, s.pollWork))
	s.mux.HandleFunc("POST "+taskapi.PathAcquire, handle(s, s.acquire))
	s.mux.HandleFunc("POST "+taskapi.PathRenew, handle(s, s.renew))
	s.mux.HandleFunc("POST "+taskapi.PathComplete, handle(s, s.complete))
	s.mux.HandleFunc("POST "+taskapi.PathFail, handle(s, s.fail))
	s.mux.HandleFunc("POST "+taskapi.PathSecrets, handle(s, s.readSecrets))
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

func handle[In, Out any](s *Server, fn func(context.Context, Caller, In) (Out, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// Behind the server's HTTP middleware the request already has its
		// span (a child of the worker's traceparent); bare, the header is
		// the parent.
		ctx := r.Context()
		if !trace.SpanContextFromContext(ctx).IsValid() {
			ctx = otel.GetTextMapPropagator().Extract(ctx, propagation.HeaderCarrier(r.Header))
		}
		caller, err := s.auth(r, false)
		if err != nil {
			s.writeError(ctx, w, err)
			return
		}
		caller.recheck = func(ctx context.Context) error {
			_, err := s.auth(r.WithContext(ctx), true)
			return err
		}
		var in In
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			if field, ok := unknownField(err); ok {
				var body taskapi.ErrorResponse
				body.Error.Code, body.Error.Field = taskapi.CodeUnknownField, field
				body.Error.Message = fmt.Sprintf("the server does not know the field %q", field)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				_ = json.NewEncoder(w).Encode(body)
				return
			}
			s.writeError(ctx, w, errs.E(errs.Invalid, "bad request body: %v", err))
			return
		}
		out, err := fn(ctx, caller, in)
		if err != nil {
			s.writeError(ctx, w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	}
}

// unknownField names the field a strict decode refused (encoding/json
// reports it only in its message).
func unknownField(err error) (string, bool) {
	rest, ok := strings.CutPrefix(err.Error(), "json: unknown field ")
	if !ok {
		return "", false
	}
	field, err := strconv.Unquote(rest)
	return field, err == nil
}

func (s *Server) writeError(ctx context.Context, w http.ResponseWriter, err error) {
	kind := errs.KindOf(err)
	status := errs.HTTPStatus(kind)
	switch {
	case status == http.StatusInternalServerError:
		s.log.Error("task API request failed", append(obs.LogFields(ctx), zap.Error(err))...)
	case kind == errs.Unavailable || kind == errs.OutcomeUnknown:
		s.log.Warn("task API request met a store fault", append(obs.LogFields(ctx), zap.String("code", string(kind)), zap.Error(err))...)
	}
	if after := errs.RetryAfter(err); after > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(after.Seconds()+0.999)))
	}
	var body taskapi.ErrorResponse
	body.Error.Code, body.Error.Message = string(kind), errs.PublicMessage(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// allowed checks the caller may act on tenant.
func allowed(c Caller, tenant uuid.UUID) error {
	if c.Platform || c.Tenant == tenant {
		return nil
	}
	// Another tenant's task does not exist for this caller.
	return errs.E(errs.NotFound, "task not found")
}

// byTenant groups refs per tenant, remembering their positions.
func byTenant(c Caller, refs []taskapi.Ref) (map[uuid.UUID][]int, error) {
	out := map[uuid.UUID][]int{}
	for i, r := range refs {
		if err := allowed(c, r.Tenant); err != nil {
			return nil, err
		}
		out[r.Tenant] = append(out[r.Tenant], i)
	}
	return out, nil
}

func ttl(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

// holder is who the caller's leases are for: the worker id it names and,
// for a tenant's worker, the key it authenticated with — so the worker id
// alone, which any key of the tenant can name, reaches nothing.
func holder(c Caller, worker string) (engine.Holder, error) {
	if c.Platform {
		return engine.Holder{Worker: worker}, nil
	}
	if c.KeyID == "" {
		return engine.Holder{}, errs.E(errs.Unauthenticated, "a tenant's worker authenticates with its API key")
	}
	return engine.Holder{Worker: worker, Key: c.KeyID}, nil
}

// readSecrets answers a platform worker executing an http task with the
// values of the secrets its request names. Tenant workers never run http
// tasks, so they are refused; the answer is neither stored nor logged.
func (s *Server) readSecrets(ctx context.Context, c Caller, in taskapi.SecretsRequest) (taskapi.SecretsResponse, error) {
	if !c.Platform {
		return taskapi.SecretsResponse{}, errs.E(errs.Forbidden, "only the platform's workers read secrets, for the http tasks they hold")
	}
	if s.secrets == nil {
		return taskapi.SecretsResponse{}, errs.E(errs.Unavailable, "this server does not serve secrets")
	}
	if in.WorkerID == "" {
		return taskapi.SecretsResponse{}, errs.E(errs.Invalid, "worker_id is required")
	}
	v, err := s.secrets(ctx, in.Ref, in.WorkerID)
	if err != nil {
		return taskapi.SecretsResponse{}, err
	}
	return taskapi.SecretsResponse{Secrets: v}, nil
}

// pollWork answers a tenant worker's poll with leases of its tenant's
// task nodes (see taskpoll).
func (s *Server) pollWork(ctx context.Context, c Caller, in taskapi.PollRequest) (taskapi.PollResponse, error) {
	if c.Platform {
		return taskapi.PollResponse{}, errs.E(errs.Forbidden, "polling is for a tenant's own workers, with an API key of the worker scope")
	}
	if s.poll == nil {
		return taskapi.PollResponse{}, errs.E(errs.Unavailable, "this server does not serve tenant workers")
	}
	leases, err := s.poll.Poll(ctx, taskpoll.Caller{Tenant: c.Tenant, KeyID: c.KeyID, Recheck: c.recheck}, in)
	if err != nil {
		return taskapi.PollResponse{}, err
	}
	out := taskapi.PollResponse{Leases: make([]taskapi.Lease, len(leases))}
	for i, l := range leases {
		out.Leases[i] = leaseOf(taskapi.Ref{Tenant: c.Tenant, Run: l.RunID, Task: l.TaskID, Attempt: l.Attempt}, l)
	}
	return out, nil
}

func (s *Server) acquire(ctx context.Context, c Caller, in taskapi.AcquireRequest) (taskapi.AcquireResponse, error) {
	if !c.Platform {
		// Tenant workers are served by polls: the streams they would name
		// messages from are the platform's.
		return taskapi.AcquireResponse{}, errs.E(errs.Forbidden, "a tenant's workers get their tasks by polling (%s)", taskapi.PathPoll)
	}
	groups, err := byTenant(c, in.Leases)
	if err != nil {
		return taskapi.AcquireResponse{}, err
	}
	out := taskapi.AcquireResponse{Leases: make([]taskapi.Lease, len(in.Leases))}
	// Every tenant's leases in one transaction (each statement under its
	// own tenant): a fill that spread over tenants costs one commit.
	batch := make([]engine.TenantLeases, 0, len(groups))
	var order [][]int
	for tenant, idx := range groups {
		reqs := make([]engine.LeaseRequest, len(idx))
		for j, i := range idx {
			r := in.Leases[i]
			reqs[j] = engine.LeaseRequest{RunID: r.Run, TaskID: r.Task, Attempt: r.Attempt}
		}
		batch = append(batch, engine.TenantLeases{Tenant: tenant, Requests: reqs})
		order = append(order, idx)
	}
	res, err := s.c.AcquireLeasesOf(ctx, engine.Holder{Worker: in.WorkerID}, ttl(in.TTLMillis), batch)
	if err != nil {
		return taskapi.AcquireResponse{}, err
	}
	for k, g := range res {
		out.Quotas = append(out.Quotas, taskapi.TenantQuota{Tenant: g.Tenant, Limit: g.Quota.Limit, Running: g.Quota.Running})
		for j, i := range order[k] {
			out.Leases[i] = leaseOf(in.Leases[i], g.Leases[j])
		}
	}
	return out, nil
}

func (s *Server) renew(ctx context.Context, c Caller, in taskapi.RenewRequest) (taskapi.RenewResponse, error) {
	groups, err := byTenant(c, in.Leases)
	if err != nil {
		return taskapi.RenewResponse{}, err
	}
	h, err := holder(c, in.WorkerID)
	if err != nil {
		return taskapi.RenewResponse{}, err
	}
	out := taskapi.RenewResponse{Leases: make([]taskapi.Renewal, len(in.Leases))}
	for tenant, idx := range groups {
		reqs := make([]engine.LeaseRequest, len(idx))
		for j, i := range idx {
			r := in.Leases[i]
			reqs[j] = engine.LeaseRequest{RunID: r.Run, TaskID: r.Task, Attempt: r.Attempt}
		}
		rens, err := s.c.RenewLeases(ctx, tenant, h, ttl(in.TTLMillis), reqs)
		if err != nil {
			return taskapi.RenewResponse{}, err
		}
		for j, i := range idx {
			out.Leases[i] = taskapi.Renewal{Ref: in.Leases[i], Held: rens[j].Held, ExpiresAt: rens[j].ExpiresAt}
		}
	}
	if !c.Platform && s.poll != nil {
		s.poll.Renewed(ctx, taskpoll.Caller{Tenant: c.Tenant, KeyID: c.KeyID}, in.WorkerID, ttl(in.TTLMillis), len(in.Leases))
	}
	return out, nil
}

func ackOf(tenant uuid.UUID, a engine.Ack) taskapi.ReportResponse {
	out := taskapi.ReportResponse{Acknowledged: true, Ignored: a.Ignored, Reason: a.Reason, RunStatus: string(a.Status)}
	if l := a.Next; l != nil {
		next := leaseOf(taskapi.Ref{Tenant: tenant, Run: l.RunID, Task: l.TaskID, Attempt: l.Attempt}, *l)
		out.Next = &next
	}
	return out
}

// leaseOf is an engine lease on the wire, for the task ref names.
func leaseOf(ref taskapi.Ref, l engine.Lease) taskapi.Lease {
	return taskapi.Lease{Ref: ref, Acquired: l.Acquired, ExpiresAt: l.ExpiresAt, NodeID: l.NodeID, NodeType: l.NodeType, Input: l.Input,
		Config: l.Config, WorkflowID: l.WorkflowID, WorkflowVersion: l.WorkflowVersion, MaxAttempts: l.MaxAttempts, Queue: l.Queue,
		TraceParent: l.TraceParent}
}

func (s *Server) complete(ctx context.Context, c Caller, in taskapi.CompleteRequest) (taskapi.ReportResponse, error) {
	if err := allowed(c, in.Tenant); err != nil {
		return taskapi.ReportResponse{}, err
	}
	if in.WorkerID == "" {
		return taskapi.ReportResponse{}, errs.E(errs.Invalid, "worker_id is required")
	}
	h, err := holder(c, in.WorkerID)
	if err != nil {
		return taskapi.ReportResponse{}, err
	}
	// A tenant's worker's report applies only to a lease its key took, of
	// a task node (its eager offer, too, covers task nodes only).
	r := engine.Report{RunID: in.Run, TaskID: in.Task, NodeID: in.NodeID, Attempt: in.Attempt, LeaseOwner: h.Worker, LeaseKey: h.Key,
		Output: in.Output}
	if o := in.Eager; o != nil {
		r.Eager = &engine.EagerOffer{Queue: o.Queue, NodeTypes: o.NodeTypes, Handlers: o.Handlers, TTL: ttl(o.TTLMillis)}
	}
	ack, err := s.c.CompleteTask(ctx, in.Tenant, r)
	if errors.Is(err, errs.NotFound) {
		// The run is gone (retention) or never existed: nothing to apply.
		return taskapi.ReportResponse{Acknowledged: true, Ignored: true, Reason: "run not found"}, nil
	}
	if err != nil {
		return taskapi.ReportResponse{}, err
	}
	return ackOf(in.Tenant, ack), nil
}

func (s *Server) fail(ctx context.Context, c Caller, in taskapi.FailRequest) (taskapi.ReportResponse, error) {
	if err := allowed(c, in.Tenant); err != nil {
		return taskapi.ReportResponse{}, err
	}
	if in.WorkerID == "" {
		return taskapi.ReportResponse{}, errs.E(errs.Invalid, "worker_id is required")
	}
	if in.Unleased && !c.Platform {
		// Only the platform's stream readers see a message delivered too
		// often; a tenant's worker reports what it leased.
		return taskapi.ReportResponse{}, errs.E(errs.Forbidden, "unleased reports are for platform workers")
	}
	h, err := holder(c, in.WorkerID)
	if err != nil {
		return taskapi.ReportResponse{}, err
	}
	if in.Unleased {
		h = engine.Holder{}
	}
	ack, err := s.c.FailTask(ctx, in.Tenant, engine.Report{RunID: in.Run, TaskID: in.Task, NodeID: in.NodeID, Attempt: in.Attempt,
		LeaseOwner: h.Worker, LeaseKey: h.Key, Unleased: in.Unleased, Retryable: in.Retryable, RetryAfter: time.Duration(in.RetryAfterMillis) * time.Millisecond,
		Error: sm.Error{Code: in.Error.Code, Message: in.Error.Message, Details: in.Error.Details}})
	if errors.Is(err, errs.NotFound) {
		return taskapi.ReportResponse{Acknowledged: true, Ignored: true, Reason: "run not found"}, nil
	}
	if err != nil {
		return taskapi.ReportResponse{}, err
	}
	return ackOf(in.Tenant, ack), nil
}
