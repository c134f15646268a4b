package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

func newTestServer(t *testing.T, cfg Options) (*Server, *httptest.Server) {
	t.Helper()
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 100
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s)
	t.Cleanup(func() {
		hs.Close()
		s.Close()
	})
	return s, hs
}

func post(t *testing.T, ctx context.Context, url, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// sseEvents reads every data: payload of an SSE body.
func sseEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

type testUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func TestStreamingChatReportsCachedTokens(t *testing.T) {
	_, hs := newTestServer(t, Options{ID: "sim-7"})
	system := tokens("system", 3000)
	var cached []int
	for i, q := range []string{"What is the refund policy?", "How do I reset my password?"} {
		body := mustJSON(map[string]any{
			"model": DefaultBaseModel, "stream": true, "stream_options": map[string]any{"include_usage": true}, "max_tokens": 8,
			"messages": []map[string]any{{"role": "system", "content": system}, {"role": "user", "content": []map[string]any{{"type": "text", "text": q}}}},
		})
		resp := post(t, t.Context(), hs.URL+"/v1/chat/completions", body)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("X-Instance-Id") != "sim-7" {
			t.Fatalf("status %d content type %q instance %q", resp.StatusCode, resp.Header.Get("Content-Type"), resp.Header.Get("X-Instance-Id"))
		}
		ev := sseEvents(t, resp.Body)
		resp.Body.Close()
		if len(ev) != 8+2 || ev[len(ev)-1] != "[DONE]" {
			t.Fatalf("request %d: %d events (want 8 tokens, usage, [DONE]): %q", i, len(ev), ev)
		}
		var content string
		for k, e := range ev[:8] {
			var c struct {
				Object  string `json:"object"`
				Choices []struct {
					Delta        struct{ Role, Content string } `json:"delta"`
					FinishReason *string                        `json:"finish_reason"`
				} `json:"choices"`
			}
			if err := json.Unmarshal([]byte(e), &c); err != nil || c.Object != "chat.completion.chunk" || len(c.Choices) != 1 {
				t.Fatalf("chunk %d %q: %v", k, e, err)
			}
			content += c.Choices[0].Delta.Content
			if (c.Choices[0].FinishReason != nil) != (k == 7) {
				t.Errorf("chunk %d finish_reason %v", k, c.Choices[0].FinishReason)
			}
		}
		if CountTokens(content) != 8 {
			t.Errorf("content %q is not 8 tokens", content)
		}
		var u struct {
			Choices []any     `json:"choices"`
			Usage   testUsage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev[8]), &u); err != nil || len(u.Choices) != 0 {
			t.Fatalf("usage chunk %q: %v", ev[8], err)
		}
		if u.Usage.CompletionTokens != 8 || u.Usage.PromptTokens < 3000 {
			t.Errorf("usage %+v", u.Usage)
		}
		cached = append(cached, u.Usage.PromptTokensDetails.CachedTokens)
	}
	if cached[0] != 0 || cached[1] < 2900 {
		t.Errorf("cached tokens %v: want 0, then the shared 3,000-token system prompt", cached)
	}
}

