package admin_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sony/gobreaker/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prefixrouter/prefixrouter/admin"
	"github.com/prefixrouter/prefixrouter/admin/adminpb"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/overload"
	"github.com/prefixrouter/prefixrouter/router"
)

// --- fakes of the small interfaces ---

type snapSource struct {
	p atomic.Pointer[fleet.Snapshot]
}

func (s *snapSource) Snapshot() *fleet.Snapshot { return s.p.Load() }

type statusSource map[string]overload.Status // key endpoint/id

func (s statusSource) Status(endpoint, id string) (overload.Status, bool) {
	st, ok := s[endpoint+"/"+id]
	return st, ok
}

type fakeStore struct {
	mu      sync.Mutex
	configs map[string]fleet.RoutingConfig // guarded by mu
	getErr  error
	putErr  error
}

func (f *fakeStore) GetConfig(_ context.Context, endpoint string) (fleet.RoutingConfig, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.getErr != nil {
		return fleet.RoutingConfig{}, false, f.getErr
	}
	c, ok := f.configs[endpoint]
	if !ok {
		return fleet.DefaultRoutingConfig(), false, nil
	}
	return c.WithDefaults(), true, nil
}

func (f *fakeStore) PutConfig(_ context.Context, endpoint string, c fleet.RoutingConfig) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.putErr != nil {
		return f.putErr
	}
	if err := c.Validate(); err != nil {
		return err
	}
	if f.configs == nil {
		f.configs = map[string]fleet.RoutingConfig{}
	}
	f.configs[endpoint] = c.WithDefaults()
	return nil
}

func (f *fakeStore) stored(endpoint string) (fleet.RoutingConfig, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.configs[endpoint]
	return c, ok
}

type explainCall struct {
	endpoint, path string
	header         http.Header
	body           []byte
	subset         []string
}

type fakeExplainer struct {
	mu   sync.Mutex
	last explainCall // guarded by mu
	ex   router.Explanation
	err  error
	pan  bool
}

func (f *fakeExplainer) Explain(_ context.Context, req router.PickRequest) (router.Explanation, error) {
	if f.pan {
		panic("explainer exploded")
	}
	f.mu.Lock()
	f.last = explainCall{req.Endpoint, req.Path, req.Header, req.Body, req.Subset}
	f.mu.Unlock()
	return f.ex, f.err
}

func (f *fakeExplainer) lastCall() explainCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

// --- a real server on a loopback listener ---

var built = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func testSnapshot() *fleet.Snapshot {
	return fleet.NewSnapshot([]fleet.Endpoint{
		{Name: "chat", Config: fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: 2048}}, Instances: []fleet.Instance{
			{ID: "i-b", Addr: "http://127.0.0.1:8002", Weight: 3, Draining: true},
			{ID: "i-a", Addr: "http://127.0.0.1:8001", Adapters: []string{"lora-x"}, MaxAdapters: 4, Labels: map[string]string{"model": "llama"}, RegisteredAt: built.Add(-time.Hour)},
		}},
		{Name: "batch", Config: fleet.RoutingConfig{RoutingStrategy: fleet.Random}, Instances: []fleet.Instance{{ID: "i-c", Addr: "http://127.0.0.1:8003"}}},
	}, 42, 2, built)
}

type harness struct {
	srv    *admin.Server
	client adminpb.AdminClient
	conn   *grpc.ClientConn
	reg    *prometheus.Registry
	snaps  *snapSource
}

