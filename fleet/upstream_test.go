package fleet

import (
	"errors"
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
