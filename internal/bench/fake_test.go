package bench

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/sim"
)

// fakeServer is a loopback model server speaking vLLM's SSE shape, with
// an unbounded prefix cache (the oracle's hashing) and vLLM's counters.
type fakeServer struct {
	*httptest.Server
	id string
	// firstDelay is the wait before the first content chunk (after an
	// empty role chunk, which TTFT must skip).
	firstDelay time.Duration
	// fail, if set, answers a status instead of streaming for arrival n.
	fail func(n int) int
	// block holds every request until its context ends.
	block bool
	// arrived gets a value per arrival (if non-nil; never blocks).
	arrived chan struct{}
	// noCacheInfo leaves vllm:cache_config_info out of /metrics.
	noCacheInfo bool
	// llama speaks llama.cpp's llama-server (c392e50): usage without
	// prompt_tokens_details, the evaluated prompt tokens in
	// timings.prompt_n, and only llamacpp:prompt_tokens_total on /metrics.
	llama bool

	mu      sync.Mutex // guards the fields below
	n       int
	cache   *Oracle
	hits    int64
	queries int64
	paths   []string
	headers []http.Header
	bodies  []chatBody
}

func newFake(t *testing.T, id string, configure func(*fakeServer)) *fakeServer {
	t.Helper()
	f := &fakeServer{id: id, cache: NewOracle()}
	if configure != nil {
		configure(f)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", f.chat)
	mux.HandleFunc("POST /invocations", f.chat)
	mux.HandleFunc("POST /endpoints/{ep}/invocations", f.chat)
	mux.HandleFunc("POST /endpoints/{ep}/openai/v1/chat/completions", f.chat)
	mux.HandleFunc("GET /metrics", f.metrics)
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

func (f *fakeServer) chat(w http.ResponseWriter, r *http.Request) {
	var b chatBody
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	msgs := make([]sim.Message, len(b.Messages))
	for i, m := range b.Messages {
		msgs[i] = sim.Message{Role: m.Role, Content: m.Content}
	}
	adapter := ""
	if b.Model != "" && b.Model != "base" {
		adapter = b.Model
	}
	salt := b.PromptCacheKey
	if salt == "" {
		salt = r.Header.Get(HeaderPrefixAwareID)
	}
	f.mu.Lock()
	n := f.n
	f.n++
	f.paths = append(f.paths, r.URL.Path)
	f.headers = append(f.headers, r.Header.Clone())
	f.bodies = append(f.bodies, b)
	status := 0
	if f.fail != nil {
		status = f.fail(n)
	}
	var cached, prompt int
	if status == 0 {
		cached, prompt = f.cache.Observe(adapter, salt, sim.RenderChat(msgs), true)
		f.hits += int64(cached)
		f.queries += int64(prompt)
	}
	f.mu.Unlock()
	if f.arrived != nil {
		select {
		case f.arrived <- struct{}{}:
		default:
		}
	}
	w.Header().Set(HeaderServerInstance, f.id)
	if status != 0 {
		http.Error(w, `{"error":{"message":"overloaded"}}`, status)
		return
	}
	if f.block {
		<-r.Context().Done()
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`+"\n\n")
	fl.Flush()
	if f.firstDelay > 0 {
		select {
		case <-time.After(f.firstDelay):
		case <-r.Context().Done():
			return
		}
	}
	for i := 0; i < min(b.MaxTokens, 3); i++ {
		fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{"content":"tok "}}]}`+"\n\n")
		fl.Flush()
	}
	if f.llama {
		fmt.Fprintf(w, `data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"usage":{"completion_tokens":%d,"prompt_tokens":%d,"total_tokens":%d},"timings":{"prompt_n":%d,"prompt_ms":1.5,"predicted_n":%d}}`+"\n\n", b.MaxTokens, prompt, prompt+b.MaxTokens, prompt-cached, b.MaxTokens)
	} else {
		fmt.Fprintf(w, `data: {"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`+"\n\n", prompt, b.MaxTokens, cached)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func (f *fakeServer) metrics(w http.ResponseWriter, _ *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.llama {
		fmt.Fprintf(w, "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total %d\n", f.queries-f.hits)
		return
	}
	fmt.Fprintf(w, "# HELP vllm:prefix_cache_queries_total Prefix cache queries in tokens.\n# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} %d\n", f.queries)
	fmt.Fprintf(w, "# HELP vllm:prefix_cache_hits_total Prefix cache hits in tokens.\n# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} %d\n", f.hits)
	if !f.noCacheInfo {
		fmt.Fprint(w, "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1\n")
	}
}

func (f *fakeServer) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// smallPreset is a quick shared-prefix workload for runner tests.
func smallPreset() *Preset {
	return &Preset{
		Name: "small", Kind: KindSharedPrefix, Documents: 4, DocumentTokens: 200, Zipf: 1,
		QuestionTokens: IntRange{10, 30}, Output: LengthDist{Median: 5},
	}
}

func isHTTPRef(s string) bool {
	l := strings.ToLower(s)
	return strings.Contains(l, "http:") || strings.Contains(l, "https:") || strings.Contains(l, "src=") || strings.Contains(l, "href=") || strings.Contains(l, "@import") || strings.Contains(l, "url(")
}
