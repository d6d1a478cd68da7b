package graph

import (
	"bytes"
	"io"
	"net/http"
	"strconv"

	"go.uber.org/zap"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/jsoncheck"
)

// maxDrain is how much of an oversized body is read and discarded so the
// client finishes sending and reads the 413 (instead of a reset).
const maxDrain = 8 << 20

// readBody reads and checks a POST body before gqlgen sees it: one JSON
// object (batched arrays are not served), nested at most jsoncheck.MaxDepth, no
// NUL character in any string (PostgreSQL cannot store one), within
// limit bytes. A refusal is a client error with its own code — never
// INTERNAL — answered in the GraphQL envelope; an oversized body is
// drained (up to maxDrain) so the client reads the 413.
func readBody(w http.ResponseWriter, req *http.Request, limit int64) ([]byte, bool) {
	body, err := io.ReadAll(io.LimitReader(req.Body, limit+1))
	if err == nil && int64(len(body)) > limit {
		_, _ = io.Copy(io.Discard, io.LimitReader(req.Body, maxDrain))
		writeError(w, http.StatusRequestEntityTooLarge, string(errs.Invalid), "the request body is too large")
		return nil, false
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, string(errs.Invalid), "the request body could not be read")
		return nil, false
	}
	if msg := checkJSON(body); msg != "" {
		writeError(w, http.StatusBadRequest, string(errs.Invalid), msg)
		return nil, false
	}
	return body, true
}

func checkJSON(body []byte) string {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	switch {
	case len(trimmed) == 0:
		return "the request body is empty: send a JSON object with a query"
	case trimmed[0] == '[':
		return "batched requests are not supported: send one JSON object per request"
	case trimmed[0] != '{':
		return "the request body is not a JSON object"
	}
	if msg := jsoncheck.Check(body); msg != "" {
		return "the request body " + msg
	}
	return ""
}

// authenticate is the auth middleware for GraphQL requests: a refusal is
// answered in the GraphQL error envelope ({"errors": [...]}) like every
// other error of the endpoint.
func authenticate(a *auth.Authenticator, log *zap.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.Header.Values("Authorization")) > 1 {
			writeError(w, http.StatusUnauthorized, string(errs.Unauthenticated), "malformed Authorization header")
			return
		}
		p, err := a.Authenticate(r.Context(), r.Header.Get("Authorization"))
		if err != nil {
			status, kind := http.StatusUnauthorized, errs.KindOf(err)
			if kind == errs.Unavailable {
				status = http.StatusServiceUnavailable
				w.Header().Set("Retry-After", strconv.Itoa(int(errs.RetryAfter(err).Seconds()+0.999)))
			} else {
				w.Header().Set("WWW-Authenticate", "Bearer")
			}
			writeError(w, status, string(kind), errs.PublicMessage(err))
			return
		}
		next.ServeHTTP(w, r.WithContext(auth.WithPrincipal(r.Context(), p)))
	})
}
