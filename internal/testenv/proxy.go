package testenv

import (
	"bytes"
	"context"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Proxy is a TCP proxy on loopback in front of a service (PostgreSQL), for
// tests that break connections the way a network, a crashed server or a
// killed backend does: cut every open connection, refuse new ones, lose
// the answer to a COMMIT the server carried out, or act on what a client
// sends before it reaches the server. It is closed by t.Cleanup.
type Proxy struct {
	// Addr is where clients connect (127.0.0.1:port).
	Addr   string
	t      testing.TB
	target string

	mu    sync.Mutex
	ln    net.Listener
	links map[*link]struct{}
	// lose holds, per client address ("" for any connection), the
	// CommandComplete message whose answer is to be dropped next.
	lose   map[string][]byte
	lost   int
	before func(client string, chunk []byte)
	closed bool
	wg     sync.WaitGroup
}

type link struct{ client, server net.Conn }

// NewProxy starts a proxy to target (host:port).
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: proxy: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), t: t, target: target, ln: ln, links: map[*link]struct{}{}, lose: map[string][]byte{}}
	p.wg.Add(1)
	go p.accept(ln)
	t.Cleanup(p.close)
	return p
}

// ProxyURL starts a proxy to the host of the database URL raw and returns
// it with raw rewritten to connect through it.
func ProxyURL(t testing.TB, raw string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("testenv: proxy: %v", err)
	}
	p := NewProxy(t, u.Host)
	u.Host = p.Addr
	return p, u.String()
}

func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		l := &link{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.links[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.toServer(l)
		go p.toClient(l)
	}
}

