package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/membership/etcdtest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// registeredLogger is quiet, and reports whether the agent logged that
// Run's registration returned. The record shows up in etcd before that (the
// put is applied, its answer still on the way): a test that stops the agent
// in between sees Run give up the registration as "stopped before
// registering" and skip the drain.
func registeredLogger() (*slog.Logger, func() bool) {
	h := &msgHandler{Handler: quiet.Handler(), msg: "agent: registered", seen: new(atomic.Bool)}
	return slog.New(h), h.seen.Load
}

type msgHandler struct {
	slog.Handler
	msg  string
	seen *atomic.Bool
}

func (h *msgHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *msgHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.seen.Store(true)
	}
	return nil
}

func (h *msgHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &msgHandler{Handler: h.Handler.WithAttrs(as), msg: h.msg, seen: h.seen}
}

func (h *msgHandler) WithGroup(name string) slog.Handler {
	return &msgHandler{Handler: h.Handler.WithGroup(name), msg: h.msg, seen: h.seen}
}

// fakeServer is a model server over real HTTP whose health, model list and
// load the test controls.
type fakeServer struct {
	*httptest.Server
	healthy      atomic.Bool
	healthPath   string // the only health path that exists
	healthProbes atomic.Int64
	scrapes      atomic.Int64
	running      atomic.Int64
	waiting      atomic.Int64
	noMetrics    atomic.Bool

	mu       sync.Mutex // guards adapters
	adapters []string
}

func newFakeServer(t *testing.T, healthPath string) *fakeServer {
	f := &fakeServer{healthPath: healthPath}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+healthPath, func(w http.ResponseWriter, r *http.Request) {
		f.healthProbes.Add(1)
		if !f.healthy.Load() {
			http.Error(w, "loading", http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		data := []map[string]any{{"id": "base", "object": "model", "parent": nil, "root": "base"}}
		for _, a := range f.adapters {
			data = append(data, map[string]any{"id": a, "object": "model", "parent": "base", "root": "/adapters/" + a})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		f.scrapes.Add(1)
		if f.noMetrics.Load() {
			fmt.Fprintln(w, "# TYPE other gauge\nother 1")
			return
		}
		fmt.Fprintf(w, "# HELP vllm:num_requests_running Number of requests in model execution batches.\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"base\"} %d\n", f.running.Load())
		fmt.Fprintf(w, "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"base\"} %d\n", f.waiting.Load())
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

func (f *fakeServer) setAdapters(a ...string) {
	f.mu.Lock()
	f.adapters = a
	f.mu.Unlock()
}

// record reads the instance's record from etcd; ok is false when absent.
func record(t *testing.T, cli *clientv3.Client, id string) (fleet.Instance, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, membership.Layout{}.InstanceKey("ep", id))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return fleet.Instance{}, false
	}
	var in fleet.Instance
	if err := json.Unmarshal(resp.Kvs[0].Value, &in); err != nil {
		t.Fatal(err)
	}
	return in, true
}

type running struct {
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, cfg Options) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- Run(ctx, cfg) }()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

func (r *running) stop(t *testing.T, within time.Duration) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(within):
		t.Fatalf("Run did not return within %v", within)
		return nil
	}
}

func baseConfig(cli *clientv3.Client, f *fakeServer, id string) Options {
	c := agentConfig(cli, f.URL, id)
	c.Instance.Adapters = []string{"static"}
	return c
}

// agentConfig is the agent of instance id at addr, with short intervals.
func agentConfig(cli *clientv3.Client, addr, id string) Options {
	return Options{
		Client:            cli,
		Options:           membership.Options{TTL: 2 * time.Second, Logger: quiet},
		Endpoint:          "ep",
		Instance:          fleet.Instance{ID: id, Addr: addr},
		HealthInterval:    10 * time.Millisecond,
		PollInterval:      20 * time.Millisecond,
		DrainPollInterval: 10 * time.Millisecond,
		DrainGrace:        50 * time.Millisecond,
		DrainTimeout:      10 * time.Second,
	}
}

