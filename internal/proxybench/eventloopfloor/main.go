// Command eventloopfloor is a measuring stick for `prefixrouter
// proxybench`, not a product: rawfloor's work (read a Content-Length
// request, hash its body's first 4096 bytes onto the backends, forward it
// unchanged on a backend connection of the client connection's own, copy
// the Content-Length answer back) done on event loops instead of a
// goroutine per connection: github.com/panjf2000/gnet/v2, one loop per
// GOMAXPROCS, epoll, the backend connections registered on the client's
// loop. It is a module of its own so that the router's go.mod does not
// carry gnet (docs/benchmarks.md, "What a proxy in Go can reach"):
//
//	(cd internal/proxybench/eventloopfloor && go build -o /tmp/eventloopfloor .)
//	prefixrouter proxybench --baseline /tmp/eventloopfloor --sizes 16384 --clients 16 --rounds 7
package main

import (
	"bytes"
	"context"
	"hash/maphash"
	"log"
	"net"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/panjf2000/gnet/v2"
)

type proxy struct {
	gnet.BuiltinEventEngine
	backends []*net.TCPAddr
	seed     maphash.Seed
}

// client is a client connection's state. A closed-loop client sends its
// next request after the answer, so at most one request waits (pending)
// for a backend connection being opened.
type client struct {
	c       gnet.Conn
	ups     []gnet.Conn
	pending []byte
	pidx    int
}

type backend struct {
	cl  *client
	idx int
}

// msgLen returns the length of the complete message at the start of b, or 0.
func msgLen(b []byte) (head, total int) {
	i := bytes.Index(b, []byte("\r\n\r\n"))
	if i < 0 {
		return 0, 0
	}
	head = i + 4
	cl := 0
	h := b[:i]
	for len(h) > 0 {
		j := bytes.Index(h, []byte("\r\n"))
		var line []byte
		if j < 0 {
			line, h = h, nil
		} else {
			line, h = h[:j], h[j+2:]
		}
		if len(line) > 15 && bytes.EqualFold(line[:15], []byte("content-length:")) {
			cl, _ = strconv.Atoi(string(bytes.TrimSpace(line[15:])))
		}
	}
	if len(b) < head+cl {
		return head, 0
	}
	return head, head + cl
}

func (p *proxy) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	if b, ok := c.Context().(*backend); ok {
		b.cl.ups[b.idx] = c
		if b.cl.pending != nil && b.cl.pidx == b.idx {
			_, _ = c.Write(b.cl.pending)
			b.cl.pending = nil
		}
		return nil, gnet.None
	}
	c.SetContext(&client{c: c, ups: make([]gnet.Conn, len(p.backends))})
	return nil, gnet.None
}

// OnClose closes a client's backend connections with it.
func (p *proxy) OnClose(c gnet.Conn, _ error) gnet.Action {
	if x, ok := c.Context().(*client); ok {
		for _, u := range x.ups {
			if u != nil {
				_ = u.Close()
			}
		}
	}
	return gnet.None
}

func (p *proxy) OnTraffic(c gnet.Conn) gnet.Action {
	switch x := c.Context().(type) {
	case *client:
		for {
			buf, _ := c.Peek(-1)
			head, n := msgLen(buf)
			if n == 0 {
				return gnet.None
			}
			body := buf[head:n]
			i := int(maphash.Bytes(p.seed, body[:min(len(body), 4096)]) % uint64(len(p.backends)))
			if u := x.ups[i]; u != nil {
				_, _ = u.Write(buf[:n])
			} else {
				x.pending, x.pidx = append([]byte(nil), buf[:n]...), i
				_, err := c.EventLoop().Register(gnet.NewContext(context.Background(), &backend{cl: x, idx: i}), p.backends[i])
				if err != nil {
					return gnet.Close
				}
			}
			_, _ = c.Discard(n)
		}
	case *backend:
		for {
			buf, _ := c.Peek(-1)
			_, n := msgLen(buf)
			if n == 0 {
				return gnet.None
			}
			_, _ = x.cl.c.Write(buf[:n])
			_, _ = c.Discard(n)
		}
	}
	return gnet.None
}

// args reads `serve --listen ADDR --static-instances id=URL,...` (the
// arguments proxybench gives every proxy; the others are ignored).
func args() (listen string, backends []*net.TCPAddr) {
	listen = "127.0.0.1:8080"
	a := os.Args
	for i := 2; i+1 < len(a); i++ {
		switch a[i] {
		case "--listen":
			listen = a[i+1]
		case "--static-instances":
			for _, kv := range strings.Split(a[i+1], ",") {
				_, raw, _ := strings.Cut(kv, "=")
				u, err := url.Parse(raw)
				if err != nil {
					log.Fatal(err)
				}
				addr, err := net.ResolveTCPAddr("tcp", u.Host)
				if err != nil {
					log.Fatalf("eventloopfloor: backend %q: %v", kv, err)
				}
				backends = append(backends, addr)
			}
		}
	}
	if len(backends) == 0 {
		log.Fatal("usage: eventloopfloor serve --listen ADDR --static-instances id=URL,...")
	}
	return listen, backends
}

func main() {
	listen, backends := args()
	p := &proxy{seed: maphash.MakeSeed(), backends: backends}
	log.Fatal(gnet.Run(p, "tcp://"+listen, gnet.WithMulticore(true), gnet.WithNumEventLoop(runtime.GOMAXPROCS(0)), gnet.WithTCPNoDelay(gnet.TCPNoDelay)))
}
