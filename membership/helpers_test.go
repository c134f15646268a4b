package membership

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/prefixrouter/prefixrouter/fleet"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// eventually polls cond every 5 ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(d)
	for {
		if cond() {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func instanceOf(s *fleet.Snapshot, ep, id string) (fleet.Instance, bool) {
	e := s.Endpoint(ep)
	if e == nil {
		return fleet.Instance{}, false
	}
	for _, in := range e.Instances {
		if in.ID == id {
			return in, true
		}
	}
	return fleet.Instance{}, false
}

// proxy is a loopback TCP proxy in front of etcd that a test can cut, to
// put one client behind while others keep talking to etcd.
type proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex // guards blocked and conns
	blocked bool
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

func startProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.blocked {
			p.mu.Unlock()
			c.Close()
			continue
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[u] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			defer p.wg.Done()
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
		}
		go pipe(u, c)
		go pipe(c, u)
	}
}

// setBlocked cuts every connection and refuses new ones, or lets them in.
func (p *proxy) setBlocked(b bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = b
	if b {
		for c := range p.conns {
			c.Close()
		}
		p.conns = map[net.Conn]struct{}{}
	}
}

func (p *proxy) close() {
	p.ln.Close()
	p.setBlocked(true)
	p.wg.Wait()
}
