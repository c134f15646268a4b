package sim

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/probe"
)

func loraCall(t *testing.T, ctx context.Context, base, path, name string) (int, string) {
	t.Helper()
	resp := post(t, ctx, base+path, mustJSON(map[string]string{"lora_name": name, "lora_path": "/adapters/" + name}))
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestLoadUnloadCapLRU(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Load time 1 s simulated at time scale 100: 10 ms of real time.
	s, hs := newTestServer(t, Options{MaxLoras: 2, AdapterLoadTime: time.Second})
	infer := func(model string) int {
		resp := post(t, ctx, hs.URL+"/v1/completions", mustJSON(map[string]any{"model": model, "prompt": "hello there", "max_tokens": 1}))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := infer("a"); code != http.StatusNotFound {
		t.Fatalf("an adapter not loaded: %d, want 404", code)
	}
	start := time.Now()
	if code, body := loraCall(t, ctx, hs.URL, "/v1/load_lora_adapter", "a"); code != http.StatusOK || !strings.Contains(body, "added successfully") {
		t.Fatalf("load a: %d %q", code, body)
	}
	if d := time.Since(start); d < 10*time.Millisecond {
		t.Fatalf("load took %v, want at least the scaled load time of 10ms", d)
	}
	if code, _ := loraCall(t, ctx, hs.URL, "/v1/load_lora_adapter", "a"); code != http.StatusBadRequest {
		t.Fatalf("second load of a: %d, want 400 as vLLM", code)
	}
	if code, _ := loraCall(t, ctx, hs.URL, "/v1/load_lora_adapter", "b"); code != http.StatusOK {
		t.Fatal("load b")
	}
	// a is used after b was loaded: b is now the least recently used.
	if code := infer("a"); code != http.StatusOK {
		t.Fatalf("a after load: %d", code)
	}
	if code, _ := loraCall(t, ctx, hs.URL, "/v1/load_lora_adapter", "c"); code != http.StatusOK {
		t.Fatal("load c")
	}
	if got := s.Adapters(); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("after loading a third adapter with 2 slots: %v, want b (least recently used) evicted", got)
	}
	if code := infer("b"); code != http.StatusNotFound {
		t.Fatalf("evicted b: %d, want 404", code)
	}
	if code, _ := loraCall(t, ctx, hs.URL, "/v1/unload_lora_adapter", "a"); code != http.StatusOK {
		t.Fatal("unload a")
	}
	if code, _ := loraCall(t, ctx, hs.URL, "/v1/unload_lora_adapter", "a"); code != http.StatusNotFound {
		t.Fatalf("unload of an adapter not loaded: %d, want 404", code)
	}
	if code, _ := loraCall(t, ctx, hs.URL, "/v1/load_lora_adapter", ""); code != http.StatusBadRequest {
		t.Fatalf("load without a name: %d, want 400", code)
	}
	// The model list and vLLM's lora info metric follow.
	resp, err := http.Get(hs.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"id":"c"`) || strings.Contains(string(b), `"id":"a"`) {
		t.Fatalf("/v1/models: %s", b)
	}
	resp, err = http.Get(hs.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""}`) {
		t.Fatalf("no lora info in /metrics:\n%.3000s", b)
	}
	// The agent reads it through probe.
	m, err := probe.ParseMetrics(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if inUse, slots := m.LoRAUse(); inUse != nil || slots != 2 {
		t.Fatalf("LoRAUse = %q, %d; want none in use, 2 slots", inUse, slots)
	}
}

func TestEvictionSparesAdaptersInUse(t *testing.T) {
	a := newAdapters([]string{"x"}, 1)
	if !a.acquire("x") {
		t.Fatal("acquire x")
	}
	if _, _, err := a.load("y"); err != errFull {
		t.Fatalf("load over a busy adapter: %v, want errFull", err)
	}
	if got := a.running(); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("running %v", got)
	}
	a.release("x")
	if ev, _, err := a.load("y"); err != nil || ev != "x" {
		t.Fatalf("load after release: evicted %q %v", ev, err)
	}
}

func TestLoRAStepOverhead(t *testing.T) {
	p, err := LookupProfile(DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	w := StepWork{Prefills: []PrefillChunk{{Tokens: 2048}}, DecodeSeqs: 8, DecodeContextTokens: 8 * 1000}
	base := p.StepDuration(w)
	w.LoRA = true
	lora := p.StepDuration(w)
	if want := base + time.Duration(float64(base)*LoRAStepOverhead); lora < want-time.Microsecond || lora > want+time.Microsecond {
		t.Fatalf("step with an adapter %v, base %v: want %v", lora, base, want)
	}
}
