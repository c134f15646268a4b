package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/engine"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/membership/etcdtest"
)

// fakeLlama answers as llama-server c392e50 did when captured
// (engine/testdata/llamacpp-c392e50: its /v1/models, /lora-adapters and
// Server header), with /metrics in its names whose request gauges the test
// sets, and counts any POST (it has no runtime adapter loading).
type fakeLlama struct {
	*httptest.Server
	processing, deferred atomic.Int64
	scrapes, posts       atomic.Int64
	metrics              atomic.Bool // --metrics given
}

func newFakeLlama(t *testing.T) *fakeLlama {
	f := &fakeLlama{}
	f.metrics.Store(true)
	models := testsupport.EngineTestdata(t, "llamacpp-c392e50/models.json")
	adapters := testsupport.EngineTestdata(t, "llamacpp-c392e50/lora-adapters.json")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"status":"ok"}`)) })
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) { w.Write(models) })
	mux.HandleFunc("GET /lora-adapters", func(w http.ResponseWriter, r *http.Request) { w.Write(adapters) })
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		f.scrapes.Add(1)
		if !f.metrics.Load() {
			http.Error(w, `{"error":{"code":501,"message":"This server does not support metrics endpoint. Start it with `+"`--metrics`"+`","type":"not_supported_error"}}`, http.StatusNotImplemented)
			return
		}
		fmt.Fprintf(w, "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.1\n# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing %d\n# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred %d\n", f.processing.Load(), f.deferred.Load())
	})
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		f.posts.Add(1)
		http.NotFound(w, r)
	})
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Server", "llama.cpp")
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

func llamaConfig(cli *clientv3.Client, f *fakeLlama, id string) Options {
	c := agentConfig(cli, f.URL, id)
	c.PlaceAdapters, c.LoadPollInterval = true, 20*time.Millisecond
	return c
}

// TestAgentLlamaCpp: beside llama-server the agent detects the engine
// (from its /metrics names, or without --metrics from its owned_by and
// Server header), registers "engine":"llamacpp" with the adapters it
// loaded at start and their positions (read although --discover-adapters
// is off: requests must address them by position), places nothing (it
// cannot load adapters at run time), and drains on llama-server's own
// gauges (issue 20: the drain waited on vLLM's names).
func TestAgentLlamaCpp(t *testing.T) {
	e := etcdtest.Start(t)
	cli := etcdtest.Client(t, e)
	for _, withMetrics := range []bool{true, false} {
		t.Run(fmt.Sprintf("metrics=%v", withMetrics), func(t *testing.T) {
			f := newFakeLlama(t)
			f.metrics.Store(withMetrics)
			id := fmt.Sprintf("llama-%v", withMetrics)
			cfg := llamaConfig(cli, f, id)
			if !withMetrics {
				cfg.DrainTimeout = 200 * time.Millisecond // unknown load: only the timeout ends it
			}
			var registered func() bool
			cfg.Options.Logger, registered = registeredLogger()
			r := start(t, cfg)
			want := map[string]int{"sql-lora": 0, "chat-lora": 1}
			testsupport.Eventually(t, 5*time.Second, "registered as llama.cpp with indexed adapters", func() bool {
				in, ok := record(t, cli, id)
				return ok && in.Engine == engine.LlamaCpp && slices.Equal(in.Adapters, []string{"chat-lora", "sql-lora"}) &&
					maps.Equal(in.AdapterIndex, want) && in.Labels[ModelLabel] == "tiny"
			})
			// The record shows before Run's registration returned; stopped
			// in between, Run gives the registration up and skips the drain.
			testsupport.Eventually(t, 5*time.Second, "Run past its registration", registered)
			if !withMetrics {
				if err := r.stop(t, 5*time.Second); err != nil {
					t.Fatal(err)
				}
				if _, ok := record(t, cli, id); ok {
					t.Fatal("record left after the drain")
				}
				return
			}
			f.processing.Store(1)
			f.deferred.Store(1)
			r.cancel()
			testsupport.Eventually(t, 2*time.Second, "draining", func() bool {
				in, ok := record(t, cli, id)
				return ok && in.Draining
			})
			scrapes := f.scrapes.Load()
			testsupport.Eventually(t, 2*time.Second, "scrapes while busy", func() bool { return f.scrapes.Load() >= scrapes+5 })
			if _, ok := record(t, cli, id); !ok {
				t.Fatal("deregistered while llama-server processed a request")
			}
			f.processing.Store(0)
			testsupport.Eventually(t, 2*time.Second, "scrapes while one is deferred", func() bool { return f.scrapes.Load() >= scrapes+8 })
			if _, ok := record(t, cli, id); !ok {
				t.Fatal("deregistered while a request was deferred")
			}
			f.deferred.Store(0)
			if err := r.stop(t, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if _, ok := record(t, cli, id); ok {
				t.Fatal("record left after the drain")
			}
			if n := f.posts.Load(); n != 0 {
				t.Fatalf("%d POSTs to llama-server: placement tried to load adapters", n)
			}
		})
	}
}

// TestAgentEngineFlag: --engine overrides detection, an unknown name is
// refused before anything runs, and an adapter declared with --adapters
// that llama-server did not load at start stops the agent with an error
// naming what it loaded.
func TestAgentEngineFlag(t *testing.T) {
	e := etcdtest.Start(t)
	cli := etcdtest.Client(t, e)
	f := newFakeServer(t, "/health") // vLLM's names on /metrics
	f.healthy.Store(true)
	cfg := baseConfig(cli, f, "forced")
	cfg.Engine = engine.SGLang
	cfg.DrainTimeout = 100 * time.Millisecond // SGLang's gauges are not there: load unknown
	start(t, cfg)
	testsupport.Eventually(t, 5*time.Second, "registered as forced", func() bool {
		in, ok := record(t, cli, "forced")
		return ok && in.Engine == engine.SGLang
	})
	detected := baseConfig(cli, f, "detected")
	start(t, detected)
	testsupport.Eventually(t, 5*time.Second, "registered as detected", func() bool {
		in, ok := record(t, cli, "detected")
		return ok && in.Engine == engine.VLLM
	})

	bad := baseConfig(cli, f, "bad")
	bad.Engine = "vllm2"
	if err := Run(context.Background(), bad); err == nil || !strings.Contains(err.Error(), "unknown engine") {
		t.Fatalf("unknown engine: %v", err)
	}

	l := newFakeLlama(t)
	missing := llamaConfig(cli, l, "missing")
	missing.Instance.Adapters = []string{"sql-lora", "other"}
	ctx := testsupport.Context(t, 10*time.Second)
	err := Run(ctx, missing)
	if err == nil || !strings.Contains(err.Error(), `"other"`) || !strings.Contains(err.Error(), "chat-lora") {
		t.Fatalf("an adapter llama-server did not load: %v", err)
	}
	if _, ok := record(t, cli, "missing"); ok {
		t.Fatal("registered with an adapter it cannot address")
	}
}

// fakeSGLang answers /v1/models as SGLang does (engine/testdata/
// sglang-source: owned_by "sglang", adapters with "parent") and loads and
// unloads adapters at SGLang's paths, answering a repeated load as SGLang
// does (400, "already loaded").
type fakeSGLang struct {
	*httptest.Server
	mu       sync.Mutex // guards adapters and paths
	adapters map[string]string
	paths    []string
}

func newFakeSGLang(t *testing.T) *fakeSGLang {
	f := &fakeSGLang{adapters: map[string]string{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Write(testsupport.EngineTestdata(t, "sglang-source/metrics.txt"))
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		data := []map[string]any{{"id": "Qwen/Qwen2.5-7B-Instruct", "object": "model", "owned_by": "sglang", "root": "Qwen/Qwen2.5-7B-Instruct", "parent": nil}}
		for name, path := range f.adapters {
			data = append(data, map[string]any{"id": name, "object": "model", "owned_by": "sglang", "root": path, "parent": "Qwen/Qwen2.5-7B-Instruct"})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
	})
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Name string `json:"lora_name"`
			Path string `json:"lora_path"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		defer f.mu.Unlock()
		f.paths = append(f.paths, r.URL.Path)
		switch r.URL.Path {
		case "/load_lora_adapter":
			if _, ok := f.adapters[req.Name]; ok {
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprintf(w, `{"success":false,"error_message":"LoRA adapter %s is skipped as it is already loaded. If you want to reload it, please unload it first."}`, req.Name)
				return
			}
			f.adapters[req.Name] = req.Path
		case "/unload_lora_adapter":
			delete(f.adapters, req.Name)
		default:
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(`{"success":true}`))
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

