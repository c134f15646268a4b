package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/lora"
)

// The routing sequence (issue 18). Every front end runs the same steps, in
// this order and once: the HTTP data plane (serve), the ext_proc endpoint
// picker (Pick) and the explanation the admin API gives (Explain).
//
//	1. endpoint  the view loaded once, the endpoint's resolved config
//	2. body      the size limit; what the key needs of the body
//	3. parse     tenant, model (or inference component), routing key; tenant salt
//	4. session   a stateful session's instance
//	5. variant   the production variant the request is held to
//	6. set       the model's sticky set, waiting (bounded) for a catalogued adapter
//	7. subset    the proxy's subset hint (ext_proc)
//	8. pick      admission by the endpoint's strategy; Explain takes the
//	             no-load choice instead and admits nothing
//
// A step either fills the route or ends it with a *routeError, the one error
// type, which each front end renders in its own wire format (HTTP body and
// headers, ext_proc ImmediateResponse, gRPC status). The proxy's retries
// re-enter step 8 with a skip set (route.repick); an adapter's holders
// failing re-enter steps 6 to 8 on a newer view (route.awaitHolder).

// route is one request's way through the sequence: what each step found.
// It belongs to the goroutine serving the request.
type route struct {
	kind     apiKind
	endpoint string
	view     *view         // loaded once in step 1; replaced only by awaitHolder
	ev       *endpointView // nil when step 1 failed

	body   []byte    // what step 2 read (salted in step 3 when the salt applies)
	salted bool      // step 3 salted the body: body is a salted copy, or tail salts rest
	rest   io.Reader // the body after body, streamed after the pick; nil when body is all of it
	// tail salts the end of a salted body that streams (rest, or the
	// chunks an ext_proc proxy sends after the pick); nil otherwise.
	tail *tailSalter

	tenant, model string
	// key is the key whose ring order the pick follows: the fixed-length
	// key, or with adaptive keys the shallowest depth's until step 8
	// chooses the depth the request routes on (popular.go).
	key     uint64
	digests prefixDigests     // the prefix at the ladder's depths
	keys    [maxLevels]uint64 // routing keys of the first nkeys depths (levelKey)
	nkeys   int
	stream  bool // an OpenAI body's "stream": true (as far as step 2 read it)

	session   *instanceView // step 4: the session's instance; nil without a session
	sessionID string        // the container's own session id, sent to the instance

	variant string    // step 5: the variant the request is held to; "" for none
	set     *lora.Set // step 6
	skip    bitset    // set indexes steps 5 and 7 exclude
	hot     hotChoice
	cur     pick // step 8's admitted instance (cur.done releases it)
	start   time.Time
}

// routeInput is what a front end hands the sequence.
type routeInput struct {
	ctx      context.Context // bounds the adapter wait; the request's own
	kind     apiKind
	endpoint string
	header   http.Header // canonical keys; never nil
	src      bodySource
	subset   []string // the proxy's subset hint; nil for none
	// explain computes where the request would go with no load: it
	// counts nothing in the hot-key sketch and admits no instance.
	explain bool
}

// bodySource is how a front end supplies the body to step 2.
type bodySource interface {
	// read returns what the key needs of the body on ev: body and, when
	// the body goes on after it, the reader of the rest.
	read(ev *endpointView, kind apiKind) (body []byte, rest io.Reader, err *routeError)
	// whole returns the whole body, given what read returned (a hot key's
	// spread hash reads its end), and what the instance is then sent
	// after it (nil when nothing).
	whole(body []byte, rest io.Reader) ([]byte, io.Reader, *routeError)
}

// routeError is a request the sequence turned away: the status, the short
// code (the OpenAI "code", X-Prefixrouter-Error, and through errors.Is the
// class) and the message. Each front end renders it in its wire format.
type routeError struct {
	status int
	code   string
	msg    string
}

func (e *routeError) Error() string { return e.msg }