func TestAgentLifecycle(t *testing.T) {
	e := etcdtest.Start(t)
	cli := etcdtest.Client(t, e)
	f := newFakeServer(t, "/health")
	f.setAdapters("lora-a")
	cfg := baseConfig(cli, f, "i-1")
	cfg.DiscoverAdapters = true
	r := start(t, cfg)

	// Not registered while the server is unhealthy.
	testsupport.Eventually(t, 5*time.Second, "health probed", func() bool { return f.healthProbes.Load() >= 3 })
	if _, ok := record(t, cli, "i-1"); ok {
		t.Fatal("registered before the model server was healthy")
	}
	f.healthy.Store(true)
	testsupport.Eventually(t, 5*time.Second, "registered with discovered adapters", func() bool {
		in, ok := record(t, cli, "i-1")
		return ok && slices.Equal(in.Adapters, []string{"lora-a", "static"}) && in.Labels[ModelLabel] == "base"
	})

	f.setAdapters("lora-a", "lora-b")
	testsupport.Eventually(t, 2*time.Second, "adapter change registered", func() bool {
		in, _ := record(t, cli, "i-1")
		return slices.Equal(in.Adapters, []string{"lora-a", "lora-b", "static"})
	})
	f.setAdapters()
	testsupport.Eventually(t, 2*time.Second, "adapter removal registered", func() bool {
		in, _ := record(t, cli, "i-1")
		return slices.Equal(in.Adapters, []string{"static"})
	})

	// Busy server: shutting down marks draining but keeps the record
	// until the load is zero.
	f.running.Store(2)
	f.waiting.Store(1)
	r.cancel()
	testsupport.Eventually(t, 2*time.Second, "draining", func() bool {
		in, ok := record(t, cli, "i-1")
		return ok && in.Draining
	})
	scrapes := f.scrapes.Load()
	testsupport.Eventually(t, 2*time.Second, "several scrapes while busy", func() bool { return f.scrapes.Load() >= scrapes+5 })
	if _, ok := record(t, cli, "i-1"); !ok {
		t.Fatal("deregistered while requests were running")
	}
	f.running.Store(0)
	testsupport.Eventually(t, 2*time.Second, "waiting scrape", func() bool { return f.scrapes.Load() >= scrapes+8 })
	if _, ok := record(t, cli, "i-1"); !ok {
		t.Fatal("deregistered while requests were waiting")
	}
	f.waiting.Store(0)
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if _, ok := record(t, cli, "i-1"); ok {
		t.Fatal("record still there after the drain")
	}
}

