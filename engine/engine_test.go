package engine_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/engine"
	"github.com/prefixrouter/prefixrouter/probe"
)

// TestServerErrorIsEngineFault: 4xx and 501 never count, 502-504 always
// do, and 500 follows the profile: llama-server answers 500 to malformed
// requests (testdata/llamacpp-c392e50/error-500-*.json), so its 500 does
// not prove a failure.
func TestServerErrorIsEngineFault(t *testing.T) {
	for _, tc := range []struct {
		engine string
		status int
		want   bool
	}{
		{engine.VLLM, 200, false},
		{engine.VLLM, 400, false},
		{engine.VLLM, 404, false},
		{engine.VLLM, 429, false},
		{engine.VLLM, 500, true},
		{engine.VLLM, 501, false},
		{engine.VLLM, 502, true},
		{engine.VLLM, 503, true},
		{engine.VLLM, 504, true},
		{engine.VLLM, 505, true},
		{engine.VLLM, 600, false},
		{engine.SGLang, 500, true},
		{engine.TGI, 500, true},
		{engine.LlamaCpp, 400, false},
		{engine.LlamaCpp, 500, false},
		{engine.LlamaCpp, 501, false},
		{engine.LlamaCpp, 502, true},
		{engine.LlamaCpp, 503, true},
		{engine.LlamaCpp, 504, true},
		{"", 500, false}, // Generic: an unknown engine's 500 is no proof alone (overload counts it across requests)
	} {
		p, _ := engine.Lookup(tc.engine)
		if got := p.ServerErrorIsEngineFault(tc.status); got != tc.want {
			t.Errorf("%q: ServerErrorIsEngineFault(%d) = %v, want %v", tc.engine, tc.status, got, tc.want)
		}
	}
	// Only llama-server's 500 is the client's whatever it is sent: the
	// others fail with a 500 (or, unknown, may).
	for _, name := range []string{engine.VLLM, engine.SGLang, engine.LlamaCpp, engine.TGI, ""} {
		if p, _ := engine.Lookup(name); (p.Server500 == engine.Client500) != (name == engine.LlamaCpp) {
			t.Errorf("%q: Server500 %v", name, p.Server500)
		}
	}
	// The captured 500s are the client's fault: their bodies say so.
	for _, f := range []string{"error-500-n2.json", "error-500-badjson.json"} {
		var e struct {
			Error struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(read(t, "llamacpp-c392e50", f), &e); err != nil || e.Error.Code != 500 || e.Error.Message == "" {
			t.Fatalf("%s: %+v, %v: not llama-server's 500 error shape", f, e, err)
		}
	}
}

func TestLookupAndValidateName(t *testing.T) {
	for _, name := range []string{engine.VLLM, engine.SGLang, engine.LlamaCpp, engine.TGI} {
		p, ok := engine.Lookup(name)
		if !ok || p.Name != name {
			t.Errorf("Lookup(%q) = %q, %v", name, p.Name, ok)
		}
		if err := engine.ValidateName(name); err != nil {
			t.Errorf("ValidateName(%q): %v", name, err)
		}
	}
	if p, ok := engine.Lookup(""); !ok || p.Name != "" || p.Server500 != engine.Unclear500 {
		t.Errorf(`Lookup("") = %+v, %v; want Generic`, p, ok)
	}
	if p, ok := engine.Lookup("tgi-next"); ok || p.Name != "" {
		t.Errorf(`Lookup("tgi-next") = %q, %v; want Generic, false`, p.Name, ok)
	}
	for _, bad := range []string{"vLLM", "v llm", "a/b", strings.Repeat("x", engine.MaxNameLength+1), "é"} {
		if engine.ValidateName(bad) == nil {
			t.Errorf("ValidateName(%q) = nil, want an error", bad)
		}
	}
	for _, good := range []string{"", "tgi-next", "vllm_0.11"} {
		if err := engine.ValidateName(good); err != nil {
			t.Errorf("ValidateName(%q): %v", good, err)
		}
	}
	// Profiles are copies: editing one does not change Lookup's.
	ps := engine.Profiles()
	ps[0].Name = "changed"
	if p, _ := engine.Lookup(engine.VLLM); p.Name != engine.VLLM {
		t.Fatal("Profiles shares its backing array with Lookup")
	}
}

// TestDetect reads each engine's evidence from testdata: llama-server's
// captured /metrics, /v1/models and Server header, and the metrics and
// model lists built from vLLM's and SGLang's source.
func TestDetect(t *testing.T) {
	names := func(dir, file string) []string {
		m, err := probe.ParseMetrics(strings.NewReader(string(read(t, dir, file))))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for n := range m {
			out = append(out, n)
		}
		return out
	}
	ownedBy := func(dir string) []string {
		var list struct {
			Data []struct {
				OwnedBy string `json:"owned_by"`
			} `json:"data"`
		}
		if err := json.Unmarshal(read(t, dir, "models.json"), &list); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range list.Data {
			out = append(out, e.OwnedBy)
		}
		return out
	}
	header := string(read(t, "llamacpp-c392e50", "models.headers"))
	server := ""
	for _, line := range strings.Split(header, "\n") {
		if v, ok := strings.CutPrefix(line, "Server: "); ok {
			server = v
		}
	}
	if server != "llama.cpp" {
		t.Fatalf("captured Server header %q", server)
	}
	for _, tc := range []struct {
		name string
		e    engine.Evidence
		want string
	}{
		{"llama.cpp metrics", engine.Evidence{Metrics: names("llamacpp-c392e50", "metrics-idle.txt")}, engine.LlamaCpp},
		{"llama.cpp models (no --metrics)", engine.Evidence{OwnedBy: ownedBy("llamacpp-c392e50")}, engine.LlamaCpp},
		{"llama.cpp Server header alone", engine.Evidence{Server: server}, engine.LlamaCpp},
		{"vLLM metrics", engine.Evidence{Metrics: names("vllm-source", "metrics.txt")}, engine.VLLM},
		{"vLLM models", engine.Evidence{OwnedBy: ownedBy("vllm-source")}, engine.VLLM},
		{"SGLang metrics", engine.Evidence{Metrics: names("sglang-source", "metrics.txt"), Server: "uvicorn"}, engine.SGLang},
		{"SGLang models (no --enable-metrics)", engine.Evidence{OwnedBy: ownedBy("sglang-source"), Server: "uvicorn"}, engine.SGLang},
		{"TGI metrics", engine.Evidence{Metrics: []string{"tgi_queue_size", "tgi_batch_current_size"}}, engine.TGI},
		// Metrics win over a listing that says otherwise (a proxy in front).
		{"metrics first", engine.Evidence{Metrics: []string{"sglang:num_running_reqs"}, OwnedBy: []string{"vllm"}}, engine.SGLang},
	} {
		p, ok := engine.Detect(tc.e)
		if !ok || p.Name != tc.want {
			t.Errorf("%s: Detect = %q, %v; want %q", tc.name, p.Name, ok, tc.want)
		}
	}
	for _, e := range []engine.Evidence{
		{},
		{Metrics: []string{"process_cpu_seconds_total", "http_requests_total"}, OwnedBy: []string{"openai"}, Server: "uvicorn"},
	} {
		if p, ok := engine.Detect(e); ok || p.Name != "" {
			t.Errorf("Detect(%+v) = %q, %v; want Generic, false", e, p.Name, ok)
		}
	}
}

// TestRequestField: the member each engine needs to serve an adapter, on
// the shapes llama-server (captured: "lora" applies adapter 0 and sets the
// others to 0; "lora": [] serves the base model) and SGLang ("lora_path")
// take.
func TestRequestField(t *testing.T) {
	get := func(name string) engine.Profile { p, _ := engine.Lookup(name); return p }
	for _, tc := range []struct {
		p       engine.Profile
		adapter string
		index   int
		loaded  bool
		want    string
	}{
		{get(engine.VLLM), "sql-lora", 0, true, ""},
		{get(""), "sql-lora", 0, true, ""},
		{get(engine.SGLang), "sql-lora", 0, true, `"lora_path":"sql-lora"`},
		{get(engine.SGLang), `we"ird\name`, 0, true, `"lora_path":"we\"ird\\name"`},
		{get(engine.SGLang), "", 0, true, ""},
		{get(engine.LlamaCpp), "sql-lora", 0, true, `"lora":[{"id":0,"scale":1}]`},
		{get(engine.LlamaCpp), "chat-lora", 1, true, `"lora":[{"id":1,"scale":1}]`},
		{get(engine.LlamaCpp), "", 0, true, `"lora":[]`},
		{get(engine.LlamaCpp), "", 0, false, ""},
	} {
		got := string(tc.p.RequestField(tc.adapter, tc.index, tc.loaded))
		if got != tc.want {
			t.Errorf("%q.RequestField(%q, %d, %v) = %s, want %s", tc.p.Name, tc.adapter, tc.index, tc.loaded, got, tc.want)
		}
		if got != "" {
			var v map[string]any
			if err := json.Unmarshal([]byte("{"+got+"}"), &v); err != nil {
				t.Errorf("%s is not a JSON member: %v", got, err)
			}
		}
	}
}

func TestAdapterName(t *testing.T) {
	var list []struct {
		ID   int    `json:"id"`
		Path string `json:"path"`
	}
	if err := json.Unmarshal(read(t, "llamacpp-c392e50", "lora-adapters.json"), &list); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range list {
		got = append(got, engine.AdapterName(a.Path))
	}
	if want := []string{"sql-lora", "chat-lora"}; !slices.Equal(got, want) {
		t.Fatalf("names of the captured adapters = %v, want %v", got, want)
	}
	for in, want := range map[string]string{"a.gguf": "a", `C:\m\b.gguf`: "b", "/x/c.bin": "c.bin", "d": "d"} {
		if got := engine.AdapterName(in); got != want {
			t.Errorf("AdapterName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestProfilesComplete: every profile names its load gauges, and an engine that loads adapters at run time names both paths.
func TestProfilesComplete(t *testing.T) {
	for _, p := range engine.Profiles() {
		if p.Name == "" || len(p.Running) == 0 || len(p.Waiting) == 0 || p.Cached == 0 {
			t.Errorf("%q: incomplete profile %+v", p.Name, p)
		}
		a := p.Adapters
		if (a.LoadPath == "") != (a.UnloadPath == "") {
			t.Errorf("%q: load %q and unload %q paths must come together", p.Name, a.LoadPath, a.UnloadPath)
		}
		if (a.List == engine.ListNone) != (a.ListPath == "") {
			t.Errorf("%q: listing %v with path %q", p.Name, a.List, a.ListPath)
		}
	}
	if p, _ := engine.Lookup(engine.LlamaCpp); p.Adapters.RuntimeLoading() {
		t.Error("llama-server loads adapters only at start")
	}
	if p, _ := engine.Lookup(engine.SGLang); !p.Adapters.RuntimeLoading() || p.Adapters.LoadPath != "/load_lora_adapter" {
		t.Errorf("SGLang's runtime loading: %+v", p.Adapters)
	}
}

func read(t *testing.T, dir, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", dir, file))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
