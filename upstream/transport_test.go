package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

// server is an httptest server that counts the connections it accepted.
type server struct {
	*httptest.Server
	conns atomic.Int64
}

func newServer(t *testing.T, h http.HandlerFunc) *server {
	t.Helper()
	s := &server{}
	s.Server = httptest.NewUnstartedServer(h)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func newTransport(t *testing.T, o Options) *Transport {
	tr := New(o)
	t.Cleanup(tr.Close)
	return tr
}

// do sends a request through tr and returns the status and body.
func do(t *testing.T, tr http.RoundTripper, req *http.Request) (int, string) {
	t.Helper()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	return resp.StatusCode, string(b)
}

// echo answers with the method, path, Host, Content-Length, Transfer-Encoding
// and body it received.
func echo(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("X-Method", r.Method)
	w.Header().Set("X-Host", r.Host)
	w.Header().Set("X-Length", strconv.FormatInt(r.ContentLength, 10))
	w.Header().Set("X-Header", r.Header.Get("X-Test"))
	w.Header().Set("X-Chunked", strings.Join(r.TransferEncoding, ","))
	w.Header().Set("X-UA", r.UserAgent())
	_, _ = w.Write(b)
}

// TestRoundTripSendsRequestsAndReusesOneConnection: bodies of known length
// (small, larger than the write buffer) arrive whole with their headers,
// and sequential requests share one connection.
func TestRoundTripSendsRequestsAndReusesOneConnection(t *testing.T) {
	s := newServer(t, echo)
	tr := newTransport(t, Options{})
	for _, size := range []int{0, 1, 4097, 16 << 10, 100 << 10} {
		body := bytes.Repeat([]byte("b"), size)
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/invocations?x=1", bytes.NewReader(body))
		req.Header.Set("X-Test", "v")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Equal(got, body) || resp.Header.Get("X-Method") != "POST" {
			t.Fatalf("size %d: status %d, %d bytes back, method %q", size, resp.StatusCode, len(got), resp.Header.Get("X-Method"))
		}
		if l, h := resp.Header.Get("X-Length"), resp.Header.Get("X-Header"); l != strconv.Itoa(size) || h != "v" {
			t.Fatalf("size %d: server saw Content-Length %s, X-Test %q", size, l, h)
		}
		if h := resp.Header.Get("X-Host"); h != strings.TrimPrefix(s.URL, "http://") {
			t.Fatalf("Host %q, want %q", h, strings.TrimPrefix(s.URL, "http://"))
		}
	}
	if n := s.conns.Load(); n != 1 {
		t.Fatalf("%d connections for 5 sequential requests, want 1", n)
	}
}

// TestRoundTripUnknownLengthIsChunked: a body of unknown length goes chunked.
func TestRoundTripUnknownLengthIsChunked(t *testing.T) {
	s := newServer(t, echo)
	tr := newTransport(t, Options{})
	body := strings.Repeat("c", 50<<10)
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/", io.NopCloser(strings.NewReader(body)))
	req.ContentLength = -1
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(got) != body || resp.Header.Get("X-Chunked") != "chunked" {
		t.Fatalf("chunked body: %d bytes back, transfer encodings %q", len(got), resp.Header.Get("X-Chunked"))
	}
	// A ContentLength of 0 with a body is unknown too (net/http's rule).
	req, _ = http.NewRequest(http.MethodPost, s.URL+"/", io.NopCloser(strings.NewReader("zero")))
	req.ContentLength = 0
	if code, got := do(t, tr, req); code != 200 || got != "zero" {
		t.Fatalf("ContentLength 0 with a body: %d %q", code, got)
	}
	// The connection is still usable after a chunked request.
	req, _ = http.NewRequest(http.MethodGet, s.URL+"/", nil)
	if code, _ := do(t, tr, req); code != 200 || s.conns.Load() != 1 {
		t.Fatalf("after a chunked request: status %d, %d connections", code, s.conns.Load())
	}
}

// TestRoundTripDropsAConnectionTheServerClosed: an idle connection the
// server closed is found before reuse; the request goes on a new one and
// succeeds.
func TestRoundTripDropsAConnectionTheServerClosed(t *testing.T) {
	s := newServer(t, echo)
	tr := newTransport(t, Options{})
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/", strings.NewReader("one"))
	do(t, tr, req)
	s.CloseClientConnections() // the server ends its idle connections
	testsupport.Eventually(t, 5*time.Second, "the idle connection is seen closed", func() bool {
		h := tr.host(strings.TrimPrefix(s.URL, "http://"))
		select {
		case c := <-h.idle:
			dead := !alive(c.nc)
			h.idle <- c
			return dead
		default:
			return false
		}
	})
	req, _ = http.NewRequest(http.MethodPost, s.URL+"/", strings.NewReader("two"))
	if code, got := do(t, tr, req); code != 200 || got != "two" {
		t.Fatalf("after the server closed the idle connection: %d %q", code, got)
	}
	if n := s.conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
}

// TestBodyClosedEarlyClosesTheConnection: a body closed before its end
// leaves its connection unusable; the next request dials.
func TestBodyClosedEarlyClosesTheConnection(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(bytes.Repeat([]byte("x"), 64<<10))
	})
	tr := newTransport(t, Options{})
	req, _ := http.NewRequest(http.MethodGet, s.URL+"/", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = resp.Body.Read(make([]byte, 10))
	resp.Body.Close()
	req, _ = http.NewRequest(http.MethodGet, s.URL+"/", nil)
	if code, got := do(t, tr, req); code != 200 || len(got) != 64<<10 {
		t.Fatalf("second request: %d, %d bytes", code, len(got))
	}
	if n := s.conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (the first closed with its unread body)", n)
	}
}

