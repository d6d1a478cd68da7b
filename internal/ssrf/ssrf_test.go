package ssrf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func mustPolicy(t *testing.T, allow ...string) *Policy {
	t.Helper()
	p, err := NewPolicy(allow)
	require.NoError(t, err)
	return p
}

func TestCheck(t *testing.T) {
	t.Parallel()
	p := mustPolicy(t)
	tests := []struct {
		ip     string
		reason string // empty means allowed
	}{
		{"127.0.0.1", "loopback"},
		{"::1", "loopback"},
		{"10.0.0.1", "private"},
		{"172.16.5.4", "private"},
		{"192.168.1.1", "private"},
		{"169.254.169.254", "link-local (cloud metadata)"},
		{"0.0.0.0", "unspecified"},
		{"0.1.2.3", "this network"},
		{"::", "unspecified"},
		{"100.64.0.1", "carrier-grade NAT"},
		{"192.0.0.8", "IETF protocol assignments"},
		{"198.18.0.1", "benchmarking"},
		{"192.0.2.1", "documentation"},
		{"198.51.100.1", "documentation"},
		{"203.0.113.1", "documentation"},
		{"2001:db8::1", "documentation"},
		{"240.0.0.1", "reserved"},
		{"255.255.255.255", "broadcast"},
		{"fd00:ec2::254", "metadata"},
		{"fc00::1", "unique-local"},
		{"fe80::1", "link-local"},
		{"fe80::1%eth0", "link-local"},
		{"::ffff:127.0.0.1", "loopback"},
		{"::ffff:10.0.0.1", "private"},
		{"::ffff:169.254.169.254", "cloud metadata"},
		{"::7f00:1", "IPv4-compatible"},
		{"2002:7f00:1::1", "6to4"},
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"},
		{"64:ff9b::a00:1", "NAT64"},
		{"224.0.0.1", "multicast"},
		{"ff02::1", "multicast"},
		{"8.8.8.8", ""},
		{"1.1.1.1", ""},
		{"2606:4700:4700::1111", ""},
		{"::ffff:8.8.8.8", ""},
	}
	for _, tc := range tests {
		t.Run(tc.ip, func(t *testing.T) {
			t.Parallel()
			err := p.Check(netip.MustParseAddr(tc.ip))
			if tc.reason == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrBlocked)
			assert.Contains(t, err.Error(), tc.ip)
			assert.Contains(t, err.Error(), tc.reason)
		})
	}
}

func TestCheckInvalidAddr(t *testing.T) {
	t.Parallel()
	assert.ErrorIs(t, mustPolicy(t).Check(netip.Addr{}), ErrBlocked)
	var zero Policy
	assert.ErrorIs(t, zero.Check(netip.MustParseAddr("10.0.0.1")), ErrBlocked)
	assert.NoError(t, zero.Check(netip.MustParseAddr("8.8.8.8")))
}

func TestNewPolicyAllowList(t *testing.T) {
	t.Parallel()
	p := mustPolicy(t, "127.0.0.0/8", "fd00::/8")
	assert.NoError(t, p.Check(netip.MustParseAddr("127.0.0.1")))
	assert.NoError(t, p.Check(netip.MustParseAddr("::ffff:127.0.0.1")), "mapped address matches IPv4 allow CIDR")
	assert.NoError(t, p.Check(netip.MustParseAddr("fd12::1")))
	assert.ErrorIs(t, p.Check(netip.MustParseAddr("10.0.0.1")), ErrBlocked)
	assert.ErrorIs(t, p.Check(netip.MustParseAddr("::1")), ErrBlocked)

	for _, bad := range []string{"nonsense", "10.0.0.1", "10.0.0.0/33", ""} {
		_, err := NewPolicy([]string{"127.0.0.0/8", bad})
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), fmt.Sprintf("%q", bad))
	}
}

