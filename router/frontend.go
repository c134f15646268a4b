package router

import (
	"cmp"
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/prefixrouter/prefixrouter/overload"
)

// This file is the data plane's second front end: a proxy that asks which
// instance should serve (Envoy's ext_proc endpoint picker) gets the choice
// the HTTP data plane would make, from the same snapshot, strategies,
// thresholds, breakers and health. One pick, two front ends.

// ErrNeedBody is returned by Pick when the body received so far is too short
// to build the routing key: the caller waits for more and asks again.
var ErrNeedBody = errors.New("router: routing key needs more of the body")

// PickRequest is a request as a front end sees it while its body streams in.
type PickRequest struct {
	// Endpoint, when set, names the endpoint; otherwise Path does.
	Endpoint string
	// Path is the request path (a query is ignored). It selects the endpoint
	// and the API as on the HTTP data plane: /endpoints/{endpoint}/... names
	// the endpoint, other paths use Options.DefaultEndpoint; paths ending in
	// chat/completions or /v1/completions are OpenAI, others invoke.
	Path string
	// Header holds the request headers with canonical keys (tenant and
	// target-model headers of the invoke paths).
	Header http.Header
	// Body is the body received so far.
	Body []byte
	// Held, when set, holds the body received so far instead of Body
	// (Router.HoldBody): an OpenAI key is then decided on its head, as
	// on the HTTP data plane.
	Held *HeldBody
	// Complete is true when Body is the whole body.
	Complete bool
	// Subset, if non-nil, restricts the pick to instances whose address
	// (host:port of their base URL, or host alone) it lists: the subset hint
	// of the Gateway API Inference Extension. An empty non-nil Subset leaves
	// nothing eligible.
	Subset []string
	// MaxCandidates bounds Picked.Candidates; zero means 1.
	MaxCandidates int
	// Context bounds the wait for a catalogued adapter the agents are
	// loading (at most Options.AdapterWait, as on the HTTP data plane):
	// the stream's context, so that a proxy that gives up ends the wait.
	// Nil means context.Background().
	Context context.Context
}

// Picked is an admitted choice. Its methods are for the one goroutine that
// serves the request.
type Picked struct {
	// Candidates are host:port addresses in the order the proxy should try
	// them: the admitted instance first, then the key's further ring
	// candidates (its spill order) that are eligible now.
	Candidates []string
	// Instance is the id of the admitted instance, Decision how it was
	// chosen (the decision label), Endpoint and Strategy where.
	Instance, Decision, Endpoint, Strategy string
	// Spill is why the key's ring primary was passed over (a Spill*
	// value), empty when it was not.
	Spill string
	// SetHeaders are request headers the proxy must set before it sends
	// the request on, as the HTTP data plane does: a stateful session's
	// id becomes the container's own (X-Amzn-SageMaker-Session-Id).
	SetHeaders http.Header
	// Body, when not nil, replaces the request body held so far: a
	// tenant's body with the endpoint's cache salt, or when the body goes
	// on, its start, and then the chunks that follow go through Rest. It
	// may share the buffers of PickRequest.Held: valid until its Release.
	Body []byte
	tail *tailSalter // salts the end of a body that goes on; nil otherwise

	r       *Router
	kind    apiKind
	ev      *endpointView
	cur     pick
	primary string // Candidates[0]
	key     uint64 // the routing key, which the breaker rule reads (overload.StatusError)
}

// ResponseHeaders returns the headers the proxy sets on the instance's
// response, as the HTTP data plane does: the instance (unless
// Options.HideInstanceID) and the decision; on invoke paths the invoked
// variant and a new or closed session's id turned into the client's (so
// that the session's next request reaches its instance from any replica
// and either front end). upstream holds the response's headers.
func (p *Picked) ResponseHeaders(upstream http.Header) http.Header {
	out := http.Header{}
	if p.cur.iv == nil {
		return out
	}
	if p.r == nil || !p.r.opts.HideInstanceID {
		out.Set(HeaderInstance, p.cur.iv.inst.ID)
	}
	out.Set(HeaderDecision, p.cur.decision)
	if p.kind == kindInvoke {
		out.Set(HeaderInvokedVariant, variantOf(p.cur.iv))
		for _, h := range [...]string{HeaderNewSessionID, HeaderClosedSessionID} {
			if v := upstream.Get(h); v != "" && p.r != nil {
				out.Set(h, v)
				p.r.sessions.rewrite(out, h, p.Endpoint, p.cur.iv.inst.ID)
			}
		}
	}
	return out
}

