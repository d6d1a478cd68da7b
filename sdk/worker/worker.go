// Package worker runs your own code as steps of Composer workflows. It
// needs the server's URL and an API key with the worker scope — nothing
// else: no database, no Redis, no platform credentials. It talks to the
// server's public task API only.
//
// A workflow's task node names a handler:
//
//	{"id": "charge", "type": "task", "task": {"handler": "charge"}, "input": {"amount": "input.amount"}}
//
// and a worker that registered that handler runs it:
//
//	w, err := worker.New(os.Getenv("COMPOSER_URL"), os.Getenv("COMPOSER_API_KEY"), worker.Options{})
//	worker.Handle(w, "charge", func(ctx context.Context, in Charge) (Receipt, error) { … })
//	err = w.Run(ctx)
//
// What the worker does for you:
//   - it asks for work only when it has free slots (Options.Concurrency)
//     and the server answers as soon as work arrives (a long poll), so an
//     idle worker costs next to nothing and a busy one never takes more
//     than it can run;
//   - it renews every lease it holds every LeaseTTL/3 (the heartbeat); if
//     the server says a lease is gone, the handler's context is cancelled
//     with ErrLeaseLost and its result discarded;
//   - every result carries its attempt number, so a late result of a
//     superseded attempt is ignored by the server (fencing); reports are
//     retried until the server acknowledges them;
//   - a success may take the run's next task in the same call (eager
//     dispatch), saving a round trip per step of a chain;
//   - on SIGINT or SIGTERM (or when Run's context ends) it stops asking
//     for work, lets running handlers finish for ShutdownTimeout, then
//     cancels them with ErrShutdown and reports them as retryable;
//   - when the server refuses the API key (revoked, expired, no worker
//     scope) it stops at once and Run returns an error wrapping
//     ErrUnauthorized; its tasks go back to the queue.
//
// A plain error from a handler is retried while the node has attempts
// left; Permanent fails the node at once; RetryAfter sets the earliest
// retry. A panic is recovered and retried.
//
// The package links nothing of the server (go list -deps shows no
// database or Redis driver). A Worker is safe for concurrent use.
package worker

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/composer-dev/composer/engine/taskapi"
)

// Version is this SDK's version, shown with the worker in the tenant's
// list of workers.
const Version = "composer-go/0.1.0"

// Options configure a Worker. Zero fields take the defaults.
type Options struct {
	// Queues the worker serves (default ["default"], the queue of a task
	// node that names none).
	Queues []string
	// Concurrency is how many handlers may run at once (default 16).
	Concurrency int
	// LeaseTTL is how long a task stays this worker's without a
	// heartbeat; heartbeats come every LeaseTTL/3 (default 30s). A worker
	// that dies gives its tasks back after this long.
	LeaseTTL time.Duration
	// ShutdownTimeout is how long running handlers may finish once
	// shutdown begins (default 30s).
	ShutdownTimeout time.Duration
	// WorkerID names this worker process; it must be unique among the
	// tenant's workers (default host-pid-random).
	WorkerID string
	// Label describes the worker in the tenant's list of workers (default
	// the host name).
	Label string
	// Logger receives the worker's structured logs (default slog.Default()).
	Logger *slog.Logger
	// HTTPClient reaches the server (default: a client honouring the
	// proxy environment variables).
	HTTPClient *http.Client
	// NoEager turns off taking a run's next task with a step's result.
	NoEager bool
	// NoSignals stops Run from handling SIGINT and SIGTERM itself (then
	// only its context ends it).
	NoSignals bool
}

// reportGrace is how long cancelled handlers get to return and have their
// failures reported before Run gives up on them.
const reportGrace = 5 * time.Second

// eagerWindow bounds how long one slot keeps taking a run's next tasks
// with its results before it asks for work like everyone else, so one
// long chain cannot keep a slot from the tenant's other runs.
const eagerWindow = time.Second

// Worker runs registered handlers for the tasks the server leases to it.
type Worker struct {
	api  *taskapi.Client
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	handlers map[string]RawHandler
	names    []string
	started  bool
	inflight map[taskapi.Ref]*execution

	slots    chan struct{} // a token per busy slot
	running  sync.WaitGroup
	stopping atomic.Bool
	fatal    chan error
}

