// Package tracing builds a replica's OpenTelemetry tracer provider: spans
// exported over OTLP/gRPC in batches, off unless an endpoint is configured.
package tracing

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// DefaultServiceName is service.name unless OTEL_SERVICE_NAME says otherwise.
const DefaultServiceName = "prefixrouter"

// Options configures tracing. The zero value is off unless the standard
// OTLP environment names an endpoint.
type Options struct {
	// Endpoint is the OTLP/gRPC collector: a URL (http:// means no TLS,
	// https:// TLS) or host:port (TLS). Empty means the standard environment
	// (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT);
	// when that is empty too, or OTEL_SDK_DISABLED=true, tracing is off.
	// The exporter also reads the other OTEL_EXPORTER_OTLP_* variables
	// (headers, timeout, certificates), and the SDK OTEL_TRACES_SAMPLER and
	// OTEL_RESOURCE_ATTRIBUTES.
	Endpoint string
	// InstanceID is the service.instance.id resource attribute (the
	// replica id); empty leaves it out.
	InstanceID string
}

// Provider is a running tracer provider, or nil when tracing is off.
type Provider struct{ tp *sdktrace.TracerProvider }

// Start returns the provider Options ask for: nil (and no error) when
// tracing is off. The exporter connects lazily, so a collector that is down
// costs dropped spans, never a failed start.
func Start(ctx context.Context, o Options) (*Provider, error) {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, nil
	}
	var eopts []otlptracegrpc.Option
	switch {
	case strings.Contains(o.Endpoint, "://"):
		eopts = append(eopts, otlptracegrpc.WithEndpointURL(o.Endpoint))
	case o.Endpoint != "":
		eopts = append(eopts, otlptracegrpc.WithEndpoint(o.Endpoint))
	case os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "":
		return nil, nil
	}
	exp, err := otlptracegrpc.New(ctx, eopts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	ropts := []resource.Option{resource.WithAttributes(semconv.ServiceName(DefaultServiceName))}
	if o.InstanceID != "" {
		ropts = append(ropts, resource.WithAttributes(semconv.ServiceInstanceID(o.InstanceID)))
	}
	// Later detectors win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// override the defaults above.
	ropts = append(ropts, resource.WithFromEnv())
	res, err := resource.New(ctx, ropts...)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return &Provider{tp: sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))}, nil
}

// TracerProvider is what router.Options and extproc.Options take: nil when
// tracing is off.
func (p *Provider) TracerProvider() trace.TracerProvider {
	if p == nil {
		return nil
	}
	return p.tp
}

// Close flushes the spans not yet exported (up to ctx's deadline) and stops
// the exporter. A nil Provider does nothing.
func (p *Provider) Close(ctx context.Context) error {
	if p == nil {
		return nil
	}
	if err := p.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}