// Rejection is a request Pick turned away before any instance was admitted:
// the status, headers and body the HTTP data plane answers in the same case.
// It wraps the routing sequence's error, whose class errors.Is tells:
// ErrInvalidRequest, ErrUnknownEndpoint, lora.ErrUnknownModel,
// lora.ErrModelNotReady or fleet.ErrNoInstance.
type Rejection struct {
	Status int
	Header http.Header
	Body   []byte
	err    error
}

func (e *Rejection) Error() string { return e.err.Error() }
func (e *Rejection) Unwrap() error { return e.err }

// Pick is the ext_proc front end: it runs the routing sequence (route.go)
// on req as the HTTP data plane does (sessions, variants and inference
// components, the bounded wait for a catalogued adapter, the tenant salt)
// and admits an instance, once the body holds enough of the prompt for the
// key: the first PrefixLength bytes on invoke paths; on OpenAI paths the
// whole body (model and prompt_cache_key may follow the messages), or with
// req.Held a head that holds them, as on the HTTP data plane. Before that
// it returns ErrNeedBody. Otherwise the error is a *Rejection.
// The caller must call Done on the result when the response ends.
func (r *Router) Pick(req PickRequest) (*Picked, error) {
	kind := kindForPath(req.Path)
	header := req.Header
	if header == nil {
		header = http.Header{}
	}
	ctx := req.Context
	if ctx == nil {
		ctx = context.Background()
	}
	src := heldBody{body: req.Body, complete: req.Complete, limit: r.opts.MaxBodyBytes}
	if req.Held != nil {
		src.body, src.held = req.Held.Bytes(), req.Held
	}
	rt, err := r.route(routeInput{
		ctx: ctx, kind: kind, endpoint: cmp.Or(req.Endpoint, r.endpointOf(req.Path)), header: header,
		src:    src,
		subset: req.Subset,
	})
	if err != nil {
		if err.code == codeNeedBody {
			return nil, ErrNeedBody
		}
		ep, strategy := rt.labels()
		return nil, r.rejectPick(kind, ep, strategy, err)
	}
	out := &Picked{
		Instance: rt.cur.iv.inst.ID, Decision: rt.cur.decision, Endpoint: rt.endpoint, Strategy: string(rt.ev.strategy), Spill: rt.cur.spill.String(),
		r: r, kind: kind, ev: rt.ev, cur: rt.cur, primary: rt.cur.iv.hostPort, key: rt.key,
	}
	if rt.session != nil {
		// A session stays on its instance: no fallback elsewhere.
		out.Candidates = []string{rt.cur.iv.hostPort}
		out.SetHeaders = http.Header{HeaderSessionID: {rt.sessionID}}
	} else {
		out.Candidates = fallbacks(rt, rt.skip, max(req.MaxCandidates, 1))
	}
	if rt.salted {
		out.Body, out.tail = rt.body, rt.tail
	}
	return out, nil
}

// Rest returns what the proxy sends for a chunk of the request body that
// arrives after the pick (end: the body's last): the chunk itself, or for
// a salted body that goes on, the chunk with the salt put in at the
// body's end. An error ends the request (a salted body with more than 4
// KiB of whitespace after a closing brace).
func (p *Picked) Rest(chunk []byte, end bool) ([]byte, error) {
	if p.tail == nil {
		return chunk, nil
	}
	out, err := p.tail.next(nil, chunk)
	if err != nil {
		return nil, err
	}
	if end {
		out = p.tail.end(out)
	}
	return out, nil
}

// endpointOf is the endpoint a data-plane path names: /endpoints/{endpoint}/...,
// else Options.DefaultEndpoint.
func (r *Router) endpointOf(path string) string {
	if rest, ok := strings.CutPrefix(path, "/endpoints/"); ok {
		if name, _, ok := strings.Cut(rest, "/"); ok && name != "" {
			if n, err := url.PathUnescape(name); err == nil {
				return n
			}
		}
	}
	return r.opts.DefaultEndpoint
}

