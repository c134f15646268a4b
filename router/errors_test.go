package router

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/overload"
)

// checkError asserts a router-made error: status, X-Prefixrouter-Error and
// the body shape of the path's API.
func checkError(t *testing.T, res result, openAI bool, status int, code string) {
	t.Helper()
	if res.status != status {
		t.Fatalf("status %d, want %d; body %s", res.status, status, res.body)
	}
	if got := res.header.Get(HeaderError); got != code {
		t.Fatalf("%s = %q, want %q", HeaderError, got, code)
	}
	if status == http.StatusServiceUnavailable && res.header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	if openAI {
		var e openAIError
		if err := json.Unmarshal(res.body, &e); err != nil || e.Error.Code != code || e.Error.Message == "" || e.Error.Type == "" {
			t.Fatalf("OpenAI error body %s (%v)", res.body, err)
		}
		return
	}
	var e sageMakerError
	if err := json.Unmarshal(res.body, &e); err != nil || e.ErrorCode == "" || e.Message == "" || e.LowerMessage != e.Message {
		t.Fatalf("SageMaker error body %s (%v)", res.body, err)
	}
	want := map[int]string{500: "InternalFailure", 400: "ValidationError", 413: "ValidationError", 424: "ModelError", 429: "ModelNotReadyException", 503: "ServiceUnavailable", 530: "InternalDependencyException"}[status]
	if e.ErrorCode != want || res.header.Get("X-Amzn-ErrorType") != want {
		t.Fatalf("ErrorCode %q, X-Amzn-ErrorType %q, want %q", e.ErrorCode, res.header.Get("X-Amzn-ErrorType"), want)
	}
}

func TestInvalidInputs(t *testing.T) {
	h := newHarness(t, hopts{cfg: prefixCfg(10), maxBody: 4096, labels: map[string]string{"model": "base"}, adapters: []string{"lora-1"}}, threeBackends(t)...)
	big := strings.Repeat("x", 5000)
	tests := []struct {
		name   string
		path   string
		body   string
		hdr    map[string]string
		status int
		code   string
	}{
		{"malformed chat JSON", "/v1/chat/completions", `{"model":"base","messages":[`, nil, 400, codeInvalidJSON},
		{"malformed completions JSON", "/v1/completions", `{"prompt":"a",}`, nil, 400, codeInvalidJSON},
		{"65-char tenant header", "/invocations", "x", map[string]string{"X-Amzn-SageMaker-Prefix-Aware-Id": strings.Repeat("a", 65)}, 400, codeInvalidTenant},
		{"control char tenant header", "/invocations", "x", map[string]string{"X-Amzn-SageMaker-Prefix-Aware-Id": "a\tb"}, 400, codeInvalidTenant},
		{"65-char prompt_cache_key", "/v1/chat/completions", `{"model":"base","prompt_cache_key":"` + strings.Repeat("a", 65) + `","messages":[]}`, nil, 400, codeInvalidTenant},
		{"control char prompt_cache_key", "/v1/chat/completions", `{"model":"base","prompt_cache_key":"a\u0001b","messages":[]}`, nil, 400, codeInvalidTenant},
		{"empty prompt_cache_key", "/v1/completions", `{"model":"base","prompt_cache_key":"","prompt":"a"}`, nil, 400, codeInvalidTenant},
		{"body over limit invoke", "/invocations", big, nil, 413, codeTooLarge},
		{"body over limit chat", "/v1/chat/completions", `{"messages":"` + big + `"}`, nil, 413, codeTooLarge},
		{"unknown endpoint invoke", "/endpoints/nope/invocations", "x", nil, 400, codeUnknownEndpoint},
		{"unknown endpoint invoke stream", "/endpoints/nope/invocations-response-stream", "x", nil, 400, codeUnknownEndpoint},
		{"unknown endpoint chat", "/endpoints/nope/openai/v1/chat/completions", `{"messages":[]}`, nil, 404, codeUnknownEndpoint},
		{"unknown adapter invoke", "/invocations", "x", map[string]string{"X-Amzn-SageMaker-Target-Model": "lora-9"}, 400, codeUnknownModel},
		{"unknown model chat", "/v1/chat/completions", `{"model":"gpt-9","messages":[]}`, nil, 404, codeUnknownModel},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := h.mustDo(tc.path, tc.body, tc.hdr)
			checkError(t, res, strings.Contains(tc.path, "/v1/"), tc.status, tc.code)
		})
	}
	// Known model and adapter route.
	for _, hdr := range []map[string]string{{"X-Amzn-SageMaker-Target-Model": "lora-1"}, {"X-Amzn-SageMaker-Target-Model": "base"}, nil} {
		if res := h.mustDo("/invocations", "x", hdr); res.status != 200 {
			t.Fatalf("%v: status %d %s", hdr, res.status, res.body)
		}
	}
	// Body with chunked encoding (no Content-Length) over the limit.
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/invocations", io.MultiReader(strings.NewReader(big)))
	req.ContentLength = -1
	resp, err := h.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Fatalf("chunked over limit: %d", resp.StatusCode)
	}
}