// Unwrap gives the class every front end maps: ErrInvalidRequest,
// ErrUnknownEndpoint, lora.ErrUnknownModel, lora.ErrModelNotReady or
// fleet.ErrNoInstance.
func (e *routeError) Unwrap() error {
	switch e.code {
	case codeUnknownEndpoint:
		return ErrUnknownEndpoint
	case codeUnknownModel:
		return lora.ErrUnknownModel
	case codeModelNotReady:
		return lora.ErrModelNotReady
	case codeNoInstance, codeNotLoaded:
		return fleet.ErrNoInstance
	case codeNeedBody:
		return ErrNeedBody
	case codeInternal:
		return nil
	}
	return ErrInvalidRequest
}

// codeNeedBody ends step 2 of a front end whose body is still arriving
// (ext_proc): it is not an answer, the front end asks again later.
const codeNeedBody = "need_body"

// labels are the endpoint and strategy labels of the request's metrics:
// "unknown" before the endpoint is known (a client's string must not make
// a series).
func (rt *route) labels() (endpoint, strategy string) {
	if rt.ev == nil {
		return "unknown", ""
	}
	return rt.endpoint, string(rt.ev.strategy)
}

// route runs the sequence. It always returns the route, filled as far as
// the steps went; a non-nil error ends it.
func (r *Router) route(in routeInput) (*route, *routeError) {
	rt := &route{kind: in.kind, endpoint: in.endpoint}
	// The steps are called one by one, not through a table of method
	// values: through func values the compiler cannot see that no step
	// keeps &in, and in moved to the heap on every request.
	err := r.stepEndpoint(rt, &in)
	if err == nil {
		err = r.stepBody(rt, &in)
	}
	if err == nil {
		err = r.stepParse(rt, &in)
	}
	if err == nil {
		err = r.stepSession(rt, &in)
	}
	if err == nil {
		err = r.stepVariant(rt, &in)
	}
	if err == nil {
		err = r.stepSet(rt, &in)
	}
	if err == nil {
		err = r.stepSubset(rt, &in)
	}
	if err == nil {
		err = r.stepPick(rt, &in)
	}
	return rt, err
}

// stepEndpoint loads the view once: the request uses it for its whole life.
func (r *Router) stepEndpoint(rt *route, in *routeInput) *routeError {
	if rt.view = r.view.Load(); rt.view == nil {
		return &routeError{statusNotLoaded(in.kind), codeNotLoaded, "no fleet snapshot loaded yet"}
	}
	if rt.ev = rt.view.endpoints[in.endpoint]; rt.ev == nil {
		return &routeError{statusNotFound(in.kind), codeUnknownEndpoint, fmt.Sprintf("endpoint %q not found", in.endpoint)}
	}
	return nil
}

// stepBody applies the size limit and reads what the key needs.
func (r *Router) stepBody(rt *route, in *routeInput) *routeError {
	var err *routeError
	rt.body, rt.rest, err = in.src.read(rt.ev, in.kind)
	return err
}

// stepParse builds the key from tenant, model and prefix, and salts the
// body of a tenant's OpenAI request when the endpoint asks for it.
func (r *Router) stepParse(rt *route, in *routeInput) *routeError {
	rr, err := parseRoute(in.kind, in.header, rt.body, rt.ev.prefixLen, rt.rest != nil && in.kind.openAI())
	if err != nil {
		return err
	}
	rt.tenant, rt.model, rt.key, rt.digests, rt.stream = rr.tenant, rr.model, rr.key, rr.digests, rr.stream
	if rt.ev.pop != nil {
		rt.key = rt.levelKey(0) // the variant's key; step 8 chooses the depth
	}
	if rt.ev.salt && rt.tenant != "" && in.kind.openAI() {
		rt.salted = true
		if rt.rest == nil {
			rt.body = r.salter.withCacheSalt(rt.body, rt.endpoint, rt.tenant)
			return nil
		}
		// The key was known before the body's end: the rest streams,
		// and the salt goes in at its end (salt.go).
		rt.body, rt.tail = r.salter.streamed(rt.body, rt.endpoint, rt.tenant)
		rt.rest = rt.tail.reader(rt.rest)
	}
	return nil
}