func TestNonStreamingShapes(t *testing.T) {
	_, hs := newTestServer(t, Options{Adapters: []string{"lora-a"}})
	tests := []struct {
		name, path, body string
		check            func(t *testing.T, b []byte)
	}{
		{"chat", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":3}`, func(t *testing.T, b []byte) {
			var r struct {
				Object  string
				Choices []struct {
					Message struct{ Role, Content string }
				}
				Usage testUsage
			}
			if err := json.Unmarshal(b, &r); err != nil || r.Object != "chat.completion" || len(r.Choices) != 1 ||
				r.Choices[0].Message.Role != "assistant" || r.Usage.CompletionTokens != 3 {
				t.Errorf("%s: %v", b, err)
			}
		}},
		{"completion list", "/v1/completions", `{"model":"lora-a","prompt":["one","two"],"max_tokens":2}`, func(t *testing.T, b []byte) {
			var r struct {
				Object  string
				Model   string
				Choices []struct {
					Index int
					Text  string
				}
				Usage testUsage
			}
			if err := json.Unmarshal(b, &r); err != nil || r.Object != "text_completion" || r.Model != "lora-a" || len(r.Choices) != 2 ||
				r.Choices[1].Index != 1 || r.Usage.CompletionTokens != 4 {
				t.Errorf("%s: %v", b, err)
			}
		}},
		{"default max tokens", "/v1/completions", `{"prompt":"x"}`, func(t *testing.T, b []byte) {
			var r struct{ Usage testUsage }
			if err := json.Unmarshal(b, &r); err != nil || r.Usage.CompletionTokens != 16 {
				t.Errorf("%s: %v", b, err)
			}
		}},
		{"invocations messages", "/invocations", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, func(t *testing.T, b []byte) {
			if !strings.Contains(string(b), `"object":"chat.completion"`) {
				t.Errorf("%s", b)
			}
		}},
		{"invocations prompt", "/invocations", `{"prompt":"hi","max_tokens":2}`, func(t *testing.T, b []byte) {
			if !strings.Contains(string(b), `"object":"text_completion"`) {
				t.Errorf("%s", b)
			}
		}},
		{"invocations inputs", "/invocations", `{"inputs":"hi","parameters":{"max_new_tokens":3}}`, func(t *testing.T, b []byte) {
			var r []struct {
				GeneratedText string `json:"generated_text"`
			}
			if err := json.Unmarshal(b, &r); err != nil || len(r) != 1 || CountTokens(r[0].GeneratedText) != 3 {
				t.Errorf("%s: %v", b, err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(t, t.Context(), hs.URL+tt.path, tt.body)
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || resp.Header.Get("X-Instance-Id") != DefaultID {
				t.Fatalf("status %d instance %q: %s", resp.StatusCode, resp.Header.Get("X-Instance-Id"), b)
			}
			tt.check(t, b)
		})
	}
}

func TestInvocationsStream(t *testing.T) {
	_, hs := newTestServer(t, Options{})
	resp := post(t, t.Context(), hs.URL+"/invocations", `{"inputs":"hello","parameters":{"max_new_tokens":4},"stream":true}`)
	defer resp.Body.Close()
	ev := sseEvents(t, resp.Body)
	if len(ev) != 4 || !strings.Contains(ev[3], `"generated_text":" the and for you"`) {
		t.Errorf("TGI stream %q", ev)
	}
	resp = post(t, t.Context(), hs.URL+"/invocations", `{"prompt":"hello","max_tokens":2,"stream":true}`)
	defer resp.Body.Close()
	if ev := sseEvents(t, resp.Body); len(ev) != 3 || ev[2] != "[DONE]" {
		t.Errorf("completion stream %q", ev)
	}
}

func TestErrors(t *testing.T) {
	_, hs := newTestServer(t, Options{KVCapacityTokens: 1024})
	tests := []struct {
		name, path, body string
		status           int
	}{
		{"unknown model", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, 404},
		{"malformed JSON", "/v1/chat/completions", `{"messages":`, 400},
		{"malformed JSON completions", "/v1/completions", `not json`, 400},
		{"bad max_tokens", "/v1/completions", `{"prompt":"x","max_tokens":0}`, 400},
		{"prompt of numbers", "/v1/completions", `{"prompt":[1,2]}`, 400},
		{"empty invocation", "/invocations", `{}`, 400},
		{"longer than the cache", "/v1/completions", mustJSON(map[string]any{"prompt": tokens("x", 1100)}), 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(t, t.Context(), hs.URL+tt.path, tt.body)
			defer resp.Body.Close()
			var e struct {
				Error struct {
					Message string
					Type    string
					Code    int
				}
			}
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.status || e.Error.Code != tt.status || e.Error.Message == "" || e.Error.Type == "" {
				t.Errorf("status %d, error %+v; want %d", resp.StatusCode, e.Error, tt.status)
			}
		})
	}
}

