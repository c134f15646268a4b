package replica

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/prefixrouter/prefixrouter/admin/adminpb"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/router"
)

var quiet = slog.New(slog.DiscardHandler)

// backends starts n loopback model servers answering 200.
func backends(t *testing.T, n int) []fleet.Instance {
	t.Helper()
	var out []fleet.Instance
	for i := range n {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"ok":true}`)
		}))
		t.Cleanup(srv.Close)
		out = append(out, fleet.Instance{ID: fmt.Sprintf("i-%d", i), Addr: srv.URL})
	}
	return out
}

// dialAdmin opens a gRPC client on the replica's admin address.
func dialAdmin(t *testing.T, r *Replica) (adminpb.AdminClient, *grpc.ClientConn) {
	t.Helper()
	conn, err := grpc.NewClient(r.AdminAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return adminpb.NewAdminClient(conn), conn
}

// TestStaticFleetAdmin also checks that Close ends a health Watch stream
// promptly and leaves no goroutine behind.
func TestStaticFleetAdmin(t *testing.T) {
	insts := backends(t, 2)
	tr := &http.Transport{}
	ignore := goleak.IgnoreCurrent()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := Start(ctx, Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Router: router.Options{DefaultEndpoint: "chat"},
		Static: insts, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	ac, conn := dialAdmin(t, rep)

	if _, err := ac.SetRoutingConfig(ctx, &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{Strategy: "RANDOM"}}); status.Code(err) != codes.Unavailable {
		t.Fatalf("SetRoutingConfig on a static fleet: %v, want Unavailable", err)
	}
	if _, err := ac.ListAdapters(ctx, &adminpb.ListAdaptersRequest{Endpoint: "chat"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("ListAdapters on a static fleet: %v, want Unavailable", err)
	}
	got, err := ac.GetRoutingConfig(ctx, &adminpb.GetRoutingConfigRequest{Endpoint: "chat"})
	if err != nil || got.GetStored() || got.GetConfig().GetStrategy() != "PREFIX_AWARE" {
		t.Fatalf("GetRoutingConfig %v %v", got, err)
	}
	fl, err := ac.GetFleet(ctx, &adminpb.GetFleetRequest{})
	if err != nil || len(fl.GetEndpoints()) != 1 || len(fl.GetEndpoints()[0].GetInstances()) != 2 {
		t.Fatalf("GetFleet %v %v", fl, err)
	}
	ex, err := ac.ExplainRoute(ctx, &adminpb.ExplainRouteRequest{Endpoint: "chat", Payload: &adminpb.ExplainRouteRequest_Body{Body: []byte("x")}})
	if err != nil || ex.GetInstanceAddr() == "" || len(ex.GetCandidates()) != 2 {
		t.Fatalf("ExplainRoute %v %v", ex, err)
	}
	resp, err := (&http.Client{Transport: tr}).Get("http://" + rep.AdminAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(b), "ok static fleet") {
		t.Fatalf("/readyz %d %q", resp.StatusCode, b)
	}

	hc := healthpb.NewHealthClient(conn)
	watch, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := watch.Recv(); err != nil || m.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first watch status %v %v", m, err)
	}
	start := time.Now()
	closeCtx, closeCancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer closeCancel()
	if err := rep.Close(closeCtx); err != nil {
		t.Fatal(err)
	}
	// A Watch that held Shutdown would make Close last the whole 20 s.
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %v with a health Watch open", d)
	}
	if m, err := watch.Recv(); err != nil || m.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch after Close: %v %v, want NOT_SERVING", m, err)
	}
	if _, err := watch.Recv(); err == nil {
		t.Fatal("watch stream still open after Close")
	}
	conn.Close()
	tr.CloseIdleConnections()
	goleak.VerifyNone(t, ignore)
}

// TestUpstreamHeaderTimeout: an instance that accepts a request and never
// answers is given up on after the header timeout; the client gets an error
// answer, not a hang, and the failure counts against the instance.
func TestUpstreamHeaderTimeout(t *testing.T) {
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer hung.Close()
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := Start(ctx, Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Logger: quiet,
		Router: router.Options{DefaultEndpoint: "chat", UpstreamHeaderTimeout: 200 * time.Millisecond},
		Static: []fleet.Instance{{ID: "hung", Addr: hung.URL}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close(context.Background())
	start := time.Now()
	resp, err := http.Post(rep.URL()+"/invocations", "application/json", strings.NewReader(`{"inputs":"hello"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFailedDependency || time.Since(start) > 10*time.Second {
		t.Fatalf("status %d after %v; want 424 soon after the 200 ms timeout", resp.StatusCode, time.Since(start))
	}
	st, ok := rep.Router().Status("chat", "hung")
	if !ok || st.InFlight != 0 {
		t.Fatalf("instance state %+v %v: the slot must be released", st, ok)
	}
	if _, err := Start(ctx, Options{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0",
		Router: router.Options{DefaultEndpoint: "chat", UpstreamHeaderTimeout: -time.Second},
		Static: []fleet.Instance{{ID: "a", Addr: hung.URL}}}); err == nil {
		t.Fatal("a negative timeout must be refused")
	}
}

// TestPopularityStatic: a replica of a static fleet publishes its popular
// prefixes into its own snapshot every interval: a prompt every request
// repeats becomes hot there, and requests held on it then spread.
func TestPopularityStatic(t *testing.T) {
	rep, err := Start(context.Background(), Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Static: backends(t, 3), Logger: quiet,
		Router: router.Options{DefaultEndpoint: "chat"}, PopularityInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rep.Close(context.Background()) })
	body := fmt.Sprintf(`{"inputs":%q}`, strings.Repeat("one prompt for all. ", 300))
	client := &http.Client{Timeout: 10 * time.Second}
	for range 200 {
		resp, err := client.Post(rep.URL()+"/invocations", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	testsupport.Eventually(t, 10*time.Second, "the prompt hot in the replica's snapshot", func() bool {
		for _, k := range rep.Router().Snapshot().Endpoint("chat").Popular {
			if k.K == 3 {
				return true
			}
		}
		return false
	})
	ex, err := rep.Router().Explain(context.Background(), router.PickRequest{Path: "/invocations", Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	if ex.HotReplicas != 3 {
		t.Fatalf("explained with k = %d, want 3", ex.HotReplicas)
	}
}
