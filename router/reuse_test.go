package router

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prefixrouter/prefixrouter/upstream"
)

// closingStream answers a request with a two-event stream and the
// Keep-Alive header llama-server's cpp-httplib sends (timeout=5, max=100),
// written on the hijacked connection, then closes the connection: at once
// (llama-server after every streamed answer), or when the next request's
// first byte arrives, unread (the race of a reused connection, lost every
// time).
func closingStream(onNext bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		c, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		data := "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"
		if _, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(data), data); err != nil {
			return
		}
		if onNext {
			_, _ = brw.Reader.Peek(1)
		}
	}
}

// TestInstanceThatClosesAfterEveryStreamFailsNoRequest is issue 20's
// acceptance for upstream connections: 1,000 streamed requests through
// the router to an instance that closes the connection after every
// streamed answer, 0 failed. With the close made to race every reuse, the
// requests that lost it were sent again, on new connections.
func TestInstanceThatClosesAfterEveryStreamFailsNoRequest(t *testing.T) {
	const (
		requests = 1000
		clients  = 4
	)
	for _, tc := range []struct {
		name   string
		onNext bool
	}{
		{"closes after the answer", false},
		{"closes as the next request arrives", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t, "i-close")
			b.handler = closingStream(tc.onNext)
			h := newHarness(t, hopts{cfg: prefixCfg(100)}, b)
			var failed atomic.Int64
			var firstErr sync.Once
			var wg sync.WaitGroup
			for c := range clients {
				wg.Go(func() {
					for i := range requests / clients {
						body := fmt.Sprintf(`{"model":"m","stream":true,"messages":[{"role":"user","content":"client %d request %d"}]}`, c, i)
						res, err := h.do(t.Context(), "/v1/chat/completions", body, nil)
						if err == nil && res.status == http.StatusOK && strings.HasSuffix(string(res.body), "data: [DONE]\n\n") {
							continue
						}
						failed.Add(1)
						firstErr.Do(func() { t.Errorf("request %d of client %d: status %d, %q, %v", i, c, res.status, res.body, err) })
					}
				})
			}
			wg.Wait()
			resent := h.r.opts.Transport.(*upstream.Transport).Resent()
			t.Logf("%d requests, %d failed, %d sent again on a new connection, %d read by the instance", requests, failed.Load(), resent, b.hits.Load())
			if n := failed.Load(); n != 0 {
				t.Fatalf("%d of %d streamed requests failed, want 0", n, requests)
			}
			if n := b.hits.Load(); n != requests {
				t.Fatalf("the instance read %d requests, want each of the %d once", n, requests)
			}
			if tc.onNext && resent == 0 {
				t.Fatal("no request was sent again: the test's instance did not make the race happen")
			}
			fams, err := h.reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			var exported float64 = -1
			for _, f := range fams {
				if f.GetName() == "prefixrouter_upstream_resent_total" {
					exported = f.GetMetric()[0].GetCounter().GetValue()
				}
			}
			if exported != float64(resent) {
				t.Fatalf("prefixrouter_upstream_resent_total %v, want %d", exported, resent)
			}
		})
	}
}
