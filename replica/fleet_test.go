package replica_test

// The tests of a replica on etcd run in the one in-process cluster harness,
// localfleet; it imports replica, hence this external test package.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prefixrouter/prefixrouter/admin/adminpb"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// startFleet starts etcd with n stub instances, registered by the harness
// under endpoint "chat", and one replica that sees them all.
func startFleet(t *testing.T, n int) (*localfleet.Fleet, *replica.Replica, []*localfleet.Instance) {
	t.Helper()
	return startFleetWith(t, n, nil)
}

// startFleetWith is startFleet with tune applied to the replica's options
// (nil: none).
func startFleetWith(t *testing.T, n int, tune func(*replica.Options)) (*localfleet.Fleet, *replica.Replica, []*localfleet.Instance) {
	t.Helper()
	ctx := testsupport.Context(t, 30*time.Second)
	f, err := localfleet.Start(ctx, localfleet.Options{Endpoint: "chat", FastEtcd: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	var ins []*localfleet.Instance
	for i := range n {
		id := fmt.Sprintf("i-%d", i)
		srv := httptest.NewServer(localfleet.Stub(id))
		t.Cleanup(srv.Close)
		in, err := f.Register(ctx, fleet.Instance{ID: id, Addr: srv.URL}, 0)
		if err != nil {
			t.Fatal(err)
		}
		ins = append(ins, in)
	}
	rep, err := f.AddReplicaWith(ctx, tune)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.StopReplica(ctx, rep); err != nil {
			t.Errorf("close replica: %v", err)
		}
	})
	if err := f.WaitFor(ctx, f.HasInstances(f.IDs()...)); err != nil {
		t.Fatal(err)
	}
	return f, rep, ins
}