// stepSession finds the instance a stateful session id names (invoke
// paths). The id must name an instance of the endpoint that is not leaving;
// step 6 checks it serves the model, step 5 that it is in the variant.
func (r *Router) stepSession(rt *route, in *routeInput) *routeError {
	sid := in.header.Get(HeaderSessionID)
	if in.kind != kindInvoke || sid == "" || sid == NewSession {
		return nil
	}
	id, inner, ok := r.sessions.open(rt.endpoint, sid)
	if !ok {
		return &routeError{http.StatusBadRequest, codeInvalidSession, "X-Amzn-SageMaker-Session-Id is not a session id this endpoint issued"}
	}
	iv := rt.ev.instances[id]
	if iv == nil || iv.target == nil || iv.inst.Draining {
		return &routeError{http.StatusBadRequest, codeInvalidSession, "the session's instance has left the endpoint: the session is closed"}
	}
	rt.session, rt.sessionID = iv, inner
	return nil
}

// stepVariant holds the request to the production variant it names, or
// the one the endpoint's weights give its key (invoke paths).
func (r *Router) stepVariant(rt *route, in *routeInput) *routeError {
	if in.kind != kindInvoke {
		return nil
	}
	if rt.variant = in.header.Get(HeaderTargetVariant); rt.variant != "" || rt.session != nil {
		// A named variant holds; a session's instance is its own
		// variant (the weights split new traffic, not sessions).
		return nil
	}
	rt.variant = rt.ev.weightedVariant(rt.key)
	return nil
}

// stepSet finds the model's sticky set, waiting within AdapterWait for a
// catalogued adapter the agents are loading, and applies the variant.
func (r *Router) stepSet(rt *route, in *routeInput) *routeError {
	rt.start = time.Now()
	set, err := rt.ev.table.Set(rt.model)
	if errors.Is(err, lora.ErrNotLoaded) {
		v, ev, s, werr := r.waitLoaded(in.ctx, rt.view, rt.endpoint, rt.model, nil)
		if werr != nil {
			return &routeError{statusModelNotReady(in.kind), codeModelNotReady, fmt.Sprintf("adapter %q is not loaded yet: %v", rt.model, werr)}
		}
		rt.view, rt.ev, set, err = v, ev, s, nil
		rt.start = time.Now()
		if rt.session != nil {
			// The session's instance as the new view has it, if it
			// is still there.
			if rt.session = ev.instances[rt.session.inst.ID]; rt.session == nil || rt.session.target == nil || rt.session.inst.Draining {
				rt.session = nil
				return &routeError{http.StatusBadRequest, codeInvalidSession, "the session's instance has left the endpoint: the session is closed"}
			}
		}
	}
	switch {
	case errors.Is(err, lora.ErrUnknownModel):
		return &routeError{statusNotFound(in.kind), codeUnknownModel, fmt.Sprintf("model %q is not served by endpoint %q", rt.model, rt.endpoint)}
	case errors.Is(err, lora.ErrModelNotReady):
		return &routeError{statusModelNotReady(in.kind), codeModelNotReady, err.Error()}
	case err != nil:
		return &routeError{http.StatusServiceUnavailable, codeNoInstance, err.Error()}
	}
	rt.set = set
	if rt.variant != "" {
		skip, ok := variantSkip(rt.ev, set, rt.variant)
		switch {
		case ok:
			rt.skip = skip
		case in.header.Get(HeaderTargetVariant) != "":
			return &routeError{http.StatusBadRequest, codeUnknownModel, fmt.Sprintf("endpoint %q has no production variant %q serving the request", rt.endpoint, rt.variant)}
		default:
			// The weights chose a variant with no instance of the set:
			// the whole set serves.
			rt.variant = ""
		}
	}
	if rt.session != nil {
		i := set.Index(rt.session.inst)
		if i < 0 || rt.skip.has(i) {
			return &routeError{http.StatusBadRequest, codeInvalidSession, "the session's instance does not serve this model or variant"}
		}
		rt.cur.idx = i
	}
	return nil
}

// stepSubset excludes the instances outside the proxy's subset hint.
func (r *Router) stepSubset(rt *route, in *routeInput) *routeError {
	if in.subset == nil {
		return nil
	}
	for i := 0; i < rt.set.Len(); i++ {
		if iv := rt.ev.instance(rt.set, i); iv == nil || !inSubset(iv, in.subset) {
			rt.skip.set(i)
		}
	}
	if rt.session != nil && rt.skip.has(rt.cur.idx) {
		return &routeError{http.StatusServiceUnavailable, codeNoInstance, fmt.Sprintf("the session's instance is not in the proxy's subset of %d", len(in.subset))}
	}
	return nil
}