func TestModelsAndAdapters(t *testing.T) {
	s, hs := newTestServer(t, Options{BaseModel: "base", Adapters: []string{"a1", "a2"}})
	list := func() map[string]*string {
		resp, err := http.Get(hs.URL + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r struct {
			Object string
			Data   []struct {
				ID     string  `json:"id"`
				Object string  `json:"object"`
				Parent *string `json:"parent"`
			}
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || r.Object != "list" {
			t.Fatalf("models: %v", err)
		}
		out := map[string]*string{}
		for _, d := range r.Data {
			if d.Object != "model" {
				t.Errorf("object %q", d.Object)
			}
			out[d.ID] = d.Parent
		}
		return out
	}
	m := list()
	if len(m) != 3 || m["base"] != nil || m["a1"] == nil || *m["a1"] != "base" || *m["a2"] != "base" {
		t.Errorf("models %v", m)
	}
	s.SetAdapters([]string{"a3"})
	m = list()
	if _, ok := m["a1"]; ok || len(m) != 2 || m["a3"] == nil {
		t.Errorf("after SetAdapters: %v", m)
	}
	for model, want := range map[string]int{"a1": 404, "a3": 200, "base": 200} {
		resp := post(t, t.Context(), hs.URL+"/v1/completions", `{"model":"`+model+`","prompt":"x","max_tokens":1}`)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("model %s: status %d, want %d", model, resp.StatusCode, want)
		}
	}
	// An adapter has its own cache; cache_salt too, but not
	// prompt_cache_key (a routing hint, as in vLLM).
	text := tokens("doc", 500)
	hit := func(model, extra string) int {
		resp := post(t, t.Context(), hs.URL+"/v1/completions", `{"model":"`+model+`","prompt":"`+text+`","max_tokens":1`+extra+`}`)
		defer resp.Body.Close()
		var r struct{ Usage testUsage }
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			t.Fatal(err)
		}
		return r.Usage.PromptTokensDetails.CachedTokens
	}
	steps := []struct {
		model, extra string
		hit          bool
	}{
		{"base", "", false}, {"base", "", true}, {"a3", "", false}, {"a3", "", true},
		{"base", `,"cache_salt":"t1"`, false}, {"base", `,"cache_salt":"t1"`, true},
		{"base", `,"prompt_cache_key":"t2"`, true}, {"base", `,"cache_salt":"t1","prompt_cache_key":"t2"`, true},
		{"base", `,"cache_salt":"t2"`, false},
	}
	for i, st := range steps {
		if got := hit(st.model, st.extra); (got > 0) != st.hit {
			t.Errorf("step %d (%s%s): cached %d, want hit=%v", i, st.model, st.extra, got, st.hit)
		}
	}
}

// scrape returns the value of the first sample of name.
func scrape(t *testing.T, url, name string) (float64, bool) {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v, true
		}
	}
	return 0, false
}

func TestMetrics(t *testing.T) {
	_, hs := newTestServer(t, Options{})
	names := []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_count",
		"vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:e2e_request_latency_seconds_count"}
	for _, n := range names {
		if _, ok := scrape(t, hs.URL, n); !ok {
			t.Errorf("/metrics lacks %s", n)
		}
	}
	text := tokens("doc", 1000)
	for range 2 {
		resp := post(t, t.Context(), hs.URL+"/v1/completions", `{"prompt":"`+text+`","max_tokens":2}`)
		resp.Body.Close()
	}
	want := map[string]float64{
		"vllm:prefix_cache_queries_total":        2000,
		"vllm:prefix_cache_hits_total":           992, // 62 full blocks; the block with the last token is recomputed
		"vllm:time_to_first_token_seconds_count": 2,
		"vllm:request_success_total":             2,
		"vllm:generation_tokens_total":           4,
		"vllm:num_requests_running":              0,
	}
	for n, w := range want {
		if v, _ := scrape(t, hs.URL, n); v != w {
			t.Errorf("%s = %v, want %v", n, v, w)
		}
	}
	// TTFT is simulated time: one uncached and one cached prefill,
	// whatever the time scale and the goroutine overhead.
	p, _ := LookupProfile(DefaultProfile)
	wantSum := (p.PrefillDuration(1000, 0) + p.PrefillDuration(1000, 992)).Seconds()
	if v, _ := scrape(t, hs.URL, "vllm:time_to_first_token_seconds_sum"); math.Abs(v-wantSum) > 1e-6 {
		t.Errorf("TTFT sum %v s, want %v s", v, wantSum)
	}
}

