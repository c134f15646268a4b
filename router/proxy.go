package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/prefixrouter/prefixrouter/overload"
	"github.com/prefixrouter/prefixrouter/upstream"
)

// proxy forwards a picked request with net/http/httputil.ReverseProxy. The
// per-request state (the attempt) travels in the request context, so one
// ReverseProxy serves every request. Retries happen inside RoundTrip, before
// ReverseProxy has written anything to the client.
type proxy struct {
	r    *Router
	rp   *httputil.ReverseProxy
	base http.RoundTripper

	// failLog rate-limits the warning per upstream failure (issue 12: they
	// were logged at debug only, so a failing fleet was silent); failures
	// counts those since the last line, which reports them.
	failLog  rate.Sometimes
	failures atomic.Int64
}

type attemptKey struct{}

// attempt is one client request's journey through the proxy. Its fields are
// touched only by the goroutine serving the request (ReverseProxy calls
// Rewrite, RoundTrip, ModifyResponse, ErrorHandler and reads the body on it).
type attempt struct {
	r *Router
	// route is the routing sequence's result (route.go); retries and
	// waits for an adapter's holder move it on (repick, awaitHolder).
	*route
	upstreamPath string
	streamed     *streamed // the body routed before it ended; nil when body is all of it
	clientCtx    context.Context
	upCtx        context.Context         // the upstream call's (every try's parent)
	tryCtx       context.Context         // the current try's; its cause tells a first-byte timeout
	firstByte    *firstByte              // the current try's first-byte timeout; nil when off or stopped
	cancelTry    context.CancelCauseFunc // ends tryCtx; nil when no try had one
	stream       bool                    // frame the answer as an AWS event stream (…/invocations-response-stream)
	streaming    bool                    // the answer streams (stream, or an OpenAI "stream": true): the first-byte timeout applies
	bodyAsync    bool                    // a try went to a transport that may read body after answering (https)

	tried   bitset // set indexes already tried (and those the route excluded)
	retries int
	// failed lists the instances that could not serve model: they
	// answered "adapter not found" (the stale retry) or could not be
	// dialled while no other member was left (a crashed holder), each
	// with its record's revision then; nil until one did.
	failed    failedHolders
	waits     int       // stale retries and waits for another holder
	waitUntil time.Time // the first of them plus AdapterWait

	usage    usageScanner // usage read from the response as it passes
	status   int          // status sent to the client (upstream's or ours); 0 if none
	upStatus int          // the upstream's status, which its breaker judges; 0 if none
	err      error        // transport error of the last try, if no response
	bodyErr  error        // upstream body read error while copying
}

// pinned reports a session's request: its instance only, no retry
// elsewhere.
func (a *attempt) pinned() bool { return a.session != nil }

// statusClientClosed is nginx's convention for the metrics of a request whose
// client went away before any status was sent.
const statusClientClosed = 499

var bufferPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

type bytesPool struct{}

func (bytesPool) Get() []byte  { return *bufferPool.Get().(*[]byte) }
func (bytesPool) Put(b []byte) { bufferPool.Put(&b) }

func newProxy(r *Router, base http.RoundTripper) *proxy {
	p := &proxy{r: r, base: base, failLog: rate.Sometimes{First: 5, Interval: 10 * time.Second}}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// Append the client to X-Forwarded-For as a proxy in a chain
			// does (ReverseProxy dropped the inbound one from Out), and
			// set X-Forwarded-Proto and -Host. Entries before the last
			// are the client's word, not the router's.
			if prior, ok := pr.In.Header["X-Forwarded-For"]; ok {
				pr.Out.Header["X-Forwarded-For"] = prior
			}
			pr.SetXForwarded()
			attemptFrom(pr.In.Context()).setTarget(pr.Out)
		},
		Transport: retryTransport{p},
		// Zero, not -1: ReverseProxy already flushes every write of a
		// stream (text/event-stream, or no Content-Length: chunked token
		// streams and our event streams, whose length modifyResponse
		// drops), so SSE and PayloadPart events reach the client chunk by
		// chunk. -1 also flushed answers of known length: the headers
		// alone from a timer goroutine, then the body, two writes where
		// one does (issue 9: 8 % of the router's CPU under load).
		FlushInterval:  0,
		BufferPool:     bytesPool{},
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.errorHandler,
		ErrorLog:       log.New(slogWriter{r.log}, "", 0),
	}
	return p
}