func TestAgentDrainTimeout(t *testing.T) {
	for _, tc := range []struct {
		name string
		prep func(*fakeServer)
	}{
		{"busy", func(f *fakeServer) { f.running.Store(1) }},
		{"unknown load", func(f *fakeServer) { f.noMetrics.Store(true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := etcdtest.Start(t)
			cli := etcdtest.Client(t, e)
			f := newFakeServer(t, "/health")
			f.healthy.Store(true)
			tc.prep(f)
			cfg := baseConfig(cli, f, "i-1")
			cfg.DrainTimeout = 300 * time.Millisecond
			var registered func() bool
			cfg.Options.Logger, registered = registeredLogger()
			r := start(t, cfg)
			testsupport.Eventually(t, 5*time.Second, "registered", func() bool { _, ok := record(t, cli, "i-1"); return ok && registered() })
			began := time.Now()
			if err := r.stop(t, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(began); took < cfg.DrainTimeout {
				t.Fatalf("drain ended after %v, before the %v timeout", took, cfg.DrainTimeout)
			}
			if _, ok := record(t, cli, "i-1"); ok {
				t.Fatal("record still there after the drain timeout")
			}
		})
	}
}

// TestAgentDrainEtcdGone: with etcd unreachable or the agent's client
// closed, the drain still waits for the busy server until DrainTimeout, and
// its etcd calls (the draining flag, the revoke) add at most about
// EtcdCallTimeout to it.
func TestAgentDrainEtcdGone(t *testing.T) {
	for _, tc := range []struct {
		name string
		cut  func(e *membership.Embedded, agentCli *clientv3.Client)
	}{
		{"etcd down", func(e *membership.Embedded, _ *clientv3.Client) { e.Close() }},
		{"client closed", func(_ *membership.Embedded, c *clientv3.Client) { c.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := etcdtest.Start(t)
			cli := etcdtest.Client(t, e)
			agentCli := etcdtest.Client(t, e)
			f := newFakeServer(t, "/health")
			f.healthy.Store(true)
			f.running.Store(1) // busy until the drain timeout
			cfg := baseConfig(agentCli, f, "i-1")
			cfg.DrainTimeout = time.Second
			var registered func() bool
			cfg.Options.Logger, registered = registeredLogger()
			r := start(t, cfg)
			testsupport.Eventually(t, 5*time.Second, "registered", func() bool { _, ok := record(t, cli, "i-1"); return ok && registered() })
			tc.cut(e, agentCli)
			began := time.Now()
			if err := r.stop(t, 15*time.Second); err != nil {
				t.Fatal(err)
			}
			took := time.Since(began)
			bound := cfg.DrainTimeout + EtcdCallTimeout + time.Second // slack for a loaded machine
			t.Logf("drain took %v (DrainTimeout %v, bound %v)", took, cfg.DrainTimeout, bound)
			if took < cfg.DrainTimeout {
				t.Fatalf("drain ended after %v, before the %v timeout with the server busy", took, cfg.DrainTimeout)
			}
			if took > bound {
				t.Fatalf("drain took %v, want within %v", took, bound)
			}
		})
	}
}

func TestAgentServerGoneEndsDrain(t *testing.T) {
	e := etcdtest.Start(t)
	cli := etcdtest.Client(t, e)
	f := newFakeServer(t, "/health")
	f.healthy.Store(true)
	f.running.Store(5)
	cfg := baseConfig(cli, f, "i-1")
	cfg.DrainTimeout = time.Minute
	var registered func() bool
	cfg.Options.Logger, registered = registeredLogger()
	r := start(t, cfg)
	testsupport.Eventually(t, 5*time.Second, "registered", func() bool { _, ok := record(t, cli, "i-1"); return ok && registered() })
	f.Close()
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, ok := record(t, cli, "i-1"); ok {
		t.Fatal("record still there")
	}
}

func TestAgentPingFallback(t *testing.T) {
	e := etcdtest.Start(t)
	cli := etcdtest.Client(t, e)
	f := newFakeServer(t, "/ping") // no /health: 404
	f.healthy.Store(true)
	r := start(t, baseConfig(cli, f, "i-2"))
	testsupport.Eventually(t, 5*time.Second, "registered via /ping", func() bool {
		in, ok := record(t, cli, "i-2")
		return ok && slices.Equal(in.Adapters, []string{"static"}) && in.Labels[ModelLabel] == ""
	})
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestAgentStopBeforeHealthy(t *testing.T) {
	e := etcdtest.Start(t)
	cli := etcdtest.Client(t, e)
	f := newFakeServer(t, "/health")
	r := start(t, baseConfig(cli, f, "i-3"))
	testsupport.Eventually(t, 5*time.Second, "health probed", func() bool { return f.healthProbes.Load() >= 2 })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if _, ok := record(t, cli, "i-3"); ok {
		t.Fatal("registered although never healthy")
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	e := etcdtest.Start(t)
	cli := etcdtest.Client(t, e)
	for _, tc := range []struct {
		name string
		cfg  Options
	}{
		{"no client", Options{Endpoint: "ep", Instance: fleet.Instance{ID: "a", Addr: "http://x"}}},
		{"no endpoint", Options{Client: cli, Instance: fleet.Instance{ID: "a", Addr: "http://x"}}},
		{"no addr", Options{Client: cli, Endpoint: "ep", Instance: fleet.Instance{ID: "a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := Run(context.Background(), tc.cfg); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}