func start(t *testing.T, o admin.Options) *harness {
	t.Helper()
	h := &harness{snaps: &snapSource{}, reg: prometheus.NewRegistry()}
	if o.Snapshots == nil {
		h.snaps.p.Store(testSnapshot())
		o.Snapshots = h.snaps
	}
	if o.Registry == nil {
		o.Registry = h.reg
	} else {
		h.reg = o.Registry
	}
	if o.Now == nil {
		o.Now = func() time.Time { return built.Add(90 * time.Second) }
	}
	if o.Ready == nil {
		o.Ready = func() error { return nil }
	}
	srv, err := admin.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	conn, served := serveAndDial(t, srv)
	t.Cleanup(func() {
		_ = conn.Close()
		srv.GracefulStop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	h.srv, h.conn, h.client = srv, conn, adminpb.NewAdminClient(conn)
	return h
}

// serveAndDial serves srv on a loopback port and dials it; Serve's result
// arrives on served once the server stops (the caller stops it).
func serveAndDial(t *testing.T, srv *admin.Server) (conn *grpc.ClientConn, served <-chan error) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	return conn, done
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// wantCode fails unless err carries code and its message contains msg.
func wantCode(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code {
		t.Fatalf("code = %v (%v), want %v", st.Code(), err, code)
	}
	if !strings.Contains(st.Message(), msg) {
		t.Fatalf("message %q does not contain %q", st.Message(), msg)
	}
}

// --- RPCs ---

func TestGetFleet(t *testing.T) {
	h := start(t, admin.Options{Statuses: statusSource{
		"chat/i-a": {ID: "i-a", InFlight: 3, ExternalLoad: -1, Breaker: gobreaker.StateOpen, Healthy: true},
		"chat/i-b": {ID: "i-b", InFlight: 0, ExternalLoad: 5, Breaker: gobreaker.StateHalfOpen, Healthy: false},
	}})
	resp, err := h.client.GetFleet(ctx(t), &adminpb.GetFleetRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Revision != 42 || resp.Replicas != 2 || !resp.BuiltAt.AsTime().Equal(built) || resp.Age.AsDuration() != 90*time.Second {
		t.Fatalf("header = rev %d replicas %d built %v age %v", resp.Revision, resp.Replicas, resp.BuiltAt.AsTime(), resp.Age.AsDuration())
	}
	if len(resp.Endpoints) != 2 || resp.Endpoints[0].Name != "batch" || resp.Endpoints[1].Name != "chat" {
		t.Fatalf("endpoints not sorted by name: %v", resp.Endpoints)
	}
	batch, chat := resp.Endpoints[0], resp.Endpoints[1]
	if c := batch.Config; c.Strategy != "RANDOM" || c.PrefixLength != 4096 || c.ConcurrencyThreshold != 10 {
		t.Errorf("batch config = %v, want RANDOM with defaults", c)
	}
	if c := chat.Config; c.Strategy != "PREFIX_AWARE" || c.PrefixLength != 2048 || c.ConcurrencyThreshold != 10 {
		t.Errorf("chat config = %v", c)
	}
	if batch.Instances[0].State != nil {
		t.Errorf("batch/i-c has state %v, want none (the source does not know it)", batch.Instances[0].State)
	}
	a, b := chat.Instances[0], chat.Instances[1]
	if a.Id != "i-a" || a.Addr != "http://127.0.0.1:8001" || len(a.Adapters) != 1 || a.Adapters[0] != "lora-x" ||
		a.MaxAdapters != 4 || a.Weight != 1 || a.Draining || a.Labels["model"] != "llama" ||
		!a.RegisteredAt.AsTime().Equal(built.Add(-time.Hour)) {
		t.Errorf("i-a = %v", a)
	}
	if st := a.State; st == nil || st.InFlight != 3 || st.ExternalLoad != -1 || st.Breaker != adminpb.BreakerState_BREAKER_STATE_OPEN || !st.Healthy {
		t.Errorf("i-a state = %v", st)
	}
	if b.Id != "i-b" || b.Weight != 3 || !b.Draining || b.RegisteredAt != nil {
		t.Errorf("i-b = %v", b)
	}
	if st := b.State; st == nil || st.ExternalLoad != 5 || st.Breaker != adminpb.BreakerState_BREAKER_STATE_HALF_OPEN || st.Healthy {
		t.Errorf("i-b state = %v", st)
	}

	one, err := h.client.GetFleet(ctx(t), &adminpb.GetFleetRequest{Endpoint: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	if len(one.Endpoints) != 1 || one.Endpoints[0].Name != "chat" {
		t.Errorf("filtered endpoints = %v", one.Endpoints)
	}
	_, err = h.client.GetFleet(ctx(t), &adminpb.GetFleetRequest{Endpoint: "nope"})
	wantCode(t, err, codes.NotFound, `"nope"`)

	h.snaps.p.Store(nil)
	_, err = h.client.GetFleet(ctx(t), &adminpb.GetFleetRequest{})
	wantCode(t, err, codes.Unavailable, "no fleet snapshot")
}

func TestGetRoutingConfig(t *testing.T) {
	stored := fleet.RoutingConfig{RoutingStrategy: fleet.LeastOutstanding, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{ConcurrencyThreshold: 7}}
	tests := []struct {
		name     string
		store    *fakeStore // nil: static fleet
		endpoint string
		code     codes.Code
		msg      string
		config   *adminpb.RoutingConfig
		stored   bool
		applied  *adminpb.RoutingConfig
	}{
		{name: "stored", store: &fakeStore{configs: map[string]fleet.RoutingConfig{"chat": stored}}, endpoint: "chat",
			config:  &adminpb.RoutingConfig{Strategy: "LEAST_OUTSTANDING_REQUESTS", PrefixLength: 4096, ConcurrencyThreshold: 7},
			stored:  true,
			applied: &adminpb.RoutingConfig{Strategy: "PREFIX_AWARE", PrefixLength: 2048, ConcurrencyThreshold: 10}},
		{name: "stored before any instance", store: &fakeStore{configs: map[string]fleet.RoutingConfig{"new": stored}}, endpoint: "new",
			config: &adminpb.RoutingConfig{Strategy: "LEAST_OUTSTANDING_REQUESTS", PrefixLength: 4096, ConcurrencyThreshold: 7}, stored: true},
		{name: "nothing stored: defaults", store: &fakeStore{}, endpoint: "batch",
			config:  &adminpb.RoutingConfig{Strategy: "PREFIX_AWARE", PrefixLength: fleet.DefaultAdaptivePrefixLength, ConcurrencyThreshold: 10},
			applied: &adminpb.RoutingConfig{Strategy: "RANDOM", PrefixLength: 4096, ConcurrencyThreshold: 10}},
		{name: "unknown endpoint", store: &fakeStore{}, endpoint: "nope", code: codes.NotFound, msg: `"nope"`},
		{name: "static fleet", endpoint: "chat",
			config:  &adminpb.RoutingConfig{Strategy: "PREFIX_AWARE", PrefixLength: 2048, ConcurrencyThreshold: 10},
			applied: &adminpb.RoutingConfig{Strategy: "PREFIX_AWARE", PrefixLength: 2048, ConcurrencyThreshold: 10}},
		{name: "static fleet, unknown endpoint", endpoint: "nope", code: codes.NotFound, msg: `"nope"`},
		{name: "empty endpoint", store: &fakeStore{}, endpoint: "", code: codes.InvalidArgument, msg: "endpoint name"},
		{name: "slash in endpoint", store: &fakeStore{}, endpoint: "a/b", code: codes.InvalidArgument, msg: "'/'"},
		{name: "bad stored value", store: &fakeStore{getErr: fmt.Errorf("membership: stored value: %w", fleet.ErrInvalidConfig)}, endpoint: "chat",
			code: codes.FailedPrecondition, msg: "invalid routing config"},
		{name: "etcd down", store: &fakeStore{getErr: errors.New("etcdserver: request timed out")}, endpoint: "chat",
			code: codes.Unavailable, msg: "request timed out"},
		{name: "deadline", store: &fakeStore{getErr: fmt.Errorf("get: %w", context.DeadlineExceeded)}, endpoint: "chat",
			code: codes.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := admin.Options{}
			if tt.store != nil {
				o.Configs = tt.store
			}
			h := start(t, o)
			resp, err := h.client.GetRoutingConfig(ctx(t), &adminpb.GetRoutingConfigRequest{Endpoint: tt.endpoint})
			if tt.code != codes.OK {
				wantCode(t, err, tt.code, tt.msg)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !sameConfig(resp.Config, tt.config) || resp.Stored != tt.stored || !sameConfig(resp.Applied, tt.applied) {
				t.Fatalf("got config %v stored %v applied %v, want %v %v %v", resp.Config, resp.Stored, resp.Applied, tt.config, tt.stored, tt.applied)
			}
		})
	}
}

// sameConfig compares every field, so a field that configToPB or
// configFromPB forgets fails the tests that round-trip it.
func sameConfig(a, b *adminpb.RoutingConfig) bool { return proto.Equal(a, b) }

// storedAsPB spells a stored config, field by field, in the API's terms
// independently of the service's mapping, so that two fields swapped both
// ways still fail.
func storedAsPB(c fleet.RoutingConfig) *adminpb.RoutingConfig {
	pc := &adminpb.RoutingConfig{
		Strategy: string(c.RoutingStrategy), PrefixLength: int32(c.PrefixAwareRoutingConfig.PrefixLength), ConcurrencyThreshold: int32(c.PrefixAwareRoutingConfig.ConcurrencyThreshold),
		HotKeyReplication: c.PrefixAwareRoutingConfig.HotKeyReplication, FixedLengthKeys: c.PrefixAwareRoutingConfig.FixedLengthKeys,
		TenantCacheSalt: c.TenantCacheSalt, FirstByteTimeoutInMilliseconds: int32(c.FirstByteTimeoutInMilliseconds),
	}
	for _, v := range c.ProductionVariants {
		pc.ProductionVariants = append(pc.ProductionVariants, &adminpb.ProductionVariant{VariantName: v.VariantName, InitialVariantWeight: v.InitialVariantWeight})
	}
	return pc
}

// everyField is a routing config with every field away from its default.
func everyField() *adminpb.RoutingConfig {
	return &adminpb.RoutingConfig{
		Strategy: "PREFIX_AWARE", PrefixLength: 8192, ConcurrencyThreshold: 20,
		HotKeyReplication: true, FixedLengthKeys: true, TenantCacheSalt: true,
		ProductionVariants: []*adminpb.ProductionVariant{
			{VariantName: "blue", InitialVariantWeight: 4}, {VariantName: "green", InitialVariantWeight: 0.5},
		},
		FirstByteTimeoutInMilliseconds: 250,
	}
}

func TestSetRoutingConfig(t *testing.T) {
	tests := []struct {
		name   string
		static bool
		putErr error
		req    *adminpb.SetRoutingConfigRequest
		code   codes.Code
		msg    string
		want   *adminpb.RoutingConfig
	}{
		{name: "prefix aware", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{Strategy: "PREFIX_AWARE", PrefixLength: 8192, ConcurrencyThreshold: 20}},
			want: &adminpb.RoutingConfig{Strategy: "PREFIX_AWARE", PrefixLength: 8192, ConcurrencyThreshold: 20}},
		{name: "zeros mean defaults", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{Strategy: "RANDOM"}},
			want: &adminpb.RoutingConfig{Strategy: "RANDOM", PrefixLength: 4096, ConcurrencyThreshold: 10}},
		{name: "endpoint without instances yet", req: &adminpb.SetRoutingConfigRequest{Endpoint: "later", Config: &adminpb.RoutingConfig{Strategy: "LEAST_OUTSTANDING_REQUESTS"}},
			want: &adminpb.RoutingConfig{Strategy: "LEAST_OUTSTANDING_REQUESTS", PrefixLength: 4096, ConcurrencyThreshold: 10}},
		{name: "every field", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: everyField()},
			want: everyField()},
		{name: "first byte timeout 1 ms", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{FirstByteTimeoutInMilliseconds: 1}},
			want: &adminpb.RoutingConfig{Strategy: "PREFIX_AWARE", PrefixLength: fleet.DefaultAdaptivePrefixLength, ConcurrencyThreshold: 10, FirstByteTimeoutInMilliseconds: 1}},
		{name: "first byte timeout one hour", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{FirstByteTimeoutInMilliseconds: fleet.MaxFirstByteTimeoutMillis}},
			want: &adminpb.RoutingConfig{Strategy: "PREFIX_AWARE", PrefixLength: fleet.DefaultAdaptivePrefixLength, ConcurrencyThreshold: 10, FirstByteTimeoutInMilliseconds: fleet.MaxFirstByteTimeoutMillis}},
		{name: "first byte timeout over one hour", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{FirstByteTimeoutInMilliseconds: fleet.MaxFirstByteTimeoutMillis + 1}},
			code: codes.InvalidArgument, msg: "FirstByteTimeoutInMilliseconds 3600001 is outside 1..3600000"},
		{name: "negative first byte timeout", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{FirstByteTimeoutInMilliseconds: -5}},
			code: codes.InvalidArgument, msg: "FirstByteTimeoutInMilliseconds -5 is outside"},
		{name: "negative variant weight", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{ProductionVariants: []*adminpb.ProductionVariant{{VariantName: "blue", InitialVariantWeight: -1}}}},
			code: codes.InvalidArgument, msg: `InitialVariantWeight -1 of "blue" must be in 0..1e6`},
		{name: "NaN variant weight", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{ProductionVariants: []*adminpb.ProductionVariant{{VariantName: "blue", InitialVariantWeight: math.NaN()}}}},
			code: codes.InvalidArgument, msg: `InitialVariantWeight NaN of "blue"`},
		{name: "variant weights sum to 0", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{ProductionVariants: []*adminpb.ProductionVariant{{VariantName: "blue"}, {VariantName: "green"}}}},
			code: codes.InvalidArgument, msg: "the weights sum to 0"},
		{name: "duplicate variant", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{ProductionVariants: []*adminpb.ProductionVariant{{VariantName: "blue", InitialVariantWeight: 1}, {VariantName: "blue", InitialVariantWeight: 1}}}},
			code: codes.InvalidArgument, msg: `VariantName "blue" must be 1..63 characters and unique`},
		{name: "unnamed variant", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{ProductionVariants: []*adminpb.ProductionVariant{{InitialVariantWeight: 1}}}},
			code: codes.InvalidArgument, msg: `VariantName "" must be 1..63`},
		{name: "bad strategy", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{Strategy: "ROUND_ROBIN"}},
			code: codes.InvalidArgument, msg: `RoutingStrategy "ROUND_ROBIN" is not one of`},
		{name: "lowercase strategy", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{Strategy: "prefix_aware"}},
			code: codes.InvalidArgument, msg: "RoutingStrategy"},
		{name: "prefix length 100", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{Strategy: "PREFIX_AWARE", PrefixLength: 100}},
			code: codes.InvalidArgument, msg: "PrefixLength 100 is outside 1024..65536"},
		{name: "prefix length too long", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{PrefixLength: 65537}},
			code: codes.InvalidArgument, msg: "PrefixLength 65537"},
		{name: "negative threshold", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{ConcurrencyThreshold: -1}},
			code: codes.InvalidArgument, msg: "ConcurrencyThreshold -1 is outside 1..1024"},
		{name: "threshold 2000", req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{ConcurrencyThreshold: 2000}},
			code: codes.InvalidArgument, msg: "ConcurrencyThreshold 2000"},
		{name: "bad endpoint", req: &adminpb.SetRoutingConfigRequest{Endpoint: "has space", Config: &adminpb.RoutingConfig{Strategy: "RANDOM"}},
			code: codes.InvalidArgument, msg: "endpoint name"},
		{name: "static fleet", static: true, req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{Strategy: "RANDOM"}},
			code: codes.Unavailable, msg: "without etcd"},
		{name: "invalid before unavailable", static: true, req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{PrefixLength: 100}},
			code: codes.InvalidArgument, msg: "PrefixLength 100"},
		{name: "etcd down", putErr: errors.New("context deadline exceeded from etcd"), req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{Strategy: "RANDOM"}},
			code: codes.Unavailable, msg: "write routing config"},
		{name: "store rejects", putErr: fmt.Errorf("%w: by store", fleet.ErrInvalidConfig), req: &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{Strategy: "RANDOM"}},
			code: codes.InvalidArgument, msg: "by store"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := &fakeStore{putErr: tt.putErr}
			o := admin.Options{}
			if !tt.static {
				o.Configs = store
			}
			h := start(t, o)
			resp, err := h.client.SetRoutingConfig(ctx(t), tt.req)
			got, written := store.stored(tt.req.Endpoint)
			if tt.code != codes.OK {
				wantCode(t, err, tt.code, tt.msg)
				if written {
					t.Fatalf("rejected config was written: %v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !sameConfig(resp.Config, tt.want) {
				t.Fatalf("response config = %v, want %v", resp.Config, tt.want)
			}
			if !written || !sameConfig(storedAsPB(got), tt.want) {
				t.Fatalf("store holds %v (written %v), want %v", got, written, tt.want)
			}
			// A read through the API returns what was written.
			read, err := h.client.GetRoutingConfig(ctx(t), &adminpb.GetRoutingConfigRequest{Endpoint: tt.req.Endpoint})
			if err != nil {
				t.Fatal(err)
			}
			if !read.Stored || !sameConfig(read.Config, tt.want) {
				t.Fatalf("read back %v stored %v, want %v", read.Config, read.Stored, tt.want)
			}
		})
	}
}

