package router

import (
	"io"
	"net/http"
	"runtime/debug"
	"slices"
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

// routeRequest is what a request contributes to routing.
type routeRequest struct {
	tenant  string
	model   string
	key     uint64        // the fixed-length key: tenant, model, digests.last()
	digests prefixDigests // the prefix at the ladder's depths (issue 21)
	stream  bool          // an OpenAI body asking for a streamed answer ("stream": true)
}

// parseRoute extracts tenant, model and routing key from the body read so
// far; head says that body is the start of an OpenAI body that
// readOpenAIHead found holds the key's inputs.
func parseRoute(kind apiKind, h http.Header, body []byte, prefixLen int, head bool) (routeRequest, *routeError) {
	var rr routeRequest
	if kind == kindInvoke {
		if vals, ok := h[HeaderTenant]; ok {
			if len(vals) != 1 || !validTenant(vals[0]) {
				return rr, &routeError{http.StatusBadRequest, codeInvalidTenant, "X-Amzn-SageMaker-Prefix-Aware-Id must be 1 to 64 printable ASCII characters"}
			}
			rr.tenant = vals[0]
		}
		rr.model = h.Get(HeaderTargetModel)
		if ic := h.Get(HeaderInferenceComponent); ic != "" {
			rr.model = ic // the component's set, exactly like an adapter's
		}
		rr.digests = invokeDigests(body, prefixLen)
		rr.key = routingKey(rr.tenant, rr.model, rr.digests.last())
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
		return rr, &routeError{http.StatusBadRequest, codeInvalidJSON, "invalid request body: " + err.Error()}
	}
	if o.hasTenant && !validTenant(o.tenant) {
		return rr, &routeError{http.StatusBadRequest, codeInvalidTenant, "prompt_cache_key must be 1 to 64 printable ASCII characters"}
	}
	rr.tenant, rr.model, rr.digests, rr.stream = o.tenant, o.model, o.digests, o.stream
	rr.key = routingKey(rr.tenant, rr.model, o.prefix)
	return rr, nil
}

// reject answers a router-made error and counts it.
func (r *Router) reject(w http.ResponseWriter, req *http.Request, kind apiKind, endpoint, strategy string, e *routeError) {
	traceReject(req.Context(), endpoint, strategy, e)
	writeError(w, kind, e.status, e.code, e.msg)
	r.metrics.requests.WithLabelValues(endpoint, strategy, decisionNone, r.metrics.code(e.status)).Inc()
}

// serve is the HTTP front end: it runs the routing sequence (route.go) on
// the request and proxies it to the admitted instance, or answers the
// sequence's error. stream frames the answer as an AWS event stream.
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
			r.reject(w, req, kind, "unknown", "", &routeError{http.StatusInternalServerError, codeInternal, "internal failure of the router"})
		}
	}()
	rt, err := r.route(routeInput{
		ctx: req.Context(), kind: kind, endpoint: endpoint, header: req.Header,
		src: httpBody{r: r, w: w, req: req, limit: r.opts.MaxBodyBytes},
	})
	var a *attempt
	defer func() {
		// Our upstream transport reads the body on this goroutine; the
		// net/http fallback (https instances) may still read it after the
		// answer, so such bodies are left to the collector.
		if a == nil || !a.bodyAsync {
			r.putHead(req.Context(), rt.body)
		}
	}()
	if err != nil {
		if err.code == codeModelNotReady && req.Context().Err() != nil {
			return // the client left while the request waited for an adapter
		}
		ep, strategy := rt.labels()
		r.reject(w, req, kind, ep, strategy, err)
		return
	}
	if rt.session != nil {
		req.Header.Set(HeaderSessionID, rt.sessionID)
	}
	a = &attempt{r: r, route: rt, upstreamPath: upstreamPath, stream: stream, streaming: stream || rt.stream, tried: rt.skip}
	proxied = true
	r.proxy.serve(w, req, a)
}
