package replica

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prefixrouter/prefixrouter/admin/adminpb"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/membership/etcdtest"
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

// TestOneReadiness runs a replica on etcd and checks that the data-plane
// /readyz, the admin port's /readyz and the gRPC health service give one
// verdict, with the snapshot's revision and age on both HTTP answers: ready
// with one instance; not ready once the only instance drains (the rule:
// at least one instance that is not draining); ready again when it stops
// draining.
func TestOneReadiness(t *testing.T) {
	e := etcdtest.Start(t)
	cli := etcdtest.Client(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mopts := membership.Options{Logger: quiet}
	reg, err := membership.RegisterInstance(ctx, cli, "chat", backends(t, 1)[0], mopts)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(context.Background())
	rep, err := Start(ctx, Options{
		ID: "r-1", Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Router: router.Options{DefaultEndpoint: "chat"},
		Client: cli, Membership: mopts, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close(context.Background())
	_, conn := dialAdmin(t, rep)
	hc := healthpb.NewHealthClient(conn)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	get := func(url string) (int, string) {
		resp, err := (&http.Client{Transport: tr}).Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// verdict reads all three; it reports "" when they disagree.
	verdict := func() string {
		dataCode, dataBody := get(rep.URL() + "/readyz")
		adminCode, adminBody := get("http://" + rep.AdminAddr() + "/readyz")
		h, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range []string{dataBody, adminBody} {
			if !strings.Contains(b, " revision=") || !strings.Contains(b, " snapshot_age=") || !strings.Contains(b, " fresh") {
				t.Fatalf("/readyz %q lacks the revision, the age or the fresh note", b)
			}
		}
		switch {
		case dataCode == 200 && adminCode == 200 && h.GetStatus() == healthpb.HealthCheckResponse_SERVING:
			return "ready"
		case dataCode == 503 && adminCode == 503 && h.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING &&
			strings.Contains(dataBody, "draining") && strings.Contains(adminBody, "draining"):
			return "draining"
		}
		return ""
	}
	testsupport.Eventually(t, 5*time.Second, "ready on all three", func() bool { return verdict() == "ready" })
	if err := reg.SetDraining(ctx, true); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 5*time.Second, "not ready on all three once the only instance drains", func() bool { return verdict() == "draining" })
	if err := reg.SetDraining(ctx, false); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 5*time.Second, "ready again", func() bool { return verdict() == "ready" })
}
