package fleet

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrUpstreamNotAllowed is wrapped by Upstreams.Check's refusals: an instance
// address the router must never connect to. It wraps ErrInvalid.
var ErrUpstreamNotAllowed = fmt.Errorf("fleet: %w upstream", ErrInvalid)

// DefaultUpstreams is what an empty allow list means: loopback and the
// private ranges (RFC 1918, RFC 4193), plus the name localhost. Link-local
// (169.254.0.0/16 and fe80::/10, where cloud metadata services answer) and
// public addresses are outside it, and so are the Reserved addresses inside
// it (fd00:ec2::254 lies in fc00::/7).
var DefaultUpstreams = []string{"127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "localhost"}

// Reserved are the ranges where link-local services and cloud metadata
// answer (credentials for the host's role among them). An address in one
// is refused unless the allow list names that range or a part of it
// itself: a broader entry (0.0.0.0/0, fc00::/7, the default list) does not
// let it through (issue 19: fd00:ec2::254, AWS's IPv6 metadata address, was
// allowed by the default fc00::/7). IPv4 addresses are also found inside
// IPv4-mapped (::ffff:a.b.c.d) and NAT64 (64:ff9b::a.b.c.d) IPv6 forms.
var Reserved = []string{
	"169.254.0.0/16",     // IPv4 link-local: AWS, GCP, Azure, OCI metadata at 169.254.169.254, ECS task metadata
	"fe80::/10",          // IPv6 link-local
	"fd00:ec2::254/128",  // AWS instance metadata over IPv6
	"100.100.100.200/32", // Alibaba Cloud metadata (inside 100.64.0.0/10)
}

var reserved = func() []netip.Prefix {
	out := make([]netip.Prefix, len(Reserved))
	for i, s := range Reserved {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}()

// nat64 is the well-known NAT64 prefix (RFC 6052): an address in it
// reaches the IPv4 address in its last 32 bits through a NAT64 gateway.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// Upstreams is the set of addresses instance records may point at
// (--allowed-upstreams). Any writer of instances/ in etcd can otherwise send
// every client's prompt to any URL and make every replica's health checks and
// load polls GET it (issue 12). The zero value allows DefaultUpstreams.
type Upstreams struct {
	prefixes []netip.Prefix
	hosts    map[string]bool // lower-case names; ".example.com" matches subdomains
	suffixes []string
	self     []Listener // the router's own listeners (WithSelf)
	names    *nameCache // resolves allowed host names (WithResolver); nil: names are not resolved
}

// Listener is one of the router's own listening sockets as records may
// name it: a port on the addresses of Prefix.
type Listener struct {
	Prefix netip.Prefix
	Port   uint16
}

// ParseUpstreams parses CIDRs (10.0.0.0/8), single IPs, host names
// (vllm-0.internal) and domain suffixes with a leading dot (.svc.cluster.local).
// An empty list means DefaultUpstreams.
func ParseUpstreams(list []string) (Upstreams, error) {
	if len(list) == 0 {
		list = DefaultUpstreams
	}
	u := Upstreams{hosts: map[string]bool{}}
	for _, raw := range list {
		s := strings.TrimSpace(raw)
		switch {
		case s == "":
			return Upstreams{}, fmt.Errorf("%w: empty entry in the allowed upstreams", ErrInvalid)
		case strings.Contains(s, "/"):
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return Upstreams{}, fmt.Errorf("%w: allowed upstream %q: %w", ErrInvalid, s, err)
			}
			u.prefixes = append(u.prefixes, p.Masked())
		default:
			if a, err := netip.ParseAddr(s); err == nil {
				u.prefixes = append(u.prefixes, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
				continue
			}
			name := strings.ToLower(s)
			if strings.HasPrefix(name, ".") {
				if len(name) < 2 || strings.ContainsAny(name, ":@ ") {
					return Upstreams{}, fmt.Errorf("%w: allowed upstream suffix %q", ErrInvalid, s)
				}
				u.suffixes = append(u.suffixes, name)
				continue
			}
			if strings.ContainsAny(name, ":@/ ") {
				return Upstreams{}, fmt.Errorf("%w: allowed upstream %q is not a CIDR, an IP or a host name", ErrInvalid, s)
			}
			u.hosts[name] = true
		}
	}
	return u, nil
}

// Check reports whether addr, an instance's base URL, may be proxied to and
// probed: scheme http or https, no user info, query or fragment (a probe
// would send them), and a host inside the list. A host name must be listed
// (or match a listed suffix); an IP must fall in a listed prefix. Listing
// a name trusts its DNS, but WithResolver resolves it to refuse the
// router's own listeners and Reserved addresses (checkName).
func (u Upstreams) Check(addr string) error {
	if u.hosts == nil {
		var err error
		if u, err = ParseUpstreams(nil); err != nil {
			return err
		}
	}
	p, err := url.Parse(addr)
	if err != nil {
		return fmt.Errorf("%w: %q does not parse: %w", ErrUpstreamNotAllowed, addr, err)
	}
	switch {
	case p.Scheme != "http" && p.Scheme != "https":
		return fmt.Errorf("%w: %q: scheme must be http or https", ErrUpstreamNotAllowed, addr)
	case p.User != nil:
		return fmt.Errorf("%w: %q carries user info", ErrUpstreamNotAllowed, p.Redacted())
	case p.RawQuery != "" || p.ForceQuery || p.Fragment != "":
		return fmt.Errorf("%w: %q carries a query or fragment", ErrUpstreamNotAllowed, addr)
	case p.Opaque != "" || p.Host == "":
		return fmt.Errorf("%w: %q has no host", ErrUpstreamNotAllowed, addr)
	}
	host := p.Hostname()
	port := p.Port()
	if port == "" {
		port = "80"
		if p.Scheme == "https" {
			port = "443"
		}
	}
	if a, err := netip.ParseAddr(host); err == nil {
		a = a.Unmap()
		if a.Zone() != "" {
			return fmt.Errorf("%w: %q: zoned addresses are not allowed", ErrUpstreamNotAllowed, addr)
		}
		if err := u.checkSelf(addr, []netip.Addr{a}, port); err != nil {
			return err
		}
		return u.checkAddr(a)
	}
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		// RFC 6761: such names are loopback.
		if err := u.checkSelf(addr, []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1}), netip.IPv6Loopback()}, port); err != nil {
			return err
		}
	}
	allowed := u.hosts[name]
	for _, s := range u.suffixes {
		allowed = allowed || strings.HasSuffix(name, s)
	}
	if !allowed {
		return fmt.Errorf("%w: host %q is not an allowed upstream", ErrUpstreamNotAllowed, host)
	}
	return u.checkName(addr, name, port)
}

