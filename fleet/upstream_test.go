package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
)

func TestUpstreamsCheck(t *testing.T) {
	def, err := ParseUpstreams(nil)
	if err != nil {
		t.Fatal(err)
	}
	custom, err := ParseUpstreams([]string{"203.0.113.0/24", "198.51.100.7", "vllm-0.internal", ".svc.cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	wide, err := ParseUpstreams([]string{"0.0.0.0/0", "::/0"})
	if err != nil {
		t.Fatal(err)
	}
	explicit, err := ParseUpstreams([]string{"169.254.169.254", "fe80::/10", "fd00:ec2::254"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		u    Upstreams
		addr string
		ok   bool
	}{
		{"loopback", def, "http://127.0.0.1:8000", true},
		{"loopback v6", def, "http://[::1]:8000", true},
		{"private 10/8", def, "http://10.1.2.3:8000", true},
		{"private 172.16/12", def, "https://172.31.0.1", true},
		{"private 192.168/16", def, "http://192.168.1.1:80/base", true},
		{"localhost name", def, "http://localhost:8000", true},
		{"zero value means default", Upstreams{}, "http://127.0.0.1:1", true},
		{"link-local metadata", def, "http://169.254.169.254/latest/meta-data", false},
		{"v4-mapped metadata", def, "http://[::ffff:169.254.169.254]/", false},
		{"public", def, "http://203.0.113.9:8000", false},
		{"file scheme", def, "file:///etc/passwd", false},
		{"ftp scheme", def, "ftp://127.0.0.1/", false},
		{"gopher scheme", def, "gopher://127.0.0.1:70/", false},
		{"userinfo", def, "http://user:pw@127.0.0.1:8000", false},
		{"query", def, "http://127.0.0.1:8000/?token=x", false},
		{"fragment", def, "http://127.0.0.1:8000/#x", false},
		{"unlisted name", def, "http://metadata.google.internal/", false},
		{"no host", def, "http:///x", false},
		{"opaque", def, "http:127.0.0.1", false},
		{"zoned", def, "http://[fe80::1%25eth0]:80/", false},
		{"custom CIDR", custom, "http://203.0.113.9:8000", true},
		{"custom single IP", custom, "http://198.51.100.7", true},
		{"custom neighbour IP", custom, "http://198.51.100.8", false},
		{"custom name", custom, "http://VLLM-0.internal:8000", true},
		{"custom suffix", custom, "http://vllm-1.ns.svc.cluster.local:8000", true},
		{"custom replaces default", custom, "http://127.0.0.1:8000", false},
		// Issue 19: reserved addresses stay out even inside a listed range.
		{"AWS IPv6 metadata inside fc00::/7", def, "http://[fd00:ec2::254]/latest/meta-data", false},
		{"AWS IPv6 metadata, v4-mapped form of the IPv4 one", def, "http://[::ffff:a9fe:a9fe]/", false},
		{"metadata through NAT64", wide, "http://[64:ff9b::a9fe:a9fe]/", false},
		{"other ULA stays allowed", def, "http://[fd00:ec2::253]:8000", true},
		{"IPv4 metadata inside 0.0.0.0/0", wide, "http://169.254.169.254/", false},
		{"IPv6 link-local inside ::/0", wide, "http://[fe80::1]/", false},
		{"Alibaba metadata inside 100.64/10", wide, "http://100.100.100.200/", false},
		{"public inside 0.0.0.0/0", wide, "http://203.0.113.9/", true},
		{"metadata listed exactly", explicit, "http://169.254.169.254/", true},
		{"link-local listed as its range", explicit, "http://[fe80::7]:80/", true},
		{"IPv6 metadata listed exactly", explicit, "http://[fd00:ec2::254]/", true},
		{"listed as a range it is part of", explicit, "http://169.254.170.2/", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.u.Check(tt.addr)
			if (err == nil) != tt.ok {
				t.Fatalf("Check(%q) = %v, want ok=%v", tt.addr, err, tt.ok)
			}
			if err != nil && (!errors.Is(err, ErrUpstreamNotAllowed) || !errors.Is(err, ErrInvalid)) {
				t.Fatalf("error %v does not wrap ErrUpstreamNotAllowed and ErrInvalid", err)
			}
		})
	}
	for _, bad := range [][]string{{""}, {"10.0.0.0/33"}, {"a b"}, {"user@host"}, {"."}} {
		if _, err := ParseUpstreams(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseUpstreams(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

// TestUpstreamsRefuseOwnListeners: records that point at one of the
// router's own listeners are refused (issue 19: a record at the data port
// turned 30 requests into 180), in every spelling of the address.
func TestUpstreamsRefuseOwnListeners(t *testing.T) {
	self := []Listener{
		{Prefix: netip.MustParsePrefix("127.0.0.1/32"), Port: 8080},   // data, bound to loopback
		{Prefix: netip.MustParsePrefix("0.0.0.0/32"), Port: 8080},     // 0.0.0.0 reaches local listeners
		{Prefix: netip.MustParsePrefix("10.0.0.5/32"), Port: 9090},    // admin, one interface
		{Prefix: netip.MustParsePrefix("127.0.0.0/8"), Port: 9002},    // ext_proc on a wildcard
		{Prefix: netip.MustParsePrefix("::1/128"), Port: 9002},        // ... IPv6 loopback
		{Prefix: netip.MustParsePrefix("192.168.1.9/32"), Port: 9002}, // ... an interface
	}
	u := Upstreams{}.WithSelf(self)
	tests := []upstreamCase{
		{"http://127.0.0.1:8080", false},
		{"http://localhost:8080/v1", false},
		{"http://api.localhost:8080", false},
		{"http://[::ffff:127.0.0.1]:8080", false},
		{"http://10.0.0.5:9090", false},
		{"http://127.9.9.9:9002", false},
		{"http://[::1]:9002", false},
		{"http://192.168.1.9:9002", false},
		{"http://127.0.0.1:8000", true},   // another port: a model server beside the router
		{"http://10.0.0.6:9090", true},    // another host
		{"http://192.168.1.9:8080", true}, // the data port is bound to loopback only
		{"http://localhost:8000", true},
	}
	checkUpstreams(t, u, tests)
}

// TestUpstreamsResolveNames: with a resolver, an allowed host name is
// refused when it leads to one of the router's own listeners or to a
// Reserved address the list does not name (issue 19: only IP literals were
// refused); a name that does not resolve is let through; answers are
// cached, and the cache stays bounded.
func TestUpstreamsResolveNames(t *testing.T) {
	names := map[string][]netip.Addr{
		"router.internal": {netip.MustParseAddr("10.0.0.9"), netip.MustParseAddr("127.0.0.1")},
		"mapped.internal": {netip.MustParseAddr("::ffff:127.0.0.1")},
		"meta.internal":   {netip.MustParseAddr("169.254.169.254")},
		"meta6.internal":  {netip.MustParseAddr("fd00:ec2::254")},
		"vllm.internal":   {netip.MustParseAddr("10.0.0.7")},
	}
	lookups := 0
	resolve := func(_ context.Context, host string) ([]netip.Addr, error) {
		lookups++
		if as, ok := names[host]; ok {
			return slices.Clone(as), nil
		}
		return nil, errors.New("no such host")
	}
	u, err := ParseUpstreams(append(slices.Clone(DefaultUpstreams), ".internal"))
	if err != nil {
		t.Fatal(err)
	}
	u = u.WithSelf([]Listener{{Prefix: netip.MustParsePrefix("127.0.0.0/8"), Port: 8080}}).WithResolver(resolve)
	tests := []upstreamCase{
		{"http://router.internal:8080", false}, // one of its addresses is the router's
		{"http://mapped.internal:8080", false},
		{"http://router.internal:8000", true}, // another port
		{"http://meta.internal", false},
		{"http://meta6.internal:8000", false},
		{"http://vllm.internal:8000", true},
		{"http://gone.internal:8000", true},  // does not resolve: let through
		{"http://other.example:8000", false}, // not allowed, resolved or not
	}
	checkUpstreams(t, u, tests)
	// Listing the metadata range itself lets its name through, as its address.
	listed, _ := ParseUpstreams([]string{"169.254.169.254", ".internal"})
	if err := listed.WithResolver(resolve).Check("http://meta.internal"); err != nil {
		t.Errorf("a name of a listed metadata address: %v", err)
	}
	// Cached: checking again looks nothing up; the cache stays bounded.
	before := lookups
	if err := u.Check("http://vllm.internal:8000"); err != nil || lookups != before {
		t.Fatalf("a second check: %v, %d lookups, want none", err, lookups-before)
	}
	for i := range nameCacheSize + 10 {
		_ = u.Check(fmt.Sprintf("http://n%d.internal:8000", i))
	}
	if n := len(u.names.entries); n > nameCacheSize {
		t.Fatalf("%d names cached, want at most %d", n, nameCacheSize)
	}
}

// upstreamCase is an address and whether Check lets it through.
type upstreamCase struct {
	addr string
	ok   bool
}

// checkUpstreams checks every case on u; a refusal must wrap
// ErrUpstreamNotAllowed.
func checkUpstreams(t *testing.T, u Upstreams, cases []upstreamCase) {
	t.Helper()
	for _, tt := range cases {
		err := u.Check(tt.addr)
		if (err == nil) != tt.ok {
			t.Errorf("Check(%q) = %v, want ok=%v", tt.addr, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrUpstreamNotAllowed) {
			t.Errorf("Check(%q) = %v, does not wrap ErrUpstreamNotAllowed", tt.addr, err)
		}
	}
}

// TestUpstreamsCheckDial: the addresses a name leads to when the router
// dials it are refused when they are its own listeners or Reserved
// addresses the list does not name (a DNS answer may change after the
// record was accepted); other addresses of an allowed name pass.
func TestUpstreamsCheckDial(t *testing.T) {
	u, err := ParseUpstreams([]string{".internal", "fe80::/10"})
	if err != nil {
		t.Fatal(err)
	}
	u = u.WithSelf([]Listener{{Prefix: netip.MustParsePrefix("127.0.0.0/8"), Port: 8080}})
	for _, tt := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:8080", false},
		{"[::ffff:127.0.0.2]:8080", false},
		{"127.0.0.1:8000", true},
		{"169.254.169.254:80", false},
		{"[fd00:ec2::254]:80", false},
		{"[64:ff9b::a9fe:a9fe]:80", false},
		{"[fe80::1]:8000", true}, // the list names fe80::/10 itself
		{"203.0.113.9:8000", true},
	} {
		err := u.CheckDial(netip.MustParseAddrPort(tt.addr))
		if (err == nil) != tt.ok {
			t.Errorf("CheckDial(%s) = %v, want ok=%v", tt.addr, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrUpstreamNotAllowed) {
			t.Errorf("CheckDial(%s) = %v, does not wrap ErrUpstreamNotAllowed", tt.addr, err)
		}
	}
}