type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(b []byte) (int, error) {
	w.l.Debug("router: reverse proxy", "msg", strings.TrimSpace(string(b)))
	return len(b), nil
}

func attemptFrom(ctx context.Context) *attempt { return ctx.Value(attemptKey{}).(*attempt) }

// setTarget points out at the current instance.
func (a *attempt) setTarget(out *http.Request) {
	t := a.cur.iv.target
	if t.Scheme != "http" {
		a.bodyAsync = true
	}
	out.URL.Scheme = t.Scheme
	out.URL.Host = t.Host
	out.URL.Path = joinPath(t.Path, a.upstreamPath)
	out.URL.RawPath = ""
	out.Host = "" // the instance's host, not the router's
	if t.Scheme != "http" && hasIdempotencyKey(out.Header) {
		// Go's Transport (the https fallback) replays a POST with an
		// Idempotency-Key on a reused connection that broke after the
		// upstream may have read it; without GetBody it cannot. Our own
		// transport re-sends only what the instance provably never read
		// (a dead pooled connection, no answer byte), and our retries
		// (dial errors) replay a.body (replayBody): both keep GetBody.
		out.GetBody = nil
	}
}

func joinPath(base, p string) string {
	return strings.TrimSuffix(base, "/") + p
}

// serve proxies req to a.cur. a.body holds the body read so far; a.rest,
// when not nil, is the client's body after it, streamed to the instance as
// it arrives (the client's Content-Length, or chunked when it sent none).
func (p *proxy) serve(w http.ResponseWriter, req *http.Request, a *attempt) {
	body, rest := a.body, a.rest
	if rest == nil {
		// Replay the body from the bytes already read, also for retries.
		req.Body = upstream.NewBytesBody(body)
		req.GetBody = func() (io.ReadCloser, error) { return upstream.NewBytesBody(body), nil }
		req.ContentLength = int64(len(body))
	} else {
		// Replayable until a byte of rest has gone to an instance (then
		// GetBody, Go's own retry on a dead idle connection, fails too).
		a.streamed = &streamed{head: body, rest: rest}
		req.Body, _ = a.streamed.body()
		req.GetBody = a.streamed.body
		if a.salted {
			req.ContentLength = -1 // the salt changes the length: chunked
		}
	}
	req.TransferEncoding = nil
	clientCtx := req.Context()
	a.clientCtx = clientCtx
	upCtx := context.WithValue(clientCtx, attemptKey{}, a)
	a.upCtx = upCtx
	req = req.WithContext(upCtx)
	defer func() {
		// ReverseProxy panics with http.ErrAbortHandler when a streamed copy
		// fails; release the slot and report the outcome before re-panicking.
		rec := recover()
		a.finish(clientCtx, rec != nil)
		if rec != nil {
			panic(rec)
		}
	}()
	p.rp.ServeHTTP(w, req)
}

// finish reports the outcome to the instance's breaker, releases its slot
// and counts the request.
func (a *attempt) finish(clientCtx context.Context, aborted bool) {
	m := a.r.metrics
	clientGone := clientCtx.Err() != nil
	a.stopFirstByte()
	var outcome error
	switch {
	case a.clientBodyErr() != nil:
		// The client's body broke off (or crossed the limit) while it
		// streamed to the instance: not the instance's fault.
		outcome = overload.ErrClientGone
	case !clientGone && a.timedOut():
		outcome = errFirstByte
		m.upstreamErrors.WithLabelValues(a.endpoint, errKindTimeout).Inc()
	case clientGone:
		outcome = clientCtx.Err() // context.Canceled: not the instance's fault
	case a.err != nil && !a.streaming && errorKind(a.err) == errKindTimeout:
		// --upstream-header-timeout ended a non-streamed generation
		// before its headers: its length is the client's, as above.
		outcome = fmt.Errorf("%w: %w", overload.ErrNotJudged, a.err)
	case a.err != nil:
		outcome = a.err
	case a.bodyErr != nil:
		outcome = a.bodyErr
		m.upstreamErrors.WithLabelValues(a.endpoint, errKindBody).Inc()
	case aborted:
		outcome = overload.ErrClientGone // the write to the client failed
	case a.upStatus != 0:
		outcome = overload.UpstreamStatusFor(a.upStatus, a.key)
	default:
		outcome = overload.UpstreamStatusFor(a.status, a.key)
	}
	if a.cur.done != nil {
		a.cur.done(outcome)
		a.cur.done = nil
	}
	status := a.status
	if status == 0 {
		status = statusClientClosed
	}
	m.requests.WithLabelValues(a.endpoint, string(a.ev.strategy), a.cur.decision, m.code(status)).Inc()
	if u := &a.usage; u.found && a.cur.iv != nil {
		model := modelLabel(a.ev, a.model)
		m.promptTokens.WithLabelValues(a.endpoint, model, a.cur.iv.inst.ID, a.cur.decision).Add(float64(u.prompt))
		m.cachedTokens.WithLabelValues(a.endpoint, model, a.cur.iv.inst.ID, a.cur.decision).Add(float64(u.cached))
	}
	a.traceFinish(clientCtx)
	if a.cancelTry != nil {
		a.cancelTry(nil)
	}
}

