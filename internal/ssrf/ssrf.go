// Package ssrf keeps outbound HTTP requests to tenant-supplied URLs (HTTP
// workflow steps, webhooks) away from internal infrastructure.
//
// A Policy refuses every address that is not public internet: unspecified,
// "this network", loopback, private (RFC 1918 and IPv6 unique-local),
// link-local (which hosts cloud metadata endpoints such as 169.254.169.254
// and fd00:ec2::254), carrier-grade NAT, IETF protocol assignments,
// benchmarking, documentation, reserved, broadcast and multicast ranges, and
// the 6to4, Teredo and NAT64 prefixes that can embed a private IPv4 address.
// IPv4-mapped IPv6 addresses are unmapped first, so ::ffff:10.0.0.1 is
// treated as 10.0.0.1. CIDRs passed to NewPolicy override the block list,
// for local development and tests.
//
// The check runs at connect time, in net.Dialer.Control, on the IP the
// socket is about to connect to. Validating a URL's hostname before the
// request is not enough: DNS can answer differently on the second lookup
// (DNS rebinding), and every redirect hop resolves again. Checking the
// dialed address covers both, and a refused address never sees a packet.
//
// A Policy is immutable after NewPolicy and safe for concurrent use; the
// dialers, transports and clients it builds may be shared across goroutines.
package ssrf

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrBlocked is wrapped by every refusal; errors.Is(err, ssrf.ErrBlocked)
// identifies them.
var ErrBlocked = errors.New("ssrf: blocked")

const maxRedirects = 5

// Policy decides which addresses outbound connections may reach. The zero
// Policy blocks every non-public address and allows nothing extra.
type Policy struct {
	allow []netip.Prefix
	ports map[int]bool
}

// DefaultPorts are the ports a public address may be reached on unless the
// policy allows more.
var DefaultPorts = []int{80, 443}

// NewPolicy returns a policy that blocks every non-public address, except
// the CIDRs in allow (for local development and tests, e.g. "127.0.0.0/8"),
// and every port of a public address but DefaultPorts and ports. An
// allowed private CIDR may be reached on any port. A bad CIDR or port is
// an error naming it.
func NewPolicy(allow []string, ports ...int) (*Policy, error) {
	p := &Policy{allow: make([]netip.Prefix, 0, len(allow)), ports: map[int]bool{}}
	for _, s := range allow {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("ssrf: invalid allow CIDR %q: %w", s, err)
		}
		p.allow = append(p.allow, pfx.Masked())
	}
	for _, port := range append(append([]int{}, DefaultPorts...), ports...) {
		if port < 1 || port > 65535 {
			return nil, fmt.Errorf("ssrf: invalid port %d", port)
		}
		p.ports[port] = true
	}
	return p, nil
}

// PortAllowed reports whether a public address may be called on port.
func (p *Policy) PortAllowed(port int) bool { return p.ports == nil || p.ports[port] }

// CheckAddr is Check plus the port: a public address only on an allowed
// port, an allow-listed one on any.
func (p *Policy) CheckAddr(ip netip.Addr, port int) error {
	if err := p.Check(ip); err != nil {
		return err
	}
	norm := ip.Unmap().WithZone("")
	for _, a := range p.allow {
		if a.Contains(norm) {
			return nil
		}
	}
	if p.ports != nil && !p.ports[port] {
		return &blockedError{addr: netip.AddrPortFrom(ip, uint16(port)).String(), reason: "on a port that is not allowed"}
	}
	return nil
}

type rule struct {
	prefix netip.Prefix
	reason string // completes "<ip> is ..."
}

