package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// rawServer accepts loopback connections and hands each, numbered from 1,
// to serve on a goroutine of its own; the test's cleanup closes the
// listener and every connection and waits for the goroutines.
type rawServer struct {
	ln    net.Listener
	addr  string
	conns atomic.Int64
}

func newRawServer(t *testing.T, serve func(n int64, c net.Conn, br *bufio.Reader)) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{ln: ln, addr: ln.Addr().String()}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex // guards open
		open []net.Conn
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := s.conns.Add(1)
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				serve(n, c, bufio.NewReader(c))
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return s
}

// readRequest reads one request and its body.
func readRequest(br *bufio.Reader) (string, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return "", err
	}
	b, err := io.ReadAll(req.Body)
	return string(b), err
}

// writeStream answers with an event stream of two events and the
// Keep-Alive header llama-server's cpp-httplib sends (it closes the
// connection after a streamed answer all the same).
func writeStream(c net.Conn, body string) error {
	data := fmt.Sprintf("data: %s\n\ndata: [DONE]\n\n", body)
	_, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(data), data)
	return err
}

// closeOnNextRequest waits until the next request's first byte arrives,
// then closes the connection without reading it: the race a reused
// connection loses when the instance closes it as the request goes out,
// made certain. Its unread bytes make the close a reset.
func closeOnNextRequest(_ int64, c net.Conn, br *bufio.Reader) {
	_, _ = br.Peek(1)
	c.Close()
}

func post(t *testing.T, addr, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestALostReusedConnectionSendsTheRequestAgain: an instance that closes
// every connection as the next request arrives (unread) answers every
// request all the same: each one after the first is sent again on a new
// connection, POST included, whatever makes its body replayable
// (GetBody, a BytesBody, no body), and the instance reads each body once.
func TestALostReusedConnectionSendsTheRequestAgain(t *testing.T) {
	var got sync.Map // body → times read
	s := newRawServer(t, func(_ int64, c net.Conn, br *bufio.Reader) {
		body, err := readRequest(br)
		if err != nil {
			return
		}
		n, _ := got.LoadOrStore(body, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if writeStream(c, body) == nil {
			closeOnNextRequest(0, c, br)
		}
	})
	tr := newTransport(t, Options{})
	reqs := []func(i int) *http.Request{
		func(i int) *http.Request { return post(t, s.addr, fmt.Sprintf("getbody-%d", i)) },
		func(i int) *http.Request {
			req := post(t, s.addr, "")
			b := []byte(fmt.Sprintf("bytesbody-%d", i))
			req.Body, req.GetBody, req.ContentLength = NewBytesBody(b), nil, int64(len(b))
			return req
		},
		func(i int) *http.Request {
			req, _ := http.NewRequest(http.MethodGet, "http://"+s.addr+"/health", nil)
			return req
		},
	}
	const rounds = 5
	for i := range rounds {
		for _, mk := range reqs {
			req := mk(i)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("%s %s (request %d): %v", req.Method, req.URL.Path, i, err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")) || resp.Request != req {
				t.Fatalf("%s (request %d): %q, %v", req.Method, i, b, err)
			}
		}
	}
	total := int64(rounds * len(reqs))
	if n := tr.Resent(); n != total-1 {
		t.Fatalf("%d requests sent again, want %d (every one after the first)", n, total-1)
	}
	if n := s.conns.Load(); n != total {
		t.Fatalf("%d connections, want %d (each one lost on its reuse)", n, total)
	}
	got.Range(func(k, v any) bool {
		if n := v.(*atomic.Int64).Load(); n != 1 && k != "" {
			t.Errorf("the instance read %q %d times, want once", k, n)
		}
		return true
	})
}

// TestWhatIsNotSentAgain: a request is sent again only when a reused
// connection broke before a byte of the answer; not when the connection
// was new, when the answer had begun, when the body cannot be replayed,
// and not a second time.
func TestWhatIsNotSentAgain(t *testing.T) {
	// A behaviour is what an instance does on one connection.
	type behaviour func(n int64, c net.Conn, br *bufio.Reader)
	// answerThen answers the connection's first request, then does next.
	answerThen := func(next behaviour) behaviour {
		return func(n int64, c net.Conn, br *bufio.Reader) {
			body, err := readRequest(br)
			if err != nil || writeStream(c, body) != nil {
				return
			}
			next(n, c, br)
		}
	}
	readAndClose := func(_ int64, _ net.Conn, br *bufio.Reader) { _, _ = readRequest(br) }
	cases := []struct {
		name   string
		serve  behaviour
		body   func(req *http.Request) // makes the second request's body
		resent int64
	}{
		{
			name: "the answer had begun",
			serve: answerThen(func(_ int64, c net.Conn, br *bufio.Reader) {
				if _, err := readRequest(br); err == nil {
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\n")
				}
			}),
		},
		{
			name:  "the body cannot be replayed",
			serve: answerThen(closeOnNextRequest),
			body: func(req *http.Request) {
				req.Body, req.GetBody = io.NopCloser(strings.NewReader("once")), nil
			},
		},
		{
			name:  "GetBody fails",
			serve: answerThen(closeOnNextRequest),
			body: func(req *http.Request) {
				req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("gone") }
			},
		},
		{
			// The new connection reads the request and closes: the
			// instance failed on it; one re-send only.
			name: "the new connection broke too",
			serve: func(n int64, c net.Conn, br *bufio.Reader) {
				if n == 1 {
					answerThen(closeOnNextRequest)(n, c, br)
					return
				}
				readAndClose(n, c, br)
			},
			resent: 1,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newRawServer(t, tc.serve)
			tr := newTransport(t, Options{})
			if code, _ := do(t, tr, post(t, s.addr, "first")); code != 200 {
				t.Fatalf("first request: %d", code)
			}
			req := post(t, s.addr, "second")
			if tc.body != nil {
				tc.body(req)
			}
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
				t.Fatalf("the second request succeeded (%d); the test's instance never answers it", resp.StatusCode)
			}
			if n := tr.Resent(); n != tc.resent {
				t.Fatalf("%d requests sent again, want %d", n, tc.resent)
			}
		})
	}
	t.Run("a new connection", func(t *testing.T) {
		s := newRawServer(t, readAndClose)
		tr := newTransport(t, Options{})
		if _, err := tr.RoundTrip(post(t, s.addr, "first")); err == nil || tr.Resent() != 0 {
			t.Fatalf("a new connection closed unanswered: err %v, %d sent again; want an error, none", err, tr.Resent())
		}
	})
}

