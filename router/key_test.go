package router

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

func chatBody(t testing.TB, msgs ...any) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func msg(role string, content any) map[string]any {
	return map[string]any{"role": role, "content": content}
}

func chatPrefix(t *testing.T, body string, n int) uint64 {
	t.Helper()
	o, err := parseOpenAI([]byte(body), true, n)
	if err != nil {
		t.Fatalf("parseOpenAI(%s): %v", body, err)
	}
	return o.prefix
}

func TestChatKey(t *testing.T) {
	long := strings.Repeat("x", 100)
	tests := []struct {
		name  string
		a, b  string
		n     int
		equal bool
	}{
		{"boundaries matter", `{"messages":[{"role":"user","content":"ab"},{"role":"user","content":"c"}]}`,
			`{"messages":[{"role":"user","content":"a"},{"role":"user","content":"bc"}]}`, 1024, false},
		{"roles matter", `{"messages":[{"role":"user","content":"ab"}]}`,
			`{"messages":[{"role":"system","content":"ab"}]}`, 1024, false},
		{"part boundaries matter", `{"messages":[{"role":"user","content":[{"type":"text","text":"ab"},{"type":"text","text":"c"}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"bc"}]}]}`, 1024, false},
		{"text parts only", `{"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"http://a/1.png"}}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://b/2.png"}},{"type":"text","text":"hi"}]}]}`, 1024, true},
		{"string equals one text part", `{"messages":[{"role":"user","content":"hello"}]}`,
			`{"messages":[{"role":"user","content":[{"text":"hello","type":"text"}]}]}`, 1024, true},
		{"key order irrelevant", `{"model":"m","messages":[{"content":"hi","role":"user"}]}`,
			`{"messages":[{"role":"user","content":"hi"}],"model":"m"}`, 1024, true},
		{"escapes decoded", `{"messages":[{"role":"user","content":"\u00e9\n\"\ud83d\ude00"}]}`,
			`{"messages":[{"role":"user","content":"é\n\"😀"}]}`, 1024, true},
		{"cut at prefix length", `{"messages":[{"role":"user","content":"` + long + `A"}]}`,
			`{"messages":[{"role":"user","content":"` + long + `B"}]}`, 100, true},
		{"within prefix length", `{"messages":[{"role":"user","content":"` + long + `A"}]}`,
			`{"messages":[{"role":"user","content":"` + long + `B"}]}`, 101, false},
		{"code points not bytes", `{"messages":[{"role":"user","content":"ééééX"}]}`,
			`{"messages":[{"role":"user","content":"ééééY"}]}`, 4, true},
		{"code points not bytes 2", `{"messages":[{"role":"user","content":"ééééX"}]}`,
			`{"messages":[{"role":"user","content":"ééééY"}]}`, 5, false},
		{"escaped code points count once", `{"messages":[{"role":"user","content":"\u00e9\u00e9X"}]}`,
			`{"messages":[{"role":"user","content":"\u00e9\u00e9Y"}]}`, 2, true},
		{"later messages past the prefix ignored", `{"messages":[{"role":"user","content":"abcd"},{"role":"assistant","content":"1"}]}`,
			`{"messages":[{"role":"user","content":"abcd"},{"role":"user","content":"2"}]}`, 4, true},
		{"other fields ignored", `{"messages":[{"role":"user","content":"hi"}],"temperature":0.5,"stream":true,"tools":[{"a":[1,2,{"b":null}]}]}`,
			`{"messages":[{"role":"user","content":"hi"}]}`, 1024, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := chatPrefix(t, tc.a, tc.n), chatPrefix(t, tc.b, tc.n)
			if (a == b) != tc.equal {
				t.Fatalf("equal = %v, want %v", a == b, tc.equal)
			}
		})
	}
}

func TestCompletionsKey(t *testing.T) {
	p := func(body string, n int) uint64 {
		o, err := parseOpenAI([]byte(body), false, n)
		if err != nil {
			t.Fatalf("parseOpenAI(%s): %v", body, err)
		}
		return o.prefix
	}
	tests := []struct {
		name  string
		a, b  string
		n     int
		equal bool
	}{
		{"string", `{"prompt":"hello world"}`, `{"prompt":"hello there"}`, 5, true},
		{"string differs", `{"prompt":"hello world"}`, `{"prompt":"hello there"}`, 7, false},
		{"list boundaries", `{"prompt":["ab","c"]}`, `{"prompt":["a","bc"]}`, 1024, false},
		{"list equals list", `{"prompt":["ab","c"]}`, `{"model":"x","prompt":["ab","c"]}`, 1024, true},
		{"list vs string", `{"prompt":["abc"]}`, `{"prompt":"abc"}`, 1024, true},
		{"token ids", `{"prompt":[1,2,3]}`, `{"prompt":[1,2,4]}`, 1024, false},
		{"token ids cut", `{"prompt":[1,2,3]}`, `{"prompt":[1,2,4]}`, 2, true},
		{"messages ignored", `{"prompt":"a","messages":[{"role":"user","content":"x"}]}`, `{"prompt":"a"}`, 1024, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if eq := p(tc.a, tc.n) == p(tc.b, tc.n); eq != tc.equal {
				t.Fatalf("equal = %v, want %v", eq, tc.equal)
			}
		})
	}
}