// checkName resolves an allowed host name (WithResolver) and refuses it
// when an address it leads to is one of the router's own listeners, or a
// Reserved address the list does not name itself (issue 19: only IP
// literals were refused). A name that does not resolve is let through:
// the instance's health checks will fail, and a later record is checked
// again.
func (u Upstreams) checkName(addr, name, port string) error {
	if u.names == nil {
		return nil
	}
	as, err := u.names.lookup(name)
	if err != nil {
		return nil
	}
	if err := u.checkSelf(addr, as, port); err != nil {
		return fmt.Errorf("%w (host %q resolves to %v)", err, name, as)
	}
	for _, a := range as {
		if res, isReserved := reservedRange(a); isReserved && !u.listsReserved(a, res) {
			return fmt.Errorf("%w: host %q resolves to %s, link-local or a cloud metadata address (%s): list it, or a part of %s, to allow it", ErrUpstreamNotAllowed, name, a, res, res)
		}
	}
	return nil
}

// CheckDial reports whether a connection to ap may be opened: an address
// a host name led to when the router dialled it, which may differ from what
// it resolved to when its record was accepted (DNS answers change). It
// refuses the router's own listeners (WithSelf) and Reserved addresses the
// list does not name itself; other addresses of an allowed name are its
// DNS's to choose.
func (u Upstreams) CheckDial(ap netip.AddrPort) error {
	a := ap.Addr().Unmap()
	for _, l := range u.self {
		if l.Port == ap.Port() && l.Prefix.Contains(a) {
			return fmt.Errorf("%w: %s is this router's own listener on port %d", ErrUpstreamNotAllowed, ap, l.Port)
		}
	}
	if res, isReserved := reservedRange(a); isReserved && !u.listsReserved(a, res) {
		return fmt.Errorf("%w: %s is link-local or a cloud metadata address (%s): list it, or a part of %s, to allow it", ErrUpstreamNotAllowed, a, res, res)
	}
	return nil
}