// fakeNow makes tr's idle clock a value the test moves.
func fakeNow(tr *Transport) *atomic.Int64 {
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	tr.now = func() time.Time { return time.Unix(0, now.Load()) }
	return &now
}

// TestKeepAliveTimeoutBoundsTheIdleTime: a connection stays in the pool
// for less than the timeout its instance advertised (a second less, half
// of it below 2 s), or IdleTimeout when it advertised none.
func TestKeepAliveTimeoutBoundsTheIdleTime(t *testing.T) {
	for _, tc := range []struct {
		header       string
		reused, gone time.Duration // idle times at which the next request reuses, dials
	}{
		{"timeout=5, max=100", 3900 * time.Millisecond, 4100 * time.Millisecond},
		{"timeout=1", 400 * time.Millisecond, 600 * time.Millisecond},
		{"max=100", 9 * time.Second, 11 * time.Second},
		{"timeout=600", 9 * time.Second, 11 * time.Second}, // IdleTimeout is lower
		{"timeout=x, max=", 9 * time.Second, 11 * time.Second},
		{"timeout=99999999999999999, max=-1", 9 * time.Second, 11 * time.Second},
	} {
		s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Keep-Alive", tc.header)
		})
		tr := newTransport(t, Options{IdleTimeout: 10 * time.Second})
		now := fakeNow(tr)
		get := func() {
			req, _ := http.NewRequest(http.MethodGet, s.URL+"/", nil)
			do(t, tr, req)
		}
		get()
		now.Add(int64(tc.reused))
		get()
		if n := s.conns.Load(); n != 1 {
			t.Fatalf("Keep-Alive %q: idle %v: %d connections, want the first reused", tc.header, tc.reused, n)
		}
		now.Add(int64(tc.gone))
		get()
		if n := s.conns.Load(); n != 2 {
			t.Fatalf("Keep-Alive %q: idle %v: %d connections, want a new one", tc.header, tc.gone, n)
		}
	}
}

// TestKeepAliveMaxBoundsTheAnswersPerConnection: a connection serves at
// most max answers; max=0 (or timeout=0) means none after the first.
func TestKeepAliveMaxBoundsTheAnswersPerConnection(t *testing.T) {
	for _, tc := range []struct {
		header string
		conns  int64 // for 5 requests
	}{
		{"timeout=5, max=2", 3},
		{"max=0", 5},
		{"timeout=0", 5},
		{"timeout=5, max=100", 1},
	} {
		s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Keep-Alive", tc.header)
		})
		tr := newTransport(t, Options{})
		for range 5 {
			req, _ := http.NewRequest(http.MethodGet, s.URL+"/", nil)
			do(t, tr, req)
		}
		if n := s.conns.Load(); n != tc.conns {
			t.Errorf("Keep-Alive %q: %d connections for 5 requests, want %d", tc.header, n, tc.conns)
		}
	}
}

// TestFallbackIdlesLessThanTheServers: the https fallback drops idle
// connections before uvicorn's and cpp-httplib's 5 s.
func TestFallbackIdlesLessThanTheServers(t *testing.T) {
	for _, tc := range []struct{ idle, want time.Duration }{
		{0, FallbackIdleTimeout},
		{time.Second, time.Second},
	} {
		tr := New(Options{IdleTimeout: tc.idle})
		if got := tr.fallback.(*http.Transport).IdleConnTimeout; got != tc.want || got >= 5*time.Second {
			t.Errorf("IdleTimeout %v: fallback IdleConnTimeout %v, want %v", tc.idle, got, tc.want)
		}
		tr.Close()
	}
}
