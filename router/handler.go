package router

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"slices"
	"time"

	"github.com/prefixrouter/prefixrouter/lora"
)

// Short error codes (the OpenAI "code" and X-Prefixrouter-Error).
const (
	codeInvalidJSON     = "invalid_json"
	codeInvalidTenant   = "invalid_tenant_id"
	codeBadBody         = "invalid_request"
	codeTooLarge        = "request_too_large"
	codeUnknownEndpoint = "endpoint_not_found"
	codeUnknownModel    = "model_not_found"
	codeNoInstance      = "no_instance_available"
	codeNotLoaded       = "fleet_not_loaded"
	codeUpstream        = "upstream_error"
	codeUnreachable     = "upstream_unreachable"
	codeUpstreamStatus  = "upstream_status"
	codeModelNotReady   = "model_not_ready"
	codeInvalidSession  = "invalid_session_id"
	codeInternal        = "internal_error"
)

// Upstream paths (see the issue: every invoke path maps to /invocations).
const (
	upInvocations = "/invocations"
	upChat        = "/v1/chat/completions"
	upCompletions = "/v1/completions"
)

func (r *Router) routes() *http.ServeMux {
	mux := http.NewServeMux()
	data := func(kind apiKind, upstream string, scoped bool) http.HandlerFunc {
		return func(w http.ResponseWriter, req *http.Request) {
			ep := r.opts.DefaultEndpoint
			if scoped {
				ep = req.PathValue("endpoint")
			}
			r.serve(w, req, kind, upstream, ep, false)
		}
	}
	mux.HandleFunc("POST /endpoints/{endpoint}/invocations", data(kindInvoke, upInvocations, true))
	mux.HandleFunc("POST /endpoints/{endpoint}/invocations-response-stream", func(w http.ResponseWriter, req *http.Request) {
		r.serve(w, req, kindInvoke, upInvocations, req.PathValue("endpoint"), true)
	})
	mux.HandleFunc("POST /invocations", data(kindInvoke, upInvocations, false))
	mux.HandleFunc("POST /v1/chat/completions", data(kindChat, upChat, false))
	mux.HandleFunc("POST /v1/completions", data(kindCompletions, upCompletions, false))
	mux.HandleFunc("POST /endpoints/{endpoint}/openai/v1/chat/completions", data(kindChat, upChat, true))
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, req *http.Request) {
		r.models(w, req, r.opts.DefaultEndpoint)
	})
	mux.HandleFunc("GET /endpoints/{endpoint}/openai/v1/models", func(w http.ResponseWriter, req *http.Request) {
		r.models(w, req, req.PathValue("endpoint"))
	})
	live := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	}
	mux.HandleFunc("GET /ping", live)
	mux.HandleFunc("GET /healthz", live)
	mux.HandleFunc("GET /readyz", r.ServeReadyz)
	return mux
}

// modelLabel is the model label of the usage metrics: a model the
// endpoint's fleet records name, "" for none, "unlisted" for any other
// (the label must not take arbitrary client strings).
func modelLabel(ev *endpointView, model string) string {
	if model == "" {
		return ""
	}
	if _, ok := slices.BinarySearch(ev.table.Models(), model); ok {
		return model
	}
	return "unlisted"
}

// noInstance is the rejection when lora has no instance for a model: a
// named model whose instances are all draining, or a catalogued adapter
// not loaded yet (the ext_proc front end does not wait for it), is not
// ready (SageMaker's ModelNotReadyException); otherwise the endpoint has
// no capacity.
func noInstance(kind apiKind, err error) *reqError {
	if errors.Is(err, lora.ErrModelNotReady) || errors.Is(err, lora.ErrNotLoaded) {
		return &reqError{statusModelNotReady(kind), codeModelNotReady, err.Error()}
	}
	return &reqError{http.StatusServiceUnavailable, codeNoInstance, err.Error()}
}

// reqError is a client-facing rejection before any pick.
type reqError struct {
	status int
	code   string
	msg    string
}

func (e *reqError) Error() string { return e.msg }

// routeRequest is what a request contributes to routing.
type routeRequest struct {
	tenant string
	model  string
	key    uint64
}

// parseRequest extracts tenant, model and routing key from a request whose
// body has been read.
func parseRequest(kind apiKind, h http.Header, body []byte, prefixLen int) (routeRequest, *reqError) {
	return parseRoute(kind, h, body, prefixLen, false)
}