func (p *proxy) modifyResponse(resp *http.Response) error {
	a := attemptFrom(resp.Request.Context())
	a.status = resp.StatusCode
	a.upStatus = resp.StatusCode
	stripRouterHeaders(resp.Header)
	if !p.r.opts.HideInstanceID {
		resp.Header.Set(HeaderInstance, a.cur.iv.inst.ID)
	}
	resp.Header.Set(HeaderDecision, a.cur.decision)
	if overload.IsFailure(overload.UpstreamStatus(resp.StatusCode)) {
		p.r.metrics.upstreamErrors.WithLabelValues(a.endpoint, errKindStatus).Inc()
	}
	if a.kind == kindInvoke {
		resp.Header.Set(HeaderInvokedVariant, variantOf(a.cur.iv))
		p.r.sessions.rewrite(resp.Header, HeaderNewSessionID, a.endpoint, a.cur.iv.inst.ID)
		p.r.sessions.rewrite(resp.Header, HeaderClosedSessionID, a.endpoint, a.cur.iv.inst.ID)
	}
	body := &trackedBody{ReadCloser: resp.Body, a: a}
	resp.Body = body
	switch {
	case a.kind == kindInvoke && (resp.StatusCode < 200 || resp.StatusCode > 299):
		a.modelError(resp)
	case a.stream:
		resp.Header.Set(HeaderSageMakerContentType, resp.Header.Get("Content-Type"))
		resp.Header.Set("Content-Type", ContentTypeEventStream)
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
		clientCtx := resp.Request.Context()
		resp.Body = newEventBody(body, func(err error) bool {
			return errors.Is(err, context.Canceled) && clientCtx.Err() == nil
		})
	}
	return nil
}

// maxOriginalMessage bounds how much of an upstream error body a ModelError
// quotes.
const maxOriginalMessage = 16 << 10

// modelError replaces an upstream non-2xx answer on an invoke path with
// SageMaker's ModelError (424), which quotes the instance's status and body
// (OriginalStatusCode, OriginalMessage) as SageMaker Runtime does. Error
// bodies are small; only the first maxOriginalMessage bytes are read.
func (a *attempt) modelError(resp *http.Response) {
	orig, _ := io.ReadAll(io.LimitReader(resp.Body, maxOriginalMessage))
	resp.Body.Close()
	side := "server"
	if resp.StatusCode < 500 {
		side = "client"
	}
	from := "instance " + a.cur.iv.inst.ID
	if a.r.opts.HideInstanceID {
		from = "the model"
	}
	msg := fmt.Sprintf("Received %s error (%d) from %s with message %q.", side, resp.StatusCode, from, orig)
	out, _ := json.Marshal(sageMakerError{ErrorCode: errModel, Message: msg, LowerMessage: msg, OriginalStatusCode: resp.StatusCode, OriginalMessage: string(orig)})
	out = append(out, '\n')
	for _, h := range []string{"Content-Length", "Content-Encoding", "Transfer-Encoding", "Retry-After"} {
		resp.Header.Del(h)
	}
	resp.Header.Set("Content-Type", "application/json")
	resp.Header.Set(HeaderErrorType, errModel)
	resp.Header.Set(HeaderError, codeUpstreamStatus)
	resp.StatusCode = http.StatusFailedDependency
	resp.Status = ""
	resp.ContentLength = int64(len(out))
	resp.Body = io.NopCloser(bytes.NewReader(out))
	a.status = resp.StatusCode
}

