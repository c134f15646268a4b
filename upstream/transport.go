// Package upstream is the router's HTTP/1.1 client for model-server
// instances: an http.RoundTripper that sends a request and reads its answer
// on the caller's goroutine, with pooled keep-alive connections.
//
// Why not net/http's Transport (issue 9, docs/benchmarks.md "The upstream
// transport"): Transport hands every request to two goroutines of the
// connection (a writer and a reader) and back over channels, writes the
// headers of a body it cannot tell is in memory in a write of their own,
// and keeps a 32 KiB copy buffer and a write buffer per request or
// connection. Under proxybench's 16 KiB/16-client load those costs made the
// router 1.3-1.5x the CPU per request of a proxy without them. This client
// writes the request line, headers and as much of the body as has arrived in
// one write, streams the rest through one pooled buffer, and parses the
// answer with net/http's own http.ReadResponse.
//
// What it does not do, by design: HTTP/2, TLS (requests whose scheme is not
// "http" go to Options.Fallback, a net/http Transport), proxies, 100-continue
// (the body is sent at once) and compression.
//
// Pooled connections, as a proxy users trust handles them (issue 20):
//   - An idle connection the instance has closed is found before reuse by a
//     non-blocking peek and dropped.
//   - A connection is kept idle no longer than the instance promised:
//     IdleTimeout, or less when its answers advertise Keep-Alive: timeout=N
//     (llama-server's cpp-httplib closes idle connections after 5 s while
//     the pool would keep them 90 s), and it serves no more answers than
//     Keep-Alive: max=M allows.
//   - The one race the peek cannot see (the instance closes the connection
//     as the request goes out on it: llama-server closes after every
//     streamed answer) is repaired: a request that fails on a reused
//     connection with the connection closed or reset and not one byte of
//     an answer read is sent once more, on a new connection to the same
//     instance, POST included, when its body can be sent again (GetBody,
//     or a BytesBody). The instance read nothing of it: a server that had
//     read the request would answer it or, if it died, could not be told
//     apart, which is why there is one re-send and never on a new
//     connection. HAProxy (retry-on conn-failure empty-response), Envoy
//     (reset-before-request) and curl do the same. Any other failure is the
//     router's to retry or not.
//
// Connections idle past their limit, and the pools of addresses no longer
// used, are swept by the request that finds the last sweep half an idle
// timeout old (no goroutine of its own).
package upstream

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Options configures a Transport. Zero values mean the defaults.
type Options struct {
	// DialTimeout bounds a connection attempt (default 2 s, so a dead
	// instance fails fast and the router retries elsewhere).
	DialTimeout time.Duration
	// KeepAlive is the TCP keep-alive period (default 30 s).
	KeepAlive time.Duration
	// MaxIdlePerHost bounds the idle connections kept per instance
	// (default 1024: LLM servers hold hundreds of long requests each).
	MaxIdlePerHost int
	// IdleTimeout closes a connection idle for longer, found when it is
	// next taken from the pool (default 90 s). An instance that advertises
	// a shorter Keep-Alive: timeout shortens it for its connections.
	IdleTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for a response's headers after
	// the request was written; zero means none (a non-streamed generation
	// sends its headers only at its end).
	ResponseHeaderTimeout time.Duration
	// Fallback sends requests whose scheme is not "http" (https
	// instances). Nil means a net/http Transport with the same dial and
	// header-timeout settings whose idle connections close after
	// FallbackIdleTimeout (or IdleTimeout, if shorter).
	Fallback http.RoundTripper
	// Control, when set, is called with the address of each connection
	// before it is opened (net.Dialer.Control: after name resolution); an
	// error refuses it. The fallback made here uses it too.
	Control func(network, address string, c syscall.RawConn) error
}

// Defaults.
const (
	DefaultDialTimeout    = 2 * time.Second
	DefaultKeepAlive      = 30 * time.Second
	DefaultMaxIdlePerHost = 1024
	DefaultIdleTimeout    = 90 * time.Second
)

// FallbackIdleTimeout bounds the idle time of the fallback's connections.
// net/http's Transport neither reads Keep-Alive: timeout nor re-sends a
// POST on a connection the server closed as it was reused, so it must drop
// its idle connections before the servers do: uvicorn (vLLM, SGLang)
// closes them after 5 s by default without advertising it, cpp-httplib
// (llama.cpp) after 5 s too.
const FallbackIdleTimeout = 4 * time.Second