// parseRoute is parseRequest; head says that body is the start of an
// OpenAI body that readOpenAIHead found holds the key's inputs.
func parseRoute(kind apiKind, h http.Header, body []byte, prefixLen int, head bool) (routeRequest, *reqError) {
	var rr routeRequest
	if kind == kindInvoke {
		if vals, ok := h[HeaderTenant]; ok {
			if len(vals) != 1 || !validTenant(vals[0]) {
				return rr, &reqError{http.StatusBadRequest, codeInvalidTenant, "X-Amzn-SageMaker-Prefix-Aware-Id must be 1 to 64 printable ASCII characters"}
			}
			rr.tenant = vals[0]
		}
		rr.model = h.Get(HeaderTargetModel)
		if ic := h.Get(HeaderInferenceComponent); ic != "" {
			rr.model = ic // the component's set, exactly like an adapter's
		}
		rr.key = routingKey(rr.tenant, rr.model, invokePrefix(body, prefixLen))
		return rr, nil
	}
	var o openAIRequest
	var err error
	if head {
		o, _ = parseOpenAIHead(body, kind == kindChat, prefixLen)
	} else {
		o, err = parseOpenAI(body, kind == kindChat, prefixLen)
	}
	if err != nil {
		return rr, &reqError{http.StatusBadRequest, codeInvalidJSON, "invalid request body: " + err.Error()}
	}
	if o.hasTenant && !validTenant(o.tenant) {
		return rr, &reqError{http.StatusBadRequest, codeInvalidTenant, "prompt_cache_key must be 1 to 64 printable ASCII characters"}
	}
	rr.tenant, rr.model = o.tenant, o.model
	rr.key = routingKey(rr.tenant, rr.model, o.prefix)
	return rr, nil
}

// initialBodyBuffer caps the buffer readBody allocates before any byte of
// the body has arrived.
const initialBodyBuffer = 64 << 10

// readBody reads the whole body, up to limit bytes.
func readBody(w http.ResponseWriter, req *http.Request, limit int64) ([]byte, *reqError) {
	if req.ContentLength > limit {
		return nil, &reqError{http.StatusRequestEntityTooLarge, codeTooLarge, fmt.Sprintf("request body of %d bytes exceeds the limit of %d bytes", req.ContentLength, limit)}
	}
	var buf bytes.Buffer
	// Never allocate what a client only declares: 200 sockets announcing
	// 6 MiB and sending nothing held 1.2 GiB (issue 12). Start small and
	// grow with the bytes that actually arrive.
	if req.ContentLength > 0 {
		buf.Grow(int(min(req.ContentLength, initialBodyBuffer)) + bytes.MinRead)
	}
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, req.Body, limit)); err != nil {
		return nil, bodyError(err, limit)
	}
	return buf.Bytes(), nil
}

// reject answers a router-made error and counts it.
func (r *Router) reject(w http.ResponseWriter, req *http.Request, kind apiKind, endpoint, strategy string, e *reqError) {
	traceReject(req.Context(), endpoint, strategy, e)
	writeError(w, kind, e.status, e.code, e.msg)
	r.metrics.requests.WithLabelValues(endpoint, strategy, decisionNone, r.metrics.code(e.status)).Inc()
}