// fallbacks lists the admitted instance, then the key's further ring
// candidates that are eligible now (not skipped, not marked down, breaker not
// open, as picks see them), up to n addresses.
func fallbacks(rt *route, skip bitset, n int) []string {
	p := rt.cur
	out := make([]string, 1, n)
	out[0] = p.iv.hostPort
	if n == 1 {
		return out
	}
	var buf [MaxExplainCandidates]int
	for _, i := range rt.set.Ring().Candidates(rt.key, min(rt.set.Len(), MaxExplainCandidates), buf[:0]) {
		if len(out) == n {
			break
		}
		iv := rt.ev.instance(rt.set, i)
		if i == p.idx || skip.has(i) || iv == nil || iv.state.Ejected() || iv.state.MarkedDown() {
			continue
		}
		out = append(out, iv.hostPort)
	}
	return out
}

// inSubset matches host:port exactly, or the host alone when an entry has no
// port (GIE's reference picker matches on the address alone).
func inSubset(iv *instanceView, subset []string) bool {
	for _, s := range subset {
		if s == iv.hostPort || s == iv.target.Hostname() {
			return true
		}
	}
	return false
}

// hostPort is the address a proxy connects to for base URL u: host:port, the
// port defaulted from the scheme.
func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// rejectPick counts a rejection as the HTTP data plane does and renders the
// answer it would write.
func (r *Router) rejectPick(kind apiKind, endpoint, strategy string, e *routeError) *Rejection {
	r.metrics.requests.WithLabelValues(endpoint, strategy, decisionNone, r.metrics.code(e.status)).Inc()
	w := &bufferWriter{header: http.Header{}}
	writeError(w, kind, e.status, e.code, e.msg)
	return &Rejection{Status: e.status, Header: w.header, Body: w.body, err: e}
}

// bufferWriter is the http.ResponseWriter writeError renders a Rejection
// into.
type bufferWriter struct {
	header http.Header
	body   []byte
}

func (w *bufferWriter) Header() http.Header { return w.header }
func (w *bufferWriter) WriteHeader(int)     {}
func (w *bufferWriter) Write(b []byte) (int, error) {
	w.body = append(w.body, b...)
	return len(b), nil
}

// Served tells which address served the request, as the proxy reports it
// (GIE's x-gateway-destination-endpoint-served). When the proxy moved on from
// the admitted instance to a fallback, the slot moves with it: the admitted
// instance is released without blame (the proxy's retry policy, not this
// router, judged it) and the instance that serves is counted until Done.
// An address of no instance of the endpoint is ignored.
func (p *Picked) Served(addr string) {
	if addr == "" || addr == p.primary || p.cur.done == nil {
		return
	}
	for _, iv := range p.ev.instances {
		if iv.hostPort != addr || iv.target == nil {
			continue
		}
		p.cur.done(overload.ErrClientGone)
		p.cur.done = nil
		if done, ok := iv.state.Acquire(); ok {
			p.cur = pick{iv: iv, done: done, decision: p.cur.decision}
			p.Instance = iv.inst.ID
		}
		return
	}
}

// Done releases the slot and reports the outcome to the serving instance's
// breaker: status is the response status, or 0 when the response never
// came (the stream was cancelled), which is not the instance's fault. The
// request is counted in prefixrouter_requests_total as on the HTTP data
// plane. Calls after the first do nothing.
func (p *Picked) Done(status int) { p.end(status, true) }

// Release is Done for an outcome the caller cannot vouch for (an ext_proc
// peer that is not authenticated, issue 19): the slot is freed and the
// request counted, but the instance's breaker learns nothing.
func (p *Picked) Release(status int) { p.end(status, false) }

func (p *Picked) end(status int, judge bool) {
	if p.r == nil {
		return
	}
	outcome := overload.UpstreamStatusFor(status, p.key)
	switch {
	case status == 0:
		outcome = context.Canceled // the response never came: not the instance's fault
	case !judge:
		outcome = overload.ErrNotJudged
	}
	if status == 0 {
		status = statusClientClosed
	}
	if p.cur.done != nil {
		p.cur.done(outcome)
		p.cur.done = nil
	}
	m := p.r.metrics
	m.requests.WithLabelValues(p.Endpoint, p.Strategy, p.cur.decision, m.code(status)).Inc()
	p.r = nil
}