type execution struct {
	cancel context.CancelCauseFunc
	// settled (under Worker.mu) is set once the attempt's result is being
	// reported or the attempt ended: the lease's end is then the report's
	// doing (or already handled), and a renewal's "not held" is no loss.
	settled bool
}

// New returns a worker for the server at serverURL (e.g.
// "https://composer.example.com") authenticating with apiKey, an API key
// of the tenant with the worker scope.
func New(serverURL, apiKey string, opts Options) (*Worker, error) {
	if !strings.HasPrefix(serverURL, "http://") && !strings.HasPrefix(serverURL, "https://") {
		return nil, fmt.Errorf("composer worker: the server URL %q must start with https:// (or http:// for a local server)", serverURL)
	}
	if !strings.HasPrefix(apiKey, "cmp_") {
		return nil, errors.New("composer worker: the API key must be a Composer API key (cmp_…) with the worker scope")
	}
	if len(opts.Queues) == 0 {
		opts.Queues = []string{"default"}
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 16
	}
	if opts.Concurrency > 1000 {
		return nil, errors.New("composer worker: Concurrency may be at most 1000")
	}
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = 30 * time.Second
	}
	if opts.LeaseTTL < time.Second || opts.LeaseTTL > 10*time.Minute {
		return nil, errors.New("composer worker: LeaseTTL must be between 1s and 10m")
	}
	if opts.ShutdownTimeout <= 0 {
		opts.ShutdownTimeout = 30 * time.Second
	}
	host, _ := os.Hostname()
	if opts.WorkerID == "" {
		opts.WorkerID = fmt.Sprintf("%s-%d-%s", sanitize(host), os.Getpid(), randomID(4))
	}
	if opts.Label == "" {
		opts.Label = host
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.HTTPClient == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = opts.Concurrency + 4
		opts.HTTPClient = &http.Client{Transport: t}
	}
	w := &Worker{
		api: &taskapi.Client{BaseURL: strings.TrimRight(serverURL, "/"), Token: apiKey, HTTP: opts.HTTPClient,
			Propagator: propagation.TraceContext{}},
		opts: opts, log: opts.Logger.With("worker_id", opts.WorkerID), handlers: map[string]RawHandler{},
		inflight: map[taskapi.Ref]*execution{}, slots: make(chan struct{}, opts.Concurrency), fatal: make(chan error, 1),
	}
	return w, nil
}

func sanitize(s string) string {
	s = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_' {
			return r
		}
		return '-'
	}, s)
	if s == "" || !(s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z' || s[0] >= '0' && s[0] <= '9') {
		s = "w" + s
	}
	return s[:min(len(s), 80)]
}

func randomID(n int) string {
	b := make([]byte, n)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

// ID is the worker's id (its lease owner name).
func (w *Worker) ID() string { return w.opts.WorkerID }

// Run serves tasks until ctx ends, or SIGINT/SIGTERM arrives (unless
// Options.NoSignals), then shuts down gracefully and returns nil. It
// returns an error wrapping ErrUnauthorized when the server refuses the
// API key, and an error when the server refuses the worker's settings.
func (w *Worker) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.started {
		w.mu.Unlock()
		return errors.New("composer worker: Run called twice")
	}
	if len(w.handlers) == 0 {
		w.mu.Unlock()
		return errors.New("composer worker: register at least one handler before Run")
	}
	w.started = true
	for name := range w.handlers {
		w.names = append(w.names, name)
	}
	slices.Sort(w.names)
	w.mu.Unlock()
	if !w.opts.NoSignals {
		var stop context.CancelFunc
		ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
	}

	execCtx, cancelExec := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelExec(ErrShutdown)
	pollCtx, cancelPoll := context.WithCancel(ctx)
	defer cancelPoll()
	var loops sync.WaitGroup
	loops.Add(2)
	go func() { defer loops.Done(); w.pollLoop(pollCtx, execCtx) }()
	go func() { defer loops.Done(); w.renewLoop(execCtx) }()
	w.log.Info("worker started", "queues", w.opts.Queues, "handlers", w.names, "concurrency", w.opts.Concurrency)

	var err error
	select {
	case <-ctx.Done():
	case err = <-w.fatal:
	}
	w.stopping.Store(true)
	cancelPoll()
	done := make(chan struct{})
	go func() { w.running.Wait(); close(done) }()
	grace := reportGrace
	if errors.Is(err, ErrUnauthorized) {
		// Nothing this worker reports can be accepted any more.
		cancelExec(ErrUnauthorized)
		grace = time.Second
	} else {
		select {
		case <-done:
		case <-time.After(w.opts.ShutdownTimeout):
			w.log.Warn("shutdown deadline passed; cancelling running handlers")
			cancelExec(ErrShutdown)
		}
	}
	select {
	case <-done:
	case <-time.After(grace):
		// A handler that ignores its context cannot hold the process:
		// its lease expires and the task is retried elsewhere.
		w.log.Warn("handlers ignored their cancelled context; stopping without them")
	}
	cancelExec(ErrShutdown)
	loops.Wait()
	if err != nil {
		w.log.Error("worker stopped", "error", err)
		return err
	}
	w.log.Info("worker stopped")
	return nil
}

