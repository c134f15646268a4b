package router

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/overload"
)

// tracedRouter serves a router with tracing into an in-memory exporter;
// every backend records the traceparent it received.
type tracedRouter struct {
	r        *Router
	srv      *httptest.Server
	exp      *tracetest.InMemoryExporter
	backends map[string]*backend
	parents  chan string // traceparent headers seen upstream
}

func newTracedRouter(t *testing.T, threshold int) *tracedRouter {
	t.Helper()
	tr := &tracedRouter{exp: tracetest.NewInMemoryExporter(), backends: map[string]*backend{}, parents: make(chan string, 64)}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tr.exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	upstream := NewTransport(0)
	r, err := New(Options{DefaultEndpoint: "ep", TracerProvider: tp, Transport: upstream,
		Breaker: overload.BreakerOptions{ConsecutiveFailures: 1, OpenTimeout: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	ep := fleet.Endpoint{Name: "ep", Config: fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware,
		PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: fleet.MinPrefixLength, ConcurrencyThreshold: threshold}}}
	for _, id := range []string{"a", "b", "c"} {
		b := newBackend(t, id)
		b.handler = func(w http.ResponseWriter, req *http.Request) {
			tr.parents <- req.Header.Get("Traceparent")
			_, _ = io.Copy(io.Discard, req.Body)
			if req.Header.Get("X-Test-Block") != "" {
				select {
				case <-b.release:
				case <-req.Context().Done():
				}
			}
			if req.Header.Get("X-Test-Fail") != "" {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			_, _ = io.WriteString(w, "{}")
		}
		tr.backends[id] = b
		ep.Instances = append(ep.Instances, fleet.Instance{ID: id, Addr: b.srv.URL})
	}
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{ep}, 0, 1, time.Now()))
	tr.r, tr.srv = r, httptest.NewServer(r)
	t.Cleanup(func() {
		tr.srv.Close()
		upstream.CloseIdleConnections()
		_ = r.Close()
	})
	return tr
}

func (tr *tracedRouter) post(t *testing.T, body string, h map[string]string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, tr.srv.URL+"/invocations", strings.NewReader(body))
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// serverSpan waits for the n-th (1-based) server span to be exported: the
// span ends when the handler returns, just after the client has its answer.
func (tr *tracedRouter) serverSpan(t *testing.T, n int) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	testsupport.Eventually(t, 5*time.Second, "the request's server span", func() bool {
		found = found[:0]
		for _, s := range tr.exp.GetSpans() {
			if s.SpanKind == trace.SpanKindServer {
				found = append(found, s)
			}
		}
		return len(found) >= n
	})
	return found[n-1]
}

func attrs(s tracetest.SpanStub) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value.Emit()
	}
	return m
}

// TestTracing: the request's span carries the routing decision, the
// upstream request carries the span's trace in traceparent, and a spill
// names its reason.
func TestTracing(t *testing.T) {
	tr := newTracedRouter(t, 1)
	body := strings.Repeat("shared prefix ", 100)
	ex, err := tr.r.Explain(context.Background(), PickRequest{Endpoint: "ep", Path: "/invocations", Header: nil, Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	primary, second := ex.Candidates[0], ex.Candidates[1]

	// The client's own trace context continues through the router.
	const clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	resp := tr.post(t, body, map[string]string{"Traceparent": "00-" + clientTrace + "-00f067aa0ba902b7-01"})
	parent := <-tr.parents
	span := tr.serverSpan(t, 1)
	a := attrs(span)
	want := map[attribute.Key]string{AttrEndpoint: "ep", AttrStrategy: "PREFIX_AWARE", AttrDecision: DecisionAffinity, AttrInstance: primary, AttrRetries: "0"}
	for k, v := range want {
		if a[k] != v {
			t.Errorf("span attribute %s = %q, want %q (all: %v)", k, a[k], v, a)
		}
	}
	if _, ok := a[AttrSpill]; ok {
		t.Errorf("an affinity pick has a spill reason: %v", a)
	}
	if resp.Header.Get(HeaderInstance) != primary {
		t.Fatalf("answered by %s, want %s", resp.Header.Get(HeaderInstance), primary)
	}
	if span.SpanContext.TraceID().String() != clientTrace {
		t.Errorf("span trace %s, want the client's %s", span.SpanContext.TraceID(), clientTrace)
	}
	// traceparent: version-traceid-spanid-flags; the upstream sees the
	// client's trace and a span of this router's (the upstream try).
	f := strings.Split(parent, "-")
	if len(f) != 4 || f[1] != clientTrace || f[2] == "00f067aa0ba902b7" {
		t.Fatalf("upstream traceparent %q: want trace %s and a router span", parent, clientTrace)
	}

	// Threshold 1: while one request holds the primary, the same key
	// spills to the next candidate, for the reason "threshold".
	held := make(chan struct{})
	go func() {
		defer close(held)
		tr.post(t, body, map[string]string{"X-Test-Block": "1"})
	}()
	<-tr.parents // the held request reached the primary
	tr.post(t, body, nil)
	<-tr.parents
	close(tr.backends[primary].release)
	<-held
	var spilled tracetest.SpanStub
	testsupport.Eventually(t, 5*time.Second, "three server spans", func() bool { return countServer(tr.exp) >= 3 })
	for _, s := range tr.exp.GetSpans() {
		if s.SpanKind == trace.SpanKindServer && attrs(s)[AttrDecision] == DecisionSpill {
			spilled = s
		}
	}
	a = attrs(spilled)
	if a[AttrSpill] != SpillThreshold || a[AttrInstance] != second {
		t.Fatalf("spilled span: %v; want reason %q and instance %s", a, SpillThreshold, second)
	}

	// A 503 opens the primary's breaker (ConsecutiveFailures 1): the next
	// request spills for the reason "breaker".
	tr.post(t, body, map[string]string{"X-Test-Fail": "1"})
	<-tr.parents
	testsupport.Eventually(t, 5*time.Second, "the primary's breaker to open", func() bool {
		st, _ := tr.r.Status("ep", primary)
		return st.Breaker == gobreaker.StateOpen
	})
	tr.exp.Reset()
	tr.post(t, body, nil)
	<-tr.parents
	a = attrs(tr.serverSpan(t, 1))
	if a[AttrSpill] != SpillBreaker || a[AttrInstance] == primary {
		t.Fatalf("span after the breaker opened: %v; want reason %q", a, SpillBreaker)
	}
}

func countServer(exp *tracetest.InMemoryExporter) int {
	n := 0
	for _, s := range exp.GetSpans() {
		if s.SpanKind == trace.SpanKindServer {
			n++
		}
	}
	return n
}

// TestTracingSpillHealth: a primary marked down by health checks is passed
// over for the reason "health".
func TestTracingSpillHealth(t *testing.T) {
	tr := newTracedRouter(t, 4)
	body := strings.Repeat("health prefix ", 100)
	ex, err := tr.r.Explain(context.Background(), PickRequest{Endpoint: "ep", Path: "/invocations", Header: nil, Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	tr.r.view.Load().endpoints["ep"].instances[ex.Instance].state.ObserveProbe(false, 1)
	resp := tr.post(t, body, nil)
	<-tr.parents
	a := attrs(tr.serverSpan(t, 1))
	if a[AttrSpill] != SpillHealth || a[AttrInstance] == ex.Instance || resp.Header.Get(HeaderInstance) != a[AttrInstance] {
		t.Fatalf("span %v (answered by %s); want reason %q and not the down primary %s", a, resp.Header.Get(HeaderInstance), SpillHealth, ex.Instance)
	}
}
