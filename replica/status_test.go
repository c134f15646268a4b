package replica

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/admin/adminpb"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/router"
)

// modelServer is a loopback instance whose /health answers healthStatus and
// whose /metrics reports running+waiting requests in vLLM's gauges.
func modelServer(t *testing.T, healthStatus, running, waiting int) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			w.WriteHeader(healthStatus)
		case "/metrics":
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			fmt.Fprintf(w, "vllm:num_requests_running{model_name=\"m\"} %d\nvllm:num_requests_waiting{model_name=\"m\"} %d\n", running, waiting)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestGetFleetShowsHealthAndExternalLoad runs a replica with health checks
// and load polling against two real instances: one whose health endpoint
// fails and one that reports 4 running + 3 waiting requests. GetFleet over
// gRPC must show the first down and the second up with external load 7 (the
// replica sends nothing, so all of it comes from elsewhere).
func TestGetFleetShowsHealthAndExternalLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := Start(ctx, Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Logger: quiet,
		Static: []fleet.Instance{
			{ID: "down", Addr: modelServer(t, http.StatusInternalServerError, 0, 0)},
			{ID: "loaded", Addr: modelServer(t, http.StatusOK, 4, 3)},
		},
		Router: router.Options{
			DefaultEndpoint:     "chat",
			HealthCheckInterval: 10 * time.Millisecond,
			LoadPollInterval:    10 * time.Millisecond,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close(context.Background())
	client, _ := dialAdmin(t, rep)

	states := func() map[string]*adminpb.InstanceState {
		resp, err := client.GetFleet(ctx, &adminpb.GetFleetRequest{Endpoint: "chat"})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*adminpb.InstanceState{}
		for _, in := range resp.GetEndpoints()[0].GetInstances() {
			out[in.GetId()] = in.GetState()
		}
		return out
	}
	var got map[string]*adminpb.InstanceState
	testsupport.Eventually(t, 10*time.Second, "down marked down and loaded's load polled", func() bool {
		got = states()
		return !got["down"].GetHealthy() && got["loaded"].GetExternalLoad() == 7
	})
	down, loaded := got["down"], got["loaded"]
	if down == nil || down.GetHealthy() || down.GetBreaker() != adminpb.BreakerState_BREAKER_STATE_CLOSED {
		t.Errorf("down = %v, want unhealthy with a closed breaker (no request failed)", down)
	}
	if loaded == nil || !loaded.GetHealthy() || loaded.GetExternalLoad() != 7 || loaded.GetInFlight() != 0 {
		t.Errorf("loaded = %v, want healthy, external load 7, nothing in flight", loaded)
	}
}
