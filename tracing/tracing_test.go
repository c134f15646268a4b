package tracing_test

import (
	"context"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"

	"github.com/prefixrouter/prefixrouter/tracing"
	"github.com/prefixrouter/prefixrouter/tracing/tracingtest"
)

// exportOne starts a provider, ends one span and flushes it.
func exportOne(t *testing.T, o tracing.Options) *tracing.Provider {
	t.Helper()
	p, err := tracing.Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if p == nil {
		return nil
	}
	_, span := p.TracerProvider().Tracer("test").Start(context.Background(), "one")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	return p
}

func resourceAttrs(req *collectorpb.ExportTraceServiceRequest) map[string]string {
	m := map[string]string{}
	for _, rs := range req.GetResourceSpans() {
		for _, kv := range rs.GetResource().GetAttributes() {
			m[kv.GetKey()] = kv.GetValue().GetStringValue()
		}
	}
	return m
}

func TestExportsToEndpoint(t *testing.T) {
	c, url := tracingtest.Start(t)
	exportOne(t, tracing.Options{Endpoint: url, InstanceID: "r1"})
	req := <-c.Got
	a := resourceAttrs(req)
	if a["service.name"] != tracing.DefaultServiceName || a["service.instance.id"] != "r1" {
		t.Fatalf("resource %v", a)
	}
	if n := len(req.GetResourceSpans()[0].GetScopeSpans()[0].GetSpans()); n != 1 {
		t.Fatalf("%d spans exported, want 1", n)
	}
}

func TestStandardEnvironment(t *testing.T) {
	c, url := tracingtest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
	t.Setenv("OTEL_SERVICE_NAME", "edge-router")
	if p := exportOne(t, tracing.Options{}); p == nil {
		t.Fatal("OTEL_EXPORTER_OTLP_ENDPOINT set: tracing must be on")
	}
	if a := resourceAttrs(<-c.Got); a["service.name"] != "edge-router" {
		t.Fatalf("OTEL_SERVICE_NAME not honoured: %v", a)
	}
}

func TestOff(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	if p := exportOne(t, tracing.Options{}); p != nil || p.TracerProvider() != nil {
		t.Fatal("no endpoint: tracing must be off")
	}
	t.Setenv("OTEL_SDK_DISABLED", "true")
	if p := exportOne(t, tracing.Options{Endpoint: "http://127.0.0.1:1"}); p != nil {
		t.Fatal("OTEL_SDK_DISABLED=true: tracing must be off")
	}
	var p *tracing.Provider
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}