// Transport is an HTTP/1.1 RoundTripper; see the package comment. It is
// safe for concurrent use; the zero value is not usable (use New).
type Transport struct {
	opts     Options
	dialer   net.Dialer
	hosts    sync.Map // host:port → *host
	fallback http.RoundTripper
	closed   atomic.Bool
	swept    atomic.Int64 // unix nanoseconds of the last sweep
	resent   atomic.Int64 // requests sent again after a reused connection broke
	now      func() time.Time
}

// host is the idle pool of one instance address. A buffered channel: put
// and take do not block, and a full pool closes the connection instead.
// A host that has been unused for two idle timeouts is removed from the map
// by a sweep (instances come and go; their addresses would otherwise pile
// up); dead tells a put that raced with the removal to close instead.
type host struct {
	idle     chan *conn
	lastUsed atomic.Int64 // unix nanoseconds
	dead     atomic.Bool
}

// conn is one upstream connection. Its response reader comes from a pool
// when a response is read and goes back when the connection is idle or
// closed: a request whose body is still streaming, and an idle connection,
// hold none.
type conn struct {
	nc        net.Conn
	lr        limitedReader // nc, limited while an answer's head is read
	br        *bufio.Reader // reads lr; nil until the request is written
	idleSince time.Time
	// idleLimit is how long the connection may wait idle in the pool:
	// IdleTimeout, or less if the instance advertised Keep-Alive: timeout.
	idleLimit time.Duration
	// served counts the answers read on the connection: one that has
	// served one is reused.
	served int
}

var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, readBufferSize) }}

// close closes the connection and returns its reader.
func (c *conn) close() {
	c.nc.Close()
	c.releaseReader()
}

func (c *conn) releaseReader() {
	if c.br != nil {
		c.br.Reset(nil)
		readers.Put(c.br)
		c.br = nil
	}
}

// New returns a Transport with opts (zero values: the defaults).
func New(opts Options) *Transport {
	opts.DialTimeout = cmp.Or(max(opts.DialTimeout, 0), DefaultDialTimeout)
	opts.KeepAlive = cmp.Or(max(opts.KeepAlive, 0), DefaultKeepAlive)
	opts.MaxIdlePerHost = cmp.Or(max(opts.MaxIdlePerHost, 0), DefaultMaxIdlePerHost)
	opts.IdleTimeout = cmp.Or(max(opts.IdleTimeout, 0), DefaultIdleTimeout)
	t := &Transport{opts: opts, dialer: net.Dialer{Timeout: opts.DialTimeout, KeepAlive: opts.KeepAlive, Control: opts.Control}, now: time.Now}
	t.swept.Store(t.now().UnixNano())
	t.fallback = opts.Fallback
	if t.fallback == nil {
		t.fallback = &http.Transport{
			Proxy:                 nil, // upstreams are direct; never an env proxy
			DialContext:           t.dialer.DialContext,
			MaxIdleConnsPerHost:   opts.MaxIdlePerHost,
			IdleConnTimeout:       min(opts.IdleTimeout, FallbackIdleTimeout),
			ResponseHeaderTimeout: opts.ResponseHeaderTimeout,
			DisableCompression:    true,
		}
	}
	return t
}

// CloseIdleConnections closes the idle connections of every instance (and
// of the fallback).
func (t *Transport) CloseIdleConnections() {
	t.hosts.Range(func(_, v any) bool {
		v.(*host).drain(func(*conn) bool { return false })
		return true
	})
	if ci, ok := t.fallback.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// Close closes the idle connections and stops pooling: connections in use
// are closed when their requests end.
func (t *Transport) Close() {
	t.closed.Store(true)
	t.CloseIdleConnections()
}

// aLongTimeAgo is a deadline in the past: setting it unblocks a read or
// write at once (how a cancelled context stops I/O in progress).
var aLongTimeAgo = time.Unix(1, 0)

// RoundTrip sends req and returns the response whose headers were read; the
// body streams from the connection, which returns to the pool when the body
// has been read to its end. The request's context cancels the call at any
// point, the body's read included; the error is then the context's cause.
// A request that a reused connection lost before the instance read it is
// sent once more on a new connection (see the package comment).
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" {
		return t.fallback.RoundTrip(req)
	}
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		closeBody(req)
		return nil, context.Cause(ctx)
	}
	addr := req.URL.Host
	if req.URL.Port() == "" {
		addr = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	h := t.host(addr)
	c, err := t.get(ctx, h, addr)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	resp, unseen, err := t.exchange(ctx, h, c, req)
	if err == nil || !unseen || c.served == 0 {
		return resp, err
	}
	again, ok := resendable(req)
	if !ok {
		return nil, err
	}
	t.resent.Add(1)
	if c, err = t.dial(ctx, addr); err != nil {
		closeBody(again)
		return nil, err
	}
	resp, _, err = t.exchange(ctx, h, c, again)
	if resp != nil {
		resp.Request = req
	}
	return resp, err
}

