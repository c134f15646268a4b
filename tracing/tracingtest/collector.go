// Package tracingtest is a loopback OTLP/gRPC trace collector for the tests
// of the packages that export spans (tracing, replica), in the manner of
// net/http/httptest.
package tracingtest

import (
	"context"
	"net"
	"testing"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// Collector receives OTLP trace exports on a loopback port.
type Collector struct {
	collectorpb.UnimplementedTraceServiceServer
	// Got delivers every export request, in order; it holds 16 before an
	// exporter blocks.
	Got chan *collectorpb.ExportTraceServiceRequest
}

// Export implements the OTLP trace service.
func (c *Collector) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	c.Got <- req
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

// Start serves a Collector on 127.0.0.1 until the test's cleanup and returns
// it with its endpoint URL (http://host:port, as an OTLP endpoint setting).
func Start(t testing.TB) (*Collector, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &Collector{Got: make(chan *collectorpb.ExportTraceServiceRequest, 16)}
	srv := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(srv, c)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return c, "http://" + ln.Addr().String()
}