func TestNoInstance(t *testing.T) {
	t.Run("not loaded", func(t *testing.T) {
		r, err := New(Options{DefaultEndpoint: "ep"})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		for _, path := range []string{"/invocations", "/v1/chat/completions"} {
			w := httptestRecorder(r, path, `{"messages":[]}`)
			status := 530 // etcd never answered: InternalDependencyException
			if strings.HasPrefix(path, "/v1") {
				status = 503
			}
			checkError(t, w, strings.HasPrefix(path, "/v1"), status, codeNotLoaded)
		}
		if r.Ready() == nil {
			t.Fatal("ready without a snapshot")
		}
	})
	t.Run("empty fleet", func(t *testing.T) {
		h := newHarness(t, hopts{cfg: prefixCfg(10)})
		checkError(t, h.mustDo("/invocations", "x", nil), false, 503, codeNoInstance)
		checkError(t, h.mustDo("/v1/chat/completions", `{"messages":[]}`, nil), true, 503, codeNoInstance)
		if h.r.Ready() == nil {
			t.Fatal("ready with an empty fleet")
		}
	})
	t.Run("all breakers open", func(t *testing.T) {
		// No ejection cap: every breaker may open (the default keeps
		// half of the endpoint in rotation: TestEjectionCapKeepsHalfTheEndpoint).
		h := newHarness(t, hopts{cfg: prefixCfg(10), breaker: overload.BreakerOptions{ConsecutiveFailures: 1, OpenTimeout: time.Hour, MaxEjectionPercent: 100}})
		for _, id := range []string{"d1", "d2", "d3"} {
			h.ep.Instances = append(h.ep.Instances, fleet.Instance{ID: id, Addr: "http://" + deadAddr(t)})
		}
		h.update()
		// One request tries all three (two retries), each dial fails: every
		// instance is unreachable, SageMaker's InternalDependencyException.
		res := h.mustDo("/invocations", "x", nil)
		checkError(t, res, false, 530, codeUnreachable)
		if res.instance == "" {
			t.Fatal("530 without the instance header")
		}
		for _, id := range []string{"d1", "d2", "d3"} {
			if st := h.state(id).Status().Breaker; st != gobreaker.StateOpen {
				t.Fatalf("%s breaker %v", id, st)
			}
		}
		checkError(t, h.mustDo("/invocations", "x", nil), false, 503, codeNoInstance)
		checkError(t, h.mustDo("/v1/chat/completions", `{"messages":[]}`, nil), true, 503, codeNoInstance)
	})
	t.Run("upstream failure on OpenAI path is 502", func(t *testing.T) {
		h := newHarness(t, hopts{cfg: prefixCfg(10)})
		h.ep.Instances = append(h.ep.Instances, fleet.Instance{ID: "d1", Addr: "http://" + deadAddr(t)})
		h.update()
		checkError(t, h.mustDo("/v1/chat/completions", `{"messages":[]}`, nil), true, 502, codeUnreachable)
	})
}

func httptestRecorder(h http.Handler, path, body string) result {
	req, _ := http.NewRequest(http.MethodPost, path, strings.NewReader(body))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return result{status: w.Code, header: w.Header(), body: w.Body.Bytes()}
}