// rules are checked in order, first match wins, so narrower prefixes come
// before the ranges that contain them to give the most precise reason.
var rules = func() []rule {
	src := []struct{ cidr, reason string }{
		// IPv4
		{"0.0.0.0/32", "unspecified"},
		{"0.0.0.0/8", `in "this network" (0.0.0.0/8)`},
		{"127.0.0.0/8", "loopback"},
		{"10.0.0.0/8", "a private address"},
		{"172.16.0.0/12", "a private address"},
		{"192.168.0.0/16", "a private address"},
		{"169.254.0.0/16", "link-local (cloud metadata)"},
		{"100.64.0.0/10", "a carrier-grade NAT address"},
		{"192.0.0.0/24", "reserved for IETF protocol assignments"},
		{"198.18.0.0/15", "reserved for benchmarking"},
		{"192.0.2.0/24", "a documentation address"},
		{"198.51.100.0/24", "a documentation address"},
		{"203.0.113.0/24", "a documentation address"},
		{"255.255.255.255/32", "broadcast"},
		{"240.0.0.0/4", "reserved (240.0.0.0/4)"},
		{"224.0.0.0/4", "multicast"},
		// IPv6
		{"::/128", "unspecified"},
		{"::1/128", "loopback"},
		{"::/96", "an IPv4-compatible address (deprecated, may embed a private IPv4 address)"},
		{"fd00:ec2::254/128", "the AWS metadata address (unique-local)"},
		{"fc00::/7", "a private (unique-local) address"},
		{"fe80::/10", "link-local"},
		{"fec0::/10", "site-local (deprecated, private)"},
		{"ff00::/8", "multicast"},
		{"2001:db8::/32", "a documentation address"},
		{"3fff::/20", "a documentation address"},
		{"100::/64", "a discard-only address"},
		{"2002::/16", "6to4 (may embed a private IPv4 address)"},
		{"2001::/32", "Teredo (may embed a private IPv4 address)"},
		{"64:ff9b::/96", "NAT64 (may embed a private IPv4 address)"},
		{"64:ff9b:1::/48", "local-use NAT64 (may embed a private IPv4 address)"},
	}
	out := make([]rule, len(src))
	for i, r := range src {
		out[i] = rule{netip.MustParsePrefix(r.cidr), r.reason}
	}
	return out
}()

type blockedError struct {
	addr   string
	reason string
}

func (e *blockedError) Error() string { return "ssrf: " + e.addr + " is " + e.reason }
func (e *blockedError) Unwrap() error { return ErrBlocked }

// Check returns nil when ip may be reached, else an error wrapping
// ErrBlocked that says why.
func (p *Policy) Check(ip netip.Addr) error {
	if !ip.IsValid() {
		return &blockedError{addr: "<invalid>", reason: "not a valid IP address"}
	}
	// Prefix.Contains never matches a zoned address, and a mapped address
	// never matches an IPv4 prefix: normalise both away first.
	norm := ip.Unmap().WithZone("")
	for _, a := range p.allow {
		if a.Contains(norm) {
			return nil
		}
	}
	for _, r := range rules {
		if r.prefix.Contains(norm) {
			return &blockedError{addr: ip.String(), reason: r.reason}
		}
	}
	// Backstop for anything the table misses.
	if !norm.IsGlobalUnicast() {
		return &blockedError{addr: ip.String(), reason: "not a global unicast address"}
	}
	return nil
}

// Control is a net.Dialer.Control function enforcing the policy on the
// address actually being dialed. By then the host is an IP literal; anything
// else is blocked.
func (p *Policy) Control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: dial address %q is not an IP literal and port (%s)", ErrBlocked, address, network)
	}
	return p.CheckAddr(ap.Addr(), int(ap.Port()))
}

// Dialer returns a net.Dialer whose Control enforces the policy (timeout
// 10s, keepalive 30s). Do not set ControlContext on it: net.Dialer then
// ignores Control.
func (p *Policy) Dialer() *net.Dialer {
	return &net.Dialer{
		Timeout:   10 * time.Second,
		KeepAlive: 30 * time.Second,
		Control:   p.Control,
	}
}

// Transport returns an *http.Transport for tenant URLs. Proxy is nil on
// purpose: through a proxy we would dial (and check) the proxy, not the
// tenant's target, and environment proxies must not change that.
func (p *Policy) Transport() *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           p.Dialer().DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
	}
}

// Client returns an *http.Client using ResolvingTransport with the
// system's resolver and the given overall timeout (0 means none). It follows at most 5 redirects and refuses
// redirects to non-http(s) schemes; every hop dials through the same
// Control, so a redirect to a blocked address fails at connect time.
func (p *Policy) Client(timeout time.Duration) *http.Client {
	return &http.Client{
		Transport: p.ResolvingTransport(net.DefaultResolver),
		Timeout:   timeout,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			// via holds the original request and earlier hops, so
			// len(via) is the number of this redirect.
			if len(via) > maxRedirects {
				return fmt.Errorf("ssrf: stopped after %d redirects", maxRedirects)
			}
			if s := req.URL.Scheme; s != "http" && s != "https" {
				return fmt.Errorf("%w: redirect to unsupported scheme %q", ErrBlocked, s)
			}
			return nil
		},
	}
}