// listsReserved reports whether the list names a, inside the Reserved
// range res, itself: with res or a part of it, not a broader range.
func (u Upstreams) listsReserved(a netip.Addr, res netip.Prefix) bool {
	for _, pre := range u.prefixes {
		if pre.Contains(a) && pre.Bits() >= res.Bits() && res.Contains(pre.Addr()) {
			return true
		}
	}
	return false
}

// Resolver looks up a host name's addresses (as
// net.Resolver.LookupNetIP does for network "ip").
type Resolver func(ctx context.Context, host string) ([]netip.Addr, error)

// WithResolver returns u resolving the host names it allows with r, so
// that Check refuses a name that leads back to the router (WithSelf) or to
// a metadata address. Answers are cached (nameCacheSize names for
// nameCacheTTL; a lookup is bounded by nameLookupTimeout). Check is called
// when a record is accepted, never per request.
func (u Upstreams) WithResolver(r Resolver) Upstreams {
	if u.hosts == nil {
		u, _ = ParseUpstreams(nil)
	}
	u.names = &nameCache{resolve: r, entries: map[string]nameEntry{}, now: time.Now}
	return u
}

// Bounds of the name cache.
const (
	nameCacheSize     = 1024
	nameCacheTTL      = 30 * time.Second
	nameLookupTimeout = 2 * time.Second
)

// nameCache caches a Resolver's answers.
type nameCache struct {
	resolve Resolver
	now     func() time.Time
	mu      sync.Mutex           // guards entries
	entries map[string]nameEntry // at most nameCacheSize
}

type nameEntry struct {
	addrs []netip.Addr
	err   error
	at    time.Time
}

func (c *nameCache) lookup(name string) ([]netip.Addr, error) {
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[name]
	c.mu.Unlock()
	if ok && now.Sub(e.at) < nameCacheTTL {
		return e.addrs, e.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), nameLookupTimeout)
	defer cancel()
	as, err := c.resolve(ctx, name)
	for i, a := range as {
		as[i] = a.Unmap()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= nameCacheSize {
		for k, old := range c.entries {
			if now.Sub(old.at) >= nameCacheTTL || len(c.entries) >= nameCacheSize {
				delete(c.entries, k)
			}
		}
	}
	c.entries[name] = nameEntry{addrs: as, err: err, at: now}
	return as, err
}

// checkAddr allows an IP inside a listed prefix, unless it is Reserved and
// the listed prefix is broader than the reserved range holding it.
func (u Upstreams) checkAddr(a netip.Addr) error {
	res, isReserved := reservedRange(a)
	for _, pre := range u.prefixes {
		if !pre.Contains(a) {
			continue
		}
		if isReserved && !(pre.Bits() >= res.Bits() && res.Contains(pre.Addr())) {
			return fmt.Errorf("%w: %s is link-local or a cloud metadata address (%s): list it, or a part of %s, to allow it", ErrUpstreamNotAllowed, a, res, res)
		}
		return nil
	}
	return fmt.Errorf("%w: %s is outside the allowed upstreams", ErrUpstreamNotAllowed, a)
}

// reservedRange returns the Reserved range that holds a, or the IPv4
// address a NAT64 address embeds.
func reservedRange(a netip.Addr) (netip.Prefix, bool) {
	for _, r := range reserved {
		if r.Contains(a) {
			return r, true
		}
	}
	if nat64.Contains(a) {
		b := a.As16()
		v4 := netip.AddrFrom4([4]byte(b[12:]))
		for _, r := range reserved {
			if r.Contains(v4) {
				return r, true
			}
		}
	}
	return netip.Prefix{}, false
}

// WithSelf returns u refusing, besides, every address among self: the
// router's own listeners (data plane, admin, ext_proc). A record pointing
// at one would make the router send requests to itself (issue 19: 30
// requests became 180). Host names other than localhost are resolved only
// WithResolver.
func (u Upstreams) WithSelf(self []Listener) Upstreams {
	if u.hosts == nil {
		u, _ = ParseUpstreams(nil)
	}
	u.self = append(slices.Clip(u.self), self...)
	return u
}

func (u Upstreams) checkSelf(addr string, as []netip.Addr, port string) error {
	for _, l := range u.self {
		if strconv.Itoa(int(l.Port)) != port {
			continue
		}
		for _, a := range as {
			if l.Prefix.Contains(a) {
				return fmt.Errorf("%w: %q points at this router's own listener on port %d", ErrUpstreamNotAllowed, addr, l.Port)
			}
		}
	}
	return nil
}