// stop ends Run with err (the first one wins).
func (w *Worker) stop(err error) {
	select {
	case w.fatal <- err:
	default:
	}
}

// refused turns an answer the server will give again however often it is
// asked into the error Run returns, or nil for anything worth retrying.
func refused(err error) error {
	var apiErr *taskapi.APIError
	if !errors.As(err, &apiErr) {
		return nil
	}
	switch {
	case apiErr.Status == http.StatusUnauthorized || apiErr.Status == http.StatusForbidden:
		return fmt.Errorf("%w: %s", ErrUnauthorized, apiErr.Message)
	case apiErr.Status == http.StatusBadRequest:
		return fmt.Errorf("composer worker: the server refused the worker's request: %s", apiErr.Message)
	}
	return nil
}

// pollLoop asks for work whenever slots are free and starts what it gets.
func (w *Worker) pollLoop(ctx, execCtx context.Context) {
	for ctx.Err() == nil {
		free := w.takeSlots(ctx)
		if free == 0 {
			return
		}
		leases := w.poll(ctx, free)
		for _, l := range leases {
			w.start(execCtx, l)
		}
		for range free - len(leases) {
			<-w.slots
		}
	}
}

// takeSlots waits for at least one free slot and takes every free one.
func (w *Worker) takeSlots(ctx context.Context) int {
	select {
	case w.slots <- struct{}{}:
	case <-ctx.Done():
		return 0
	}
	n := 1
	for n < w.opts.Concurrency {
		select {
		case w.slots <- struct{}{}:
			n++
		default:
			return n
		}
	}
	return n
}

// poll sends one poll, repeating it (with the same poll id, so a lost
// answer's leases come back) until the server answers or ctx ends.
func (w *Worker) poll(ctx context.Context, free int) []taskapi.Lease {
	wait := w.opts.LeaseTTL / 3 // a revoked key is noticed within a heartbeat
	req := taskapi.PollRequest{WorkerID: w.opts.WorkerID, PollID: randomID(12), Queues: w.opts.Queues, Handlers: w.names,
		Slots: free, Capacity: w.opts.Concurrency, TTLMillis: w.opts.LeaseTTL.Milliseconds(), WaitMillis: wait.Milliseconds(),
		Label: w.opts.Label, Version: Version}
	backoff := 100 * time.Millisecond
	for {
		req.InFlight = w.inFlight()
		callCtx, cancel := context.WithTimeout(ctx, wait+15*time.Second)
		res, err := w.api.Poll(callCtx, req)
		cancel()
		if err == nil {
			return res.Leases
		}
		if ctx.Err() != nil {
			return nil
		}
		if fatal := refused(err); fatal != nil {
			w.stop(fatal)
			return nil
		}
		// The answer may have been lost: ask again for the same one.
		req.Retry = true
		d := backoff/2 + time.Duration(rand.Int64N(int64(backoff/2)+1))
		w.log.Warn("asking for work failed; retrying", "error", err, "in", d)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (w *Worker) inFlight() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.inflight)
}

// start runs a leased task in the slot taken for it; the slot keeps
// running the run's next tasks while reports hand them over (eager).
func (w *Worker) start(execCtx context.Context, l taskapi.Lease) {
	w.running.Add(1)
	go func() {
		defer w.running.Done()
		defer func() { <-w.slots }()
		since := time.Now()
		for next := &l; next != nil; {
			next = w.execute(execCtx, *next, since)
		}
	}()
}

