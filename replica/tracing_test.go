package replica

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/prefixrouter/prefixrouter/router"
)

// collector is a loopback OTLP/gRPC trace collector.
type collector struct {
	collectorpb.UnimplementedTraceServiceServer
	got chan *collectorpb.ExportTraceServiceRequest
}

func (c *collector) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	c.got <- req
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

// TestOTLPEndpoint: with OTLPEndpoint a request's span, with the routing
// attributes, reaches the collector by the time Close returns.
func TestOTLPEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{got: make(chan *collectorpb.ExportTraceServiceRequest, 16)}
	srv := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(srv, c)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	defer func() {
		srv.Stop()
		<-served
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := Start(ctx, Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", OTLPEndpoint: "http://" + ln.Addr().String(),
		Router: router.Options{DefaultEndpoint: "chat"}, Static: backends(t, 2), Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(rep.URL()+"/invocations", "application/json", strings.NewReader(`{"inputs":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	instance := resp.Header.Get(router.HeaderInstance)
	if err := rep.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case req := <-c.got:
			for _, rs := range req.GetResourceSpans() {
				for _, ss := range rs.GetScopeSpans() {
					for _, s := range ss.GetSpans() {
						for _, kv := range s.GetAttributes() {
							if kv.GetKey() == string(router.AttrInstance) && kv.GetValue().GetStringValue() == instance {
								return
							}
						}
					}
				}
			}
		default:
			t.Fatalf("no exported span names instance %q", instance)
		}
	}
}
