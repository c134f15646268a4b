package replica

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/router"
)

// rawRequest writes raw on a new connection and returns the status of the
// answer (0 if the server closed without one).
func rawRequest(t *testing.T, addr, raw string) int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		return 0
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// manyHeaders returns n distinct header lines.
func manyHeaders(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("X-H%d: v", i)
	}
	return out
}

// post builds a POST with a correct Content-Length.
func rawPost(path, body string, headers ...string) string {
	h := ""
	for _, x := range headers {
		h += x + "\r\n"
	}
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\nConnection: close\r\n\r\n%s", path, h, len(body), body)
}

// TestHostileInputs sends hostile requests over a real socket, each with
// the status it must get (the status is the documented answer, see
// docs/security.md). Nothing may panic (the server logs recovered handler
// panics through the replica's logger) and nothing may leak (goleak in
// TestMain).
func TestHostileInputs(t *testing.T) {
	var logs testsupport.LogBuffer
	upstream := backends(t, 1)[0]
	upstream.Labels = map[string]string{"model": "base"}
	upstream.Adapters = []string{"lora-x"}
	rep, err := Start(context.Background(), Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Static: []fleet.Instance{upstream},
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Router: router.Options{DefaultEndpoint: "chat", MaxBodyBytes: 64 << 10},
		Limits: Limits{MaxHeaderBytes: 8 << 10, BodyReadTimeout: 2 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close(context.Background())
	// A second replica asks for data-plane API keys (--api-keys-file).
	const key = "sk-hostile-0123456789abcdef"
	keys, err := router.ParseAPIKeys([]byte(key))
	if err != nil {
		t.Fatal(err)
	}
	keyed, err := Start(context.Background(), Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Static: []fleet.Instance{upstream},
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Router: router.Options{DefaultEndpoint: "chat", APIKeys: keys},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer keyed.Close(context.Background())
	chat := func(body string, h ...string) string { return rawPost("/v1/chat/completions", body, h...) }
	msg := `"messages":[{"role":"user","content":"hi"}]`
	deep := strings.Repeat("[", 600) + strings.Repeat("]", 600)
	tests := []struct {
		name string // rows named "API key: …" go to the replica that asks for keys
		raw  string
		want int
	}{
		{"plain invoke (control)", rawPost("/invocations", `{"inputs":"hi"}`), 200},
		{"plain chat (control)", chat(`{"model":"base",` + msg + `}`), 200},
		{"body over the limit", rawPost("/invocations", strings.Repeat("x", 65<<10)), 413},
		{"declared length over the limit, no body", "POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 6291456\r\n\r\n", 413},
		{"chunked body over the limit", "POST /invocations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", 65<<10, strings.Repeat("y", 65<<10)), 413},
		{"header block over MaxHeaderBytes", "GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 16<<10) + "\r\n\r\n", 431},
		{"request line over MaxHeaderBytes", "GET /" + strings.Repeat("a", 16<<10) + " HTTP/1.1\r\nHost: x\r\n\r\n", 431},
		// RFC 9112 6.1: refused as Envoy and HAProxy refuse them, and the
		// connection closes (TestSmugglingRefused: the hidden request is
		// never served).
		{"Content-Length and Transfer-Encoding (smuggling)", "POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
		{"Transfer-Encoding on HTTP/1.0", "POST /invocations HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
		{"101 header fields", rawPost("/invocations", "x", manyHeaders(98)...), 431},
		{"raw newline inside a JSON string", chat("{\"model\":\"base\",\"messages\":[{\"role\":\"user\",\"content\":\"a\nb\"}]}"), 400},
		{"U+0001 inside the model name", chat("{\"model\":\"ba\x01se\"," + msg + "}"), 400},
		{"two different Content-Lengths", "POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400},
		{"non-numeric Content-Length", "POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400},
		{"HTTP/1.1 without Host", "GET /ping HTTP/1.1\r\n\r\n", 400},
		{"header name with a space", "GET /ping HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n", 400},
		{"tenant id too long", rawPost("/invocations", "x", "X-Amzn-SageMaker-Prefix-Aware-Id: "+strings.Repeat("t", 65)), 400},
		{"tenant id with a control character", rawPost("/invocations", "x", "X-Amzn-SageMaker-Prefix-Aware-Id: a\x01b"), 400},
		{"two tenant headers", rawPost("/invocations", "x", "X-Amzn-SageMaker-Prefix-Aware-Id: a", "X-Amzn-SageMaker-Prefix-Aware-Id: b"), 400},
		{"unknown target model", rawPost("/invocations", "x", "X-Amzn-SageMaker-Target-Model: nope"), 400},
		{"unknown endpoint", rawPost("/endpoints/nope/invocations", "x"), 400},
		{"endpoint of invalid UTF-8", rawPost("/endpoints/%ff%fe/invocations", "x"), 400},
		{"malformed chat JSON", chat(`{"model":"base",`), 400},
		{"chat body an array", chat(`[1,2]`), 400},
		{"chat JSON nested 600 deep", chat(`{"x":` + deep + `,` + msg + `}`), 400},
		{"model not a string", chat(`{"model":7,` + msg + `}`), 400},
		{"unknown model", chat(`{"model":"nope",` + msg + `}`), 404},
		{"prompt_cache_key too long", chat(`{"prompt_cache_key":"` + strings.Repeat("k", 65) + `",` + msg + `}`), 400},
		{"prompt_cache_key not a string", chat(`{"prompt_cache_key":{},` + msg + `}`), 400},
		{"empty chat body", chat(``), 400},
		{"trailing data after the object", chat(`{` + msg + `} {}`), 400},
		{"escaped model key (routes as lora-x)", chat(`{"model":"base","mod\u0065l":"lora-x",` + msg + `}`), 200},
		{"invalid UTF-8 in the prompt", chat("{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}"), 200},
		{"lone surrogate escape", chat(`{"messages":[{"role":"user","content":"\ud800x"}]}`), 200},
		{"GET on an invoke path", "GET /invocations HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 405},
		{"unknown path", "GET /admin/secret HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404},
		// ServeMux redirects to the cleaned path; nothing is routed.
		{"path traversal to the endpoint", rawPost("/endpoints/../invocations", "x"), 307},
		{"API key: chat with the key (control)", chat(`{"model":"base",`+msg+`}`, "Authorization: Bearer "+key), 200},
		{"API key: chat without one", chat(`{"model":"base",` + msg + `}`), 401},
		{"API key: chat with a wrong one", chat(`{"model":"base",`+msg+`}`, "Authorization: Bearer "+key+"x"), 401},
		{"API key: key as Basic credentials", chat(`{"model":"base",`+msg+`}`, "Authorization: Basic "+key), 401},
		{"API key: invoke signed with SigV4 only", rawPost("/invocations", "x", "Authorization: AWS4-HMAC-SHA256 Credential=AKID/20261201/us-east-1/sagemaker/aws4_request, SignedHeaders=host, Signature=00"), 401},
		{"API key: invoke with the key header", rawPost("/invocations", "x", router.HeaderAPIKey+": "+key), 200},
		{"API key: probe path without one", "GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 200},
	}
	if len(tests) < 25 {
		t.Fatalf("only %d hostile inputs", len(tests))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := rep.Addr()
			if strings.HasPrefix(tt.name, "API key:") {
				addr = keyed.Addr()
			}
			if got := rawRequest(t, addr, tt.raw); got != tt.want {
				t.Errorf("status %d, want %d", got, tt.want)
			}
		})
	}
	if strings.Contains(logs.String(), "panic") {
		t.Fatalf("a handler panicked:\n%s", logs.String())
	}
}