// trackedBody records upstream read errors, which tell an instance that broke
// off a stream apart from a client that stopped reading.
type trackedBody struct {
	io.ReadCloser
	a *attempt
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 || err != nil {
		b.a.stopFirstByte()
	}
	if n > 0 {
		b.a.usage.feed(p[:n])
	}
	if err != nil && err != io.EOF && b.a.bodyErr == nil {
		b.a.bodyErr = err
	}
	return n, err
}

// errorHandler runs when no try produced a response.
func (p *proxy) errorHandler(w http.ResponseWriter, req *http.Request, err error) {
	a := attemptFrom(req.Context())
	if a.timedOut() {
		err = errFirstByte
	}
	a.err = err
	if a.clientCtx.Err() != nil && (errors.Is(err, context.Canceled) || a.clientBodyErr() != nil) {
		// The client went away (a connection that breaks mid-body
		// cancels the request's context before the read fails): nobody
		// to answer; counted as 499.
		return
	}
	if cerr := a.clientBodyErr(); cerr != nil {
		// The client's body failed after the pick, while it streamed:
		// answer as for a body that fails before it (400, 413 past the
		// limit), if the client is still there to read it.
		e := bodyError(cerr, a.r.opts.MaxBodyBytes)
		a.status = e.status
		writeError(w, a.kind, e.status, e.code, e.msg)
		return
	}
	if a.cur.iv != nil {
		if !p.r.opts.HideInstanceID {
			w.Header().Set(HeaderInstance, a.cur.iv.inst.ID)
		}
		w.Header().Set(HeaderDecision, a.cur.decision)
	}
	if errors.Is(err, errAdapterGone) {
		a.status = statusModelNotReady(a.kind)
		writeError(w, a.kind, a.status, codeModelNotReady, err.Error())
		return
	}
	unreachable := errorKind(err) == errKindDial
	a.status = upstreamFailureStatus(a.kind, unreachable)
	code := codeUpstream
	if unreachable {
		code = codeUnreachable
	}
	p.warnFailure(a, err)
	// The client learns what happened, never where: the error's text
	// names the instance's address.
	writeError(w, a.kind, a.status, code, fmt.Sprintf("no instance answered after %d retries: %s", a.retries, publicError(err)))
}

// armFirstByte starts the first-byte timeout of one try, on a context of
// its own that it cancels with errFirstByte, and returns out on it.
//
// An instance whose health check answers while its generations hang must
// trip its breaker (issue 12): no first body byte within the timeout cuts
// the call, and the outcome counts against it. Only streamed answers: a
// non-streamed answer's first byte comes when the whole generation is
// done, whose length the client's max_tokens decides (issue 19);
// --max-stream-duration and the client's own deadline bound those,
// without blame. Each try gets the whole timeout on a context of its own:
// the time an earlier try took to fail (a dial that timed out on a hung
// engine whose listen backlog is full, as a stopped llama-server's is
// within a few health probes) is not this instance's silence, and a timer
// of that try that fires as it fails cannot cut this one (the e2e test of
// a hung llama-server found both).
func (a *attempt) armFirstByte(out *http.Request, parent context.Context) *http.Request {
	d := a.ev.firstByte
	if d <= 0 || !a.streaming {
		return out
	}
	a.stopFirstByte()
	if a.cancelTry != nil {
		a.cancelTry(nil)
	}
	ctx, cancel := context.WithCancelCause(parent)
	a.tryCtx, a.cancelTry = ctx, cancel
	a.firstByte = startFirstByte(d, a.streamed, func() { cancel(errFirstByte) })
	return out.WithContext(ctx)
}

// errFirstByte is the outcome of a streamed call cut by
// Options.FirstByteTimeout. It wraps context.DeadlineExceeded, so it counts
// against the instance.
var errFirstByte = fmt.Errorf("router: no first byte from the instance within the first-byte timeout: %w", context.DeadlineExceeded)