func TestParseOpenAIFields(t *testing.T) {
	o, err := parseOpenAI([]byte(`{"model":"ad\/1","prompt_cache_key":"t\u0041","messages":[]}`), true, 1024)
	if err != nil {
		t.Fatal(err)
	}
	if o.model != "ad/1" || o.tenant != "tA" || !o.hasTenant {
		t.Fatalf("got %+v", o)
	}
	o, err = parseOpenAI([]byte(`{"prompt_cache_key":null,"model":"m"}`), true, 1024)
	if err != nil || o.hasTenant || o.model != "m" {
		t.Fatalf("null key: %+v, %v", o, err)
	}
}

func TestParseOpenAIMalformed(t *testing.T) {
	bad := []string{
		``, `[]`, `{`, `{"model":}`, `{"model":"m",}`, `{"model":"m"} x`, `{"messages":{}}`,
		`{"messages":[{"role":"user","content":"a}]}`, `{"model":1}`,
		`{"prompt_cache_key":5}`, `{"a":tru}`, `{"a":[1,]}`, `{"a":-}`,
		`{"model":"m" "x":1}`, strings.Repeat("[", 1000), `{"a":` + strings.Repeat("[", 1000) + strings.Repeat("]", 1000) + `}`,
	}
	// Shapes only the chat walker reads (completions skips messages).
	chatOnly := map[string]bool{`{"messages":{}}`: true, `{"messages":["hi"]}`: true, `{"messages":[{"role":"user","content":"\x"}]}`: true}
	for b := range chatOnly {
		bad = append(bad, b)
	}
	if _, err := parseOpenAI([]byte(`{"prompt":"\x"}`), false, 1024); !errors.Is(err, errMalformed) {
		t.Errorf("bad escape in prompt: %v", err)
	}
	for _, b := range bad {
		for _, chat := range []bool{true, false} {
			if !chat && chatOnly[b] {
				continue
			}
			if _, err := parseOpenAI([]byte(b), chat, 1024); !errors.Is(err, errMalformed) {
				t.Errorf("parseOpenAI(%q, chat=%v) = %v, want malformed", b, chat, err)
			}
		}
	}
}

func TestInvokeKey(t *testing.T) {
	h := http.Header{}
	body := []byte(strings.Repeat("a", 2000) + "X")
	other := []byte(strings.Repeat("a", 2000) + "Y")
	k := func(h http.Header, b []byte, n int) uint64 {
		rr, err := parseRequest(kindInvoke, h, b, n)
		if err != nil {
			t.Fatal(err)
		}
		return rr.key
	}
	if k(h, body, 2000) != k(h, other, 2000) {
		t.Error("bytes past the prefix changed the key")
	}
	if k(h, body, 2001) == k(h, other, 2001) {
		t.Error("bytes within the prefix did not change the key")
	}
	h2 := http.Header{HeaderTenant: {"tenant-1"}}
	if k(h, body, 1024) == k(h2, body, 1024) {
		t.Error("tenant did not change the key")
	}
	h3 := http.Header{HeaderTargetModel: {"adapter"}}
	if k(h, body, 1024) == k(h3, body, 1024) {
		t.Error("target model did not change the key")
	}
}

func TestValidTenant(t *testing.T) {
	tests := []struct {
		id string
		ok bool
	}{
		{"a", true}, {strings.Repeat("a", 64), true}, {"tenant 1/x~", true},
		{"", false}, {strings.Repeat("a", 65), false}, {"a\tb", false}, {"a\x00", false}, {"é", false}, {"a\x7f", false},
	}
	for _, tc := range tests {
		if got := validTenant(tc.id); got != tc.ok {
			t.Errorf("validTenant(%q) = %v, want %v", tc.id, got, tc.ok)
		}
	}
}

func TestRoutingKeyFraming(t *testing.T) {
	if routingKey("ab", "c", 1) == routingKey("a", "bc", 1) {
		t.Error("tenant/model boundary not framed")
	}
	if routingKey("", "", 1) == routingKey("", "", 2) {
		t.Error("prefix ignored")
	}
}

