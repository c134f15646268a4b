package membership

import (
	"io"
	"net"
	"sync"
	"testing"

	"github.com/prefixrouter/prefixrouter/fleet"
)

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

// resolved is c resolved; the tests give valid configs.
func resolved(c fleet.RoutingConfig) fleet.Resolved {
	r, _ := c.Resolve()
	return r
}
