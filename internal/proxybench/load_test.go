package proxybench

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestLoadDirect runs the closed loop against real loopback backends: every
// request answered, bounded by the request budget, and latencies recorded.
func TestLoadDirect(t *testing.T) {
	b, err := startBackends(3)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	docs, err := bodies(8, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := load(ctx, directTarget(b), docs, 4, 10*time.Millisecond, 10*time.Second, 200)
	if err != nil {
		t.Fatal(err)
	}
	if s.errors != 0 || s.requests != 200 {
		t.Errorf("load: %d answered, %d errors (%v); want the budget of 200 and none", s.requests, s.errors, s.firstErr)
	}
	if s.p50 <= 0 || s.p99 < s.p50 || s.cpu != 0 {
		t.Errorf("load: p50 %v, p99 %v, cpu %v; want 0 < p50 ≤ p99 and no proxy CPU for direct", s.p50, s.p99, s.cpu)
	}
}

func TestBodies(t *testing.T) {
	docs, err := bodies(256, 1024)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, d := range docs {
		if len(d) != 1024 || !strings.HasPrefix(string(d), `{"inputs":"document `) || !strings.HasSuffix(string(d), `}}`) {
			t.Fatalf("body of %d bytes: %.60q…", len(d), d)
		}
		seen[string(d[:32])] = true
	}
	if len(seen) != 256 {
		t.Errorf("%d distinct 32-byte prefixes, want 256", len(seen))
	}
	if _, err := bodies(1, 10); err == nil {
		t.Error("a body smaller than its frame must be refused")
	}
}

func TestHAProxyConfig(t *testing.T) {
	cfg := haproxyConfig("127.0.0.1:1", []string{"http://127.0.0.1:2", "http://127.0.0.1:3"})
	for _, want := range []string{"balance hash req.body,bytes(0,4096)", "hash-type consistent", "hash-balance-factor 125",
		"option http-buffer-request", "tune.bufsize 65536", "bind 127.0.0.1:1", "server b1 127.0.0.1:3\n"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("haproxy config lacks %q:\n%s", want, cfg)
		}
	}
}
