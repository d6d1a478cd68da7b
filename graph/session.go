package graph

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql/handler/transport"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/errs"
)

// Websocket close codes of graphql-transport-ws a client can act on.
const (
	// CloseUnauthorized: the credential expired or was revoked, or its
	// member was removed; sign in again.
	CloseUnauthorized = 4401
)

// Re-validation of a websocket's credential: on a timer, and before a
// push if the last check is older than pushRecheck.
const (
	sessionRecheck = 5 * time.Second
	pushRecheck    = time.Second
)

// wsSession is one websocket connection and the credential it opened
// with. A socket authenticates once, in connection_init, but lives for
// hours: its credential is checked again every sessionRecheck and before
// pushes, and the socket is closed with CloseUnauthorized — and its
// subscriptions end — as soon as the check fails or the credential's
// expiry passes. So a revoked key or a removed member stops receiving
// within seconds, not at the next reconnect.
type wsSession struct {
	authn *auth.Authenticator
	log   *zap.Logger

	mu         sync.Mutex
	conn       transport.WebsocketConn
	credential string
	principal  auth.Principal
	cancel     context.CancelFunc
	checked    time.Time
	ended      bool
	subs       int
}

type sessionKey struct{}

func sessionFrom(ctx context.Context) *wsSession {
	s, _ := ctx.Value(sessionKey{}).(*wsSession)
	return s
}

// sessionWS accepts websockets with gqlgen's coder/websocket adapter and
// hands the connection to the request's session, so the session can close
// it with a code of its own.
type sessionWS struct {
	inner transport.CoderWebsocketImplementation
}

func (s sessionWS) Accept(w http.ResponseWriter, r *http.Request, o transport.WebsocketAcceptOptions) (transport.WebsocketConn, error) {
	conn, err := s.inner.Accept(w, r, o)
	if err == nil {
		if sess := sessionFrom(r.Context()); sess != nil {
			sess.mu.Lock()
			sess.conn = conn
			sess.mu.Unlock()
		}
	}
	return conn, err
}

// start records the authenticated credential and watches it until ctx
// ends; the returned context ends with the session.
func (s *wsSession) start(ctx context.Context, credential string, p auth.Principal) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	s.credential, s.principal, s.cancel, s.checked = credential, p, cancel, time.Now()
	s.mu.Unlock()
	go s.watch(ctx)
	return ctx
}

func (s *wsSession) watch(ctx context.Context) {
	t := time.NewTicker(sessionRecheck)
	defer t.Stop()
	var expiry <-chan time.Time
	if exp := s.principal.ExpiresAt; exp != nil {
		timer := time.NewTimer(time.Until(*exp))
		defer timer.Stop()
		expiry = timer.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-expiry:
			s.end("the credential expired; sign in again")
			return
		case <-t.C:
			if err := s.recheck(ctx); err != nil {
				return
			}
		}
	}
}

// check re-validates the credential before a push when the last check is
// older than pushRecheck; it fails once the session has ended.
func (s *wsSession) check(ctx context.Context) error {
	s.mu.Lock()
	ended, fresh := s.ended, time.Since(s.checked) < pushRecheck
	s.mu.Unlock()
	switch {
	case ended:
		return errs.E(errs.Unauthenticated, "the connection's credential is no longer valid")
	case fresh:
		return nil
	}
	return s.recheck(ctx)
}

func (s *wsSession) recheck(ctx context.Context) error {
	s.mu.Lock()
	cred := s.credential
	s.mu.Unlock()
	_, err := s.authn.Authenticate(ctx, cred)
	if err != nil && errs.KindOf(err) == errs.Unavailable {
		return nil // the database, not the credential: keep the socket, check again later
	}
	if err != nil {
		s.end("the credential is no longer valid (revoked, expired or its member removed); sign in again")
		return err
	}
	s.mu.Lock()
	s.checked = time.Now()
	s.mu.Unlock()
	return nil
}

// end closes the socket with CloseUnauthorized and ends its subscriptions.
func (s *wsSession) end(reason string) {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended = true
	conn, cancel := s.conn, s.cancel
	s.mu.Unlock()
	s.log.Info("closing a live connection", zap.String("reason", reason), zap.Stringer("tenant_id", s.principal.TenantID),
		zap.String("subject", s.principal.Subject))
	if conn != nil {
		_ = conn.WriteClose(CloseUnauthorized, reason)
	}
	if cancel != nil {
		cancel()
	}
}

// take counts one more subscription on the socket, up to max.
func (s *wsSession) take(max int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.subs >= max {
		return errs.E(errs.QuotaExceeded, "at most %d live subscriptions per connection", max)
	}
	s.subs++
	return nil
}

func (s *wsSession) give() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subs--
}