// firstByte is the first-byte timeout of one request. The clock starts
// when the instance has the whole request: at once for a body read whole,
// when a streamed body ends (on the transport's goroutine) otherwise, so a
// slow client never counts against the instance.
type firstByte struct {
	t       *time.Timer
	stopped atomic.Bool // a byte (or the end) arrived: never fire
}

// startFirstByte arms fire after d, or after d from the end of s when the
// body is streamed.
func startFirstByte(d time.Duration, s *streamed, fire func()) *firstByte {
	fb := &firstByte{}
	fb.t = time.AfterFunc(d, func() {
		if !fb.stopped.Load() {
			fire()
		}
	})
	if s != nil {
		fb.t.Stop()
		s.onEnd = func() {
			if !fb.stopped.Load() {
				fb.t.Reset(d)
			}
		}
	}
	return fb
}

// stopFirstByte disarms the first-byte timer once a byte (or the end)
// arrived.
func (a *attempt) stopFirstByte() {
	if a.firstByte != nil {
		a.firstByte.stopped.Store(true)
		a.firstByte.t.Stop()
		a.firstByte = nil
	}
}

// clientBodyErr is the error of the client's streamed body (an abort, a
// read timeout, the size limit), nil when there was none.
func (a *attempt) clientBodyErr() error {
	if a.streamed == nil {
		return nil
	}
	return a.streamed.clientErr()
}

// replayBody is the request body for another try: the bytes read, then the
// rest of a streamed body when none of it has gone to an instance yet.
func (a *attempt) replayBody() (io.ReadCloser, error) {
	if a.streamed == nil {
		return upstream.NewBytesBody(a.body), nil
	}
	return a.streamed.body()
}

// timedOut reports whether the first-byte timeout cut the current try.
func (a *attempt) timedOut() bool {
	return a.tryCtx != nil && context.Cause(a.tryCtx) == errFirstByte
}

// warnFailure logs an upstream failure at warn, at most a few lines per
// interval; each line counts the failures it stands for. Only the failure
// path pays for the limiter's lock.
func (p *proxy) warnFailure(a *attempt, err error) {
	p.failures.Add(1)
	p.failLog.Do(func() {
		id := ""
		if a.cur.iv != nil {
			id = a.cur.iv.inst.ID
		}
		p.r.log.Warn("router: upstream failed", "endpoint", a.endpoint, "instance", id, "retries", a.retries, "err", err, "failures_since_last_line", p.failures.Swap(0))
	})
}

// retryTransport sends to the attempt's instance and, when the instance
// provably received nothing (the connection could not be made), charges its
// breaker and re-sends to the next pick, at most maxRetries times.
type retryTransport struct{ p *proxy }

func (t retryTransport) RoundTrip(out *http.Request) (*http.Response, error) {
	parent := out.Context() // each try's context derives from it (armFirstByte)
	a := attemptFrom(parent)
	m := t.p.r.metrics
	for {
		out = a.armFirstByte(out, parent)
		resp, err := t.p.base.RoundTrip(a.forEngine(out))
		if err == nil {
			if a.pinned() || !a.staleAdapter(resp) {
				return resp, nil
			}
			// The instance refused the adapter: it saw the request but
			// did no work, so re-sending is safe (issue 11).
			if err := t.staleRetry(parent, a); err != nil {
				return nil, err
			}
			out = out.Clone(parent)
			a.setTarget(out)
			if out.Body, err = a.replayBody(); err != nil {
				return nil, err
			}
			continue
		}
		if out.Context().Err() != nil || a.clientBodyErr() != nil {
			// The client went away or its body failed (not the
			// instance's fault), or the first-byte timeout cut this
			// try as it failed (the instance's).
			return nil, err
		}
		kind := errorKind(err)
		m.upstreamErrors.WithLabelValues(a.endpoint, kind).Inc()
		if kind != errKindDial || a.retries >= a.maxRetries() || a.pinned() {
			return nil, err
		}
		replay, rerr := a.replayBody()
		if rerr != nil {
			// A dial error leaves the body unread; this is for a
			// transport that read it anyway: never send half a body.
			return nil, fmt.Errorf("%w: %w", rerr, err)
		}
		a.cur.done(err)
		a.cur.done = nil
		a.tried.set(a.cur.idx)
		failedIn := a.cur.iv.inst
		next, ok := a.repick(t.p.r, a.tried)
		if !ok {
			if _, catalogued := a.ev.table.Endpoint().Adapter(a.model); !catalogued {
				return nil, err
			}
			// The adapter's last reachable member is gone (crashed, its
			// lease not yet expired): nothing to retry on now, but the
			// agents place the adapter elsewhere once etcd drops the
			// record. Hold the request for that, as for an adapter not
			// loaded yet (issue 11).
			a.failed.add(failedIn)
			werr := a.countWait()
			if werr == nil {
				werr = t.awaitHolder(parent, a)
			}
			if werr != nil {
				return nil, fmt.Errorf("%w (after %w)", werr, err)
			}
			next = a.cur
		}
		a.cur = next
		a.retries++
		m.retries.WithLabelValues(a.endpoint).Inc()
		out = out.Clone(parent)
		a.setTarget(out)
		out.Body = replay
	}
}