// serve routes one data-plane request.
// stream frames the answer as an AWS event stream.
func (r *Router) serve(w http.ResponseWriter, req *http.Request, kind apiKind, upstreamPath, endpoint string, stream bool) {
	proxied := false
	defer func() {
		// A bug before the proxy wrote anything answers SageMaker's
		// InternalFailure (500) instead of a dropped connection; once the
		// proxy runs, panics go on (ErrAbortHandler ends a broken stream).
		if p := recover(); p != nil {
			if proxied {
				panic(p)
			}
			r.log.Error("router: internal failure", "endpoint", endpoint, "panic", p, "stack", string(debug.Stack()))
			r.reject(w, req, kind, "unknown", "", &reqError{http.StatusInternalServerError, codeInternal, "internal failure of the router"})
		}
	}()
	v := r.view.Load()
	if v == nil {
		r.reject(w, req, kind, "unknown", "", &reqError{statusNotLoaded(kind), codeNotLoaded, "no fleet snapshot loaded yet"})
		return
	}
	ev := v.endpoints[endpoint]
	if ev == nil {
		// The label is not the client's string: unknown names must not
		// create metric series.
		r.reject(w, req, kind, "unknown", "", &reqError{statusNotFound(kind), codeUnknownEndpoint, fmt.Sprintf("endpoint %q not found", endpoint)})
		return
	}
	strategy := string(ev.strategy)
	// Read what the key needs and stream the rest after the pick
	// (body.go): the first PrefixLength bytes of an invoke body; an OpenAI
	// body up to where model, prompt_cache_key and the prompt's prefix are
	// all known. A salted body is read whole: the salt goes at its end.
	var body []byte
	var rest io.Reader
	var berr *reqError
	switch {
	case kind == kindInvoke:
		body, rest, berr = readHead(w, req, r.opts.MaxBodyBytes, ev.prefixLen)
	case !ev.salt:
		body, rest, berr = r.readOpenAIHead(w, req, r.opts.MaxBodyBytes, kind == kindChat, ev.prefixLen)
	default:
		body, berr = readBody(w, req, r.opts.MaxBodyBytes)
	}
	if berr != nil {
		r.reject(w, req, kind, endpoint, strategy, berr)
		return
	}
	var a *attempt
	defer func() {
		// Our upstream transport reads the body on this goroutine; the
		// net/http fallback (https instances) may still read it after the
		// answer, so such bodies are left to the collector.
		if a == nil || !a.bodyAsync {
			r.putHead(req.Context(), body)
		}
	}()
	rr, rerr := parseRoute(kind, req.Header, body, ev.prefixLen, rest != nil && kind.openAI())
	if rerr != nil {
		r.reject(w, req, kind, endpoint, strategy, rerr)
		return
	}
	if ev.salt && rr.tenant != "" && kind.openAI() {
		body = r.salter.withCacheSalt(body, endpoint, rr.tenant)
	}
	start := time.Now()
	set, err := ev.table.Set(rr.model)
	if errors.Is(err, lora.ErrNotLoaded) {
		// A catalogued adapter the agents are loading: wait for it.
		if v, ev, set, err = r.waitLoaded(req.Context(), v, endpoint, rr.model, nil); err != nil {
			if req.Context().Err() == nil {
				r.reject(w, req, kind, endpoint, strategy, &reqError{statusModelNotReady(kind), codeModelNotReady, fmt.Sprintf("adapter %q is not loaded yet: %v", rr.model, err)})
			}
			return
		}
		start = time.Now()
	}
	if err != nil {
		if errors.Is(err, lora.ErrUnknownModel) {
			r.reject(w, req, kind, endpoint, strategy, &reqError{statusNotFound(kind), codeUnknownModel, fmt.Sprintf("model %q is not served by endpoint %q", rr.model, endpoint)})
		} else {
			r.reject(w, req, kind, endpoint, strategy, noInstance(kind, err))
		}
		return
	}
	var skip bitset
	var p pick
	var ok, pinned bool
	if kind == kindInvoke {
		if variant := req.Header.Get(HeaderTargetVariant); variant != "" {
			if skip, ok = variantSkip(ev, set, variant); !ok {
				r.reject(w, req, kind, endpoint, strategy, &reqError{http.StatusBadRequest, codeUnknownModel, fmt.Sprintf("endpoint %q has no production variant %q serving the request", endpoint, variant)})
				return
			}
		} else if variant := ev.weightedVariant(rr.key); variant != "" {
			// The weights' choice; a variant with no instance of the
			// set leaves the whole set.
			if s, ok := variantSkip(ev, set, variant); ok {
				skip = s
			}
		}
		if sid := req.Header.Get(HeaderSessionID); sid != "" && sid != NewSession {
			var rerr *reqError
			if p, rerr = r.pickSession(ev, set, req.Header.Get(HeaderTargetVariant), req.Header, sid); rerr != nil {
				r.reject(w, req, kind, endpoint, strategy, rerr)
				return
			}
			ok, pinned = true, true
		}
	}
	hc := newHotChoice(ev, set, rr.key, body)
	if hc.k > 1 && rest != nil {
		// A hot key's spread hash reads the body's end (pick.go): such
		// requests are read whole, as before.
		if body, rerr = readRest(body, rest, r.opts.MaxBodyBytes); rerr != nil {
			r.reject(w, req, kind, endpoint, strategy, rerr)
			return
		}
		rest, hc.spread = nil, spreadHash(body)
	}
	if !pinned {
		p, ok = r.pick(ev, set, rr.key, hc, v.snap.Replicas, skip)
	}
	r.metrics.pickSeconds.WithLabelValues(strategy).Observe(time.Since(start).Seconds())
	if _, catalogued := ev.table.Endpoint().Adapter(rr.model); !ok && catalogued && skip.empty() {
		// Every member of the adapter's set has its breaker open: its
		// holders crashed (their leases not yet expired) or fail. The
		// agents place the adapter elsewhere once etcd drops a crashed
		// record; hold the request for a member that is not one of these,
		// as for an adapter not loaded yet (issue 11).
		var failed failedHolders
		for i := 0; i < set.Len(); i++ {
			failed.add(set.Instance(i))
		}
		if v, ev, set, p, err = r.waitPick(req.Context(), v, endpoint, rr.model, rr.key, failed, time.Now().Add(r.opts.AdapterWait)); err != nil {
			if req.Context().Err() == nil {
				r.reject(w, req, kind, endpoint, strategy, &reqError{statusModelNotReady(kind), codeModelNotReady, fmt.Sprintf("no instance holding adapter %q can take the request: %v", rr.model, err)})
			}
			return
		}
		ok, hc = true, hotChoice{}
	}
	if !ok {
		r.reject(w, req, kind, endpoint, strategy, &reqError{http.StatusServiceUnavailable, codeNoInstance, fmt.Sprintf("no instance of endpoint %q can take the request (all circuit breakers open)", endpoint)})
		return
	}
	a = &attempt{
		r: r, kind: kind, endpoint: endpoint, ev: ev, set: set, key: rr.key, hot: hc, model: rr.model, view: v,
		replicas: v.snap.Replicas, upstreamPath: upstreamPath, stream: stream, cur: p, tried: skip, pinned: pinned,
	}
	proxied = true
	r.proxy.serve(w, req, body, rest, a)
}