// TestAgentSGLangPlacement: placement loads a catalogued adapter on SGLang
// through its own /load_lora_adapter (not vLLM's /v1/...), sees it in the
// model list, and unloads it through /unload_lora_adapter when it leaves
// the catalogue.
func TestAgentSGLangPlacement(t *testing.T) {
	e := etcdtest.Start(t)
	cli := etcdtest.Client(t, e)
	ctx := testsupport.Context(t, 30*time.Second)
	f := newFakeSGLang(t)
	start(t, Options{
		Client: cli, Options: membership.Options{TTL: 2 * time.Second, Logger: quiet},
		Endpoint: "ep", Instance: fleet.Instance{ID: "sg", Addr: f.URL},
		HealthInterval: 10 * time.Millisecond, DrainGrace: time.Millisecond, DrainTimeout: time.Second,
		PlaceAdapters: true, LoadPollInterval: 20 * time.Millisecond,
	})
	l := membership.Layout{}
	if err := membership.PutAdapter(ctx, cli, l, "ep", fleet.Adapter{Name: "sql-lora", Source: "/adapters/sql-lora"}); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 10*time.Second, "loaded on SGLang and registered", func() bool {
		in, ok := record(t, cli, "sg")
		return ok && in.Engine == engine.SGLang && slices.Equal(in.Adapters, []string{"sql-lora"})
	})
	if err := membership.DeleteAdapter(ctx, cli, l, "ep", "sql-lora"); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 10*time.Second, "unloaded", func() bool {
		in, _ := record(t, cli, "sg")
		return len(in.Adapters) == 0
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.paths {
		if p != "/load_lora_adapter" && p != "/unload_lora_adapter" {
			t.Fatalf("POST %s: not SGLang's path (all: %v)", p, f.paths)
		}
	}
	if !slices.Contains(f.paths, "/load_lora_adapter") || !slices.Contains(f.paths, "/unload_lora_adapter") {
		t.Fatalf("paths %v", f.paths)
	}
	if !alreadyLoaded("LoRA adapter x is skipped as it is already loaded. If you want to reload it, please unload it first.") ||
		!alreadyLoaded("The lora adapter 'x' has already been loaded.") || alreadyLoaded("not found") {
		t.Fatal("alreadyLoaded")
	}
}
