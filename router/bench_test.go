package router

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
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

func benchRouter(b *testing.B, n int, balance float64) (*Router, *endpointView, int) {
	return benchRouterHot(b, n, balance, false)
}

// benchRouterHot is benchRouter with hot-key replication on or off.
func benchRouterHot(b *testing.B, n int, balance float64, hot bool) (*Router, *endpointView, int) {
	r, err := New(Options{DefaultEndpoint: "ep", BalanceFactor: balance})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	ep := fleet.Endpoint{Name: "ep", Config: fleet.DefaultRoutingConfig()}
	ep.Config.PrefixAwareRoutingConfig.HotKeyReplication = hot
	for i := range n {
		ep.Instances = append(ep.Instances, fleet.Instance{ID: fmt.Sprintf("i-%02d", i), Addr: fmt.Sprintf("http://10.0.0.%d:8000", i)})
	}
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{ep}, 0, 1, time.Now()))
	v := r.view.Load()
	return r, v.endpoints["ep"], v.snap.Replicas
}

// BenchmarkPick is the whole pick for a 16 KiB body: prefix extraction and
// hash, the model's set, ring candidates and admission (then release),
// without and with a balance factor (which adds the sum over the set).
func BenchmarkPick(b *testing.B) {
	for _, balance := range []float64{0, 1.25} {
		b.Run(fmt.Sprintf("balance=%v", balance), func(b *testing.B) { benchPick(b, balance, false) })
	}
	// One body is one key at 100 % of the traffic: with hot-key
	// replication it is spread over every instance, the sketch's worst case.
	b.Run("hot=true", func(b *testing.B) { benchPick(b, 0, true) })
}

// BenchmarkPickHotKeys is the cost of popularity-aware replication on the
// pick alone (no body to parse): keys of a Zipf(1) stream over 200
// documents, whose top keys the sketch replicates at the default threshold
// (the top one at k = 2 at 4 instances; the top four at k = 5, 3, 2, 2 at
// 16; thirteen at 64, k up to the cap of 16), against the same pick with
// replication off (issue 10: ≤ 1.5×).
func BenchmarkPickHotKeys(b *testing.B) {
	const docs, stream = 200, 1 << 12
	rng := rand.New(rand.NewPCG(1, 2))
	var cdf []float64
	var sum float64
	for d := range docs {
		sum += 1 / float64(d+1)
		cdf = append(cdf, sum)
	}
	keys := make([]uint64, stream)
	bodies := make([][]byte, stream)
	for i := range keys {
		d, _ := slices.BinarySearch(cdf, rng.Float64()*sum)
		keys[i] = routingKey("", "", uint64(d))
		bodies[i] = fmt.Appendf(nil, `{"messages":[{"role":"user","content":"question %d"}]}`, i)
	}
	for _, n := range []int{4, 16, 64} {
		for _, hot := range []bool{false, true} {
			b.Run(fmt.Sprintf("instances=%d/hot=%v", n, hot), func(b *testing.B) {
				r, ev, replicas := benchRouterHot(b, n, 0, hot)
				set, err := ev.table.Set("")
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					j := i % stream
					i++
					hc := newHotChoice(ev, set, keys[j], bodies[j])
					p, ok := r.pickKey(ev, set, keys[j], hc, replicas, bitset{})
					if !ok {
						b.Fatal("no pick")
					}
					p.done(nil)
				}
			})
		}
	}
}

func benchPick(b *testing.B, balance float64, hot bool) {
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
				r, ev, replicas := benchRouterHot(b, n, balance, hot)
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
					p, ok := r.pickKey(ev, set, rr.key, newHotChoice(ev, set, rr.key, tc.body), replicas, bitset{})
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

// BenchmarkSetLoad compares ways to get a set's total load for the balance
// bound at 64 instances: the sum over the cached states (what pick does),
// the same sum looking each instance up by pointer, and the alternative of a
// shared atomic total, which every acquire and release of the endpoint would
// have to add to (measured under parallel contention; it also cannot serve
// adapter sets that are subsets of the endpoint).
func BenchmarkSetLoad(b *testing.B) {
	_, ev, _ := benchRouter(b, 64, 1.25)
	set, err := ev.table.Set("")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("cached-states", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = ev.setLoad(set)
		}
	})
	b.Run("map-lookup", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var total int64
			for i := range set.Len() {
				total += ev.byPtr[set.Instance(i)].state.Load()
			}
			_ = total
		}
	})
	b.Run("shared-atomic-add-release", func(b *testing.B) {
		var total atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				total.Add(1)
				total.Add(-1)
			}
		})
	})
}