// Resent counts the requests sent a second time, on a new connection,
// after a reused connection broke before the instance read them.
func (t *Transport) Resent() int64 { return t.resent.Load() }

// exchange sends req on c and reads the answer's headers. On failure c is
// closed, and unseen reports that the connection broke (closed or reset)
// before one byte of an answer came: the request may go again (RoundTrip
// decides).
func (t *Transport) exchange(ctx context.Context, h *host, c *conn, req *http.Request) (resp *http.Response, unseen bool, err error) {
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(aLongTimeAgo) })
	resp, started, err := t.send(c, req)
	if err != nil {
		stop()
		c.close()
		if ctx.Err() != nil {
			return nil, false, context.Cause(ctx)
		}
		return nil, !started && connBroke(err), err
	}
	c.served++
	b := &body{rc: resp.Body, t: t, h: h, c: c, stop: stop, ctx: ctx}
	b.reusable = !resp.Close && !req.Close && (resp.ContentLength >= 0 || isChunked(resp.TransferEncoding)) &&
		c.keepAlive(resp.Header, t.opts.IdleTimeout)
	resp.Body = b
	return resp, false, nil
}

// connBroke reports an error of a connection the other side closed or
// reset: an end of stream (io.ReadResponse's ErrUnexpectedEOF when not a
// byte came), ECONNRESET, EPIPE.
func connBroke(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err)
}

// resendable returns a copy of req with a fresh body for a second send:
// from GetBody, or from the bytes of a BytesBody (the router's in-memory
// bodies), or none for a request without a body. ok is false when the body
// cannot be sent again (a stream already partly read).
func resendable(req *http.Request) (*http.Request, bool) {
	again := *req
	switch {
	case req.Body == nil || req.Body == http.NoBody:
	case req.GetBody != nil:
		b, err := req.GetBody()
		if err != nil {
			return nil, false
		}
		again.Body = b
	default:
		bb, ok := req.Body.(BytesBody)
		if !ok {
			return nil, false
		}
		again.Body = NewBytesBody(bb.Bytes())
	}
	return &again, true
}

// keepAlive reads the answer's Keep-Alive header (RFC 2068 19.7.1.1: a
// comma-separated list of timeout=SECONDS and max=REQUESTS), lowers the
// connection's idle limit below the advertised timeout, and reports
// whether the connection may serve another request. max counts down in
// some servers (Apache: the requests left) and is the total per connection
// in others (cpp-httplib: a constant); a connection that has served max
// answers is not reused, which is right for the second and early for the
// first. Unparsable parameters are ignored.
func (c *conn) keepAlive(h http.Header, idle time.Duration) bool {
	c.idleLimit = idle
	v := h.Get("Keep-Alive")
	if v == "" {
		return true
	}
	for p := range strings.SplitSeq(v, ",") {
		name, val, _ := strings.Cut(strings.TrimSpace(p), "=")
		n, err := strconv.Atoi(strings.TrimSpace(val))
		if err != nil || n < 0 {
			continue
		}
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "timeout":
			if n <= math.MaxInt32 { // longer is no bound (and would overflow)
				c.idleLimit = min(idle, keepAliveMargin(time.Duration(n)*time.Second))
			}
		case "max":
			if c.served >= n {
				return false
			}
		}
	}
	return c.idleLimit > 0
}

// keepAliveMargin is how long a connection may idle when the instance
// closes it after d: a second less (the instance's clock started when it
// wrote the answer's end, a little before the pool's), half of it below 2 s.
func keepAliveMargin(d time.Duration) time.Duration {
	if d >= 2*time.Second {
		return d - time.Second
	}
	return d / 2
}

func (t *Transport) host(addr string) *host {
	if v, ok := t.hosts.Load(addr); ok {
		return v.(*host)
	}
	v, _ := t.hosts.LoadOrStore(addr, &host{idle: make(chan *conn, t.opts.MaxIdlePerHost)})
	return v.(*host)
}

