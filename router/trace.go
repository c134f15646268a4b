package router

import (
	"context"
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/prefixrouter/prefixrouter/overload"
)

// Span attributes of a routed request (see docs/operations.md, tracing).
const (
	AttrEndpoint = attribute.Key("prefixrouter.endpoint")
	AttrStrategy = attribute.Key("prefixrouter.strategy")
	AttrDecision = attribute.Key("prefixrouter.decision")
	AttrInstance = attribute.Key("prefixrouter.instance")
	// AttrSpill is why the key's ring primary did not take the request
	// (set only when it did not): one of the Spill* values.
	AttrSpill   = attribute.Key("prefixrouter.spill_reason")
	AttrRetries = attribute.Key("prefixrouter.retries")
	AttrError   = attribute.Key("prefixrouter.error") // code of a router-made error
)

// Spill reasons: why a PREFIX_AWARE pick passed over the ring's primary.
const (
	SpillThreshold = "threshold" // at its ConcurrencyThreshold share
	SpillBalance   = "balance"   // above the balance bound (BalanceFactor)
	SpillBreaker   = "breaker"   // breaker open, or half-open and already probing
	SpillHealth    = "health"    // marked down by active health checks
	SpillTried     = "tried"     // a retry: it already failed to connect
)

// spill is a Spill* reason in one byte: picks carry it on the request path.
type spill uint8

const (
	spillNone spill = iota
	spillThreshold
	spillBalance
	spillBreaker
	spillHealth
	spillTried
)

var spillNames = [...]string{"", SpillThreshold, SpillBalance, SpillBreaker, SpillHealth, SpillTried}

func (s spill) String() string { return spillNames[s] }

// spillReason classifies a refused admission of s, read just after the
// refusal (racy, as every load read is; it labels a trace, not a decision).
func spillReason(s *overload.State, threshold, replicas int, bound int64) spill {
	switch {
	case s.Ejected():
		return spillBreaker
	case !s.HasRoom(threshold, replicas):
		return spillThreshold
	case bound > 0:
		return spillBalance
	}
	return spillBreaker // half-open: the breaker lets one probe through at a time
}

// traceContext is W3C Trace Context: traceparent and tracestate.
var traceContext propagation.TextMapPropagator = propagation.TraceContext{}

// instrument wraps the handler and the upstream transport when tracing is
// on: a server span per request (the router's attributes are added to it)
// and a client span per upstream try, whose context travels upstream in
// traceparent.
func instrument(tp trace.TracerProvider, h http.Handler, tr http.RoundTripper) (http.Handler, http.RoundTripper) {
	if tp == nil {
		return h, tr
	}
	opts := []otelhttp.Option{otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(traceContext)}
	return otelhttp.NewHandler(h, "prefixrouter.route", opts...), otelhttp.NewTransport(tr, opts...)
}

// traceFinish records the routing of a request on its span. With tracing off
// the span does not record and nothing is built.
func (a *attempt) traceFinish(ctx context.Context) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(
		AttrEndpoint.String(a.endpoint),
		AttrStrategy.String(string(a.ev.strategy)),
		AttrDecision.String(a.cur.decision),
		AttrInstance.String(a.cur.iv.inst.ID),
		AttrRetries.Int(a.retries),
	)
	if a.cur.spill != spillNone {
		span.SetAttributes(AttrSpill.String(a.cur.spill.String()))
	}
}

// traceReject records a rejection before any pick.
func traceReject(ctx context.Context, endpoint, strategy string, e *routeError) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(AttrEndpoint.String(endpoint), AttrStrategy.String(strategy), AttrDecision.String(decisionNone), AttrError.String(e.code))
}
