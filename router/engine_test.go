package router

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/engine"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

// TestEngineAdapterSelection: a request naming an adapter reaches each
// engine in the form it serves it (issue 20): llama-server gets the
// adapter's position in "lora" (and "lora": [] for the base model, which
// it would otherwise serve with every adapter applied), SGLang gets
// "lora_path", vLLM the body as sent; over real HTTP, for a small body
// and for one streamed past the router's head (the member is inserted
// without reading it). The answers are llama-server's and SGLang's
// (captured / built from source), and their cached tokens are counted.
func TestEngineAdapterSelection(t *testing.T) {
	b := newBackend(t, "i-a")
	var (
		mu    sync.Mutex
		got   []byte
		reply []byte
	)
	b.handler = func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil || int64(len(body)) != r.ContentLength && r.ContentLength >= 0 {
			http.Error(w, fmt.Sprintf("body: %d bytes of %d, %v", len(body), r.ContentLength, err), http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = body
		out := reply
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write(out)
	}
	h := newHarness(t, hopts{}, b)
	long := strings.Repeat("the quick brown fox ", 4000) // 80 kB: streamed past the head
	for _, tc := range []struct {
		name   string
		inst   fleet.Instance
		reply  string
		body   string
		first  string // the member the instance must see first; "" for the body unchanged
		cached float64
		prompt float64
	}{
		{"llamacpp adapter", fleet.Instance{Engine: engine.LlamaCpp, Adapters: []string{"chat-lora", "sql-lora"}, AdapterIndex: map[string]int{"sql-lora": 0, "chat-lora": 1}, Labels: map[string]string{"model": "tiny"}},
			"llamacpp-c392e50/chat-warm.json", `{"model":"chat-lora","messages":[{"role":"user","content":"hi"}]}`, `"lora":[{"id":1,"scale":1}]`, 656, 657},
		{"llamacpp base model", fleet.Instance{Engine: engine.LlamaCpp, Adapters: []string{"chat-lora", "sql-lora"}, AdapterIndex: map[string]int{"sql-lora": 0, "chat-lora": 1}, Labels: map[string]string{"model": "tiny"}},
			"llamacpp-c392e50/chat-cold.json", `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`, `"lora":[]`, 0, 657},
		{"llamacpp streamed body", fleet.Instance{Engine: engine.LlamaCpp, Adapters: []string{"chat-lora", "sql-lora"}, AdapterIndex: map[string]int{"sql-lora": 0, "chat-lora": 1}},
			"llamacpp-c392e50/chat-warm.json", `{"model":"sql-lora","messages":[{"role":"user","content":"` + long + `"}]}`, `"lora":[{"id":0,"scale":1}]`, 656, 657},
		{"llamacpp without adapters", fleet.Instance{Engine: engine.LlamaCpp},
			"llamacpp-c392e50/chat-warm.json", `{"messages":[{"role":"user","content":"hi"}]}`, "", 656, 657},
		{"sglang adapter", fleet.Instance{Engine: engine.SGLang, Adapters: []string{"sql-lora"}},
			"sglang-source/chat.json", ` { "model":"sql-lora","messages":[{"role":"user","content":"hi"}]}`, `"lora_path":"sql-lora"`, 656, 657},
		{"vllm adapter", fleet.Instance{Engine: engine.VLLM, Adapters: []string{"sql-lora"}},
			"vllm-source/chat.json", `{"model":"sql-lora","messages":[{"role":"user","content":"hi"}]}`, "", 640, 657},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.inst
			in.ID, in.Addr = "i-a", b.srv.URL
			h.ep.Instances = []fleet.Instance{in}
			h.update()
			mu.Lock()
			reply = testsupport.EngineTestdata(t, tc.reply)
			mu.Unlock()
			model := modelLabel(h.r.view.Load().endpoints["ep"], modelOf(t, tc.body))
			cachedC := h.r.metrics.cachedTokens.WithLabelValues("ep", model, "i-a", DecisionAffinity)
			promptC := h.r.metrics.promptTokens.WithLabelValues("ep", model, "i-a", DecisionAffinity)
			cached0, prompt0 := counterValue(cachedC), counterValue(promptC)
			res := h.mustDo("/v1/chat/completions", tc.body, nil)
			if res.status != http.StatusOK {
				t.Fatalf("status %d: %s", res.status, res.body)
			}
			mu.Lock()
			sent := got
			mu.Unlock()
			if !json.Valid(sent) {
				t.Fatalf("the instance got invalid JSON: %.200s", sent)
			}
			want := []byte(tc.body)
			if tc.first != "" {
				i := bytes.IndexByte(want, '{')
				want = append(append(append([]byte(nil), want[:i+1]...), tc.first+","...), want[i+1:]...)
			}
			if !bytes.Equal(sent, want) {
				t.Fatalf("the instance got %.300s\nwant %.300s", sent, want)
			}
			testsupport.Eventually(t, 10*time.Second, "usage counted", func() bool {
				return counterValue(promptC)-prompt0 == tc.prompt
			})
			if d := counterValue(cachedC) - cached0; d != tc.cached {
				t.Fatalf("cached prompt tokens counted %v, want %v", d, tc.cached)
			}
		})
	}
}

func modelOf(t *testing.T, body string) string {
	var v struct {
		Model string `json:"model"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	return v.Model
}

// TestInsertReader: the member goes right after the first '{' whatever
// the reads' sizes, and an error of the read that carried '{' comes after
// it.
func TestInsertReader(t *testing.T) {
	body := ` {"a":1}`
	for size := 1; size <= len(body)+1; size++ {
		x := &insertReader{r: io.NopCloser(&chunked{s: body, n: size}), ins: []byte(`"x":0,`)}
		out, err := io.ReadAll(x)
		if err != nil || string(out) != ` {"x":0,"a":1}` {
			t.Fatalf("reads of %d: %q, %v", size, out, err)
		}
	}
	// No '{' at all: passed through unchanged.
	x := &insertReader{r: io.NopCloser(strings.NewReader("[1]")), ins: []byte(`"x":0,`)}
	if out, _ := io.ReadAll(x); string(out) != "[1]" {
		t.Fatalf("no object: %q", out)
	}
	for head, want := range map[string]bool{`{}`: true, ` { } `: true, `{"a":1}`: false, `{`: false, ``: false} {
		if emptyObject([]byte(head)) != want {
			t.Errorf("emptyObject(%q) != %v", head, want)
		}
	}
}

// chunked reads s n bytes at a time, returning io.EOF with the last ones.
type chunked struct {
	s string
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	n := copy(p[:min(len(p), c.n)], c.s)
	c.s = c.s[n:]
	if c.s == "" {
		return n, io.EOF
	}
	return n, nil
}