// get takes an idle connection that is still open, or dials one. Once per
// sweep interval the caller also sweeps the pools.
func (t *Transport) get(ctx context.Context, h *host, addr string) (*conn, error) {
	now := t.now()
	h.lastUsed.Store(now.UnixNano())
	if last := t.swept.Load(); now.UnixNano()-last > int64(t.sweepInterval()) && t.swept.CompareAndSwap(last, now.UnixNano()) {
		t.sweep(now)
	}
	for {
		var c *conn
		select {
		case c = <-h.idle:
		default:
		}
		if c == nil {
			break
		}
		if now.Sub(c.idleSince) <= c.idleLimit && alive(c.nc) {
			return c, nil
		}
		c.close()
	}
	return t.dial(ctx, addr)
}

// dial opens a new connection to addr.
func (t *Transport) dial(ctx context.Context, addr string) (*conn, error) {
	nc, err := t.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &conn{nc: nc, idleLimit: t.opts.IdleTimeout}, nil
}

// put returns c to its pool, or closes it when the pool is full, the
// transport closed, or bytes follow the answer.
func (t *Transport) put(h *host, c *conn) {
	if t.closed.Load() || (c.br != nil && c.br.Buffered() > 0) {
		// Bytes after the answer's end: the instance broke the framing.
		c.close()
		return
	}
	c.releaseReader()
	c.idleSince = t.now()
	select {
	case h.idle <- c:
		if h.dead.Load() {
			h.drain(func(*conn) bool { return false }) // removed meanwhile: close
		}
	default:
		c.nc.Close()
	}
}

// sweepInterval is how often the pools are swept: half the idle timeout.
func (t *Transport) sweepInterval() time.Duration { return t.opts.IdleTimeout / 2 }

// sweep closes the connections idle for longer than their limit
// (without it, those of an instance that left the fleet would stay open:
// nothing takes them again) and removes hosts unused for two idle
// timeouts. It runs on the goroutine of the request that found the last
// sweep old enough; its cost is one pass over the idle connections.
func (t *Transport) sweep(now time.Time) {
	t.hosts.Range(func(k, v any) bool {
		h := v.(*host)
		if now.UnixNano()-h.lastUsed.Load() > 2*int64(t.opts.IdleTimeout) {
			h.dead.Store(true)
			t.hosts.Delete(k)
			h.drain(func(*conn) bool { return false })
			return true
		}
		h.drain(func(c *conn) bool { return now.Sub(c.idleSince) <= c.idleLimit })
		return true
	})
}

// drain takes every idle connection, puts back those keep accepts (as many
// as fit) and closes the others.
func (h *host) drain(keep func(*conn) bool) {
	var kept []*conn
	for done := false; !done; {
		select {
		case c := <-h.idle:
			if keep(c) {
				kept = append(kept, c)
			} else {
				c.nc.Close()
			}
		default:
			done = true
		}
	}
	for _, c := range kept {
		select {
		case h.idle <- c:
		default:
			c.nc.Close()
		}
	}
}

// Buffer sizes. Both come from pools: the response reader while an answer
// is read, the write buffer while a request is written.
const (
	readBufferSize  = 4 << 10
	writeBufferSize = 32 << 10
)

// maxResponseHeaderBytes bounds an answer's status line and headers (and
// those of the informational answers before it), as net/http's Transport
// does with MaxResponseHeaderBytes: an instance cannot make the router
// buffer headers without end.
const maxResponseHeaderBytes = 1 << 20

// ErrSwitchingProtocols fails an answer of 101 Switching Protocols: the
// transport never asks for an upgrade, and the connection, in another
// protocol from then on, is closed instead of pooled (issue 19).
var ErrSwitchingProtocols = errors.New("upstream: the instance switched protocols (101) though no upgrade was asked for")

// errHeaderTooLarge fails an answer whose head exceeds maxResponseHeaderBytes.
var errHeaderTooLarge = fmt.Errorf("upstream: response headers exceed %d bytes", maxResponseHeaderBytes)