// hold registers a lease for renewals and returns its context and the
// function that unregisters it.
func (w *Worker) hold(execCtx context.Context, l taskapi.Lease) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(execCtx)
	e := &execution{cancel: cancel}
	w.mu.Lock()
	w.inflight[l.Ref] = e
	w.mu.Unlock()
	return ctx, func() {
		w.mu.Lock()
		e.settled = true
		delete(w.inflight, l.Ref)
		w.mu.Unlock()
		cancel(nil)
	}
}

// settle marks the attempt of ref as being reported, before its report is
// sent: a renewal answering after the report took the lease (the task is
// done) is not a lost lease. Renewals go on meanwhile, for a report that
// takes retries.
func (w *Worker) settle(ref taskapi.Ref) {
	w.mu.Lock()
	if e := w.inflight[ref]; e != nil {
		e.settled = true
	}
	w.mu.Unlock()
}

// execute runs one attempt and reports it; it returns the run's next task
// when the report's answer leased one to this worker.
func (w *Worker) execute(execCtx context.Context, l taskapi.Lease, since time.Time) *taskapi.Lease {
	ctx, release := w.hold(execCtx, l)
	defer release()
	var cfg taskapi.TaskConfig
	_ = json.Unmarshal(l.Config, &cfg)
	handler := ""
	if cfg.Task != nil {
		handler = cfg.Task.Handler
	}
	t := Task{Tenant: l.Tenant, Run: l.Run, ID: l.Task, NodeID: l.NodeID, Handler: handler, Queue: l.Queue, Attempt: l.Attempt,
		MaxAttempts: l.MaxAttempts, WorkflowID: l.WorkflowID, WorkflowVersion: l.WorkflowVersion}
	if l.TraceParent != "" {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": l.TraceParent})
	}
	ctx, span := otel.Tracer("github.com/composer-dev/composer/sdk/worker").Start(ctx, "task "+handler, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("composer.run_id", t.Run.String()), attribute.String("composer.task_id", t.ID.String()),
			attribute.String("composer.node_id", t.NodeID), attribute.Int("composer.attempt", t.Attempt)))
	defer span.End()
	log := w.log.With("run_id", t.Run.String(), "task_id", t.ID.String(), "node", t.NodeID, "handler", handler, "attempt", t.Attempt)
	ctx = context.WithValue(ctx, taskKey{}, t)

	runCtx := ctx
	if cfg.TimeoutMS > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, time.Duration(cfg.TimeoutMS)*time.Millisecond)
		defer cancel()
	}
	w.mu.Lock()
	fn := w.handlers[handler]
	w.mu.Unlock()
	var out json.RawMessage
	var err error
	if fn == nil {
		// The server only leases handlers this worker named; a lease for
		// another one is a bug somewhere, and another worker may have it.
		err = &Error{Code: taskapi.CodeNoHandler, Message: fmt.Sprintf("no handler %q is registered on worker %s", handler, w.opts.WorkerID), Retryable: true}
	} else {
		out, err = safeRun(runCtx, fn, l.Input)
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, ErrLeaseLost), errors.Is(cause, ErrUnauthorized):
		log.Info("the task is no longer this worker's; result discarded", "cause", cause)
		span.SetStatus(codes.Error, "lease lost")
		return nil
	}
	w.settle(l.Ref)
	reportCtx := trace.ContextWithSpan(execCtx, span)
	if execCtx.Err() != nil {
		var cancel context.CancelFunc
		reportCtx, cancel = context.WithTimeout(context.WithoutCancel(reportCtx), 5*time.Second)
		defer cancel()
	}
	if err == nil {
		var offer *taskapi.EagerOffer
		if !w.opts.NoEager && !w.stopping.Load() && time.Since(since) < eagerWindow {
			offer = &taskapi.EagerOffer{Queue: l.Queue, NodeTypes: []string{"task"}, Handlers: w.names, TTLMillis: w.opts.LeaseTTL.Milliseconds()}
		}
		res, ok := w.report(reportCtx, log, func(ctx context.Context) (taskapi.ReportResponse, error) {
			return w.api.Complete(ctx, taskapi.CompleteRequest{Ref: l.Ref, NodeID: l.NodeID, WorkerID: w.opts.WorkerID, Output: out, Eager: offer})
		})
		if ok && res.Next != nil && res.Next.Acquired {
			return res.Next
		}
		return nil
	}
	f := failure(err)
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, ErrShutdown):
		f = &Error{Code: taskapi.CodeWorkerShutdown, Message: "the worker shut down before the task finished", Retryable: true}
	case runCtx.Err() == context.DeadlineExceeded && ctx.Err() == nil:
		f = &Error{Code: taskapi.CodeExecutionTimeout, Message: fmt.Sprintf("the attempt exceeded its timeout of %s", time.Duration(cfg.TimeoutMS)*time.Millisecond), Retryable: true}
	}
	span.SetStatus(codes.Error, f.Code)
	log.Info("attempt failed", "code", f.Code, "retryable", f.Retryable, "error", f.Message)
	w.report(reportCtx, log, func(ctx context.Context) (taskapi.ReportResponse, error) {
		return w.api.Fail(ctx, taskapi.FailRequest{Ref: l.Ref, NodeID: l.NodeID, WorkerID: w.opts.WorkerID, Retryable: f.Retryable,
			RetryAfterMillis: f.RetryAfter.Milliseconds(), Error: taskapi.Error{Code: f.Code, Message: f.Message, Details: f.Details}})
	})
	return nil
}

