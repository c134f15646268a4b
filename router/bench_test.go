package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// benchBodies returns a 16 KiB invoke body and a 16 KiB OpenAI chat body.
func benchBodies(tb testing.TB) (invoke, chat []byte) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog; «ünïcødé» ", 300)[:16<<10-300]
	invoke, _ = json.Marshal(map[string]any{"inputs": text, "parameters": map[string]any{"max_new_tokens": 128}})
	chat, _ = json.Marshal(map[string]any{
		"model":            "base",
		"prompt_cache_key": "tenant-42",
		"stream":           true,
		"messages": []any{
			msg("system", text[:4000]),
			msg("user", []any{map[string]any{"type": "text", "text": text[4000:]}, map[string]any{"type": "image_url", "image_url": map[string]any{"url": "http://x/y.png"}}}),
		},
		"temperature": 0.2,
	})
	return invoke, chat
}

func benchRouter(b *testing.B, n int) (*Router, *endpointView, int) {
	r, err := New(Options{DefaultEndpoint: "ep"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	ep := fleet.Endpoint{Name: "ep", Config: fleet.DefaultRoutingConfig()}
	for i := range n {
		ep.Instances = append(ep.Instances, fleet.Instance{ID: fmt.Sprintf("i-%02d", i), Addr: fmt.Sprintf("http://10.0.0.%d:8000", i)})
	}
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{ep}, 0, 1, time.Now()))
	v := r.view.Load()
	return r, v.endpoints["ep"], v.snap.Replicas
}

// BenchmarkPick is the whole pick for a 16 KiB body: prefix extraction and
// hash, the model's set, ring candidates and admission (then release).
func BenchmarkPick(b *testing.B) {
	invoke, chat := benchBodies(b)
	for _, n := range []int{4, 16, 64} {
		for _, tc := range []struct {
			name string
			kind apiKind
			body []byte
			hdr  http.Header
		}{
			{"invoke", kindInvoke, invoke, http.Header{HeaderTenant: {"tenant-42"}}},
			{"chat", kindChat, chat, http.Header{}},
		} {
			b.Run(fmt.Sprintf("%s/instances=%d", tc.name, n), func(b *testing.B) {
				r, ev, replicas := benchRouter(b, n)
				b.SetBytes(int64(len(tc.body)))
				b.ReportAllocs()
				for b.Loop() {
					rr, rerr := parseRequest(tc.kind, tc.hdr, tc.body, ev.prefixLen)
					if rerr != nil {
						b.Fatal(rerr)
					}
					set, err := ev.table.Set(rr.model)
					if err != nil {
						b.Fatal(err)
					}
					p, ok := r.pick(ev, set, rr.key, replicas, bitset{})
					if !ok {
						b.Fatal("no pick")
					}
					p.done(nil)
				}
			})
		}
	}
}

// BenchmarkChatKeyStdlib is the alternative the walker replaced: decoding
// the same chat body with encoding/json into a small typed struct with
// json.RawMessage content (no hashing). Kept to show the measured reason.
func BenchmarkChatKeyStdlib(b *testing.B) {
	_, chat := benchBodies(b)
	type message struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	type request struct {
		Model          string    `json:"model"`
		PromptCacheKey *string   `json:"prompt_cache_key"`
		Messages       []message `json:"messages"`
	}
	b.SetBytes(int64(len(chat)))
	b.ReportAllocs()
	for b.Loop() {
		var req request
		if err := json.Unmarshal(chat, &req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkChatKey is the walker alone on the same body.
func BenchmarkChatKey(b *testing.B) {
	_, chat := benchBodies(b)
	b.SetBytes(int64(len(chat)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseOpenAI(chat, true, 4096); err != nil {
			b.Fatal(err)
		}
	}
}