func TestCutCodePoints(t *testing.T) {
	tests := []string{"", "a", "abcdefghijklmnopqrstuvwxyz", "ééééééééééé", "日本語のテキストです。もっと長く", "a😀b😀c😀d😀e😀f😀g😀h", strings.Repeat("ü", 37) + "x"}
	for _, s := range tests {
		total := utf8.RuneCountInString(s)
		for left := 0; left <= total+2; left++ {
			n, cut := cutCodePoints([]byte(s), left)
			want := min(left, total)
			wantCut := len(s)
			if left < total {
				wantCut = len(string([]rune(s)[:left]))
			}
			if n != want || cut != wantCut {
				t.Fatalf("cutCodePoints(%q, %d) = %d, %d; want %d, %d", s, left, n, cut, want, wantCut)
			}
		}
	}
}

// TestEscapedKeysRouteAsUnescaped: member names and compared values with
// JSON escapes route exactly as their plain forms (issue 12: the raw-byte
// comparison routed {"model":"base","mod\u0065l":"lora-x"} as base while the
// model server, which decodes escapes and keeps the last duplicate, served
// lora-x; and an escaped "m\u0065ssages" collapsed every prompt into one key).
func TestEscapedKeysRouteAsUnescaped(t *testing.T) {
	tests := []struct {
		name          string
		chat          bool
		escaped, want string
	}{
		{"duplicate model, escaped last", true, `{"model":"base","mod\u0065l":"lora-x","messages":[]}`, `{"model":"lora-x","messages":[]}`},
		{"escaped messages", true, `{"m\u0065ssages":[{"role":"user","content":"hello"}]}`, `{"messages":[{"role":"user","content":"hello"}]}`},
		{"escaped role name and value", true, `{"messages":[{"r\u006fle":"\u0075ser","content":"hello"}]}`, `{"messages":[{"role":"user","content":"hello"}]}`},
		{"escaped content", true, `{"messages":[{"role":"user","c\u006fntent":"hello"}]}`, `{"messages":[{"role":"user","content":"hello"}]}`},
		{"escaped part type and text", true, `{"messages":[{"role":"user","content":[{"t\u0079pe":"t\u0065xt","t\u0065xt":"hello"}]}]}`, `{"messages":[{"role":"user","content":[{"type":"text","text":"hello"}]}]}`},
		{"escaped tenant key", true, `{"prompt_cache_k\u0065y":"t1","messages":[]}`, `{"prompt_cache_key":"t1","messages":[]}`},
		{"escaped solidus", true, `{"model\/":"x","model":"m"}`, `{"model/":"x","model":"m"}`},
		{"escaped prompt", false, `{"pr\u006fmpt":"hello","model":"m"}`, `{"prompt":"hello","model":"m"}`},
		{"repeated role, last not a string", true, `{"messages":[{"role":"user","role":1,"content":"x"}]}`, `{"messages":[{"role":1,"content":"x"}]}`},
		{"repeated type, last not text", true, `{"messages":[{"content":[{"type":"text","type":"image","text":"x"}]}]}`, `{"messages":[{"content":[{"type":"image","text":"x"}]}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseOpenAI([]byte(tt.escaped), tt.chat, 4096)
			if err != nil {
				t.Fatal(err)
			}
			want, err := parseOpenAI([]byte(tt.want), tt.chat, 4096)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("escaped form parses as %+v, plain form as %+v", got, want)
			}
		})
	}
	// And distinct prompts behind an escaped key stay distinct.
	a, _ := parseOpenAI([]byte(`{"m\u0065ssages":[{"role":"user","content":"one"}]}`), true, 4096)
	b, _ := parseOpenAI([]byte(`{"m\u0065ssages":[{"role":"user","content":"two"}]}`), true, 4096)
	if a.prefix == b.prefix {
		t.Fatal("two prompts behind an escaped messages key share a key")
	}
}

// TestControlCharactersRejected: RFC 8259 §7 requires U+0000..U+001F to be
// escaped inside strings; raw ones made a body the router accepted and
// forwarded (issue 19), though docs/security.md promises 400 for malformed
// JSON. Everywhere the walker goes: model, tenant, message text, member
// names, skipped members.
func TestControlCharactersRejected(t *testing.T) {
	for _, body := range []string{
		"{\"model\":\"a\x01b\",\"messages\":[]}",
		"{\"prompt_cache_key\":\"t\x1f\",\"messages\":[]}",
		"{\"messages\":[{\"role\":\"user\",\"content\":\"line\nbreak\"}]}",
		"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"tab\there\"}]}]}",
		"{\"temperature\":1,\"stop\":[\"\x00\"],\"messages\":[]}",
		"{\"na\x02me\":1,\"messages\":[]}",
		"{\"messages\":[{\"role\":\"user\",\"content\":\"" + strings.Repeat("0123456789abcdef", 8) + "\x7f\x1b\"}]}",
	} {
		if _, err := parseOpenAI([]byte(body), true, 4096); !errors.Is(err, errMalformed) {
			t.Errorf("parseOpenAI(%q) = %v, want a malformed-JSON error", body, err)
		}
	}
	// Escaped control characters, DEL and multi-byte text are fine.
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"a\nb\u0001\t"}]}`,
		"{\"messages\":[{\"role\":\"user\",\"content\":\"\x7f \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 " + strings.Repeat("\xc2\xa0", 40) + "\"}]}",
	} {
		if _, err := parseOpenAI([]byte(body), true, 4096); err != nil {
			t.Errorf("parseOpenAI(%q) = %v, want nil", body, err)
		}
	}
}

func TestControlAt(t *testing.T) {
	for i := range 40 {
		b := []byte(strings.Repeat("\x80\xff~ ", 10))
		if controlAt(b) != -1 {
			t.Fatalf("controlAt found a control byte in %q", b)
		}
		b[i] = 0x1f
		if got := controlAt(b); got != i {
			t.Fatalf("controlAt = %d, want %d", got, i)
		}
	}
}

// TestOpenAIStream: the walk reads a top-level "stream": true, which makes
// the first-byte timeout apply (proxy.go); anything else is not a stream.
func TestOpenAIStream(t *testing.T) {
	for _, tc := range []struct {
		body string
		want bool
	}{
		{`{"model":"m","stream":true,"messages":[]}`, true},
		{`{"model":"m","messages":[],"stream":true}`, true},
		{`{"model":"m","messages":[],"stream":false}`, false},
		{`{"model":"m","messages":[]}`, false},
		{`{"model":"m","messages":[],"stream":"true"}`, false},
		{`{"model":"m","messages":[],"stream":null}`, false},
		{`{"model":"m","stream":true,"messages":[],"stream":false}`, false}, // the last one, as encoding/json
		{`{"model":"m","stream":false,"messages":[],"stream":true}`, true},
		{`{"model":"m","messages":[{"role":"user","content":"x","stream":true}]}`, false}, // not top-level
		{`{"model":"m","stream_options":{"stream":true},"messages":[]}`, false},
	} {
		o, err := parseOpenAI([]byte(tc.body), true, 1024)
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		if o.stream != tc.want {
			t.Errorf("%s: stream %v, want %v", tc.body, o.stream, tc.want)
		}
	}
}

// checkLadder checks a prompt's digests at its depths against the
// fixed-length digests at those depths (fixed(d): the key's digest with
// PrefixLength d): the digest at each depth is the one a fixed key of that
// length gives, every depth of the ladder the prompt reaches is there, and
// the last is the fixed key at prefixLen, so one pass gives what a walk per
// depth would (issue 21). A message's end that adds only boundary marks
// (an empty message) has no fixed key of its own and is only checked for
// its place.
func checkLadder(t testing.TB, got prefixDigests, fixed func(d int) uint64, prefixLen int) {
	t.Helper()
	if got.n < 1 || got.n > maxLevels {
		t.Fatalf("%d digests", got.n)
	}
	for i := range got.n {
		at := int(got.at[i])
		if i > 0 && at < int(got.at[i-1]) {
			t.Fatalf("depth %d at %d units, before depth %d's %d", i, at, i-1, got.at[i-1])
		}
		if i == got.n-1 || (i > 0 && at == int(got.at[i-1])) {
			continue
		}
		if want := fixed(at); got.d[i] != want {
			t.Fatalf("digest %d (at %d units of %d): %x, the fixed key of that length %x", i, at, prefixLen, got.d[i], want)
		}
	}
	if got.last() != fixed(prefixLen) {
		t.Fatalf("last digest %x, the fixed key %x", got.last(), fixed(prefixLen))
	}
	end := int(got.at[got.n-1])
	for j := 0; depthAt(j, prefixLen) < end; j++ {
		found := false
		for i := range got.n {
			found = found || int(got.at[i]) == depthAt(j, prefixLen)
		}
		if !found {
			t.Fatalf("no digest at the ladder's depth %d (the prompt goes on to %d units)", depthAt(j, prefixLen), end)
		}
	}
}

// TestLadderDigests: chat, completions and invoke bodies of many lengths,
// with escapes, multi-byte characters, several messages and text parts
// across the depths, give at each depth the fixed-length key of that depth.
func TestLadderDigests(t *testing.T) {
	unit := "ab<é\n«ü»😀 x&y\"z\\" // JSON escapes (json.Marshal escapes <, &, \n, ", \\) and multi-byte characters
	for _, prefixLen := range []int{1024, 1500, 4096, 65536} {
		for _, size := range []int{0, 1, 511, 512, 513, 1024, 3000, 5000, 40000, 70000} {
			text := strings.Repeat(unit, size/len(unit)+1)[:size]
			text = strings.ToValidUTF8(text, "")
			chat := chatBody(t, msg("system", text[:len(text)/3]), msg("user", []any{
				map[string]any{"type": "text", "text": text[len(text)/3:]},
				map[string]any{"type": "text", "text": "tail"},
			}))
			o, err := parseOpenAI(chat, true, prefixLen)
			if err != nil {
				t.Fatal(err)
			}
			checkLadder(t, o.digests, func(d int) uint64 { return chatPrefix(t, string(chat), d) }, prefixLen)
			comp, _ := json.Marshal(map[string]any{"prompt": []any{text, 7, "x"}})
			o, err = parseOpenAI(comp, false, prefixLen)
			if err != nil {
				t.Fatal(err)
			}
			checkLadder(t, o.digests, func(d int) uint64 {
				p, _ := parseOpenAI(comp, false, d)
				return p.prefix
			}, prefixLen)
			inv := []byte(text)
			checkLadder(t, invokeDigests(inv, prefixLen), func(d int) uint64 { return invokePrefix(inv, d) }, prefixLen)
		}
	}
}

// TestMessageDepths: the ends of a chat's first messages past the first
// depth are depths, so that a session's task keys alike in every turn: its
// second turn (the task, an answer, a tool output) has the first turn's
// whole prompt among its digests, at the same place.
func TestMessageDepths(t *testing.T) {
	tool := strings.Repeat("tool ", 2000) // 10,000 characters
	task := strings.Repeat("task ", 100)
	first := chatBody(t, msg("system", tool), msg("user", task))
	second := chatBody(t, msg("system", tool), msg("user", task), msg("assistant", "ok"), msg("user", strings.Repeat("output ", 1000)))
	a, err := parseOpenAI(first, true, 32768)
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseOpenAI(second, true, 32768)
	if err != nil {
		t.Fatal(err)
	}
	checkLadder(t, a.digests, func(d int) uint64 { return chatPrefix(t, string(first), d) }, 32768)
	checkLadder(t, b.digests, func(d int) uint64 { return chatPrefix(t, string(second), d) }, 32768)
	// 4096, 8192, the tool prompt's end, the task's end: the first turn.
	if a.digests.n != 4 || a.digests.at[2] != 10000 || a.digests.at[3] != 10500 {
		t.Fatalf("first turn's depths at %v (%d)", a.digests.at[:a.digests.n], a.digests.n)
	}
	for i := range a.digests.n {
		if b.digests.d[i] != a.digests.d[i] || b.digests.at[i] != a.digests.at[i] {
			t.Fatalf("depth %d: the second turn's digest differs from the first's (at %d, %d)", i, b.digests.at[i], a.digests.at[i])
		}
	}
	// A short first message is no depth: the ladder starts at 4096.
	short, _ := parseOpenAI(chatBody(t, msg("system", "be brief"), msg("user", tool)), true, 32768)
	if short.digests.at[0] != firstDepth {
		t.Fatalf("short system message: first depth at %d, want %d", short.digests.at[0], firstDepth)
	}
	// A first turn of 600 characters is one, below the ladder: the
	// session's turns share it.
	turn := strings.Repeat("q", 600)
	c, _ := parseOpenAI(chatBody(t, msg("user", turn)), true, 32768)
	d, _ := parseOpenAI(chatBody(t, msg("user", turn), msg("assistant", "a"), msg("user", tool)), true, 32768)
	if c.digests.n != 1 || d.digests.at[0] != 600 || d.digests.d[0] != c.digests.d[0] {
		t.Fatalf("first turn's depth %v, the next turn's %v", c.digests.at[:c.digests.n], d.digests.at[:d.digests.n])
	}
}

// invokePrefix is the fixed-length invoke digest written plainly: the
// digest of the first prefixLen bytes of a raw body.
func invokePrefix(body []byte, prefixLen int) uint64 {
	if len(body) > prefixLen {
		body = body[:prefixLen]
	}
	return xxhash.Sum64(body)
}