func TestClientDisconnectAborts(t *testing.T) {
	// Real time: 100,000 tokens would take half an hour of decode steps.
	_, hs := newTestServer(t, Options{TimeScale: 1})
	for _, stream := range []bool{true, false} {
		ctx, cancel := context.WithCancel(t.Context())
		body := mustJSON(map[string]any{"prompt": tokens("x", 2000), "max_tokens": 100000, "stream": stream})
		done := make(chan error, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/completions", strings.NewReader(body))
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				if stream {
					// Read the first token, then leave.
					_, err = bufio.NewReader(resp.Body).ReadString('\n')
				} else {
					_, err = io.ReadAll(resp.Body)
				}
				resp.Body.Close()
			}
			done <- err
		}()
		testsupport.Eventually(t, 10*time.Second, "the request to run", func() bool { v, _ := scrape(t, hs.URL, "vllm:num_requests_running"); return v == 1 })
		if u, _ := scrape(t, hs.URL, "vllm:kv_cache_usage_perc"); u == 0 {
			t.Error("kv usage 0 while a request runs")
		}
		cancel()
		if err := <-done; stream && err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		testsupport.Eventually(t, 10*time.Second, "the aborted request to leave the batch", func() bool {
			r, _ := scrape(t, hs.URL, "vllm:num_requests_running")
			u, _ := scrape(t, hs.URL, "vllm:kv_cache_usage_perc")
			return r == 0 && u == 0
		})
	}
	if v, _ := scrape(t, hs.URL, "prefixrouter_sim_requests_aborted_total"); v != 2 {
		t.Errorf("aborted %v, want 2", v)
	}
}

func TestCloseAnswersInFlight(t *testing.T) {
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s)
	defer hs.Close()
	done := make(chan int, 1)
	go func() {
		resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","max_tokens":100000}`))
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	testsupport.Eventually(t, 10*time.Second, "the request to run", func() bool { v, _ := scrape(t, hs.URL, "vllm:num_requests_running"); return v == 1 })
	s.Close()
	if code := <-done; code != http.StatusServiceUnavailable {
		t.Errorf("in-flight request got %d after Close, want 503", code)
	}
	s.Close() // idempotent
}

func TestHealth(t *testing.T) {
	_, hs := newTestServer(t, Options{})
	for _, p := range []string{"/ping", "/health"} {
		resp, err := http.Get(hs.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d", p, resp.StatusCode)
		}
	}
}

func TestConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Options
		ok   bool
	}{
		{"zero", Options{}, true},
		{"70b", Options{Profile: ProfileH100x8Llama70B}, true},
		{"unknown profile", Options{Profile: "x"}, false},
		{"negative capacity", Options{KVCapacityTokens: -1}, false},
		{"capacity under a block", Options{KVCapacityTokens: 8}, false},
		{"negative scale", Options{TimeScale: -1}, false},
		{"adapter named like the base", Options{Adapters: []string{DefaultBaseModel}}, false},
		{"empty adapter", Options{Adapters: []string{""}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.cfg)
			if (err == nil) != tt.ok {
				t.Fatalf("err %v, want ok=%v", err, tt.ok)
			}
			if err != nil {
				if !errors.Is(err, ErrInvalidOptions) {
					t.Errorf("error %v is not ErrInvalidOptions", err)
				}
				return
			}
			defer s.Close()
			c := s.Options()
			p := s.Profile()
			if c.KVCapacityTokens != p.KVCapacityTokens || c.TimeScale != 1 || c.DefaultMaxTokens != 16 || c.ID != DefaultID {
				t.Errorf("defaults not applied: %+v", c)
			}
		})
	}
}

func TestResetPrefixCache(t *testing.T) {
	s, hs := newTestServer(t, Options{})
	body := `{"prompt":"` + tokens("doc", 1000) + `","max_tokens":2}`
	cached := func() int {
		t.Helper()
		resp := post(t, t.Context(), hs.URL+"/v1/completions", body)
		defer resp.Body.Close()
		var r struct{ Usage testUsage }
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != 200 {
			t.Fatalf("status %d: %v", resp.StatusCode, err)
		}
		return r.Usage.PromptTokensDetails.CachedTokens
	}
	reset := func(method string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), method, hs.URL+"/reset_prefix_cache", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	steps := []struct {
		name       string
		reset      func() // before the request
		wantCached int
	}{
		{"cold", nil, 0},
		{"warm", nil, 992},
		{"after POST /reset_prefix_cache", func() {
			if code := reset(http.MethodPost); code != http.StatusOK {
				t.Fatalf("POST /reset_prefix_cache: %d, want 200", code)
			}
		}, 0},
		{"warm again", nil, 992},
		{"GET is not a reset", func() {
			if code := reset(http.MethodGet); code != http.StatusMethodNotAllowed {
				t.Errorf("GET /reset_prefix_cache: %d, want 405", code)
			}
		}, 992},
		{"after ResetPrefixCache", func() {
			// 1,000 tokens are 62 full blocks, all registered; the
			// partial last block never is.
			if n, err := s.ResetPrefixCache(); err != nil || n != 62 {
				t.Fatalf("ResetPrefixCache: %d blocks, %v", n, err)
			}
		}, 0},
	}
	for _, st := range steps {
		if st.reset != nil {
			st.reset()
		}
		if got := cached(); got != st.wantCached {
			t.Errorf("%s: cached %d tokens, want %d", st.name, got, st.wantCached)
		}
	}
	// Counters are not reset: 6 queries of 1,000 tokens, 3 warm hits.
	if v, _ := scrape(t, hs.URL, "vllm:prefix_cache_hits_total"); v != 3*992 {
		t.Errorf("hits %v after resets, want %v", v, 3*992)
	}
	s.Close()
	if _, err := s.ResetPrefixCache(); !errors.Is(err, ErrClosed) {
		t.Errorf("ResetPrefixCache after Close: %v, want ErrClosed", err)
	}
	if code := reset(http.MethodPost); code != http.StatusServiceUnavailable {
		t.Errorf("POST /reset_prefix_cache after Close: %d, want 503", code)
	}
}

