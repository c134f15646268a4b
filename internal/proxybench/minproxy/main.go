// Command minproxy is a measuring stick for `prefixrouter proxybench`, not a
// product: the least a Go proxy on net/http's server can do per request.
// It reads the body whole, hashes its first 4096 bytes onto the backends
// (modulo, no ring), sends it through upstream.Transport (the router's own
// HTTP/1.1 client) and copies the answer back: no ReverseProxy, no
// routing state, metrics, limits or retries. Run beside the router and
// HAProxy, it separates what the router's own work costs from what any
// proxy built on net/http's server costs (docs/benchmarks.md, "What a
// proxy on net/http can reach"):
//
//	go build -o /tmp/minproxy ./internal/proxybench/minproxy
//	prefixrouter proxybench --baseline /tmp/minproxy --sizes 16384 --clients 16 --rounds 7
//
// With MINPROXY_SERVER=loop it serves the same handler through a
// hand-written connection loop instead of net/http's server (loop.go).
//
// It accepts the arguments proxybench gives a baseline (`serve --listen
// ADDR --static-instances id=URL,...`; the others are ignored).
package main

import (
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log"
	"net/http"
	"net/url"
	"os"
	"sync"

	"github.com/prefixrouter/prefixrouter/internal/proxybench/stick"
	"github.com/prefixrouter/prefixrouter/upstream"
)

func main() {
	ln, args := stick.MustListen("minproxy")
	p := &proxy{backends: args.Backends, tr: upstream.New(upstream.Options{}), seed: maphash.MakeSeed()}
	switch os.Getenv("MINPROXY_SERVER") {
	case "loop":
		log.Fatal(serveLoop(ln, p))
	case "":
		log.Fatal(http.Serve(ln, p))
	default:
		log.Fatalf("minproxy: MINPROXY_SERVER %q: want loop or nothing", os.Getenv("MINPROXY_SERVER"))
	}
}

type proxy struct {
	backends []*url.URL
	tr       *upstream.Transport
	seed     maphash.Seed
}

var bodies = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	bp := bodies.Get().(*[]byte)
	defer bodies.Put(bp)
	body := (*bp)[:0]
	for {
		if len(body) == cap(body) {
			body = append(body, 0)[:len(body)]
		}
		n, err := r.Body.Read(body[len(body):cap(body)])
		body = body[:len(body)+n]
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	*bp = body
	key := body[:min(len(body), 4096)]
	target := p.backends[maphash.Bytes(p.seed, key)%uint64(len(p.backends))]
	out := r.Clone(r.Context())
	out.URL.Scheme, out.URL.Host, out.Host, out.RequestURI = target.Scheme, target.Host, "", ""
	out.Body, out.ContentLength = upstream.NewBytesBody(body), int64(len(body))
	resp, err := p.tr.RoundTrip(out)
	if err != nil {
		http.Error(w, fmt.Sprintf("upstream: %v", err), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}