// TestConnectionCloseIsHonoured: neither side's Connection: close reuses.
func TestConnectionCloseIsHonoured(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/close" {
			w.Header().Set("Connection", "close")
		}
		_, _ = io.WriteString(w, "ok")
	})
	tr := newTransport(t, Options{})
	for _, path := range []string{"/close", "/", "/"} {
		req, _ := http.NewRequest(http.MethodGet, s.URL+path, nil)
		do(t, tr, req)
	}
	req, _ := http.NewRequest(http.MethodGet, s.URL+"/", nil)
	req.Close = true
	do(t, tr, req)
	req, _ = http.NewRequest(http.MethodGet, s.URL+"/", nil)
	do(t, tr, req)
	// /close ends conn 1; "/", "/" share conn 2, which the client's close
	// ends; the last request dials conn 3.
	if n := s.conns.Load(); n != 3 {
		t.Fatalf("%d connections, want 3", n)
	}
}

// TestContextCancelsTheWaitAndTheBody: cancelling the request's context
// ends a wait for headers and a body read at once, with the context's
// cause; the connection is not reused.
func TestContextCancelsTheWaitAndTheBody(t *testing.T) {
	release := make(chan struct{})
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/body" {
			_, _ = io.WriteString(w, "start")
			w.(http.Flusher).Flush()
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) }) // before s.Close, which waits for the handlers
	tr := newTransport(t, Options{})
	cause := errors.New("the first byte took too long")

	ctx, cancel := context.WithCancelCause(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/headers", strings.NewReader("x"))
	time.AfterFunc(20*time.Millisecond, func() { cancel(cause) })
	if _, err := tr.RoundTrip(req); !errors.Is(err, cause) {
		t.Fatalf("cancelled while waiting for headers: %v, want the cause", err)
	}

	ctx, cancel = context.WithCancelCause(context.Background())
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/body", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(20*time.Millisecond, func() { cancel(context.Canceled) })
	if _, err := io.ReadAll(resp.Body); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while reading the body: %v, want context.Canceled", err)
	}
	resp.Body.Close()
}

// TestResponseHeaderTimeout: no headers within the timeout is a timeout
// error (which the router counts against the instance).
func TestResponseHeaderTimeout(t *testing.T) {
	release := make(chan struct{})
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) })
	tr := newTransport(t, Options{ResponseHeaderTimeout: 30 * time.Millisecond})
	req, _ := http.NewRequest(http.MethodGet, s.URL+"/", nil)
	_, err := tr.RoundTrip(req)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("no headers: %v, want a timeout error", err)
	}
}

// TestDialErrorIsADialOpError: a refused connection is a *net.OpError
// with Op "dial", which the router retries elsewhere.
func TestDialErrorIsADialOpError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	tr := newTransport(t, Options{})
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/", strings.NewReader("x"))
	_, err = tr.RoundTrip(req)
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" {
		t.Fatalf("refused: %v, want a dial *net.OpError", err)
	}
}

