package router

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"unicode/utf8"
)

// canonical re-encodes a JSON value with every escape decoded (HTML
// characters included), duplicate names dropped (the last wins) and members
// sorted; numbers keep their text.
func canonical(body []byte) ([]byte, bool) {
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return nil, false
	}
	var out bytes.Buffer
	e := json.NewEncoder(&out)
	e.SetEscapeHTML(false)
	if e.Encode(v) != nil {
		return nil, false
	}
	return bytes.TrimSpace(out.Bytes()), true
}

// stringPrompt reports whether a completions prompt is absent, a string or a
// list of strings: the shapes whose key depends on decoded text only.
func stringPrompt(raw json.RawMessage) bool {
	if raw == nil {
		return true
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return true
	}
	var l []string
	return json.Unmarshal(raw, &l) == nil
}

// FuzzParseOpenAI checks that the walker never panics, accepts every body
// encoding/json accepts (it may accept more: it does not check skipped
// strings byte by byte), reads model and prompt_cache_key as an exact-case,
// escape-decoding, last-duplicate-wins decoder does (Python's json, which
// vLLM and SGLang use), and gives a body the same routing key as its
// canonical re-encoding (escapes decoded, duplicates dropped, members sorted):
// escaped keys route exactly as their plain forms.
func FuzzParseOpenAI(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a\u00e9\ud83d\ude00"},{"type":"image_url","image_url":{"url":"x"}}]}],"prompt_cache_key":"k"}`,
		`{"prompt":["a","b",[1,2],3],"model":"x"}`,
		`{"prompt":"\\\"","n":-1.5e+3,"b":[true,false,null]}`,
		`{"messages":[{"content":null,"role":"assistant","tool_calls":[{"id":"1"}]}]}`,
		`{"messages":null}`, `{"messages":[{"role":1,"content":"x"}]}`,
		`{"model":"base","mod\u0065l":"lora-x"}`,
		`{"m\u0065ssages":[{"r\u006fle":"user","c\u006fntent":[{"t\u0079pe":"text","text":"a"}]}],"prompt_cache_k\u0065y":"t"}`,
		`{"pr\u006fmpt":["a","\u0062"],"MODEL":"upper"}`,
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
			if err == nil {
				checkLadder(t, o.digests, func(d int) uint64 {
					p, _ := parseOpenAI(body, chat, d)
					return p.prefix
				}, n)
			}
			if err != nil || !isObject {
				continue
			}
			// top holds the last of duplicate names, decoded, exact case.
			if raw, ok := top["model"]; ok {
				var m string
				if json.Unmarshal(raw, &m) == nil && m != o.model {
					t.Fatalf("model %q, an exact decoder %q", o.model, m)
				}
			}
			if raw, ok := top["prompt_cache_key"]; ok {
				var k string
				if json.Unmarshal(raw, &k) == nil && k != o.tenant {
					t.Fatalf("prompt_cache_key %q, an exact decoder %q", o.tenant, k)
				}
			}
			// Invalid UTF-8 decodes to U+FFFD in encoding/json but is
			// hashed raw here; token lists are hashed as written.
			if !utf8.Valid(body) || (!chat && !stringPrompt(top["prompt"])) {
				continue
			}
			canon, ok := canonical(body)
			if !ok {
				continue
			}
			c, err := parseOpenAI(canon, chat, n)
			if err != nil {
				t.Fatalf("canonical form %s rejected: %v", canon, err)
			}
			if c != o {
				t.Fatalf("body %s routes as %+v, its canonical form %s as %+v", body, o, canon, c)
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

// FuzzInvokeKey: the invoke path's key (tenant header, target model, first
// PrefixLength bytes of the raw body) never panics, rejects exactly the
// tenant ids outside 1..64 printable ASCII, and depends only on the prefix.
func FuzzInvokeKey(f *testing.F) {
	f.Add([]byte("hello world"), "tenant-a", "lora-x", 4)
	f.Add([]byte{}, "", "", 1)
	f.Add([]byte("\xff\xfe\x00"), "a\x01b", "m", 1024)
	f.Fuzz(func(t *testing.T, body []byte, tenant, model string, n int) {
		n = n%4096 + 1
		if n < 1 {
			n = -n + 1
		}
		h := http.Header{}
		if tenant != "" {
			h[HeaderTenant] = []string{tenant}
		}
		if model != "" {
			h.Set(HeaderTargetModel, model)
		}
		rr, rerr := parseRequest(kindInvoke, h, body, n)
		if (rerr != nil) != (tenant != "" && !validTenant(tenant)) {
			t.Fatalf("tenant %q: error %v", tenant, rerr)
		}
		if rerr != nil {
			return
		}
		checkLadder(t, invokeDigests(body, n), func(d int) uint64 { return invokePrefix(body, d) }, n)
		more := append(append([]byte(nil), body...), "tail"...)
		rr2, _ := parseRequest(kindInvoke, h, more, n)
		if (len(body) >= n) != (rr.key == rr2.key) {
			t.Fatalf("key depends on bytes past the prefix (len %d, n %d)", len(body), n)
		}
	})
}