// safeRun runs a handler, turning a panic into a retryable failure.
func safeRun(ctx context.Context, fn RawHandler, input json.RawMessage) (out json.RawMessage, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, &Error{Code: taskapi.CodePanic, Message: fmt.Sprintf("the handler panicked: %v", r), Retryable: true}
		}
	}()
	return fn(ctx, input)
}

// report sends a result until the server acknowledges it (applied or
// ignored as stale). ok is false when it gave up: the report was refused,
// or the worker is stopping and its deadline passed (the lease then
// expires and the task is retried).
func (w *Worker) report(ctx context.Context, log *slog.Logger, send func(context.Context) (taskapi.ReportResponse, error)) (taskapi.ReportResponse, bool) {
	backoff := 100 * time.Millisecond
	for {
		callCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		res, err := send(callCtx)
		cancel()
		if err == nil {
			if res.Ignored {
				log.Info("result ignored by the server", "reason", res.Reason)
			}
			return res, true
		}
		if fatal := refused(err); fatal != nil {
			log.Error("result refused", "error", err)
			if errors.Is(fatal, ErrUnauthorized) {
				w.stop(fatal)
			}
			return taskapi.ReportResponse{}, false
		}
		if ctx.Err() != nil {
			log.Warn("result not reported before shutdown; the task will be retried when its lease expires", "error", err)
			return taskapi.ReportResponse{}, false
		}
		log.Warn("reporting a result failed; retrying", "error", err, "in", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// renewLoop renews every held lease every LeaseTTL/3 in one call (the
// heartbeat) and cancels the handlers whose lease is gone.
func (w *Worker) renewLoop(ctx context.Context) {
	t := time.NewTicker(w.opts.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		refs := make([]taskapi.Ref, 0, len(w.inflight))
		execs := make([]*execution, 0, len(w.inflight))
		for ref, e := range w.inflight {
			refs = append(refs, ref)
			execs = append(execs, e)
		}
		w.mu.Unlock()
		if len(refs) == 0 {
			continue
		}
		callCtx, cancel := context.WithTimeout(ctx, w.opts.LeaseTTL/3)
		res, err := w.api.Renew(callCtx, taskapi.RenewRequest{WorkerID: w.opts.WorkerID, TTLMillis: w.opts.LeaseTTL.Milliseconds(), Leases: refs})
		cancel()
		if fatal := refused(err); fatal != nil {
			w.log.Error("the server refused the heartbeat; stopping", "error", err)
			w.stop(fatal)
			continue
		}
		if err != nil || len(res.Leases) != len(refs) {
			// The leases last their TTL: two more heartbeats fit.
			w.log.Warn("heartbeat failed", "error", err)
			continue
		}
		w.mu.Lock()
		for i, r := range res.Leases {
			if !r.Held && !execs[i].settled {
				w.log.Info("lease lost", "task_id", refs[i].Task.String(), "attempt", refs[i].Attempt)
				execs[i].cancel(ErrLeaseLost)
			}
		}
		w.mu.Unlock()
	}
}
