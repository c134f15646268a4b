package router

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/engine"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

func TestUsageScanner(t *testing.T) {
	chat := `{"id":"c1","choices":[{"message":{"content":"a \"usage\": {\"prompt_tokens\": 99} in text"}}],` +
		`"usage":{"prompt_tokens":120,"completion_tokens":5,"total_tokens":125,"prompt_tokens_details":{"cached_tokens":96}}}`
	sse := `data: {"choices":[{"delta":{"content":"x"}}],"usage":null}` + "\n\n" +
		`data: {"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":2,"prompt_tokens_details":null}}` + "\n\n" +
		`data: {"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":32}}}` + "\n\ndata: [DONE]\n\n"
	for _, tc := range []struct {
		name           string
		body           string
		found          bool
		prompt, cached int64
	}{
		{"chat", chat, true, 120, 96},
		{"sse, last wins", sse, true, 40, 32},
		{"no usage", `{"choices":[]}`, false, 0, 0},
		{"null usage", `{"usage":null}`, false, 0, 0},
		{"no details", `{"usage":{"prompt_tokens":7}}`, true, 7, 0},
		{"too large", `{"usage":{"prompt_tokens":7,"x":"` + strings.Repeat("y", 600) + `"}}`, false, 0, 0},
		{"cached above prompt", `{"usage":{"prompt_tokens":7,"prompt_tokens_details":{"cached_tokens":8}}}`, false, 0, 0},
		{"TGI", `[{"generated_text":"usage"}]`, false, 0, 0},
	} {
		scanEverySplit(t, tc.name, []byte(tc.body), 0, tc.found, tc.prompt, tc.cached)
	}
}

func BenchmarkUsageScanner(b *testing.B) {
	chunk := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" the"},"finish_reason":null}]}` + "\n\n")
	b.ReportAllocs()
	b.SetBytes(int64(len(chunk)))
	var u usageScanner
	for b.Loop() {
		u.feed(chunk)
	}
}

// TestUsageScannerEngines reads prompt and cached tokens from each
// engine's answers in engine/testdata: llama-server's captured ones
// (c392e50 reports its cache only in "timings": prompt_n is what it
// evaluated, so 656 of 657 prompt tokens came from the cache on the warm
// request; issue 20), and vLLM's and SGLang's built from their source. Each
// is read whole, split at every byte, and byte by byte.
func TestUsageScannerEngines(t *testing.T) {
	for _, tc := range []struct {
		file           string
		from           engine.Cached
		prompt, cached int64
	}{
		{"llamacpp-c392e50/chat-cold.json", llamacpp(), 657, 0},
		{"llamacpp-c392e50/chat-warm.json", llamacpp(), 657, 656},
		{"llamacpp-c392e50/chat-stream.sse", llamacpp(), 657, 656},
		{"llamacpp-c392e50/completion-stream.sse", llamacpp(), 631, 630},
		{"llamacpp-c392e50/chat-warm.json", 0, 657, 656}, // engine unknown: every place
		{"llamacpp-c392e50/chat-warm.json", profile(engine.VLLM).Cached, 657, 0},
		{"vllm-source/chat.json", profile(engine.VLLM).Cached, 657, 640},
		{"vllm-source/chat-stream.sse", profile(engine.VLLM).Cached, 657, 640},
		{"vllm-source/chat.json", 0, 657, 640},
		{"sglang-source/chat.json", profile(engine.SGLang).Cached, 657, 656},
	} {
		scanEverySplit(t, tc.file, testsupport.EngineTestdata(t, tc.file), tc.from, true, tc.prompt, tc.cached)
	}
}

// TestUsageScannerTimings: llama-server's timings in the shapes other
// builds send (cache_n, added after c392e50; OpenAI's details, which win),
// and timings that do not fit the prompt.
func TestUsageScannerTimings(t *testing.T) {
	for _, tc := range []struct {
		name, body     string
		found          bool
		prompt, cached int64
	}{
		{"cache_n", `{"usage":{"prompt_tokens":100},"timings":{"cache_n":96,"prompt_n":4}}`, true, 100, 96},
		// llama-server writes timings after usage; timings before any
		// usage are not looked for (a chunk of timings_per_token).
		{"timings first", `{"timings":{"prompt_n":10},"usage":{"prompt_tokens":100}}`, true, 100, 0},
		{"per-token timings, then the last chunk", `data: {"timings":{"prompt_n":3}}` + "\n\n" + `data: {"usage":{"prompt_tokens":100},"timings":{"prompt_n":10}}`, true, 100, 90},
		{"details win", `{"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":64}},"timings":{"cache_n":96,"prompt_n":4}}`, true, 100, 64},
		{"details null", `{"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":null}},"timings":{"prompt_n":4}}`, true, 100, 96},
		{"prompt_n above prompt", `{"usage":{"prompt_tokens":10},"timings":{"prompt_n":11}}`, true, 10, 0},
		{"cache_n above prompt", `{"usage":{"prompt_tokens":10},"timings":{"cache_n":11}}`, true, 10, 0},
		{"timings without counts", `{"usage":{"prompt_tokens":10},"timings":{"prompt_ms":1.5}}`, true, 10, 0},
		{"timings, no usage", `{"timings":{"prompt_n":1}}`, false, 0, 0},
		{"timings null", `{"usage":{"prompt_tokens":10},"timings":null}`, true, 10, 0},
		{"quoted key in content", `{"content":"\"timings\":{\"prompt_n\":1}","usage":{"prompt_tokens":10}}`, true, 10, 0},
	} {
		scanEverySplit(t, tc.name, []byte(tc.body), 0, tc.found, tc.prompt, tc.cached)
	}
}

// scanEverySplit scans body split into two reads at every byte, and byte
// by byte, reading cached tokens from where from says, and checks what
// the scanner found each time.
func scanEverySplit(t *testing.T, name string, body []byte, from engine.Cached, found bool, prompt, cached int64) {
	t.Helper()
	check := func(how string, u *usageScanner) {
		t.Helper()
		if u.found != found || u.prompt != prompt || u.cached != cached {
			t.Fatalf("%s (from %b), %s: found %v prompt %d cached %d; want %v %d %d", name, from, how, u.found, u.prompt, u.cached, found, prompt, cached)
		}
	}
	for cut := 0; cut <= len(body); cut++ {
		u := usageScanner{from: from}
		u.feed(body[:cut])
		u.feed(body[cut:])
		check(fmt.Sprintf("cut at %d", cut), &u)
	}
	u := usageScanner{from: from}
	for i := range body {
		u.feed(body[i : i+1])
	}
	check("byte by byte", &u)
}

func llamacpp() engine.Cached { return profile(engine.LlamaCpp).Cached }

func profile(name string) engine.Profile {
	p, _ := engine.Lookup(name)
	return p
}
