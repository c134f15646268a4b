package fleet

import (
	"fmt"
	"net/netip"
	"net/url"
	"strings"
)

// ErrUpstreamNotAllowed is wrapped by Upstreams.Check's refusals: an instance
// address the router must never connect to. It wraps ErrInvalid.
var ErrUpstreamNotAllowed = fmt.Errorf("fleet: %w upstream", ErrInvalid)

// DefaultUpstreams is what an empty allow list means: loopback and the
// private ranges (RFC 1918, RFC 4193), plus the name localhost. Link-local
// (169.254.0.0/16 and fe80::/10, where cloud metadata services answer) and
// public addresses are outside it.
var DefaultUpstreams = []string{"127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "localhost"}

// Upstreams is the set of addresses instance records may point at
// (--allowed-upstreams). Any writer of instances/ in etcd can otherwise send
// every client's prompt to any URL and make every replica's health checks and
// load polls GET it (issue 12). The zero value allows DefaultUpstreams.
type Upstreams struct {
	prefixes []netip.Prefix
	hosts    map[string]bool // lower-case names; ".example.com" matches subdomains
	suffixes []string
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
// (or match a listed suffix); an IP must fall in a listed prefix. Names are
// not resolved: listing a name trusts its DNS.
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
	if a, err := netip.ParseAddr(host); err == nil {
		a = a.Unmap()
		if a.Zone() != "" {
			return fmt.Errorf("%w: %q: zoned addresses are not allowed", ErrUpstreamNotAllowed, addr)
		}
		for _, pre := range u.prefixes {
			if pre.Contains(a) {
				return nil
			}
		}
		return fmt.Errorf("%w: %s is outside the allowed upstreams", ErrUpstreamNotAllowed, a)
	}
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	if u.hosts[name] {
		return nil
	}
	for _, s := range u.suffixes {
		if strings.HasSuffix(name, s) {
			return nil
		}
	}
	return fmt.Errorf("%w: host %q is not an allowed upstream", ErrUpstreamNotAllowed, host)
}