func TestExplainRoute(t *testing.T) {
	ex := router.Explanation{
		Endpoint: "chat", Strategy: fleet.PrefixAware, Instance: "i-a", Decision: router.DecisionAffinity, HotReplicas: 2,
		Candidates: []string{"i-a", "i-c"}, Key: 0xbeef, Model: "lora-x", Tenant: "t1", Variant: "v2", PrefixLength: 2048,
	}
	e := &fakeExplainer{ex: ex}
	h := start(t, admin.Options{Explainer: e})

	resp, err := h.client.ExplainRoute(ctx(t), &adminpb.ExplainRouteRequest{
		Endpoint: "chat",
		Path:     "/v1/chat/completions",
		Headers:  map[string]string{"x-amzn-sagemaker-prefix-aware-id": "t1"},
		Payload:  &adminpb.ExplainRouteRequest_BodyText{BodyText: `{"model":"lora-x"}`},
		Subset:   []string{"127.0.0.1:8001"},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Every field of the explanation reaches the response: nothing is
	// lost between the router's value and the wire.
	if resp.Endpoint != "chat" || resp.Strategy != "PREFIX_AWARE" || resp.Instance != "i-a" || resp.InstanceAddr != "http://127.0.0.1:8001" ||
		strings.Join(resp.Candidates, ",") != "i-a,i-c" || resp.RoutingKey != "000000000000beef" ||
		resp.Model != "lora-x" || resp.Tenant != "t1" || resp.PrefixLength != 2048 ||
		resp.HotReplicas != 2 || resp.Decision != "affinity" || resp.Variant != "v2" {
		t.Fatalf("response = %v", resp)
	}
	call := e.lastCall()
	if call.endpoint != "chat" || call.path != "/v1/chat/completions" || string(call.body) != `{"model":"lora-x"}` ||
		call.header.Get("X-Amzn-Sagemaker-Prefix-Aware-Id") != "t1" || strings.Join(call.subset, ",") != "127.0.0.1:8001" {
		t.Fatalf("explainer saw %+v", call)
	}

	// Raw bytes and the default path.
	if _, err := h.client.ExplainRoute(ctx(t), &adminpb.ExplainRouteRequest{
		Endpoint: "chat", Payload: &adminpb.ExplainRouteRequest_Body{Body: []byte{0xff, 0x00, 'x'}},
	}); err != nil {
		t.Fatal(err)
	}
	if call := e.lastCall(); call.path != "/endpoints/chat/invocations" || !bytes.Equal(call.body, []byte{0xff, 0x00, 'x'}) {
		t.Fatalf("explainer saw path %q body %q", call.path, call.body)
	}

	_, err = h.client.ExplainRoute(ctx(t), &adminpb.ExplainRouteRequest{Endpoint: "nope"})
	wantCode(t, err, codes.NotFound, `"nope"`)
	_, err = h.client.ExplainRoute(ctx(t), &adminpb.ExplainRouteRequest{})
	wantCode(t, err, codes.InvalidArgument, "endpoint name")
}

func TestExplainRouteErrors(t *testing.T) {
	tests := []struct {
		name string
		err  error
		code codes.Code
		msg  string
	}{
		{"unknown model", fmt.Errorf("router: model %q: %w", "lora-z", lora.ErrUnknownModel), codes.NotFound, "lora-z"},
		{"unknown endpoint", fmt.Errorf("%w: %q", router.ErrUnknownEndpoint, "ep-z"), codes.NotFound, "ep-z"},
		{"bad body", fmt.Errorf("%w: messages must be an array", router.ErrInvalidRequest), codes.InvalidArgument, "messages must be an array"},
		{"no instance", fmt.Errorf("%w: all draining", fleet.ErrNoInstance), codes.Unavailable, "all draining"},
		{"adapter not ready", fmt.Errorf("%w: loading", lora.ErrModelNotReady), codes.Unavailable, "loading"},
		{"status passes through", status.Error(codes.ResourceExhausted, "busy"), codes.ResourceExhausted, "busy"},
		{"other", errors.New("boom"), codes.Internal, "boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := start(t, admin.Options{Explainer: &fakeExplainer{err: tt.err}})
			_, err := h.client.ExplainRoute(ctx(t), &adminpb.ExplainRouteRequest{Endpoint: "chat"})
			wantCode(t, err, tt.code, tt.msg)
		})
	}
	t.Run("no explainer", func(t *testing.T) {
		h := start(t, admin.Options{})
		_, err := h.client.ExplainRoute(ctx(t), &adminpb.ExplainRouteRequest{Endpoint: "chat"})
		wantCode(t, err, codes.Unimplemented, "does not explain")
	})
}

// --- server plumbing: panics, logs, metrics, health, reflection ---

func TestPanicRecoveredLoggedAndCounted(t *testing.T) {
	var logs testsupport.LogBuffer
	h := start(t, admin.Options{
		Explainer: &fakeExplainer{pan: true},
		Logger:    slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	_, err := h.client.ExplainRoute(ctx(t), &adminpb.ExplainRouteRequest{Endpoint: "chat"})
	wantCode(t, err, codes.Internal, "internal error")
	// The server survived.
	if _, err := h.client.GetFleet(ctx(t), &adminpb.GetFleetRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := healthpb.NewHealthClient(h.conn).Check(ctx(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	listServices(t, h.conn)
	if got := handled(t, h.reg, "ExplainRoute", "Internal"); got != 1 {
		t.Errorf("handled{ExplainRoute,Internal} = %v, want 1", got)
	}
	// Logging runs in the handler chain before the reply is sent, so the
	// lines are there once the calls returned.
	out := logs.String()
	for _, want := range []string{"explainer exploded", "grpc.method=ExplainRoute", "grpc.code=Internal", "grpc.method=GetFleet"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "grpc.health.v1") || strings.Contains(out, "grpc.reflection") {
		t.Errorf("health checks or reflection were logged:\n%s", out)
	}
}

// handled returns grpc_server_handled_total for the Admin method and code.
func handled(t *testing.T, reg *prometheus.Registry, method, code string) float64 {
	t.Helper()
	return testsupport.Sum(t, reg, "grpc_server_handled_total", map[string]string{
		"grpc_service": adminpb.Admin_ServiceDesc.ServiceName, "grpc_method": method, "grpc_code": code})
}

func TestMetrics(t *testing.T) {
	h := start(t, admin.Options{})
	for i := range 3 {
		if got := handled(t, h.reg, "GetFleet", "OK"); got != float64(i) {
			t.Fatalf("before call %d: handled{GetFleet,OK} = %v", i, got)
		}
		if _, err := h.client.GetFleet(ctx(t), &adminpb.GetFleetRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := h.client.SetRoutingConfig(ctx(t), &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{PrefixLength: 100}})
	wantCode(t, err, codes.InvalidArgument, "PrefixLength")
	if got := handled(t, h.reg, "SetRoutingConfig", "InvalidArgument"); got != 1 {
		t.Errorf("handled{SetRoutingConfig,InvalidArgument} = %v, want 1", got)
	}
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"grpc_server_started_total", "grpc_server_handled_total", "grpc_server_handling_seconds", "grpc_server_msg_received_total"} {
		if !names[n] {
			t.Errorf("metric %s not registered", n)
		}
	}

	// The registry is the caller's: a second server on it is an error, not a panic.
	if _, err := admin.NewServer(admin.Options{Snapshots: h.snaps, Ready: func() error { return nil }, Registry: h.reg}); err == nil {
		t.Error("second NewServer on the same registry succeeded")
	}
	if _, err := admin.NewServer(admin.Options{Ready: func() error { return nil }}); err == nil {
		t.Error("NewServer without Snapshots succeeded")
	}
	// Readiness has one definition (router.Readiness): no default here.
	if _, err := admin.NewServer(admin.Options{Snapshots: h.snaps}); err == nil {
		t.Error("NewServer without Ready succeeded")
	}
}

func TestHealth(t *testing.T) {
	var ready atomic.Bool
	h := start(t, admin.Options{
		Ready: func() error {
			if !ready.Load() {
				return errors.New("not yet")
			}
			return nil
		},
		ReadyInterval: 5 * time.Millisecond,
	})
	hc := healthpb.NewHealthClient(h.conn)
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		resp, err := hc.Check(ctx(t), &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Status
	}
	for _, svc := range []string{"", "prefixrouter.admin.v1.Admin"} {
		if got := check(svc); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("Check(%q) before ready = %v", svc, got)
		}
	}
	_, err := hc.Check(ctx(t), &healthpb.HealthCheckRequest{Service: "no.such.Service"})
	wantCode(t, err, codes.NotFound, "")

	// A Watch stream sees the change without another Check.
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if first.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("first watched status = %v", first.Status)
	}
	ready.Store(true)
	next, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if next.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watched status after ready = %v", next.Status)
	}
	cancel()

	ready.Store(false)
	// Check evaluates readiness itself: no wait for the ticker.
	if got := check(""); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Check after unready = %v", got)
	}
}

func TestGracefulStopEndsHealthWatch(t *testing.T) {
	for _, tt := range []struct {
		name  string
		ready bool
	}{{"serving", true}, {"not serving", false}} {
		t.Run(tt.name, func(t *testing.T) {
			snaps := &snapSource{}
			snaps.p.Store(testSnapshot())
			srv, err := admin.NewServer(admin.Options{Snapshots: snaps, Ready: func() error {
				if !tt.ready {
					return errors.New("not ready")
				}
				return nil
			}})
			if err != nil {
				t.Fatal(err)
			}
			conn, served := serveAndDial(t, srv)
			defer conn.Close()
			// A watch that never hangs up: GracefulStop must not wait for
			// the test's deadline.
			w, err := healthpb.NewHealthClient(conn).Watch(ctx(t), &healthpb.HealthCheckRequest{})
			if err != nil {
				t.Fatal(err)
			}
			want := healthpb.HealthCheckResponse_NOT_SERVING
			if tt.ready {
				want = healthpb.HealthCheckResponse_SERVING
			}
			if r, err := w.Recv(); err != nil || r.Status != want {
				t.Fatalf("first watched status = %v, %v; want %v", r, err, want)
			}
			stopped := make(chan struct{})
			go func() { srv.GracefulStop(); close(stopped) }()
			if tt.ready {
				// The watcher learns NOT_SERVING before its stream ends.
				if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
					t.Fatalf("status during stop = %v, %v", r, err)
				}
			}
			_, err = w.Recv()
			wantCode(t, err, codes.Unavailable, "stopping")
			select {
			case <-stopped:
			case <-time.After(5 * time.Second):
				t.Fatal("GracefulStop still waiting 5s after the watch ended")
			}
			if err := <-served; err != nil {
				t.Fatalf("Serve after GracefulStop = %v", err)
			}
			srv.Stop() // idempotent
		})
	}
}

func TestReflection(t *testing.T) {
	h := start(t, admin.Options{})
	got := listServices(t, h.conn)
	for _, want := range []string{"prefixrouter.admin.v1.Admin", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
		if !strings.Contains(strings.Join(got, " "), want) {
			t.Errorf("reflection lists %v, lacks %s", got, want)
		}
	}
}

// listServices asks server reflection for the service names, as grpcurl list does.
func listServices(t *testing.T, conn *grpc.ClientConn) []string {
	t.Helper()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	// Wait for the server to end the stream, so that its log line (if any)
	// is written before the caller looks.
	if _, err := stream.Recv(); err == nil {
		t.Fatal("reflection stream sent a second response")
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	return names
}

// TestDrain: health goes NOT_SERVING and Watch streams end, but the server
// keeps answering calls on open connections until it is stopped.
func TestDrain(t *testing.T) {
	h := start(t, admin.Options{})
	hc := healthpb.NewHealthClient(h.conn)
	w, err := hc.Watch(ctx(t), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first watched status = %v, %v", r, err)
	}
	h.srv.Drain()
	if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("status after Drain = %v, %v", r, err)
	}
	_, err = w.Recv()
	wantCode(t, err, codes.Unavailable, "stopping")
	if r, err := hc.Check(ctx(t), &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Check after Drain = %v, %v", r, err)
	}
	if _, err := h.client.GetFleet(ctx(t), &adminpb.GetFleetRequest{}); err != nil {
		t.Fatalf("GetFleet after Drain: %v", err)
	}
	h.srv.Drain() // idempotent
}