// TestShortBodyFails: a body that ends before its Content-Length fails the
// request and is not sent as complete.
func TestShortBodyFails(t *testing.T) {
	s := newServer(t, echo)
	tr := newTransport(t, Options{})
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/", io.NopCloser(strings.NewReader("short")))
	req.ContentLength = 100
	if _, err := tr.RoundTrip(req); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short body: %v, want io.ErrUnexpectedEOF", err)
	}
}

// TestInformationalAnswersAreSkipped: 103 Early Hints before the answer go
// to the request's httptrace hook (ReverseProxy forwards them from there).
func TestInformationalAnswersAreSkipped(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</a>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		_, _ = io.WriteString(w, "final")
	})
	tr := newTransport(t, Options{})
	var hints []string
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		hints = append(hints, strconv.Itoa(code)+" "+h.Get("Link"))
		return nil
	}}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, s.URL+"/", nil)
	if code, got := do(t, tr, req); code != 200 || got != "final" {
		t.Fatalf("after 103: %d %q", code, got)
	}
	if len(hints) != 1 || hints[0] != "103 </a>; rel=preload" {
		t.Fatalf("the trace hook saw %q, want the 103 and its Link", hints)
	}
}

// TestHTTPSGoesToTheFallback: other schemes use Options.Fallback.
func TestHTTPSGoesToTheFallback(t *testing.T) {
	s := httptest.NewTLSServer(http.HandlerFunc(echo))
	t.Cleanup(s.Close)
	fallback := s.Client().Transport.(*http.Transport)
	tr := newTransport(t, Options{Fallback: fallback})
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/", strings.NewReader("tls"))
	if code, got := do(t, tr, req); code != 200 || got != "tls" {
		t.Fatalf("https: %d %q", code, got)
	}
}

// TestNoUserAgentIsSent: the transport adds no User-Agent of its own and
// forwards the caller's.
func TestNoUserAgentIsSent(t *testing.T) {
	s := newServer(t, echo)
	tr := newTransport(t, Options{})
	req, _ := http.NewRequest(http.MethodGet, s.URL+"/", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ua := resp.Header.Get("X-UA"); ua != "" {
		t.Fatalf("User-Agent %q sent, want none", ua)
	}
	req, _ = http.NewRequest(http.MethodGet, s.URL+"/", nil)
	req.Header.Set("User-Agent", "client/1")
	resp, err = tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ua := resp.Header.Get("X-UA"); ua != "client/1" {
		t.Fatalf("User-Agent %q, want client/1", ua)
	}
}

// recordConn records the writes made to it (and the slices passed, to
// tell a copy from the caller's bytes).
type recordConn struct {
	net.Conn
	writes, passed [][]byte
}

func (c *recordConn) Write(p []byte) (int, error) {
	c.writes = append(c.writes, bytes.Clone(p))
	c.passed = append(c.passed, p)
	return len(p), nil
}

// TestWriteShapes: a body in memory leaves uncopied after the head (one
// vectored write on a TCP connection, which net.Buffers uses; two writes
// on this recording connection), a streamed one of the same size in one
// write, a longer streamed body in buffer-sized writes; every byte arrives
// in order.
func TestWriteShapes(t *testing.T) {
	tr := New(Options{})
	body := bytes.Repeat([]byte("m"), 15<<10)
	for _, tc := range []struct {
		name   string
		body   io.ReadCloser
		size   int
		writes int
	}{
		{"in memory", NewBytesBody(body), len(body), 2},
		{"streamed, fits", io.NopCloser(io.MultiReader(bytes.NewReader(body[:4097]), bytes.NewReader(body[4097:]))), len(body), 1},
		{"streamed, long", io.NopCloser(bytes.NewReader(bytes.Repeat([]byte("l"), 100<<10))), 100 << 10, 0}, // full buffers
	} {
		req, _ := http.NewRequest(http.MethodPost, "http://instance:8080/invocations", tc.body)
		req.ContentLength = int64(tc.size)
		c := &recordConn{}
		if err := tr.write(c, req); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		all := bytes.Join(c.writes, nil)
		head, sent, _ := bytes.Cut(all, []byte("\r\n\r\n"))
		if tc.writes == 0 {
			tc.writes = (len(all) + writeBufferSize - 1) / writeBufferSize
		}
		if len(c.writes) != tc.writes || len(sent) != tc.size || !bytes.HasPrefix(head, []byte("POST /invocations HTTP/1.1\r\nHost: instance:8080\r\n")) {
			t.Fatalf("%s: %d writes, %d body bytes, head %q; want %d writes, %d bytes", tc.name, len(c.writes), len(sent), head, tc.writes, tc.size)
		}
		if _, ok := tc.body.(BytesBody); ok && &c.passed[1][0] != &body[0] {
			t.Fatalf("%s: the body was copied before the write", tc.name)
		}
	}
}

// TestBytesAfterTheAnswerCloseTheConnection: an instance that sends more
// than its Content-Length broke the framing; its connection is not reused.
func TestBytesAfterTheAnswerCloseTheConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			br := bufio.NewReader(c)
			if req, err := http.ReadRequest(br); err == nil {
				_, _ = io.Copy(io.Discard, req.Body)
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA")
			}
			// Leave the connection open: only the client can tell the
			// answer was wrong.
			defer c.Close()
		}
	}()
	defer func() { ln.Close(); <-done }()
	tr := newTransport(t, Options{})
	for range 2 {
		req, _ := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+"/", nil)
		if code, got := do(t, tr, req); code != 200 || got != "ok" {
			t.Fatalf("%d %q", code, got)
		}
	}
	if n := accepted.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (the first dropped for its extra bytes)", n)
	}
}