// Resolver looks up a host's addresses (*net.Resolver is one; tests pass
// their own).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// ResolvingTransport is Transport with name resolution done here, through
// r, instead of inside the dialer: every resolved address is checked
// before any socket exists, so a name that resolves to a refused address
// fails without a connection being attempted, and the address dialed
// (again checked by Control) is the one that was checked.
func (p *Policy) ResolvingTransport(r Resolver) *http.Transport {
	t := p.Transport()
	d := p.Dialer()
	t.DialContext = func(ctx context.Context, network, address string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(address)
		if err != nil {
			return nil, fmt.Errorf("%w: cannot parse dial address %q", ErrBlocked, address)
		}
		var addrs []netip.Addr
		literal := false
		if ip, err := netip.ParseAddr(host); err == nil {
			addrs, literal = []netip.Addr{ip}, true
		} else {
			ipNet := "ip"
			switch network {
			case "tcp4":
				ipNet = "ip4"
			case "tcp6":
				ipNet = "ip6"
			}
			if addrs, err = r.LookupNetIP(ctx, ipNet, host); err != nil {
				return nil, err
			}
		}
		portNum, _ := strconv.Atoi(port)
		var refused error
		for _, ip := range addrs {
			if err := p.CheckAddr(ip.Unmap(), portNum); err != nil {
				if refused == nil && literal {
					refused = err
				} else if refused == nil {
					refused = fmt.Errorf("%w (resolved from %s)", err, host)
				}
				continue
			}
			conn, err := d.DialContext(ctx, network, net.JoinHostPort(ip.Unmap().String(), port))
			if err == nil {
				return conn, nil
			}
			refused = err
		}
		if refused == nil {
			refused = fmt.Errorf("%s has no addresses", host)
		}
		return nil, refused
	}
	return t
}

// Describe says why a request to host got no response, for the tenant who
// asked for it: what went wrong, but nothing of the network it ran in. A
// refused address, a name that does not resolve and a resolver failure
// read the same ("not reachable"), so a tenant cannot map internal names
// or addresses by asking; the details are for the operator's log. ok is
// false when err is none of those (the caller describes it).
func Describe(host string, err error) (reason string, ok bool) {
	var op *net.OpError
	switch {
	case Unreachable(err):
		return host + " is not reachable: only public addresses on allowed ports may be called", true
	case errors.As(err, &op) && op.Op == "dial":
		return "could not connect to " + host, true
	}
	return "", false
}

// Unreachable reports a refusal by the policy or a failure to resolve:
// the errors Describe words alike, which callers must also treat alike.
func Unreachable(err error) bool {
	var dnsErr *net.DNSError
	return errors.Is(err, ErrBlocked) || errors.As(err, &dnsErr)
}

// CheckHostName refuses, when a URL is entered, hosts that can only ever
// be refused when called: localhost names (any case, with or without the
// trailing dot) and IP literals in every spelling (dotted, numeric,
// hexadecimal, octal, bracketed IPv6) that the policy blocks. Names that
// resolve to blocked addresses are refused when called.
func (p *Policy) CheckHostName(host string) error {
	h := strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if h == "" || h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return fmt.Errorf("%w: %q is a local name", ErrBlocked, host)
	}
	if ip, err := netip.ParseAddr(h); err == nil {
		return p.Check(ip)
	}
	if numericHost(h) {
		return fmt.Errorf("%w: %q is a numeric host (use a name or a dotted public address)", ErrBlocked, host)
	}
	return nil
}

// numericHost reports a host made only of digits, dots and hex markers
// ("2130706433", "0x7f.1", "127.1", "0177.0.0.1"): resolvers read these
// as IPv4 addresses.
func numericHost(h string) bool {
	for _, label := range strings.Split(h, ".") {
		l := strings.TrimPrefix(label, "0x")
		if l == "" {
			return true
		}
		for _, r := range l {
			if !strings.ContainsRune("0123456789abcdef", r) {
				return false
			}
		}
		if l == label && strings.ContainsAny(l, "abcdef") {
			return false // a hex-looking word without 0x is a name ("cafe")
		}
	}
	return true
}