func TestControl(t *testing.T) {
	t.Parallel()
	p := mustPolicy(t)
	tests := []struct {
		address string
		blocked bool
	}{
		{"8.8.8.8:443", false},
		{"8.8.8.8:80", false},
		{"8.8.8.8:53", true}, // a public address, on a port not allowed
		{"[2606:4700:4700::1111]:443", false},
		{"127.0.0.1:80", true},
		{"[::1]:443", true},
		{"[::ffff:10.0.0.1]:80", true},
		{"[fe80::1%eth0]:80", true},
		{"169.254.169.254:80", true},
		{"example.com:80", true}, // not an IP literal
		{"8.8.8.8", true},        // no port
		{"", true},
	}
	for _, tc := range tests {
		t.Run(tc.address, func(t *testing.T) {
			t.Parallel()
			err := p.Control("tcp", tc.address, nil)
			if tc.blocked {
				assert.ErrorIs(t, err, ErrBlocked)
			} else {
				assert.NoError(t, err)
			}
		})
	}
}

func TestTransportSettings(t *testing.T) {
	t.Parallel()
	p := mustPolicy(t)
	d := p.Dialer()
	assert.Equal(t, 10*time.Second, d.Timeout)
	assert.Equal(t, 30*time.Second, d.KeepAlive)
	assert.NotNil(t, d.Control)
	assert.Nil(t, d.ControlContext, "ControlContext would make net.Dialer ignore Control")

	tr := p.Transport()
	assert.Nil(t, tr.Proxy)
	assert.NotNil(t, tr.DialContext)
	assert.Nil(t, tr.DialTLSContext, "TLS must dial through DialContext")
	assert.Equal(t, 10*time.Second, tr.TLSHandshakeTimeout)
	assert.Equal(t, 30*time.Second, tr.ResponseHeaderTimeout)
	assert.Equal(t, 90*time.Second, tr.IdleConnTimeout)
	assert.Equal(t, 32, tr.MaxIdleConnsPerHost)
	assert.True(t, tr.ForceAttemptHTTP2)

	c := p.Client(7 * time.Second)
	assert.Equal(t, 7*time.Second, c.Timeout)
	assert.NotNil(t, c.CheckRedirect)
	assert.IsType(t, &http.Transport{}, c.Transport)
}

// Not parallel: t.Setenv.
func TestTransportIgnoresProxyEnv(t *testing.T) {
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"} {
		t.Setenv(k, "http://proxy.invalid:3128")
	}
	p := mustPolicy(t)
	assert.Nil(t, p.Transport().Proxy)
	assert.Nil(t, p.Client(time.Second).Transport.(*http.Transport).Proxy)
}

// countingListener counts accepted connections, to prove a blocked request
// never reached the server.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// newServer starts an httptest server on ln (127.0.0.1 when nil) and
// returns it with its accept counter.
func newServer(t *testing.T, ln net.Listener, h http.Handler) (*httptest.Server, *countingListener) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	if ln != nil {
		srv.Listener.Close()
		srv.Listener = ln
	}
	cl := &countingListener{Listener: srv.Listener}
	srv.Listener = cl
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, cl
}

func okHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})
}

func get(t *testing.T, c *http.Client, url string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestClientLoopback(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		allow   []string
		blocked bool
	}{
		{"default policy blocks loopback", nil, true},
		{"allow-list permits loopback", []string{"127.0.0.0/8"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, conns := newServer(t, nil, okHandler())
			c := mustPolicy(t, tc.allow...).Client(5 * time.Second)
			defer c.CloseIdleConnections()

			body, err := get(t, c, srv.URL)
			if tc.blocked {
				require.Error(t, err)
				assert.ErrorIs(t, err, ErrBlocked)
				assert.Contains(t, err.Error(), "127.0.0.1 is loopback")
				assert.Zero(t, conns.n.Load(), "no connection may be attempted")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, "ok", body)
			assert.Positive(t, conns.n.Load())
		})
	}
}

// fakeDNS is an in-process DNS server for net.Resolver.Dial: it answers
// every A query with addr and every other query with no records.
type fakeDNS struct {
	addr    netip.Addr
	queries atomic.Int64
}