// adminClient opens a gRPC client on the replica's admin address.
func adminClient(t *testing.T, r *replica.Replica) (adminpb.AdminClient, *grpc.ClientConn) {
	t.Helper()
	conn, err := grpc.NewClient(r.AdminAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return adminpb.NewAdminClient(conn), conn
}

func TestAdminAPIWithEtcd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f, rep, _ := startFleet(t, 3)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	ac, _ := adminClient(t, rep)

	t.Run("GetFleet", func(t *testing.T) {
		// Registrations may reach the watcher after its first snapshot.
		var got []string
		testsupport.Eventually(t, 5*time.Second, "three instances in GetFleet", func() bool {
			resp, err := ac.GetFleet(ctx, &adminpb.GetFleetRequest{Endpoint: "chat"})
			if err != nil {
				t.Fatal(err)
			}
			got = got[:0]
			for _, in := range resp.GetEndpoints()[0].GetInstances() {
				got = append(got, in.GetId())
				if in.GetState() == nil || in.GetState().GetBreaker() != adminpb.BreakerState_BREAKER_STATE_CLOSED || in.GetState().GetExternalLoad() != -1 {
					t.Fatalf("instance %s state %v", in.GetId(), in.GetState())
				}
			}
			return len(got) == 3
		})
		if !slices.Equal(got, f.IDs()) {
			t.Fatalf("instances %v", got)
		}
	})

	t.Run("ExplainRoute matches the data plane", func(t *testing.T) {
		tests := []struct {
			path, body string
			hdr        map[string]string
		}{
			{"/endpoints/chat/invocations", strings.Repeat("shared system prompt ", 100) + "q1", map[string]string{"X-Amzn-SageMaker-Prefix-Aware-Id": "tenant-a"}},
			{"/invocations", "another prompt", nil},
			{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hello there"}]}`, nil},
		}
		seen := map[string]bool{}
		for i := range 40 {
			tests = append(tests, struct {
				path, body string
				hdr        map[string]string
			}{"/endpoints/chat/invocations", fmt.Sprintf("prompt %d", i), nil})
		}
		for _, tc := range tests {
			ex, err := ac.ExplainRoute(ctx, &adminpb.ExplainRouteRequest{
				Endpoint: "chat", Path: tc.path, Headers: tc.hdr,
				Payload: &adminpb.ExplainRouteRequest_BodyText{BodyText: tc.body},
			})
			if err != nil {
				t.Fatal(err)
			}
			if ex.GetInstance() == "" || len(ex.GetCandidates()) != 3 || ex.GetCandidates()[0] != ex.GetInstance() || ex.GetStrategy() != "PREFIX_AWARE" {
				t.Fatalf("explanation %v", ex)
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rep.URL()+tc.path, strings.NewReader(tc.body))
			for k, v := range tc.hdr {
				req.Header.Set(k, v)
			}
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get(router.HeaderInstance) != ex.GetInstance() {
				t.Fatalf("%s: status %d instance %q, ExplainRoute %q", tc.path, resp.StatusCode, resp.Header.Get(router.HeaderInstance), ex.GetInstance())
			}
			seen[ex.GetInstance()] = true
		}
		// Otherwise agreement could come from a one-instance ring.
		if len(seen) != 3 {
			t.Fatalf("43 keys reached only %v", seen)
		}
	})

	t.Run("ExplainRoute errors", func(t *testing.T) {
		for _, tc := range []struct {
			req  *adminpb.ExplainRouteRequest
			want codes.Code
		}{
			{&adminpb.ExplainRouteRequest{Endpoint: "nope"}, codes.NotFound},
			{&adminpb.ExplainRouteRequest{Endpoint: "chat", Path: "/v1/chat/completions", Payload: &adminpb.ExplainRouteRequest_BodyText{BodyText: "{"}}, codes.InvalidArgument},
			{&adminpb.ExplainRouteRequest{Endpoint: "chat", Headers: map[string]string{"X-Amzn-SageMaker-Prefix-Aware-Id": strings.Repeat("t", 65)}}, codes.InvalidArgument},
		} {
			if _, err := ac.ExplainRoute(ctx, tc.req); status.Code(err) != tc.want {
				t.Fatalf("%v: %v, want %v", tc.req, err, tc.want)
			}
		}
	})

	t.Run("SetRoutingConfig", func(t *testing.T) {
		strategy := func() fleet.Strategy {
			return rep.Router().Snapshot().Endpoint("chat").Config.WithDefaults().RoutingStrategy
		}
		for _, s := range []fleet.Strategy{fleet.Random, fleet.LeastOutstanding, fleet.PrefixAware} {
			resp, err := ac.SetRoutingConfig(ctx, &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{Strategy: string(s)}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetConfig().GetStrategy() != string(s) {
				t.Fatalf("written %v", resp.GetConfig())
			}
			testsupport.Eventually(t, time.Second, "strategy "+string(s)+" in the replica's snapshot", func() bool { return strategy() == s })
			got, err := ac.GetRoutingConfig(ctx, &adminpb.GetRoutingConfigRequest{Endpoint: "chat"})
			if err != nil || !got.GetStored() || got.GetConfig().GetStrategy() != string(s) || got.GetApplied().GetStrategy() != string(s) {
				t.Fatalf("GetRoutingConfig %v %v", got, err)
			}
		}
		for _, bad := range []*adminpb.SetRoutingConfigRequest{
			{Endpoint: "chat", Config: &adminpb.RoutingConfig{Strategy: "ROUND_ROBIN"}},
			{Endpoint: "chat", Config: &adminpb.RoutingConfig{PrefixLength: 100}},
		} {
			if _, err := ac.SetRoutingConfig(ctx, bad); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("%v: %v, want InvalidArgument", bad, err)
			}
		}
		if s := strategy(); s != fleet.PrefixAware {
			t.Fatalf("strategy %s after rejected writes", s)
		}
	})

	t.Run("adapter catalogue", func(t *testing.T) {
		resp, err := ac.PutAdapter(ctx, &adminpb.PutAdapterRequest{Endpoint: "chat", Adapter: &adminpb.Adapter{Name: "sql", Source: "/m/sql", MaxReplicas: 2}})
		if err != nil || resp.GetAdapter().GetMinReplicas() != 1 || resp.GetAdapter().GetMaxReplicas() != 2 {
			t.Fatalf("PutAdapter = %v %v", resp, err)
		}
		for _, bad := range []*adminpb.PutAdapterRequest{
			{Endpoint: "chat", Adapter: &adminpb.Adapter{Name: "x"}},
			{Endpoint: "chat", Adapter: &adminpb.Adapter{Name: "x/y", Source: "s"}},
			{Endpoint: "chat", Adapter: &adminpb.Adapter{Name: "x", Source: "s", MinReplicas: 3, MaxReplicas: 1}},
		} {
			if _, err := ac.PutAdapter(ctx, bad); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("%v: %v, want InvalidArgument", bad, err)
			}
		}
		list, err := ac.ListAdapters(ctx, &adminpb.ListAdaptersRequest{Endpoint: "chat"})
		if err != nil || len(list.GetAdapters()) != 1 || list.GetAdapters()[0].GetSource() != "/m/sql" || list.GetAdapters()[0].GetReplicas() != 1 {
			t.Fatalf("ListAdapters = %v %v", list, err)
		}
		testsupport.Eventually(t, time.Second, "catalogue in the replica's snapshot", func() bool {
			_, ok := rep.Router().Snapshot().Endpoint("chat").Adapter("sql")
			return ok
		})
		if _, err := ac.DeleteAdapter(ctx, &adminpb.DeleteAdapterRequest{Endpoint: "chat", Name: "sql"}); err != nil {
			t.Fatal(err)
		}
		if _, err := ac.DeleteAdapter(ctx, &adminpb.DeleteAdapterRequest{Endpoint: "chat", Name: "sql"}); status.Code(err) != codes.NotFound {
			t.Fatalf("second DeleteAdapter: %v, want NotFound", err)
		}
	})

	t.Run("metrics over HTTP/1 on the same port", func(t *testing.T) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+rep.AdminAddr()+"/metrics", nil)
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := `grpc_server_handled_total{grpc_code="OK",grpc_method="SetRoutingConfig",grpc_service="prefixrouter.admin.v1.Admin",grpc_type="unary"} 3`
		if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 1 || !strings.Contains(string(b), want) || !strings.Contains(string(b), "prefixrouter_") {
			t.Fatalf("status %d proto %s, want %q in:\n%.2000s", resp.StatusCode, resp.Proto, want, b)
		}
	})
}