// toServer relays what the client sends, after the Before hook saw it.
func (p *Proxy) toServer(l *link) {
	defer p.wg.Done()
	defer p.drop(l)
	buf := make([]byte, 64<<10)
	for {
		n, err := l.client.Read(buf)
		if n > 0 {
			p.mu.Lock()
			before := p.before
			p.mu.Unlock()
			if before != nil {
				before(l.client.RemoteAddr().String(), buf[:n])
			}
			if _, werr := l.server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// commandComplete is PostgreSQL's CommandComplete message for tag: 'C',
// its length (4 + the tag + NUL), the tag. A COMMIT that committed
// answers "COMMIT" (a failed transaction's answers "ROLLBACK").
func commandComplete(tag string) []byte {
	n := len(tag) + 5
	return append([]byte{'C', byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, append([]byte(tag), 0)...)
}

// toClient relays the server's answers; armed for this connection, it
// drops the one holding the awaited CommandComplete and cuts the
// connection, so the client never learns the outcome.
func (p *Proxy) toClient(l *link) {
	defer p.wg.Done()
	defer p.drop(l)
	client := l.client.RemoteAddr().String()
	buf := make([]byte, 64<<10)
	var tail []byte // the end of the previous chunk, for a match across two
	for {
		n, err := l.server.Read(buf)
		if n > 0 {
			seen := append(tail, buf[:n]...)
			if p.takeAnswer(client, seen) {
				return
			}
			if _, werr := l.client.Write(buf[:n]); werr != nil {
				return
			}
			tail = append(tail[:0], seen[max(0, len(seen)-64):]...)
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) takeAnswer(client string, seen []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range []string{client, ""} {
		if m, ok := p.lose[k]; ok && bytes.Contains(seen, m) {
			delete(p.lose, k)
			p.lost++
			return true
		}
	}
	return false
}

func (p *Proxy) drop(l *link) {
	l.client.Close()
	l.server.Close()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// LoseCommitAnswer makes the server's answer to the next COMMIT that
// commits on the connection from client (its local address; "" for any
// connection) never arrive: the proxy drops it and cuts the connection.
// The transaction is committed; the client cannot know.
func (p *Proxy) LoseCommitAnswer(client string) { p.LoseAnswer(client, "COMMIT") }

// LoseAnswer is LoseCommitAnswer for the next answer that completes a
// statement with tag (e.g. "INSERT 0 1"): the server carried it out (and,
// outside a transaction block, committed it with the Sync the answer
// ends with).
func (p *Proxy) LoseAnswer(client, tag string) {
	p.mu.Lock()
	p.lose[client] = commandComplete(tag)
	p.mu.Unlock()
}

// LostAnswers is how many answers were dropped.
func (p *Proxy) LostAnswers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lost
}

// Before sets fn to see every chunk a client sends before it is relayed
// (nil removes it). It runs on the relaying goroutine: what it does — say,
// terminating the backend behind the connection — happens before the
// server reads the chunk.
func (p *Proxy) Before(fn func(client string, chunk []byte)) {
	p.mu.Lock()
	p.before = fn
	p.mu.Unlock()
}

// Cut closes every open connection, both ways, and returns how many there
// were: to the client it is a connection the network lost.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.client.Close()
		l.server.Close()
	}
	return len(links)
}

// Down cuts every connection and refuses new ones (connection refused)
// until Up.
func (p *Proxy) Down() { p.stop(false) }

// Up accepts connections again, on the same address.
func (p *Proxy) Up() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil || p.closed {
		return
	}
	ln, err := net.Listen("tcp", p.Addr)
	if err != nil {
		p.t.Fatalf("testenv: proxy: listen again on %s: %v", p.Addr, err)
	}
	p.ln = ln
	p.wg.Add(1)
	go p.accept(ln)
}

func (p *Proxy) close() {
	p.stop(true)
	p.wg.Wait()
}

// stop closes the listener and cuts every connection; for good (closed)
// when the test ends.
func (p *Proxy) stop(closed bool) {
	p.mu.Lock()
	p.closed = p.closed || closed
	ln := p.ln
	p.ln = nil
	p.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	p.Cut()
}

// TerminateBackends ends, as the role of url (a role may end its own
// backends with pg_terminate_backend), every backend of that role in url's
// database whose query matches like ('%' for all) except its own, and
// waits until they are gone. It returns how many it ended.
func TerminateBackends(t testing.TB, url, like string) int {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("testenv: terminate backends: %v", err)
	}
	defer c.Close(ctx)
	var pids []int32
	if err := c.QueryRow(ctx, `SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity
		WHERE datname = current_database() AND usename = current_user AND pid <> pg_backend_pid() AND query LIKE $1`, like).Scan(&pids); err != nil {
		t.Fatalf("testenv: terminate backends: %v", err)
	}
	if _, err := c.Exec(ctx, `SELECT pg_terminate_backend(p) FROM unnest($1::int[]) p`, pids); err != nil {
		t.Fatalf("testenv: terminate backends: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var left int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&left); err != nil {
			t.Fatalf("testenv: terminate backends: %v", err)
		}
		if left == 0 {
			return len(pids)
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: %d terminated backends still there after 10 s", left)
		}
	}
}

// When waits (up to 10 s) until a backend of url's database other than
// its own satisfies cond, an SQL condition on pg_stat_activity (e.g.
// "wait_event_type = 'Lock'"), then calls fn with its connection; the
// channel closes after. For faults that must strike a request in flight.
func When(t testing.TB, url, cond string, fn func(c *pgx.Conn)) <-chan struct{} {
	t.Helper()
	done := make(chan struct{})
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	go func() {
		defer close(done)
		defer c.Close(context.Background())
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			var n int
			err := c.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
				AND pid <> pg_backend_pid() AND (`+cond+`)`).Scan(&n)
			if err != nil || n > 0 {
				fn(c)
				return
			}
		}
	}()
	return done
}

// LoseCommitWhen returns a query tracer (for the pool that connects
// through p) that, the first time a statement for which match is true is
// sent, makes p lose the answer to that connection's next COMMIT — the
// commit of the transaction the statement is in.
func (p *Proxy) LoseCommitWhen(match func(sql string, args []any) bool) pgx.QueryTracer {
	return &commitLoser{p: p, match: match}
}

type commitLoser struct {
	p     *Proxy
	match func(sql string, args []any) bool
	once  sync.Once
}

func (l *commitLoser) see(conn *pgx.Conn, sql string, args []any) {
	if l.match(sql, args) {
		l.once.Do(func() { l.p.LoseCommitAnswer(conn.PgConn().Conn().LocalAddr().String()) })
	}
}

func (l *commitLoser) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.see(conn, d.SQL, d.Args)
	return ctx
}

func (l *commitLoser) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *commitLoser) TraceBatchStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		l.see(conn, q.SQL, q.Arguments)
	}
	return ctx
}

func (l *commitLoser) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (l *commitLoser) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
