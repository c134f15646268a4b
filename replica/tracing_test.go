package replica

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/router"
	"github.com/prefixrouter/prefixrouter/tracing/tracingtest"
)

// TestOTLPEndpoint: with OTLPEndpoint a request's span, with the routing
// attributes, reaches the collector by the time Close returns.
func TestOTLPEndpoint(t *testing.T) {
	c, url := tracingtest.Start(t)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := Start(ctx, Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", OTLPEndpoint: url,
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
		case req := <-c.Got:
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