// stepPick admits an instance: the session's, else the strategy's pick.
// When every member of a catalogued adapter's set refuses (their breakers
// are open: crashed holders whose leases have not expired yet), it waits
// within AdapterWait for a member that is not one of them (issue 11).
func (r *Router) stepPick(rt *route, in *routeInput) *routeError {
	rt.hot = r.hotChoice(rt, in)
	if rt.hot.k > 1 && rt.rest != nil {
		// A hot key's spread hash reads the body's end (pick.go): such
		// requests are read whole.
		body, rest, err := in.src.whole(rt.body, rt.rest)
		if err != nil {
			return err
		}
		rt.body, rt.rest, rt.hot.spread = body, rest, spreadHash(body)
	}
	if in.explain {
		return nil // Explain reads the ring order itself (explain.go)
	}
	r.rate.requests.Add(1) // the replica's traffic, for ShareTraffic
	defer func() {
		r.metrics.pickSeconds.WithLabelValues(string(rt.ev.strategy)).Observe(time.Since(rt.start).Seconds())
	}()
	if rt.session != nil {
		// A session stays on its instance: no spill, no retry elsewhere
		// (its state lives there); only an open breaker refuses it.
		done, ok := rt.session.state.Acquire()
		if !ok {
			return &routeError{http.StatusServiceUnavailable, codeNoInstance, "the session's instance is failing (its circuit breaker is open)"}
		}
		rt.cur = pick{iv: rt.session, idx: rt.cur.idx, done: done, decision: DecisionSession}
		return nil
	}
	if p, ok := r.pick(rt, rt.skip); ok {
		rt.cur = p
		return nil
	}
	if _, catalogued := rt.ev.table.Endpoint().Adapter(rt.model); catalogued && rt.skip.empty() {
		var failed failedHolders
		for i := 0; i < rt.set.Len(); i++ {
			failed.add(rt.set.Instance(i))
		}
		if err := rt.awaitHolder(in.ctx, r, failed, time.Now().Add(r.opts.AdapterWait)); err != nil {
			return &routeError{statusModelNotReady(in.kind), codeModelNotReady, fmt.Sprintf("no instance holding adapter %q can take the request: %v", rt.model, err)}
		}
		return nil
	}
	msg := fmt.Sprintf("no instance of endpoint %q can take the request (all circuit breakers open)", rt.endpoint)
	if in.subset != nil {
		msg = fmt.Sprintf("no instance of endpoint %q in the proxy's subset of %d can take the request", rt.endpoint, len(in.subset))
	}
	return &routeError{http.StatusServiceUnavailable, codeNoInstance, msg}
}

// hotChoice is the key's replication, or with adaptive keys the depth the
// request routes on: counted in the endpoint's sketch by the data plane,
// read only by Explain.
func (r *Router) hotChoice(rt *route, in *routeInput) hotChoice {
	if rt.session != nil || rt.ev.hot == nil {
		return hotChoice{}
	}
	if rt.ev.pop != nil {
		if !in.explain {
			rt.count()
		}
		c := rt.ev.pop.treeChoice(rt)
		rt.key = c.key
		if c.byLoad {
			c.spread = spreadHash(rt.body)
		}
		return c
	}
	if in.explain {
		k := rt.ev.hot.K(rt.key, rt.set.Len())
		if k <= 1 {
			return hotChoice{k: 1}
		}
		return hotChoice{k: k, spread: spreadHash(rt.body)}
	}
	return newHotChoice(rt.ev, rt.set, rt.key, rt.body)
}

// repick is step 8 again for a retry: the next admission for the key,
// skipping the instances in skip (those tried, and those steps 5 and 7
// excluded).
func (rt *route) repick(r *Router, skip bitset) (pick, bool) { return r.pick(rt, skip) }

