package router

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzParseOpenAI checks that the walker never panics and accepts every body
// encoding/json accepts (it may accept more: it does not check skipped
// strings byte by byte).
func FuzzParseOpenAI(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a\u00e9\ud83d\ude00"},{"type":"image_url","image_url":{"url":"x"}}]}],"prompt_cache_key":"k"}`,
		`{"prompt":["a","b",[1,2],3],"model":"x"}`,
		`{"prompt":"\\\"","n":-1.5e+3,"b":[true,false,null]}`,
		`{"messages":[{"content":null,"role":"assistant","tool_calls":[{"id":"1"}]}]}`,
		`{"messages":null}`, `{"messages":[{"role":1,"content":"x"}]}`,
	} {
		f.Add([]byte(s), 16)
	}
	f.Fuzz(func(t *testing.T, body []byte, n int) {
		n = n%2048 + 1
		if n < 1 {
			n = -n + 1
		}
		valid := json.Valid(body) && bytes.Count(body, []byte("[")) < 100 && bytes.Count(body, []byte("{")) < 100
		var top map[string]json.RawMessage
		isObject := valid && json.Unmarshal(body, &top) == nil && top != nil
		for _, chat := range []bool{true, false} {
			o, err := parseOpenAI(body, chat, n)
			if err != nil || !isObject {
				continue
			}
			// Where encoding/json reads model as a string, so must we.
			var m struct {
				Model *string `json:"model"`
			}
			if json.Unmarshal(body, &m) == nil && m.Model != nil && *m.Model != o.model && !bytes.Contains(body, []byte(`\`)) {
				t.Fatalf("model %q, encoding/json %q", o.model, *m.Model)
			}
		}
		if isObject {
			// A valid object must parse unless a routed field has the
			// wrong type (model or prompt_cache_key not a string, messages
			// not an array of objects).
			var typed struct {
				Model          *string          `json:"model"`
				PromptCacheKey *string          `json:"prompt_cache_key"`
				Messages       []map[string]any `json:"messages"`
			}
			if json.Unmarshal(body, &typed) == nil {
				if _, err := parseOpenAI(body, true, n); err != nil {
					t.Fatalf("valid chat body rejected: %v", err)
				}
			}
		}
	})
}