// labelsOf returns the labels of the first sample of name.
func labelsOf(t *testing.T, url, name string) map[string]string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.Lines(string(b)) {
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		ls, _, _ := strings.Cut(rest, "}")
		out := map[string]string{}
		for kv := range strings.SplitSeq(ls, ",") {
			k, v, _ := strings.Cut(kv, "=")
			out[k] = strings.Trim(v, `"`)
		}
		return out
	}
	return nil
}

func TestCacheConfigInfo(t *testing.T) {
	tests := []struct {
		name       string
		cfg        Options
		wantBlocks string
	}{
		{"configured", Options{KVCapacityTokens: 160_000}, "10000"},
		{"rounded down to whole blocks", Options{KVCapacityTokens: 100}, "6"},
		{"profile default", Options{}, strconv.Itoa(mustProfile(t, DefaultProfile).KVCapacityTokens / BlockTokens)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, hs := newTestServer(t, tt.cfg)
			if v, ok := scrape(t, hs.URL, "vllm:cache_config_info"); !ok || v != 1 {
				t.Fatalf("vllm:cache_config_info = %v (present %v), want 1", v, ok)
			}
			l := labelsOf(t, hs.URL, "vllm:cache_config_info")
			if l["block_size"] != "16" || l["num_gpu_blocks"] != tt.wantBlocks {
				t.Errorf("labels %v, want block_size 16, num_gpu_blocks %s", l, tt.wantBlocks)
			}
		})
	}
}

func mustProfile(t *testing.T, name string) Profile {
	t.Helper()
	p, err := LookupProfile(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// BenchmarkPace measures how closely a client timing in wall time ×
// TimeScale sees the simulated time (issue 22): four streamed requests of
// 1,500 output tokens at once against one server at TimeScale 12, and the
// ratio of the client's wall × 12 to the mean simulated E2E the server's
// metrics record. 1 is exact; every late timer wake-up used to add to it.
//
//	go test -run '^$' -bench BenchmarkPace -benchtime 3x ./internal/sim
func BenchmarkPace(b *testing.B) {
	const scale, n = 12, 4
	for range b.N {
		s, err := New(Options{Profile: ProfileH200Llama8BRoofline, TimeScale: scale})
		if err != nil {
			b.Fatal(err)
		}
		hs := httptest.NewServer(s)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range n {
			wg.Go(func() {
				body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":1500,"ignore_eos":true,"messages":[{"role":"user","content":"%d %s"}]}`,
					DefaultBaseModel, i, strings.Repeat("word ", 2000))
				resp, err := http.Post(hs.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			})
		}
		wg.Wait()
		client := time.Since(start).Seconds() * scale
		mfs, err := s.m.reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		var sum float64
		var count uint64
		for _, mf := range mfs {
			if mf.GetName() == "vllm:e2e_request_latency_seconds" {
				h := mf.GetMetric()[0].GetHistogram()
				sum, count = h.GetSampleSum(), h.GetSampleCount()
			}
		}
		hs.Close()
		s.Close()
		if count != n {
			b.Fatalf("%d requests finished, want %d", count, n)
		}
		b.ReportMetric(client/(sum/n), "client/sim")
	}
}