// cannedTransport answers every upstream request at once with a small 200,
// so BenchmarkServeHTTP measures the router's own request path.
type cannedTransport struct{}

func (cannedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
	return &http.Response{
		StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: http.NoBody, ContentLength: 0, Request: req,
	}, nil
}

// BenchmarkServeHTTP is one whole data-plane request in memory: parse, key,
// pick, ReverseProxy over an instant transport, outcome, metrics.
func BenchmarkServeHTTP(b *testing.B) {
	invoke, chat := benchBodies(b)
	for _, tc := range []struct {
		name, path string
		body       []byte
	}{
		{"invoke", "/invocations", invoke},
		{"chat", "/v1/chat/completions", chat},
	} {
		b.Run(tc.name, func(b *testing.B) {
			benchRequests(b, Options{Transport: cannedTransport{}}, 16, func(i int) string { return fmt.Sprintf("http://10.0.0.%d:8000", i) }, tc.path, tc.body)
		})
	}
}

// benchRequests measures ServeHTTP of a POST of body to path, client side
// in memory, on a router with o whose default endpoint "ep" has n
// instances, instance i at addr(i).
func benchRequests(b *testing.B, o Options, n int, addr func(i int) string, path string, body []byte) {
	o.DefaultEndpoint = "ep"
	r, err := New(o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	ep := fleet.Endpoint{Name: "ep", Config: fleet.DefaultRoutingConfig()}
	for i := range n {
		ep.Instances = append(ep.Instances, fleet.Instance{ID: fmt.Sprintf("i-%02d", i), Addr: addr(i)})
	}
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{ep}, 0, 1, time.Now()))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
}

// longChatBody is an OpenAI chat body of about n bytes: a system message of a
// quarter of the text, then a user message with the rest (issue 21 states
// the pick cost at 64 KiB prompts).
func longChatBody(n int) []byte {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", n/45+1)[:max(n-128, 4)]
	b, _ := json.Marshal(map[string]any{
		"model": "base", "stream": true, "max_tokens": 16,
		"messages": []any{msg("system", text[:len(text)/4]), msg("user", text[len(text)/4:])},
	})
	return b
}

// invokeBody is a SageMaker invoke JSON body of about n bytes.
func invokeBody(n int) []byte {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", n/45+1)[:max(n-64, 1)]
	b, _ := json.Marshal(map[string]any{"inputs": text, "parameters": map[string]any{"max_new_tokens": 16}})
	return b
}

// BenchmarkRequestPath is one whole data-plane request through the
// handler and ReverseProxy to a zero-delay upstream on loopback (which
// reads the body and answers a small JSON): key, pick, upstream request
// and body, response copy, outcome and metrics (issue 9 item 4). The
// client side is in memory (httptest.NewRequest), so B/op is the router's
// and the transport's own plus the upstream handler's, alike for every
// variant.
func BenchmarkRequestPath(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "12")
		_, _ = io.WriteString(w, `{"ok":true}`+"\n")
	}))
	defer up.Close()
	_, chat := benchBodies(b)
	for _, tc := range []struct {
		name, path string
		body       []byte
	}{
		{"invoke=1KiB", "/invocations", invokeBody(1 << 10)},
		{"invoke=16KiB", "/invocations", invokeBody(16 << 10)},
		{"invoke=256KiB", "/invocations", invokeBody(256 << 10)},
		{"chat=16KiB", "/v1/chat/completions", chat},
		{"invoke=64KiB", "/invocations", invokeBody(64 << 10)},
		{"chat=64KiB", "/v1/chat/completions", longChatBody(64 << 10)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			// Four instances, one server: the pick is real, the upstream
			// connection pool is the one the transport keeps per host.
			benchRequests(b, Options{}, 4, func(int) string { return up.URL }, tc.path, tc.body)
		})
	}
	// A streamed call under --upstream-first-byte-timeout: its try's own
	// context and timer.
	b.Run("chat=16KiB,first-byte=5s", func(b *testing.B) {
		benchRequests(b, Options{FirstByteTimeout: 5 * time.Second}, 4, func(int) string { return up.URL }, "/v1/chat/completions", chat)
	})
}

