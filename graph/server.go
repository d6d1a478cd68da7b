package graph

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/99designs/gqlgen/graphql/handler/lru"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/99designs/gqlgen/graphql/playground"
	"github.com/coder/websocket"
	"github.com/google/uuid"
	"github.com/vektah/gqlparser/v2/ast"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/graph/model"
	"github.com/composer-dev/composer/secrets"
)

// Options configures the gateway.
type Options struct {
	Resolver *Resolver
	Authn    *auth.Authenticator
	// Dev turns on introspection, the playground and field suggestions.
	Dev bool
	// AllowedOrigins are host patterns (e.g. "dashboard.example.com") whose
	// pages may open subscriptions; the gateway's own host always may.
	AllowedOrigins []string
	// Limits; zero means the default.
	MaxBodyBytes  int64         // 1 MiB
	MaxComplexity int           // 20,000
	MaxDepth      int           // 12
	MaxAliases    int           // 30
	MaxResponse   int64         // 8 MiB
	Timeout       time.Duration // 30 s per query or mutation
	Log           *zap.Logger
}

func (o *Options) defaults() {
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = 1 << 20
	}
	if o.MaxComplexity == 0 {
		o.MaxComplexity = 20_000
	}
	if o.MaxDepth == 0 {
		o.MaxDepth = 12
	}
	if o.MaxAliases == 0 {
		o.MaxAliases = 30
	}
	if o.MaxResponse == 0 {
		o.MaxResponse = 8 << 20
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
}

// Complexity of list fields: their page size times the cost of an item,
// so a query's cost is known (and limited) before it runs.
func complexity() ComplexityRoot {
	var c ComplexityRoot
	page := func(first *int) int {
		if first == nil {
			return 50
		}
		return max(*first, 1)
	}
	c.Query.Runs = func(child int, first *int, _ *string, _ *model.RunFilter) int { return 1 + page(first)*child }
	c.Query.Workflows = func(child int, first *int, _ *string) int { return 1 + page(first)*child }
	c.Query.APIKeys = func(child int, first *int, _ *uuid.UUID) int { return 1 + page(first)*child }
	c.Query.Members = func(child int) int { return 1 + 50*child }
	c.Query.Workers = func(child int) int { return 1 + 100*child }
	c.Query.WebhookEndpoints = func(child int) int { return 1 + 50*child }
	c.Query.WebhookDeliveries = func(child int, _, _ *uuid.UUID, _ *model.WebhookDeliveryState, first *int, _ *string) int {
		return 1 + page(first)*child
	}
	c.WebhookDelivery.Attempts = func(child int) int { return 1 + 20*child }
	c.WebhookEndpoint.Secrets = func(child int) int { return 1 + 2*child }
	c.Query.Secrets = func(child int) int { return 1 + secrets.MaxSecrets*child }
	c.Query.SecretAudit = func(child int, _ *string, first *int, _ *uuid.UUID) int { return 1 + page(first)*child }
	c.Secret.Versions = func(child int) int { return 1 + secrets.KeptVersions*child }
	c.Run.Tasks = func(child int) int { return 1 + 20*child }
	c.Run.Timeline = func(child int, first *int) int {
		if first == nil {
			return 1 + 200*child
		}
		return 1 + max(*first, 1)*child
	}
	c.Workflow.Versions = func(child int, first, _ *int) int { return 1 + page(first)*child }
	c.Query.BulkOperations = func(child int, first *int, _ *uuid.UUID) int { return 1 + page(first)*child }
	c.Query.PausedQueues = func(child int) int { return 1 + 100*child }
	c.Query.AuditLog = func(child int, first *int, _ *string, _ *model.AuditFilter) int { return 1 + page(first)*child }
	return c
}

// NewHandler returns the GraphQL endpoint: POST for queries and mutations
// (authenticated by the Authorization header) and websockets speaking
// graphql-transport-ws for subscriptions (authenticated by the init
// payload's Authorization).
func NewHandler(o Options) http.Handler {
	o.defaults()
	r := o.Resolver
	srv := handler.New(NewExecutableSchema(Config{Resolvers: r, Complexity: complexity()}))
	if r.Live != nil {
		r.Live.read = r.snapshot
		r.Live.readOp = r.bulkSnapshot
	}
	srv.AddTransport(transport.Websocket{
		Implementation: sessionWS{inner: transport.CoderWebsocketImplementation{AcceptOptions: websocket.AcceptOptions{
			OriginPatterns: o.AllowedOrigins}}},
		KeepAlivePingInterval: 15 * time.Second,
		InitTimeout:           10 * time.Second,
		InitFunc: func(ctx context.Context, p transport.InitPayload) (context.Context, *transport.InitPayload, error) {
			principal, err := o.Authn.Authenticate(ctx, p.Authorization())
			if err != nil {
				return ctx, nil, err
			}
			// No loaders live for the connection: each event reads fresh
			// (a run's update comes as a snapshot with its tasks).
			if sess := sessionFrom(ctx); sess != nil {
				ctx = sess.start(ctx, p.Authorization(), principal)
			}
			return auth.WithPrincipal(ctx, principal), nil, nil
		},
	})
	srv.AddTransport(transport.POST{})
	srv.SetQueryCache(lru.New[*ast.QueryDocument](1000))
	srv.SetErrorPresenter(presentError(o.Log))
	srv.SetRecoverFunc(recoverPanic(o.Log))
	srv.SetDisableSuggestion(!o.Dev)
	srv.Use(extension.FixedComplexityLimit(o.MaxComplexity))
	srv.Use(shapeLimit{maxDepth: o.MaxDepth, maxAliases: o.MaxAliases})
	srv.Use(responseBudget{max: o.MaxResponse})
	srv.AroundFields(r.auditMutations)
	srv.Use(operationType{})
	if o.Dev {
		srv.Use(extension.Introspection{})
	}

	// Websocket upgrades authenticate in the init payload (browsers cannot
	// set headers on them); every other request needs the header.
	post := r.withLoaders(authenticate(o.Authn, o.Log, srv))
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if isWebsocket(req) {
			sess := &wsSession{authn: o.Authn, log: o.Log}
			srv.ServeHTTP(w, req.WithContext(context.WithValue(req.Context(), sessionKey{}, sess)))
			return
		}
		ctx, op := withOpType(req.Context())
		defer observeRequest(ctx, op, time.Now())
		req = req.WithContext(ctx)
		if req.Method != http.MethodPost {
			writeError(w, http.StatusMethodNotAllowed, "BAD_REQUEST", "use POST, or a websocket for subscriptions")
			return
		}
		body, ok := readBody(w, req, o.MaxBodyBytes)
		if !ok {
			return
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		ctx, cancel := context.WithTimeout(req.Context(), o.Timeout)
		defer cancel()
		post.ServeHTTP(w, req.WithContext(ctx))
	})
}

// Playground serves the GraphiQL playground (development only).
func Playground(endpoint string) http.Handler { return playground.Handler("Composer", endpoint) }

func isWebsocket(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]any{{"message": msg, "extensions": map[string]any{"code": code}}}})
}