// TestSweepClosesIdleConnectionsOfAnInstanceThatLeft: nothing takes the
// idle connections of an instance that left the fleet again; a sweep, run
// by a later request to another instance, closes them and forgets the
// address.
func TestSweepClosesIdleConnectionsOfAnInstanceThatLeft(t *testing.T) {
	var closed atomic.Int64
	gone := httptest.NewUnstartedServer(http.HandlerFunc(echo))
	gone.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			closed.Add(1)
		}
	}
	gone.Start()
	defer gone.Close()
	stays := newServer(t, echo)
	const idle = 20 * time.Millisecond
	tr := newTransport(t, Options{IdleTimeout: idle})
	req, _ := http.NewRequest(http.MethodGet, gone.URL+"/", nil)
	do(t, tr, req)
	goneAddr := strings.TrimPrefix(gone.URL, "http://")
	if _, ok := tr.hosts.Load(goneAddr); !ok {
		t.Fatal("no pool for the first instance")
	}
	time.Sleep(2*idle + 10*time.Millisecond) // past two idle timeouts
	req, _ = http.NewRequest(http.MethodGet, stays.URL+"/", nil)
	do(t, tr, req)
	if _, ok := tr.hosts.Load(goneAddr); ok {
		t.Fatal("the unused instance's pool is still there after a sweep")
	}
	testsupport.Eventually(t, 5*time.Second, "the idle connection to the unused instance closed", func() bool { return closed.Load() == 1 })
}

// TestResponseHeadersAreBounded: an instance that sends headers without end
// fails the request instead of growing the router's memory.
func TestResponseHeadersAreBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		line := "X-Filler: " + strings.Repeat("f", 1000) + "\r\n"
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\n"); err != nil {
			return
		}
		for range 2 << 10 { // 2 MiB of headers
			if _, err := io.WriteString(c, line); err != nil {
				return
			}
		}
	}()
	defer func() { ln.Close(); <-done }()
	tr := newTransport(t, Options{})
	req, _ := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+"/", nil)
	if _, err := tr.RoundTrip(req); !errors.Is(err, errHeaderTooLarge) {
		t.Fatalf("2 MiB of headers: %v, want errHeaderTooLarge", err)
	}
}

// TestSwitchingProtocolsClosesTheConnection: an instance answering 101 left
// its connection open and pooled (issue 19: 60 upstream connections stayed
// open). The answer is ErrSwitchingProtocols, the connection is closed, and
// an Upgrade header is never sent.
func TestSwitchingProtocolsClosesTheConnection(t *testing.T) {
	upgrades := make(chan string, 10)
	closed := make(chan struct{}, 10)
	addr := testsupport.ServeEachConn(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		upgrades <- req.Header.Get("Upgrade") + "|" + req.Header.Get("Connection")
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		if _, err := br.ReadByte(); err == io.EOF {
			closed <- struct{}{}
		}
	})
	tr := newTransport(t, Options{})
	for range 3 {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
		req.Header.Set("Upgrade", "websocket")
		if _, err := tr.RoundTrip(req); !errors.Is(err, ErrSwitchingProtocols) {
			t.Fatalf("RoundTrip = %v, want ErrSwitchingProtocols", err)
		}
		if h := <-upgrades; h != "|" {
			t.Fatalf("the instance got Upgrade|Connection %q", h)
		}
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatal("the connection that switched protocols is still open")
		}
	}
}
