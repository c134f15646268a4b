package router

import (
	"strings"
	"testing"
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
		// Every split of the body into two reads, and byte by byte.
		for cut := 0; cut <= len(tc.body); cut++ {
			var u usageScanner
			u.feed([]byte(tc.body[:cut]))
			u.feed([]byte(tc.body[cut:]))
			if u.found != tc.found || u.prompt != tc.prompt || u.cached != tc.cached {
				t.Fatalf("%s, cut at %d: found %v prompt %d cached %d", tc.name, cut, u.found, u.prompt, u.cached)
			}
		}
		var u usageScanner
		for i := range len(tc.body) {
			u.feed([]byte{tc.body[i]})
		}
		if u.found != tc.found || u.prompt != tc.prompt || u.cached != tc.cached {
			t.Fatalf("%s, byte by byte: found %v prompt %d cached %d", tc.name, u.found, u.prompt, u.cached)
		}
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