// maxRetries bounds a request's re-sends after dial errors: MaxRetries,
// or while its endpoint panics (more of it is out than the ejection cap
// allows, so picks ignore health marks and open breakers) every other
// member of its set: there an instance that refuses connections costs a
// dial, not the request.
func (a *attempt) maxRetries() int {
	if a.cur.iv != nil && a.cur.iv.state.Panicking() {
		return max(MaxRetries, a.set.Len()-1)
	}
	return MaxRetries
}

// maxWaits bounds the re-sends after "adapter not found" answers and the
// waits for another holder. Each one after the members ran out waits for
// a record to change, and all of them end at AdapterWait after the first:
// a record that changes for another reason (its load state) costs one
// more try, not the request.
const maxWaits = 16

// staleRetry handles an "adapter not found" answer from a.cur: it reports
// the instance stale, releases it without blame and admits another member
// of the set; when none is left it waits (awaitHolder).
func (t retryTransport) staleRetry(ctx context.Context, a *attempt) error {
	r := t.p.r
	in := a.cur.iv.inst
	r.metrics.staleRetries.WithLabelValues(a.endpoint).Inc()
	r.reportStale(a.endpoint, in.ID, a.model)
	a.cur.done(nil) // it answered: not a failure
	a.cur.done = nil
	a.tried.set(a.cur.idx)
	if a.streamed != nil && a.streamed.restRead.Load() {
		// The instance took the streamed body; its bytes are gone from
		// the client's reader. Fail as when no member serves the adapter:
		// the client may send again.
		return fmt.Errorf("%w: %q: %w", errAdapterGone, a.model, errNotReplayable)
	}
	a.failed.add(in)
	if err := a.countWait(); err != nil {
		return err
	}
	if next, ok := a.repick(r, a.tried); ok {
		a.cur = next
		return nil
	}
	return t.awaitHolder(ctx, a)
}

// countWait counts one stale retry or wait and starts the AdapterWait
// bound at the first.
func (a *attempt) countWait() error {
	if a.waits++; a.waits == 1 {
		a.waitUntil = time.Now().Add(a.r.opts.AdapterWait)
	}
	if a.waits > maxWaits {
		return fmt.Errorf("%w: %q: %d members failed it", errAdapterGone, a.model, a.waits)
	}
	return nil
}

// awaitHolder is reached when the last member of a.set that could take
// the request refused the adapter or could not be dialled (the caller
// added it to a.failed and counted the wait). It re-enters the routing
// sequence on newer views (route.awaitHolder) until AdapterWait after the
// first such failure.
func (t retryTransport) awaitHolder(ctx context.Context, a *attempt) error {
	if err := a.route.awaitHolder(ctx, t.p.r, a.failed, a.waitUntil); err != nil {
		return fmt.Errorf("%w: %q: %w", errAdapterGone, a.model, err)
	}
	a.tried = bitset{}
	return nil
}

// errorKind classifies a transport error for metrics and retries. Only dial
// errors are retried: the upstream provably saw nothing.
func errorKind(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return errKindDial
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return errKindTimeout
	}
	return errKindOther
}