// limitedReader reads from r until left bytes have been read, then fails.
type limitedReader struct {
	r    io.Reader
	left int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, errHeaderTooLarge
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

// BytesBody is implemented by a request body held whole in memory. When
// Bytes holds exactly the request's ContentLength bytes, the transport
// sends them after the head in one vectored write, without copying them.
type BytesBody interface {
	io.ReadCloser
	Bytes() []byte
}

// NewBytesBody returns b as a request body the transport sends uncopied
// with the request's head. Each one reads b from the start, so a retry
// (http.Request.GetBody) makes another.
func NewBytesBody(b []byte) BytesBody {
	m := &bytesBody{b: b}
	m.Reset(b)
	return m
}

type bytesBody struct {
	bytes.Reader
	b []byte
}

func (m *bytesBody) Bytes() []byte { return m.b }
func (m *bytesBody) Close() error  { return nil }

var writeBuffers = sync.Pool{New: func() any { b := make([]byte, writeBufferSize); return &b }}

// send writes req on c and reads the response's headers (skipping 1xx
// informational answers). started reports that a byte of an answer was
// read.
func (t *Transport) send(c *conn, req *http.Request) (resp *http.Response, started bool, err error) {
	if err := t.write(c.nc, req); err != nil {
		return nil, false, err
	}
	c.br = readers.Get().(*bufio.Reader)
	c.lr = limitedReader{r: c.nc, left: maxResponseHeaderBytes}
	c.br.Reset(&c.lr)
	if d := t.opts.ResponseHeaderTimeout; d > 0 {
		_ = c.nc.SetReadDeadline(time.Now().Add(d))
	}
	for {
		resp, err := http.ReadResponse(c.br, req)
		if err != nil {
			return nil, c.lr.left < maxResponseHeaderBytes, err
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return nil, true, ErrSwitchingProtocols
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 {
			// 103 Early Hints and the like: the answer follows. They go
			// to the request's httptrace hook, as net/http's Transport
			// does (ReverseProxy's hook forwards them to the client); a
			// 100 Continue nobody asked for is dropped.
			if trace := httptrace.ContextClientTrace(req.Context()); trace != nil && trace.Got1xxResponse != nil && resp.StatusCode != http.StatusContinue {
				if err := trace.Got1xxResponse(resp.StatusCode, textproto.MIMEHeader(resp.Header)); err != nil {
					return nil, true, err
				}
			}
			continue
		}
		if t.opts.ResponseHeaderTimeout > 0 {
			_ = c.nc.SetReadDeadline(time.Time{})
		}
		c.lr.left = math.MaxInt64 // the body is the caller's to bound
		return resp, true, nil
	}
}

// excluded are the headers write sets itself, or never forwards.
var excluded = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Trailer": true,
	"Connection": true, "Expect": true, "User-Agent": true, "Upgrade": true,
}

// errBadHost rejects a host that would break the request line.
var errBadHost = errors.New("upstream: invalid host")

// write sends req: the request line, the headers and the body's first
// reads in one write, then the rest of the body as it arrives. A body of
// unknown length (ContentLength -1) is sent chunked.
func (t *Transport) write(w net.Conn, req *http.Request) (err error) {
	defer closeBody(req)
	hostHeader := req.Host
	if hostHeader == "" {
		hostHeader = req.URL.Host
	}
	if strings.ContainsAny(hostHeader, "\r\n ") {
		return errBadHost
	}
	bp := writeBuffers.Get().(*[]byte)
	defer writeBuffers.Put(bp)
	buf := *bp
	ab := appendBuffer{b: buf[:0]}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	ab.b = append(ab.b, method...)
	ab.b = append(ab.b, ' ')
	ab.b = append(ab.b, req.URL.RequestURI()...)
	ab.b = append(ab.b, " HTTP/1.1\r\nHost: "...)
	ab.b = append(ab.b, hostHeader...)
	ab.b = append(ab.b, "\r\n"...)
	if ua := req.Header.Get("User-Agent"); ua != "" {
		ab.b = append(ab.b, "User-Agent: "...)
		ab.b = append(ab.b, ua...)
		ab.b = append(ab.b, "\r\n"...)
	}
	if req.Close {
		ab.b = append(ab.b, "Connection: close\r\n"...)
	}
	if err := req.Header.WriteSubset(&ab, excluded); err != nil {
		return err
	}
	// As in net/http, a ContentLength of 0 with a body means unknown,
	// unless the body says it is empty.
	hasBody := req.Body != nil && req.Body != http.NoBody
	if bb, ok := req.Body.(BytesBody); ok && req.ContentLength == 0 && len(bb.Bytes()) == 0 {
		hasBody = false
	}
	chunked := hasBody && req.ContentLength <= 0
	switch {
	case chunked:
		ab.b = append(ab.b, "Transfer-Encoding: chunked\r\n"...)
	case hasBody:
		ab.b = append(ab.b, "Content-Length: "...)
		ab.b = strconv.AppendInt(ab.b, req.ContentLength, 10)
		ab.b = append(ab.b, "\r\n"...)
	case req.Method == http.MethodPost || req.Method == http.MethodPut || req.Method == http.MethodPatch:
		ab.b = append(ab.b, "Content-Length: 0\r\n"...)
	}
	ab.b = append(ab.b, "\r\n"...)
	if len(ab.b) > len(buf) {
		// Headers larger than the buffer: write them alone.
		if _, err := w.Write(ab.b); err != nil {
			return err
		}
		ab.b = buf[:0]
	}
	if !hasBody {
		_, err := w.Write(ab.b)
		return err
	}
	if bb, ok := req.Body.(BytesBody); ok && int64(len(bb.Bytes())) == req.ContentLength {
		bufs := net.Buffers{ab.b, bb.Bytes()}
		_, err := bufs.WriteTo(w)
		return err
	}
	if chunked {
		return writeChunked(w, ab.b, buf, req.Body)
	}
	return writeBody(w, ab.b, buf, io.LimitReader(req.Body, req.ContentLength), req.ContentLength)
}

// writeBody sends head (the request's head, already in buf) and a body of
// n bytes, in writes of a full buffer: a body that fits leaves with the
// head in one write; a longer one streams in buffer-sized writes as it
// arrives (the first when the head and the body's first bytes fill the
// buffer, so an instance sees a streamed body before its end).
func writeBody(w io.Writer, head, buf []byte, body io.Reader, n int64) error {
	filled := len(head)
	var sent int64
	for {
		m, rerr := body.Read(buf[filled:])
		filled += m
		sent += int64(m)
		done := rerr != nil || sent == n
		if (done || filled == len(buf)) && filled > 0 {
			if _, err := w.Write(buf[:filled]); err != nil {
				return err
			}
			filled = 0
		}
		switch {
		case rerr == io.EOF && sent < n:
			return fmt.Errorf("upstream: request body ended after %d of %d bytes: %w", sent, n, io.ErrUnexpectedEOF)
		case rerr == io.EOF || (rerr == nil && sent == n):
			return nil
		case rerr != nil:
			return rerr
		}
	}
}

// writeChunked sends head and body in HTTP/1.1 chunked encoding.
func writeChunked(w io.Writer, head, buf []byte, body io.Reader) error {
	if _, err := w.Write(head); err != nil {
		return err
	}
	cw := httputil.NewChunkedWriter(w)
	if _, err := io.CopyBuffer(cw, body, buf); err != nil {
		return err
	}
	if err := cw.Close(); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\r\n") // no trailers
	return err
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

func isChunked(te []string) bool {
	return len(te) > 0 && te[0] == "chunked"
}

// appendBuffer is an io.Writer that appends (http.Header.WriteSubset's
// destination).
type appendBuffer struct{ b []byte }

func (a *appendBuffer) Write(p []byte) (int, error) {
	a.b = append(a.b, p...)
	return len(p), nil
}

func (a *appendBuffer) WriteString(s string) (int, error) {
	a.b = append(a.b, s...)
	return len(s), nil
}

// body is a response body on a pooled connection: read to its end, the
// connection goes back to the pool; closed before, it is closed.
type body struct {
	rc       io.ReadCloser
	t        *Transport
	h        *host
	c        *conn
	stop     func() bool // stops the context's watch; false once it fired
	ctx      context.Context
	reusable bool
	done     bool
}

func (b *body) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	switch {
	case err == io.EOF:
		b.release(b.reusable)
	case err != nil:
		b.release(false)
		if b.ctx.Err() != nil {
			err = context.Cause(b.ctx)
		}
	}
	return n, err
}

func (b *body) Close() error {
	if !b.done {
		// An empty body (204, HEAD, Content-Length 0) has nothing left
		// to read: its connection is as good as after an EOF.
		b.release(b.reusable && b.rc == http.NoBody)
	}
	return nil
}

func (b *body) release(reuse bool) {
	b.done = true
	if b.stop() && reuse {
		b.t.put(b.h, b.c)
		return
	}
	b.c.close()
}

// CheckAddr returns a net.Dialer Control that refuses a connection when
// check refuses its address (ip:port, resolved).
func CheckAddr(check func(netip.AddrPort) error) func(network, address string, c syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("upstream: dialling %q: %w", address, err)
		}
		return check(ap)
	}
}