// awaitHolder re-enters steps 6 to 8 on newer views: it waits, until
// deadline, for a view in which the model's set has a member that failed
// does not avoid, and admits one for the key. A view whose new members
// cannot take the request either (their breakers are open) is skipped for
// the next one. The route then belongs to that view.
func (rt *route) awaitHolder(ctx context.Context, r *Router, failed failedHolders, deadline time.Time) error {
	v := rt.view
	for {
		var ev *endpointView
		var set *lora.Set
		var err error
		// v becomes the view waited for: the next round waits for the
		// view after it.
		v, ev, set, err = r.waitLoadedUntil(ctx, v, rt.endpoint, rt.model, failed.accept, deadline)
		if err != nil {
			return err
		}
		var skip bitset
		for i := 0; i < set.Len(); i++ {
			if failed.avoid(set.Instance(i)) {
				skip.set(i)
			}
		}
		next := &route{view: v, ev: ev, set: set, key: rt.key}
		if p, ok := r.pick(next, skip); ok {
			rt.view, rt.ev, rt.set, rt.hot, rt.skip, rt.cur = v, ev, set, hotChoice{}, bitset{}, p
			return nil
		}
	}
}

// httpBody is the HTTP data plane's body source: it reads from the client
// as the key needs, and streams the rest after the pick.
type httpBody struct {
	r     *Router // its body arena (heldbody.go)
	w     http.ResponseWriter
	req   *http.Request
	limit int64
}

func (b httpBody) read(ev *endpointView, kind apiKind) ([]byte, io.Reader, *routeError) {
	if kind == kindInvoke {
		return readHead(b.w, b.req, b.limit, ev.prefixLen)
	}
	return b.r.readOpenAIHead(b.w, b.req, b.limit, kind == kindChat, ev.prefixLen)
}

func (b httpBody) whole(body []byte, rest io.Reader) ([]byte, io.Reader, *routeError) {
	return b.r.readRest(b.req, body, rest, b.limit)
}

// heldBody is the body a front end holds in memory: all of it (Explain,
// ext_proc at the end of the stream), or what has arrived so far
// (ext_proc while the body streams in, in held).
type heldBody struct {
	body     []byte
	complete bool
	limit    int64
	held     *HeldBody // the body while it arrives; nil when body is all of it
}

func (b heldBody) read(ev *endpointView, kind apiKind) ([]byte, io.Reader, *routeError) {
	if b.held != nil && b.held.declared > b.limit {
		// As on the HTTP data plane: at once, from the declared length.
		return nil, nil, &routeError{http.StatusRequestEntityTooLarge, codeTooLarge, fmt.Sprintf("request body of %d bytes exceeds the limit of %d bytes", b.held.declared, b.limit)}
	}
	if int64(len(b.body)) > b.limit {
		return nil, nil, &routeError{http.StatusRequestEntityTooLarge, codeTooLarge, fmt.Sprintf("request body exceeds the limit of %d bytes", b.limit)}
	}
	switch {
	case b.complete:
		return b.body, nil, nil
	case kind == kindInvoke:
		// An invoke key needs the first PrefixLength bytes.
		if len(b.body) >= ev.prefixLen {
			return b.body, heldMore{}, nil
		}
	case b.held != nil && len(b.body) >= b.held.try:
		// An OpenAI key may need the body's end (model and
		// prompt_cache_key may follow the messages): it is tried, as
		// the HTTP data plane tries it, from 16 KiB and at each
		// doubling (readOpenAIHead).
		if _, ok := parseOpenAIHead(b.body, kind == kindChat, ev.prefixLen); ok {
			return b.body, heldMore{}, nil
		}
		b.held.try = 2 * len(b.body)
	}
	return nil, nil, &routeError{0, codeNeedBody, ErrNeedBody.Error()}
}

// whole is what has arrived: a hot key's spread hash on the ext_proc path
// reads the end of the body held at the pick (docs/envoy.md).
func (b heldBody) whole(body []byte, _ io.Reader) ([]byte, io.Reader, *routeError) {
	return body, nil, nil
}

// heldMore is the rest of a body a front end holds while it arrives: the
// front end sends it on itself, nothing reads it here.
type heldMore struct{}

func (heldMore) Read([]byte) (int, error) { return 0, io.EOF }