func (d *fakeDNS) dial(context.Context, string, string) (net.Conn, error) {
	client, server := net.Pipe()
	go d.serve(server)
	return client, nil // not a PacketConn, so the resolver uses TCP framing
}

func (d *fakeDNS) serve(c net.Conn) {
	defer c.Close()
	for {
		var n [2]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return
		}
		q := make([]byte, binary.BigEndian.Uint16(n[:]))
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
		resp, ok := d.answer(q)
		if !ok {
			return
		}
		out := binary.BigEndian.AppendUint16(nil, uint16(len(resp)))
		if _, err := c.Write(append(out, resp...)); err != nil {
			return
		}
	}
}

func (d *fakeDNS) answer(q []byte) ([]byte, bool) {
	if len(q) < 12 {
		return nil, false
	}
	// Skip the question name (uncompressed labels) to find QTYPE/QCLASS.
	i := 12
	for i < len(q) && q[i] != 0 {
		i += int(q[i]) + 1
	}
	if i+5 > len(q) {
		return nil, false
	}
	qEnd := i + 5
	qtype := binary.BigEndian.Uint16(q[i+1:])
	d.queries.Add(1)

	var ancount uint16
	if qtype == 1 { // A
		ancount = 1
	}
	r := append([]byte{}, q[:2]...)       // ID
	r = append(r, 0x85, 0x80)             // QR, AA, RD, RA, NOERROR
	r = append(r, 0, 1, 0, byte(ancount)) // QDCOUNT, ANCOUNT
	r = append(r, 0, 0, 0, 0)             // NSCOUNT, ARCOUNT
	r = append(r, q[12:qEnd]...)          // question
	if ancount == 1 {
		a := d.addr.As4()
		r = append(r, 0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4)
		r = append(r, a[:]...)
	}
	return r, true
}

// TestClientHostnameResolvingToPrivate shows the check applies to the
// resolved IP, not the name: "internal.test" passes any hostname filter but
// resolves to loopback.
func TestClientHostnameResolvingToPrivate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		allow   []string
		blocked bool
	}{
		{"default policy blocks resolved loopback", nil, true},
		{"allow-list permits resolved loopback", []string{"127.0.0.0/8"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, conns := newServer(t, nil, okHandler())
			_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
			require.NoError(t, err)

			dns := &fakeDNS{addr: netip.MustParseAddr("127.0.0.1")}
			p := mustPolicy(t, tc.allow...)
			d := p.Dialer()
			d.Resolver = &net.Resolver{PreferGo: true, Dial: dns.dial}
			c := p.Client(5 * time.Second)
			tr := c.Transport.(*http.Transport)
			tr.DialContext = d.DialContext
			defer c.CloseIdleConnections()

			body, err := get(t, c, "http://internal.test:"+port+"/")
			assert.Positive(t, dns.queries.Load(), "name must go through the resolver")
			if tc.blocked {
				require.Error(t, err)
				assert.ErrorIs(t, err, ErrBlocked)
				assert.Contains(t, err.Error(), "127.0.0.1 is loopback")
				assert.Zero(t, conns.n.Load(), "no connection may be attempted")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, "ok", body)
			assert.Positive(t, conns.n.Load())
		})
	}
}

// TestClientRedirectToBlocked: the first server is allowed (127.0.0.1/32)
// and redirects to a second loopback address outside the allow-list.
func TestClientRedirectToBlocked(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		ln, err = net.Listen("tcp4", "127.0.0.2:0")
	}
	// Linux routes all of 127.0.0.0/8 to lo, so this cannot fail on a
	// supported machine; if it does, the test fails rather than skip.
	require.NoError(t, err, "no second loopback address to redirect to")
	target, targetConns := newServer(t, ln, okHandler())
	first, firstConns := newServer(t, nil, http.RedirectHandler(target.URL+"/", http.StatusFound))

	c := mustPolicy(t, "127.0.0.1/32").Client(5 * time.Second)
	defer c.CloseIdleConnections()

	_, err = get(t, c, first.URL)
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrBlocked)
	assert.Contains(t, err.Error(), "is loopback")
	assert.Positive(t, firstConns.n.Load())
	assert.Zero(t, targetConns.n.Load(), "redirect target must not be connected to")
}