// BenchmarkUpdate is what a snapshot costs the router: a full one (new
// endpoints: the views, their lora tables and states are rebuilt) against
// one that changes only the replicas (a rate a replica published:
// fleet.Snapshot.WithReplicas), at 100 replicas.
func BenchmarkUpdate(b *testing.B) {
	for _, n := range []int{1024, 10000} {
		r, _, _ := benchRouter(b, n, 0)
		r.opts.ReplicaID = "router-0" // the rates are read
		s := r.Snapshot()
		ep := *s.Endpoint("ep")
		rates := make(map[string]float64, 100)
		for i := range 100 {
			rates[fmt.Sprintf("router-%d", i)] = float64(i)
		}
		b.Run(fmt.Sprintf("instances=%d/full", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r.Update(fleet.NewSnapshot([]fleet.Endpoint{ep}, 1, 100, time.Now()))
			}
		})
		b.Run(fmt.Sprintf("instances=%d/rates_only", n), func(b *testing.B) {
			b.ReportAllocs()
			s := r.Snapshot()
			for b.Loop() {
				r.Update(s.WithReplicas(2, rates, time.Now()))
			}
		})
	}
}

// BenchmarkPickPrompt64KiB is the routing sequence alone for a 64 KiB
// prompt (issue 21 states its cost): Pick, the ext_proc front end, parses
// the whole body held in memory, keys it, counts it and admits an instance
// of 7 (then releases it), with SageMaker's fixed-length keys (4,096 units,
// no popularity: the cost before issue 21) and with adaptive keys (32,768
// units, the ladder's depths, the sketch and the agreed view; one prompt
// repeated, so its depths are counted and it is replicated by load once
// the view says so).
func BenchmarkPickPrompt64KiB(b *testing.B) {
	for _, fixed := range []bool{true, false} {
		for _, tc := range []struct {
			name, path string
			body       []byte
		}{
			{"invoke", "/invocations", invokeBody(64 << 10)},
			{"chat", "/v1/chat/completions", longChatBody(64 << 10)},
		} {
			b.Run(fmt.Sprintf("fixed=%v/%s", fixed, tc.name), func(b *testing.B) {
				r, err := New(Options{DefaultEndpoint: "ep"})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { r.Close() })
				ep := fleet.Endpoint{Name: "ep", Config: fleet.RoutingConfig{PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{FixedLengthKeys: fixed}}}
				for i := range 7 {
					ep.Instances = append(ep.Instances, fleet.Instance{ID: fmt.Sprintf("i-%02d", i), Addr: fmt.Sprintf("http://10.0.0.%d:8000", i)})
				}
				r.Update(fleet.NewSnapshot([]fleet.Endpoint{ep}, 0, 1, time.Now()))
				req := PickRequest{Path: tc.path, Header: http.Header{}, Body: tc.body, Complete: true}
				pick := func() {
					p, err := r.Pick(req)
					if err != nil {
						b.Fatal(err)
					}
					p.Done(http.StatusOK)
				}
				for range 200 {
					pick()
				}
				if pop, ok := r.Popularity("ep", time.Now()); ok {
					ep.Popular, ep.Served = fleet.MergePopularity([]fleet.Popularity{pop}), fleet.MergeServed([]fleet.Popularity{pop})
					r.Update(fleet.NewSnapshot([]fleet.Endpoint{ep}, 0, 1, time.Now()))
				}
				b.SetBytes(int64(len(tc.body)))
				b.ReportAllocs()
				for b.Loop() {
					pick()
				}
			})
		}
	}
}

// BenchmarkChildOrder is what the weighted placement of a hot prefix's
// new children (issue 21) adds to such a request's pick: the weighted
// rendezvous over its k candidates, against the plain one it replaces.
func BenchmarkChildOrder(b *testing.B) {
	for _, k := range []int{7, maxHotCandidates} {
		h := &popNode{cands: make([]int, k), w: make([]float64, k)}
		for j := range k {
			h.cands[j], h.w[j] = j, 1/float64(1+j%3)
		}
		var buf [maxHotCandidates]int
		b.Run(fmt.Sprintf("k=%d/weighted", k), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				h.childOrder(uint64(i)*0x9e3779b97f4a7c15, buf[:0])
			}
		})
		b.Run(fmt.Sprintf("k=%d/plain", k), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				rendezvous(h.cands, uint64(i)*0x9e3779b97f4a7c15, buf[:0])
			}
		})
	}
}
