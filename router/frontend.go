package router

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prefixrouter/prefixrouter/lora"
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
	// Complete is true when Body is the whole body.
	Complete bool
	// Subset, if non-nil, restricts the pick to instances whose address
	// (host:port of their base URL, or host alone) it lists: the subset hint
	// of the Gateway API Inference Extension. An empty non-nil Subset leaves
	// nothing eligible.
	Subset []string
	// MaxCandidates bounds Picked.Candidates; zero means 1.
	MaxCandidates int
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

	r       *Router
	ev      *endpointView
	cur     pick
	primary string // Candidates[0]
}

// Rejection is a request Pick turned away before any instance was admitted:
// the status, headers and body the HTTP data plane answers in the same case.
// It wraps ErrInvalidRequest, ErrUnknownEndpoint, lora.ErrUnknownModel or
// ErrNoInstance.
type Rejection struct {
	Status int
	Header http.Header
	Body   []byte
	err    error
}

func (e *Rejection) Error() string { return e.err.Error() }
func (e *Rejection) Unwrap() error { return e.err }

// Pick chooses and admits an instance for req as the HTTP data plane would,
// once the body holds enough of the prompt for the key: the first
// PrefixLength bytes on invoke paths; on OpenAI paths the whole body, since
// model and prompt_cache_key may follow the messages. Before that it returns
// ErrNeedBody. Otherwise the error is a *Rejection. The caller must call Done
// on the result when the response ends.
func (r *Router) Pick(req PickRequest) (*Picked, error) {
	kind := kindForPath(req.Path)
	endpoint := r.opts.DefaultEndpoint
	if rest, ok := strings.CutPrefix(req.Path, "/endpoints/"); ok {
		if name, _, ok := strings.Cut(rest, "/"); ok && name != "" {
			if n, err := url.PathUnescape(name); err == nil {
				endpoint = n
			}
		}
	}
	v := r.view.Load()
	if v == nil {
		return nil, r.rejectPick(kind, "unknown", "", ErrNoInstance, &reqError{statusNotLoaded(kind), codeNotLoaded, "no fleet snapshot loaded yet"})
	}
	ev := v.endpoints[endpoint]
	if ev == nil {
		return nil, r.rejectPick(kind, "unknown", "", ErrUnknownEndpoint, &reqError{statusNotFound(kind), codeUnknownEndpoint, fmt.Sprintf("endpoint %q not found", endpoint)})
	}
	strategy := string(ev.strategy)
	if int64(len(req.Body)) > r.opts.MaxBodyBytes {
		return nil, r.rejectPick(kind, endpoint, strategy, ErrInvalidRequest, &reqError{http.StatusRequestEntityTooLarge, codeTooLarge, fmt.Sprintf("request body exceeds the limit of %d bytes", r.opts.MaxBodyBytes)})
	}
	if !req.Complete && (kind != kindInvoke || len(req.Body) < ev.prefixLen) {
		return nil, ErrNeedBody
	}
	header := req.Header
	if header == nil {
		header = http.Header{}
	}
	rr, rerr := parseRequest(kind, header, req.Body, ev.prefixLen)
	if rerr != nil {
		return nil, r.rejectPick(kind, endpoint, strategy, ErrInvalidRequest, rerr)
	}
	start := time.Now()
	set, err := ev.table.Set(rr.model)
	if err != nil {
		if errors.Is(err, lora.ErrUnknownModel) {
			return nil, r.rejectPick(kind, endpoint, strategy, err, &reqError{statusNotFound(kind), codeUnknownModel, fmt.Sprintf("model %q is not served by endpoint %q", rr.model, endpoint)})
		}
		return nil, r.rejectPick(kind, endpoint, strategy, fmt.Errorf("%w: %w", ErrNoInstance, err), noInstance(kind, err))
	}
	var skip bitset
	if req.Subset != nil {
		skip = subsetSkip(ev, set, req.Subset)
	}
	p, ok := r.pick(ev, set, rr.key, newHotChoice(ev, set, rr.key, req.Body), v.snap.Replicas, skip)
	r.metrics.pickSeconds.WithLabelValues(strategy).Observe(time.Since(start).Seconds())
	if !ok {
		msg := fmt.Sprintf("no instance of endpoint %q can take the request (all circuit breakers open)", endpoint)
		if req.Subset != nil {
			msg = fmt.Sprintf("no instance of endpoint %q in the proxy's subset of %d can take the request", endpoint, len(req.Subset))
		}
		return nil, r.rejectPick(kind, endpoint, strategy, ErrNoInstance, &reqError{http.StatusServiceUnavailable, codeNoInstance, msg})
	}
	out := &Picked{
		Instance: p.iv.inst.ID, Decision: p.decision, Endpoint: endpoint, Strategy: strategy, Spill: p.spill.String(),
		r: r, ev: ev, cur: p, primary: p.iv.hostPort,
	}
	out.Candidates = fallbacks(ev, set, rr.key, p, skip, max(req.MaxCandidates, 1))
	return out, nil
}

// fallbacks lists the admitted instance, then the key's further ring
// candidates that are eligible now (not skipped, not marked down, breaker not
// open), up to n addresses.
func fallbacks(ev *endpointView, set *lora.Set, key uint64, p pick, skip bitset, n int) []string {
	out := make([]string, 1, n)
	out[0] = p.iv.hostPort
	if n == 1 {
		return out
	}
	var buf [MaxExplainCandidates]int
	for _, i := range set.Ring().Candidates(key, min(set.Len(), MaxExplainCandidates), buf[:0]) {
		if len(out) == n {
			break
		}
		iv := ev.instance(set, i)
		if i == p.idx || skip.has(i) || iv == nil || iv.state.Open() || !iv.state.Healthy() {
			continue
		}
		out = append(out, iv.hostPort)
	}
	return out
}

// subsetSkip marks the set indexes of instances outside subset.
func subsetSkip(ev *endpointView, set *lora.Set, subset []string) bitset {
	var skip bitset
	for i := 0; i < set.Len(); i++ {
		iv := ev.instance(set, i)
		if iv == nil || !inSubset(iv, subset) {
			skip.set(i)
		}
	}
	return skip
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
func (r *Router) rejectPick(kind apiKind, endpoint, strategy string, sentinel error, e *reqError) *Rejection {
	r.metrics.requests.WithLabelValues(endpoint, strategy, decisionNone, r.metrics.code(e.status)).Inc()
	w := &bufferWriter{header: http.Header{}}
	writeError(w, kind, e.status, e.code, e.msg)
	return &Rejection{Status: e.status, Header: w.header, Body: w.body, err: fmt.Errorf("%w: %s", sentinel, e.msg)}
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
	outcome := overload.UpstreamStatus(status)
	if status == 0 || !judge {
		outcome = context.Canceled // neither a success nor a failure
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