func TestClientRedirectLimits(t *testing.T) {
	t.Parallel()
	t.Run("at most 5 redirects", func(t *testing.T) {
		t.Parallel()
		var hits atomic.Int64
		srv, _ := newServer(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := hits.Add(1)
			http.Redirect(w, r, fmt.Sprintf("/%d", n), http.StatusFound)
		}))
		c := mustPolicy(t, "127.0.0.1/32").Client(5 * time.Second)
		defer c.CloseIdleConnections()

		_, err := get(t, c, srv.URL)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "stopped after 5 redirects")
		assert.False(t, errors.Is(err, ErrBlocked))
		assert.Equal(t, int64(6), hits.Load(), "original request plus 5 redirects")
	})
	for _, loc := range []string{"ftp://127.0.0.1/x", "file:///etc/passwd", "gopher://127.0.0.1/"} {
		t.Run("refuses "+strings.SplitN(loc, ":", 2)[0], func(t *testing.T) {
			t.Parallel()
			srv, _ := newServer(t, nil, http.RedirectHandler(loc, http.StatusFound))
			c := mustPolicy(t, "127.0.0.1/32").Client(5 * time.Second)
			defer c.CloseIdleConnections()

			_, err := get(t, c, srv.URL)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrBlocked)
			assert.Contains(t, err.Error(), "scheme")
		})
	}
}

func TestPortsAreLimitedOnPublicAddressesOnly(t *testing.T) {
	t.Parallel()
	p, err := NewPolicy([]string{"127.0.0.0/8"}, 8443)
	require.NoError(t, err)
	assert.NoError(t, p.CheckAddr(netip.MustParseAddr("8.8.8.8"), 8443), "a configured port")
	assert.ErrorIs(t, p.CheckAddr(netip.MustParseAddr("8.8.8.8"), 22), ErrBlocked)
	assert.NoError(t, p.CheckAddr(netip.MustParseAddr("127.0.0.1"), 5432), "an allow-listed network on any port")
	_, err = NewPolicy(nil, 70000)
	assert.Error(t, err)
}

func TestDescribeRevealsNothingOfTheNetwork(t *testing.T) {
	t.Parallel()
	blocked := fmt.Errorf("%w (resolved from internal.corp)", &blockedError{addr: "10.1.2.3", reason: "a private address"})
	notFound := &net.DNSError{Err: "no such host", Name: "nope.example", Server: "10.0.0.53:53", IsNotFound: true}
	failed := &net.DNSError{Err: "server misbehaving", Name: "x.example", Server: "10.0.0.53:53"}
	var reasons []string
	for _, err := range []error{blocked, notFound, failed} {
		r, ok := Describe("host.example", err)
		require.True(t, ok)
		for _, secret := range []string{"10.1.2.3", "10.0.0.53", "internal.corp", "private", "no such host"} {
			assert.NotContains(t, r, secret)
		}
		reasons = append(reasons, r)
	}
	assert.Equal(t, reasons[0], reasons[1], "a refused address and a missing name read the same")
	assert.Equal(t, reasons[1], reasons[2])
}

func TestCheckHostNameRefusesWhatCanNeverBeCalled(t *testing.T) {
	t.Parallel()
	p := mustPolicy(t)
	for _, h := range []string{"localhost", "LOCALHOST.", "api.localhost", "127.0.0.1", "[::1]", "2130706433", "0x7f.1", "127.1",
		"0177.0.0.1", "10.0.0.1", "0x7f000001"} {
		assert.ErrorIs(t, p.CheckHostName(h), ErrBlocked, h)
	}
	for _, h := range []string{"example.com", "cafe.example", "8.8.8.8", "hooks.example.org.", "deadbeef.io"} {
		assert.NoError(t, p.CheckHostName(h), h)
	}
}
