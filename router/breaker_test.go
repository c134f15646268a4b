package router

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/prefixrouter/prefixrouter/overload"
)

// This file tests the one breaker rule (docs/operations.md, "What counts
// against a breaker") from outside, over real HTTP: clients cannot drive
// an instance's breaker with requests that fail by their own making, and
// whatever drives them, breakers and health checks take at most half of
// an endpoint out of rotation (issue 19, "Breakers that clients can trip";
// issue 20, "Client errors open the circuit breaker").

// engineReq is what the fake engine reads of an OpenAI or invoke body.
type engineReq struct {
	N         int    `json:"n"`
	MaxTokens int    `json:"max_tokens"`
	Stream    bool   `json:"stream"`
	Inputs    string `json:"inputs"`
}

// newEngineBackend is a backend that behaves as llama.cpp's llama-server
// does where breakers judge it: HTTP 500 to a request it cannot take (a
// body that is not JSON, "n" above 1); a non-streamed answer only once its
// whole generation is done (max_tokens milliseconds: one per token); a
// streamed answer whose headers and first token leave at once.
func newEngineBackend(t *testing.T, id string) *backend {
	b := newBackend(t, id)
	b.handler = func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req engineReq
		if err := json.Unmarshal(body, &req); err != nil || req.N > 1 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, `{"error":{"code":500,"message":"cannot take this request","type":"server_error"}}`)
			return
		}
		if req.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"id\":%q,\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n", id)
			http.NewResponseController(w).Flush()
			fmt.Fprint(w, "data: [DONE]\n\n")
			return
		}
		if !engineWork(r, time.Duration(req.MaxTokens)*time.Millisecond) { // the generation
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"choices":[{"message":{"content":"x"}}]}`, id)
	}
	return b
}

// engineWork is a fake engine's work on r for d (simulated, not a wait
// for the test); false when the client left first.
func engineWork(r *http.Request, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}

func engineBackends(t *testing.T, n int) []*backend {
	bs := make([]*backend, n)
	for i := range bs {
		bs[i] = newEngineBackend(t, fmt.Sprintf("i-%d", i))
	}
	return bs
}

// chatRequest is an OpenAI chat body whose prompt starts with prefix.
func chatRequest(prefix string, fields map[string]any) string {
	m := map[string]any{"model": "m", "messages": []any{msg("system", prefix), msg("user", "the question")}}
	for k, v := range fields {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// openBreakers lists the instances of the harness whose breaker is open,
// once every request's outcome is in (the proxy reports it after the
// client has its answer; a released slot means it has).
func openBreakers(h *harness) []string {
	h.assertIdle()
	var open []string
	for _, iv := range h.r.view.Load().endpoints["ep"].instances {
		if iv.state.Status().Breaker == gobreaker.StateOpen {
			open = append(open, iv.inst.ID)
		}
	}
	return open
}

// TestMalformedRequestsDoNotMoveValidTraffic is issue 20's attack: five
// malformed requests that the engine answers with 500, sharing a valid
// request's prefix, must not change where that valid request goes. The
// engine is of no known profile, so its 500 is ambiguous; five 500s to
// one routing key are one request failing, not the instance.
func TestMalformedRequestsDoNotMoveValidTraffic(t *testing.T) {
	prefix := strings.Repeat("A system prompt that many tenants share. ", 40)
	for _, tc := range []struct {
		name, path   string
		valid        string
		malformed    func(i int) string
		upstreamCode int // what the client sees of the engine's 500
	}{
		{
			name:         "chat n=2",
			path:         "/v1/chat/completions",
			valid:        chatRequest(prefix, map[string]any{"max_tokens": 1}),
			malformed:    func(i int) string { return chatRequest(prefix, map[string]any{"n": 2 + i, "max_tokens": 1}) },
			upstreamCode: http.StatusInternalServerError,
		},
		{
			name:         "invoke bad JSON",
			path:         "/invocations",
			valid:        fmt.Sprintf(`{"inputs":%q,"max_tokens":1}`, prefix),
			malformed:    func(i int) string { return fmt.Sprintf(`{"inputs":%q,"max_tokens":1,%d`, prefix, i) },
			upstreamCode: http.StatusFailedDependency, // SageMaker's ModelError quoting the 500
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, hopts{cfg: prefixCfg(10)}, engineBackends(t, 3)...)
			first := h.mustDo(tc.path, tc.valid, nil)
			if first.status != 200 || first.decision != DecisionAffinity {
				t.Fatalf("valid request: %d from %s (%s)", first.status, first.instance, first.decision)
			}
			for i := range overload.DefaultConsecutiveFailures {
				res := h.mustDo(tc.path, tc.malformed(i), nil)
				if res.status != tc.upstreamCode || res.instance != first.instance {
					t.Fatalf("malformed request %d: %d from %s, want %d from %s", i, res.status, res.instance, tc.upstreamCode, first.instance)
				}
			}
			h.assertIdle() // every outcome is in
			again := h.mustDo(tc.path, tc.valid, nil)
			if again.status != 200 || again.instance != first.instance || again.decision != DecisionAffinity {
				t.Fatalf("after %d malformed requests the valid one went to %s (%s, %d), want %s (affinity)",
					overload.DefaultConsecutiveFailures, again.instance, again.decision, again.status, first.instance)
			}
			if open := openBreakers(h); len(open) != 0 {
				t.Fatalf("breakers open: %v", open)
			}
		})
	}
}

// TestSlowGenerationsDoNotTripBreakers is issue 19's attack: one client
// sends 30 non-streamed requests with max_tokens 300 (300 ms of
// generation on the fake engine) under a first-byte timeout of 50 ms. A
// non-streamed answer's first byte comes when its generation ends, so the
// timeout does not apply to them: the client gets its 30 answers, no
// breaker opens, and another client's 40 requests see 0 failures.
func TestSlowGenerationsDoNotTripBreakers(t *testing.T) {
	h := newHarness(t, hopts{cfg: prefixCfg(10), first: 50 * time.Millisecond}, engineBackends(t, 3)...)
	statuses := func(n, workers int, body func(i int) string) map[int]int {
		var mu sync.Mutex
		got := map[int]int{}
		var wg sync.WaitGroup
		next := make(chan int)
		for range workers {
			wg.Go(func() {
				for i := range next {
					res, err := h.do(t.Context(), "/v1/chat/completions", body(i), nil)
					mu.Lock()
					if err != nil {
						got[-1]++
					} else {
						got[res.status]++
					}
					mu.Unlock()
				}
			})
		}
		for i := range n {
			next <- i
		}
		close(next)
		wg.Wait()
		return got
	}
	slow := statuses(30, 30, func(i int) string {
		return chatRequest(fmt.Sprintf("slow client %d ", i)+strings.Repeat("p", 1100), map[string]any{"max_tokens": 300})
	})
	if slow[200] != 30 {
		t.Errorf("the slow client's 30 non-streamed requests: %v, want 30 × 200", slow)
	}
	if open := openBreakers(h); len(open) != 0 {
		t.Errorf("breakers open after slow generations: %v", open)
	}
	other := statuses(40, 4, func(i int) string {
		return chatRequest(fmt.Sprintf("other client %d ", i)+strings.Repeat("q", 1100), map[string]any{"max_tokens": 2})
	})
	if other[200] != 40 {
		t.Fatalf("the other client's 40 requests: %v, want 40 × 200 (0 failures)", other)
	}
}

// TestFirstByteTimeoutCutsStreamsOnly: the first-byte timeout still cuts a
// streamed request whose instance sends no token (and that counts), while
// a non-streamed request to the same hung instance is not cut by it (the
// client's own deadline ends it, and that does not count).
func TestFirstByteTimeoutCutsStreamsOnly(t *testing.T) {
	b := newBackend(t, "hung")
	b.handler = func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}
	h := newHarness(t, hopts{cfg: prefixCfg(10), first: 50 * time.Millisecond, breaker: overload.BreakerOptions{ConsecutiveFailures: 1, OpenTimeout: time.Hour, MaxEjectionPercent: 100}}, b)
	body := chatRequest(strings.Repeat("hang ", 300), map[string]any{"max_tokens": 5})
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if res, err := h.do(ctx, "/v1/chat/completions", body, nil); err == nil {
		t.Fatalf("non-streamed request to a hung instance cut by the first-byte timeout: %d", res.status)
	}
	h.assertIdle()
	if st := h.state("hung").Status().Breaker; st != gobreaker.StateClosed {
		t.Fatalf("breaker %v after a non-streamed request the client gave up on", st)
	}
	streamed := chatRequest(strings.Repeat("hang ", 300), map[string]any{"max_tokens": 5, "stream": true})
	res, err := h.do(t.Context(), "/v1/chat/completions", streamed, nil)
	if err != nil || res.status != http.StatusBadGateway {
		t.Fatalf("streamed request to a hung instance: %d, %v; want 502 after the first-byte timeout", res.status, err)
	}
	h.assertIdle()
	if st := h.state("hung").Status().Breaker; st != gobreaker.StateOpen {
		t.Fatalf("breaker %v after a streamed request cut by the first-byte timeout, want open", st)
	}
}

// TestEjectionCapKeepsHalfTheEndpoint: one client whose requests the
// engines answer 503 (they count: the instance says it cannot serve) opens
// breakers on at most half of the endpoint's instances (DefaultMax­
// EjectionPercent); another client's requests then see 0 failures.
func TestEjectionCapKeepsHalfTheEndpoint(t *testing.T) {
	bs := engineBackends(t, 4)
	for _, b := range bs {
		serve := b.handler
		b.handler = func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Test-Fail") != "" {
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			serve(w, r)
		}
	}
	h := newHarness(t, hopts{cfg: prefixCfg(10)}, bs...)
	for i := range 80 {
		body := chatRequest(fmt.Sprintf("overloading client %d ", i)+strings.Repeat("p", 1100), map[string]any{"max_tokens": 1})
		res := h.mustDo("/v1/chat/completions", body, map[string]string{"X-Test-Fail": "1"})
		if res.status != http.StatusServiceUnavailable {
			t.Fatalf("failing request %d: %d", i, res.status)
		}
	}
	if open := openBreakers(h); len(open) != len(bs)*overload.DefaultMaxEjectionPercent/100 {
		t.Fatalf("open breakers after 80 failures over 4 instances: %v, want exactly %d (the cap)", open, len(bs)*overload.DefaultMaxEjectionPercent/100)
	}
	failures := 0
	for i := range 40 {
		body := chatRequest(fmt.Sprintf("other client %d ", i)+strings.Repeat("q", 1100), map[string]any{"max_tokens": 1})
		if res := h.mustDo("/v1/chat/completions", body, nil); res.status != 200 {
			failures++
		}
	}
	if failures != 0 {
		t.Fatalf("the other client: %d of 40 failed", failures)
	}
}

// TestPanicRoutingBeyondCap: when health checks mark more of an endpoint
// down than the cap allows (3 of 4), the endpoint panics: picks ignore
// health marks and open breakers, so a key goes to its ring primary again
// although that one is marked down, as with no health checks at all.
func TestPanicRoutingBeyondCap(t *testing.T) {
	hbs := []*healthBackend{newHealthBackend(t, "i-a"), newHealthBackend(t, "i-b"), newHealthBackend(t, "i-c"), newHealthBackend(t, "i-d")}
	h := newHealthHarness(t, prefixCfg(100), hbs)
	body := strings.Repeat("panic ", 300)
	rr, _ := parseRequest(kindInvoke, http.Header{}, []byte(body), 1024)
	order := ringOrder(t, h.harness, rr.key)
	byID := map[string]*healthBackend{}
	for _, hb := range hbs {
		byID[hb.id] = hb
	}
	down := func(ids ...string) {
		for _, hb := range hbs {
			hb.health.Store(http.StatusOK)
		}
		for _, id := range ids {
			byID[id].health.Store(http.StatusInternalServerError)
		}
		h.healthRound()
		h.healthRound()
	}
	// Two of four down: within the cap, the primary is passed over.
	down(order[0], order[1])
	if g := gaugeValue(t, h.reg, "prefixrouter_endpoint_panic", "endpoint", "ep"); g != 0 {
		t.Fatalf("prefixrouter_endpoint_panic = %v with 2 of 4 down", g)
	}
	if res := h.mustDo("/invocations", body, nil); res.status != 200 || res.instance != order[2] || res.decision != DecisionSpill {
		t.Fatalf("2 of 4 down: went to %s (%s), want spill to %s", res.instance, res.decision, order[2])
	}
	// Three of four down: beyond it, panic routing.
	down(order[0], order[1], order[2])
	if g := gaugeValue(t, h.reg, "prefixrouter_endpoint_panic", "endpoint", "ep"); g != 1 {
		t.Fatalf("prefixrouter_endpoint_panic = %v with 3 of 4 down", g)
	}
	if res := h.mustDo("/invocations", body, nil); res.status != 200 || res.instance != order[0] || res.decision != DecisionAffinity {
		t.Fatalf("3 of 4 down: went to %s (%s), want the primary %s (panic routing)", res.instance, res.decision, order[0])
	}
	// Back within the cap: health applies again.
	down(order[0])
	if g := gaugeValue(t, h.reg, "prefixrouter_endpoint_panic", "endpoint", "ep"); g != 0 {
		t.Fatalf("prefixrouter_endpoint_panic = %v with 1 of 4 down", g)
	}
	if res := h.mustDo("/invocations", body, nil); res.instance != order[1] || res.decision != DecisionSpill {
		t.Fatalf("1 of 4 down: went to %s (%s), want spill to %s", res.instance, res.decision, order[1])
	}
}

// TestServerErrorsAcrossRequestsCount: a broken engine of no known
// profile, which answers 500 to every request, is still ejected: its 500s
// to different routing keys count.
func TestServerErrorsAcrossRequestsCount(t *testing.T) {
	bs := engineBackends(t, 2)
	broken := bs[0]
	broken.handler = func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusInternalServerError)
	}
	h := newHarness(t, hopts{cfg: prefixCfg(10)}, bs...)
	sent := 0
	for i := 0; len(openBreakers(h)) == 0; i++ {
		if i == 1000 {
			t.Fatalf("no breaker open after 1000 requests, %d of them answered 500 by %s", sent, broken.id)
		}
		body := chatRequest(fmt.Sprintf("tenant prompt %d ", i)+strings.Repeat("p", 1100), map[string]any{"max_tokens": 1})
		if res := h.mustDo("/v1/chat/completions", body, nil); res.instance == broken.id {
			sent++
		}
	}
	// The first DefaultServerErrorKeys-1 keys' 500s are ambiguous; from
	// the next key on, each counts, and DefaultConsecutiveFailures open.
	want := overload.DefaultServerErrorKeys - 1 + overload.DefaultConsecutiveFailures
	if open := openBreakers(h); len(open) != 1 || open[0] != broken.id || sent != want {
		t.Fatalf("open breakers %v after %d 500s to different keys, want [%s] after %d", open, sent, broken.id, want)
	}
}

// TestHeaderTimeoutJudgesStreamsOnly: --upstream-header-timeout ends a
// non-streamed generation that outlasts it without blaming the instance
// (the client's max_tokens set its length), and still counts for a
// streamed call, whose headers an engine sends at once.
func TestHeaderTimeoutJudgesStreamsOnly(t *testing.T) {
	b := newEngineBackend(t, "i-0")
	serve := b.handler
	b.handler = func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test-Block") != "" { // a hung engine
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
			return
		}
		serve(w, r)
	}
	h := newHarness(t, hopts{cfg: prefixCfg(10), header: 50 * time.Millisecond,
		breaker: overload.BreakerOptions{ConsecutiveFailures: 1, OpenTimeout: time.Hour, MaxEjectionPercent: 100}}, b)
	post := func(body string, hdr map[string]string) int {
		return h.mustDo("/v1/chat/completions", body, hdr).status
	}
	breaker := func() gobreaker.State { h.assertIdle(); return h.state("i-0").Status().Breaker }
	for i := range 3 {
		if code := post(chatRequest(fmt.Sprintf("slow %d ", i), map[string]any{"max_tokens": 300}), nil); code != http.StatusBadGateway {
			t.Fatalf("non-streamed generation past the header timeout: %d, want 502", code)
		}
	}
	if st := breaker(); st != gobreaker.StateClosed {
		t.Fatalf("breaker %v after non-streamed generations outlasted the header timeout", st)
	}
	if code := post(chatRequest("hung ", map[string]any{"stream": true}), map[string]string{"X-Test-Block": "1"}); code != http.StatusBadGateway {
		t.Fatalf("streamed call to a hung engine: %d, want 502", code)
	}
	if st := breaker(); st != gobreaker.StateOpen {
		t.Fatalf("breaker %v after a streamed call's header timeout, want open", st)
	}
}

// TestPanicRetriesDialErrorsAcrossTheSet: three of four servers crash and
// health checks mark them down, beyond the cap: the endpoint panics and
// picks may choose the dead ones again, so a request whose instance
// refuses the connection is re-sent to every other member if need be, not
// only MaxRetries times. No request fails (the vanish guard's promise:
// replica.TestVanishGuardMassCrashMovesAfterGrace).
func TestPanicRetriesDialErrorsAcrossTheSet(t *testing.T) {
	hbs := []*healthBackend{newHealthBackend(t, "i-a"), newHealthBackend(t, "i-b"), newHealthBackend(t, "i-c"), newHealthBackend(t, "i-d")}
	h := newHealthHarness(t, prefixCfg(100), hbs)
	for _, hb := range hbs[:3] {
		hb.srv.Close()
	}
	h.healthRound()
	h.healthRound()
	if !h.state("i-a").Panicking() {
		t.Fatal("3 of 4 down and no panic")
	}
	failed := 0
	for i := range 40 {
		res := h.mustDo("/invocations", fmt.Sprintf("crashed %d ", i)+strings.Repeat("x", 1100), nil)
		if res.status != 200 || res.instance != "i-d" {
			failed++
		}
	}
	if failed != 0 {
		t.Fatalf("%d of 40 failed with 3 of 4 servers crashed", failed)
	}
}

// TestEngineProfileDecidesServerErrors: the instance record's engine feeds
// the rule. A 500 from vLLM proves a failure (its profile: Fault500), so
// five of them to one key open its breaker; llama.cpp's never do, however
// many prompts get one (it answers 500 to malformed requests and fails by
// crashing or hanging: Client500); those of an engine of no known profile
// (a record without one, or a name this build does not know) do once they
// repeat across different keys, whatever engine.Generic guesses for other
// purposes.
func TestEngineProfileDecidesServerErrors(t *testing.T) {
	for _, tc := range []struct {
		engine string
		keys   int // different prompts: 1, or one per request
		opens  bool
	}{
		{"vllm", 1, true},
		{"sglang", 1, true},
		{"llamacpp", 1, false},
		{"", 1, false},
		{"some-new-engine", 1, false},
		{"llamacpp", 24, false},
		{"", 24, true},
		{"some-new-engine", 24, true},
	} {
		t.Run(fmt.Sprintf("%s/%d keys", cmp.Or(tc.engine, "none"), tc.keys), func(t *testing.T) {
			bs := engineBackends(t, 2)
			h := newHarness(t, hopts{cfg: prefixCfg(10)}, bs...)
			for i := range h.ep.Instances {
				h.ep.Instances[i].Engine = tc.engine
			}
			h.update()
			n := overload.DefaultConsecutiveFailures
			if tc.keys > 1 {
				n = tc.keys
			}
			var first result
			for i := range n {
				body := chatRequest(fmt.Sprintf("prompt %d ", i%tc.keys)+strings.Repeat("one prompt ", 150), map[string]any{"n": 2})
				res := h.mustDo("/v1/chat/completions", body, nil)
				if res.status != http.StatusInternalServerError {
					t.Fatalf("request %d: %d, want the engine's 500", i, res.status)
				}
				if i == 0 {
					first = res
				}
			}
			open := openBreakers(h)
			got := len(open) == 1 && (tc.keys > 1 || open[0] == first.instance)
			if got != tc.opens {
				t.Fatalf("engine %q: open breakers %v after %d × 500 to %d keys (the first from %s); want open %v",
					tc.engine, open, n, tc.keys, first.instance, tc.opens)
			}
		})
	}
}

// slowDialFailure fails the first try it sends, after d, as a dial that
// timed out (a hung engine whose listen backlog is full: llama-server's
// holds 5 connections), and passes every other try to next.
type slowDialFailure struct {
	next  http.RoundTripper
	d     time.Duration
	tries atomic.Int64
}

func (s *slowDialFailure) RoundTrip(req *http.Request) (*http.Response, error) {
	if s.tries.Add(1) > 1 {
		return s.next.RoundTrip(req)
	}
	if req.Body != nil {
		req.Body.Close()
	}
	t := time.NewTimer(s.d) // the dial's wait, not the test's
	defer t.Stop()
	select {
	case <-t.C:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
}

// TestFirstByteTimeoutPerTry: a streamed request whose first try ends in
// a slow dial error is retried on another instance, which gets the whole
// first-byte timeout: the dial's wait is not its silence (the e2e test of
// a hung llama-server found the retry cut, and its instance's breaker
// charged, because the timer ran on from the first try).
func TestFirstByteTimeoutPerTry(t *testing.T) {
	bs := make([]*backend, 2)
	for i := range bs {
		bs[i] = newBackend(t, fmt.Sprintf("i-%d", i))
		bs[i].handler = func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			if !engineWork(r, 120*time.Millisecond) { // the prefill before the first token
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n")
		}
	}
	slow := &slowDialFailure{d: 150 * time.Millisecond}
	h := newHarness(t, hopts{cfg: prefixCfg(10), first: 200 * time.Millisecond,
		breaker: overload.BreakerOptions{ConsecutiveFailures: 1, OpenTimeout: time.Hour, MaxEjectionPercent: 100},
		wrap:    func(next http.RoundTripper) http.RoundTripper { slow.next = next; return slow }}, bs...)
	body := chatRequest(strings.Repeat("retried ", 300), map[string]any{"max_tokens": 5, "stream": true})
	res, err := h.do(t.Context(), "/v1/chat/completions", body, nil)
	if err != nil || res.status != http.StatusOK {
		t.Fatalf("streamed request retried after a slow dial error: %d, %v; want 200 (the retry's instance answers within its first-byte timeout)", res.status, err)
	}
	h.assertIdle()
	if open := openBreakers(h); len(open) != 1 {
		t.Fatalf("open breakers %v: want only the one whose dial failed", open)
	}
}