func TestClientCancelIsNotAFailure(t *testing.T) {
	b := newBackend(t, "i-a")
	h := newHarness(t, hopts{cfg: prefixCfg(10), breaker: overload.BreakerOptions{ConsecutiveFailures: 1, OpenTimeout: time.Hour}}, b)
	// Canceled while the backend holds the request.
	for range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := h.do(ctx, "/invocations", "x", map[string]string{"X-Test-Block": "1"})
			done <- err
		}()
		testsupport.Eventually(t, 10*time.Second, "request blocked in backend", func() bool { return b.blocked.Load() == 1 })
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("client error %v", err)
		}
		testsupport.Eventually(t, 10*time.Second, "slot released", func() bool { return h.state("i-a").InFlight() == 0 && b.blocked.Load() == 0 })
	}
	// Canceled mid-stream.
	sent := make(chan struct{})
	sb := newBackend(t, "i-s")
	sb.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; ; i++ {
			if _, err := io.WriteString(w, "data: tok\n\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			if i == 0 {
				close(sent)
			}
			select {
			case <-r.Context().Done():
				return
			case <-time.After(time.Millisecond):
			}
		}
	}
	h2 := newHarness(t, hopts{cfg: prefixCfg(10), breaker: overload.BreakerOptions{ConsecutiveFailures: 1, OpenTimeout: time.Hour}}, sb)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h2.srv.URL+"/v1/chat/completions", strings.NewReader(`{"stream":true,"messages":[]}`))
	resp, err := h2.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	<-sent
	buf := make([]byte, 4)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	testsupport.Eventually(t, 10*time.Second, "stream slot released", func() bool { return h2.state("i-s").InFlight() == 0 })
	for _, st := range []*overload.State{h.state("i-a"), h2.state("i-s")} {
		if s := st.Status().Breaker; s != gobreaker.StateClosed {
			t.Fatalf("%s breaker %v after client cancels", st.ID(), s)
		}
	}
	// The instances still serve.
	if res := h.mustDo("/invocations", "x", nil); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
}

func TestUpstream5xxCountsAndPassesThrough(t *testing.T) {
	b := newBackend(t, "i-a")
	var mu sync.Mutex
	code := 503
	b.handler = func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		c := code
		mu.Unlock()
		w.WriteHeader(c)
		io.WriteString(w, `{"upstream":true}`)
	}
	// A one-instance endpoint's breaker opens only without the ejection cap.
	h := newHarness(t, hopts{cfg: prefixCfg(10), breaker: overload.BreakerOptions{ConsecutiveFailures: 3, OpenTimeout: time.Hour, MaxEjectionPercent: 100}}, b)
	for i, c := range []int{501, 501, 501, 400, 503, 503} {
		mu.Lock()
		code = c
		mu.Unlock()
		if i%2 == 0 {
			// OpenAI paths pass the upstream's answer through.
			res := h.mustDo("/v1/completions", `{"prompt":"x"}`, nil)
			if res.status != c || string(res.body) != `{"upstream":true}` || res.instance != "i-a" {
				t.Fatalf("status %d body %s instance %q", res.status, res.body, res.instance)
			}
			continue
		}
		// Invoke paths wrap it in SageMaker's ModelError.
		res := h.mustDo("/invocations", "x", nil)
		checkError(t, res, false, 424, codeUpstreamStatus)
		var e sageMakerError
		if err := json.Unmarshal(res.body, &e); err != nil || e.OriginalStatusCode != c || e.OriginalMessage != `{"upstream":true}` || res.instance != "i-a" {
			t.Fatalf("ModelError %+v (%v) instance %q", e, err, res.instance)
		}
	}
	if st := h.state("i-a").Status().Breaker; st != gobreaker.StateClosed {
		t.Fatalf("breaker %v after two 503s (threshold 3)", st)
	}
	h.mustDo("/invocations", "x", nil)
	// The proxy reports the outcome after the client has the response.
	testsupport.Eventually(t, 10*time.Second, "breaker open after three 503s", func() bool { return h.state("i-a").Status().Breaker == gobreaker.StateOpen })
}