// TestRoutingConfigFieldsWithEtcd sets each field of the routing config over
// gRPC, one at a time, and reads it back from etcd (GetRoutingConfig), from
// the replica's snapshot (GetRoutingConfig's applied, GetFleet) and from the
// router itself; an invalid value is InvalidArgument naming the field and
// leaves the stored config alone.
func TestRoutingConfigFieldsWithEtcd(t *testing.T) {
	ctx := testsupport.Context(t, 30*time.Second)
	_, rep, _ := startFleet(t, 1)
	ac, _ := adminClient(t, rep)
	defaults := func() *adminpb.RoutingConfig {
		return &adminpb.RoutingConfig{Strategy: "PREFIX_AWARE", PrefixLength: fleet.DefaultPrefixLength, ConcurrencyThreshold: fleet.DefaultConcurrencyThreshold}
	}
	variants := []*adminpb.ProductionVariant{{VariantName: "blue", InitialVariantWeight: 4}, {VariantName: "green", InitialVariantWeight: 0.5}}
	for _, tc := range []struct {
		field   string
		set     func(*adminpb.RoutingConfig)
		applied func(fleet.RoutingConfig) bool
	}{
		{"hot_key_replication", func(c *adminpb.RoutingConfig) { c.HotKeyReplication = true },
			func(c fleet.RoutingConfig) bool {
				return c.PrefixAwareRoutingConfig != nil && c.PrefixAwareRoutingConfig.HotKeyReplication
			}},
		{"tenant_cache_salt", func(c *adminpb.RoutingConfig) { c.TenantCacheSalt = true },
			func(c fleet.RoutingConfig) bool { return c.TenantCacheSalt }},
		{"production_variants", func(c *adminpb.RoutingConfig) { c.ProductionVariants = variants },
			func(c fleet.RoutingConfig) bool {
				return slices.Equal(c.ProductionVariants, []fleet.ProductionVariant{{VariantName: "blue", InitialVariantWeight: 4}, {VariantName: "green", InitialVariantWeight: 0.5}})
			}},
		{"first_byte_timeout_in_milliseconds", func(c *adminpb.RoutingConfig) { c.FirstByteTimeoutInMilliseconds = 250 },
			func(c fleet.RoutingConfig) bool { return c.FirstByteTimeoutInMilliseconds == 250 }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			want := defaults()
			tc.set(want)
			resp, err := ac.SetRoutingConfig(ctx, &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: want})
			if err != nil || !proto.Equal(resp.GetConfig(), want) {
				t.Fatalf("SetRoutingConfig = %v, %v; want %v", resp.GetConfig(), err, want)
			}
			testsupport.Eventually(t, 5*time.Second, tc.field+" in the replica's snapshot", func() bool {
				return tc.applied(rep.Router().Snapshot().Endpoint("chat").Config)
			})
			got, err := ac.GetRoutingConfig(ctx, &adminpb.GetRoutingConfigRequest{Endpoint: "chat"})
			if err != nil || !got.GetStored() || !proto.Equal(got.GetConfig(), want) || !proto.Equal(got.GetApplied(), want) {
				t.Fatalf("GetRoutingConfig = %v, %v; want stored and applied %v", got, err, want)
			}
			fl, err := ac.GetFleet(ctx, &adminpb.GetFleetRequest{Endpoint: "chat"})
			if err != nil || !proto.Equal(fl.GetEndpoints()[0].GetConfig(), want) {
				t.Fatalf("GetFleet config = %v, %v; want %v", fl.GetEndpoints()[0].GetConfig(), err, want)
			}
		})
	}

	t.Run("invalid values", func(t *testing.T) {
		before, err := ac.GetRoutingConfig(ctx, &adminpb.GetRoutingConfigRequest{Endpoint: "chat"})
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			config *adminpb.RoutingConfig
			msg    string
		}{
			{&adminpb.RoutingConfig{FirstByteTimeoutInMilliseconds: fleet.MaxFirstByteTimeoutMillis + 1}, "FirstByteTimeoutInMilliseconds 3600001 is outside 1..3600000"},
			{&adminpb.RoutingConfig{FirstByteTimeoutInMilliseconds: -1}, "FirstByteTimeoutInMilliseconds -1 is outside 1..3600000"},
			{&adminpb.RoutingConfig{ProductionVariants: []*adminpb.ProductionVariant{{VariantName: "blue", InitialVariantWeight: -2}}}, `InitialVariantWeight -2 of "blue" must be in 0..1e6`},
			{&adminpb.RoutingConfig{ProductionVariants: []*adminpb.ProductionVariant{{VariantName: "blue", InitialVariantWeight: 2e6}}}, `InitialVariantWeight 2e+06 of "blue" must be in 0..1e6`},
			{&adminpb.RoutingConfig{ProductionVariants: []*adminpb.ProductionVariant{{VariantName: "blue"}}}, "the weights sum to 0"},
			{&adminpb.RoutingConfig{ProductionVariants: []*adminpb.ProductionVariant{{VariantName: strings.Repeat("v", 64), InitialVariantWeight: 1}}}, "must be 1..63 characters"},
		} {
			_, err := ac.SetRoutingConfig(ctx, &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: tc.config})
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.msg) {
				t.Errorf("SetRoutingConfig(%v) = %v, want InvalidArgument with %q", tc.config, err, tc.msg)
			}
		}
		after, err := ac.GetRoutingConfig(ctx, &adminpb.GetRoutingConfigRequest{Endpoint: "chat"})
		if err != nil || !proto.Equal(after.GetConfig(), before.GetConfig()) {
			t.Fatalf("stored config %v after rejected writes, want %v (%v)", after.GetConfig(), before.GetConfig(), err)
		}
	})
}

// TestOneReadiness runs a replica on etcd and checks that the data-plane
// /readyz, the admin port's /readyz and the gRPC health service give one
// verdict, with the snapshot's revision and age on both HTTP answers: ready
// with one instance; not ready once the only instance drains (the rule:
// at least one instance that is not draining); ready again when it stops
// draining.
func TestOneReadiness(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, rep, ins := startFleet(t, 1)
	reg := ins[0].Registration()
	_, conn := adminClient(t, rep)
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
