package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/sony/gobreaker/v2"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/overload"
)

// backend is a loopback model server. By default it answers 200 with its id;
// a request with header X-Test-Block waits until release is closed (or the
// request is canceled).
type backend struct {
	id      string
	srv     *httptest.Server
	hits    atomic.Int64
	blocked atomic.Int64 // requests currently waiting in the handler
	release chan struct{}
	handler http.HandlerFunc // overrides the default when set
}

func newBackend(t *testing.T, id string) *backend {
	t.Helper()
	b := &backend{id: id, release: make(chan struct{})}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.hits.Add(1)
		if b.handler != nil {
			b.handler(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Test-Block") != "" {
			b.blocked.Add(1)
			select {
			case <-b.release:
			case <-r.Context().Done():
			}
			b.blocked.Add(-1)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"path":%q}`, b.id, r.URL.Path)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

type harness struct {
	t       *testing.T
	r       *Router
	srv     *httptest.Server
	client  *http.Client
	reg     *prometheus.Registry
	ep      fleet.Endpoint
	bySrvID map[string]*backend
}

type hopts struct {
	cfg      fleet.RoutingConfig
	breaker  overload.BreakerOptions
	maxBody  int64
	labels   map[string]string
	adapters []string
	balance  float64
	health   time.Duration   // HealthCheckInterval
	hTimeout time.Duration   // HealthCheckTimeout
	clock    clockwork.Clock // paces health checks; nil means the real clock
	hide     bool            // HideInstanceID
	share    Share           // ThresholdShare
	self     string          // ReplicaID
	first    time.Duration   // FirstByteTimeout
	idle     time.Duration   // UpstreamIdleTimeout
	header   time.Duration   // the transport's response-header timeout
	// wrap, when set, wraps the upstream transport (a fault of one try).
	wrap func(http.RoundTripper) http.RoundTripper
}

func newHarness(t *testing.T, o hopts, backends ...*backend) *harness {
	t.Helper()
	reg := prometheus.NewRegistry()
	tr := NewTransport(o.header)
	var up http.RoundTripper = tr
	if o.wrap != nil {
		up = o.wrap(tr)
	}
	r, err := newRouter(Options{DefaultEndpoint: "ep", Registry: reg, Transport: up, Breaker: o.breaker, MaxBodyBytes: o.maxBody, BalanceFactor: o.balance, HealthCheckInterval: o.health, HealthCheckTimeout: o.hTimeout, HideInstanceID: o.hide, FirstByteTimeout: o.first, UpstreamIdleTimeout: o.idle, ThresholdShare: o.share, ReplicaID: o.self}, o.clock)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, r: r, reg: reg, bySrvID: map[string]*backend{}}
	h.ep = fleet.Endpoint{Name: "ep", Config: o.cfg}
	for _, b := range backends {
		h.ep.Instances = append(h.ep.Instances, fleet.Instance{ID: b.id, Addr: b.srv.URL, Labels: o.labels, Adapters: o.adapters})
		h.bySrvID[b.id] = b
	}
	h.update()
	h.srv = httptest.NewServer(r)
	ctr := &http.Transport{}
	h.client = &http.Client{Transport: ctr}
	t.Cleanup(func() {
		h.srv.Close()
		ctr.CloseIdleConnections()
		tr.CloseIdleConnections()
		h.assertIdle()
		_ = r.Close()
	})
	return h
}

func (h *harness) update() {
	h.r.Update(fleet.NewSnapshot([]fleet.Endpoint{h.ep}, 0, 1, time.Now()))
}

// assertIdle checks that no in-flight slot leaked.
func (h *harness) assertIdle() {
	h.t.Helper()
	testsupport.Eventually(h.t, 10*time.Second, "in flight back to 0", func() bool {
		v := h.r.view.Load()
		for _, ev := range v.endpoints {
			for _, iv := range ev.instances {
				if iv.state.InFlight() != 0 {
					return false
				}
			}
		}
		return true
	})
}

func (h *harness) state(id string) *overload.State {
	return h.r.view.Load().endpoints["ep"].instances[id].state
}

type result struct {
	status   int
	instance string
	decision string
	header   http.Header
	body     []byte
}

func (h *harness) do(ctx context.Context, path string, body string, hdr map[string]string) (result, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+path, strings.NewReader(body))
	if err != nil {
		return result{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{resp.StatusCode, resp.Header.Get(HeaderInstance), resp.Header.Get(HeaderDecision), resp.Header, b}, err
}

func (h *harness) mustDo(path, body string, hdr map[string]string) result {
	h.t.Helper()
	res, err := h.do(context.Background(), path, body, hdr)
	if err != nil {
		h.t.Fatal(err)
	}
	return res
}

func threeBackends(t *testing.T) []*backend {
	return []*backend{newBackend(t, "i-a"), newBackend(t, "i-b"), newBackend(t, "i-c")}
}

func prefixCfg(threshold int) fleet.RoutingConfig {
	// SageMaker's fixed-length keys: the tests compute the key the router
	// routes on (parseRequest at 1024); adaptive keys have tests of their own.
	return fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: 1024, ConcurrencyThreshold: threshold, FixedLengthKeys: true}}
}

func TestAffinityAndTenantSplit(t *testing.T) {
	bs := threeBackends(t)
	h := newHarness(t, hopts{cfg: prefixCfg(10)}, bs...)
	prompt := strings.Repeat("You are a helpful assistant. ", 40)
	chat := func(tenant string) string {
		b, _ := json.Marshal(map[string]any{"model": "m", "prompt_cache_key": tenant, "messages": []any{msg("system", prompt), msg("user", "q"+tenant)}})
		return string(b)
	}
	for _, path := range []string{"/invocations", "/endpoints/ep/invocations", "/v1/chat/completions", "/endpoints/ep/openai/v1/chat/completions"} {
		first := ""
		for i := range 10 {
			var res result
			if strings.Contains(path, "chat") {
				res = h.mustDo(path, chat("tenant-1"), nil)
			} else {
				res = h.mustDo(path, prompt+fmt.Sprint(i), map[string]string{"X-Amzn-SageMaker-Prefix-Aware-Id": "tenant-1"})
			}
			if res.status != 200 || res.decision != DecisionAffinity {
				t.Fatalf("%s: status %d decision %q body %s", path, res.status, res.decision, res.body)
			}
			if first == "" {
				first = res.instance
			} else if res.instance != first {
				t.Fatalf("%s: same prefix and tenant went to %s and %s", path, first, res.instance)
			}
			wantPath := "/invocations"
			if strings.Contains(path, "chat") {
				wantPath = "/v1/chat/completions"
			}
			if !bytes.Contains(res.body, []byte(`"path":"`+wantPath+`"`)) {
				t.Fatalf("%s: upstream path wrong: %s", path, res.body)
			}
		}
	}
	// Tenants split one prefix across the fleet. With 300 tenants each of 3
	// instances expects 100 (sd ≈ 8); require 60, five sd below.
	counts := map[string]int{}
	for i := range 300 {
		res := h.mustDo("/invocations", prompt, map[string]string{"X-Amzn-SageMaker-Prefix-Aware-Id": fmt.Sprintf("t%d", i)})
		counts[res.instance]++
	}
	for _, b := range bs {
		if counts[b.id] < 60 {
			t.Fatalf("tenants not split: %v", counts)
		}
	}
}

func TestSpillAndReturn(t *testing.T) {
	bs := threeBackends(t)
	h := newHarness(t, hopts{cfg: prefixCfg(1)}, bs...)
	body := strings.Repeat("spill me ", 200)
	req, _ := http.NewRequest(http.MethodPost, "/invocations", strings.NewReader(body))
	primary, err := h.r.Choose("ep", req)
	if err != nil {
		t.Fatal(err)
	}
	// Order of candidates for this key, from the ring itself.
	v := h.r.view.Load()
	set, _ := v.endpoints["ep"].table.Set("")
	rr, _ := parseRequest(kindInvoke, http.Header{}, []byte(body), 1024)
	var order []string
	for _, i := range set.Ring().Candidates(rr.key, 3, nil) {
		order = append(order, set.Instance(i).ID)
	}
	if order[0] != primary {
		t.Fatalf("Choose %s, ring primary %s", primary, order[0])
	}
	// Hold one blocked request on each instance in turn (threshold 1).
	var wg sync.WaitGroup
	results := make([]result, 3)
	for k := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := h.do(context.Background(), "/invocations", body, map[string]string{"X-Test-Block": "1"})
			if err != nil {
				t.Error(err)
			}
			results[k] = res
		}()
		b := h.bySrvID[order[k]]
		testsupport.Eventually(t, 10*time.Second, "blocked request on "+order[k], func() bool { return b.blocked.Load() == 1 })
	}
	// Everything full: least loaded (all at 1, so any) is the fallback.
	res := h.mustDo("/invocations", body, nil)
	if res.status != 200 || res.decision != DecisionFallback {
		t.Fatalf("all full: status %d decision %q", res.status, res.decision)
	}
	for _, b := range bs {
		close(b.release)
	}
	wg.Wait()
	wantDecision := []string{DecisionAffinity, DecisionSpill, DecisionSpill}
	for k, res := range results {
		if res.instance != order[k] || res.decision != wantDecision[k] {
			t.Fatalf("blocked request %d went to %s (%s), want %s (%s)", k, res.instance, res.decision, order[k], wantDecision[k])
		}
	}
	h.assertIdle()
	// Room again: back to the primary.
	res = h.mustDo("/invocations", body, nil)
	if res.instance != primary || res.decision != DecisionAffinity {
		t.Fatalf("after release went to %s (%s), want primary %s", res.instance, res.decision, primary)
	}
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// tenantFor finds a tenant id whose key's primary is the given instance.
func tenantFor(t *testing.T, h *harness, body, id string) string {
	for i := range 1000 {
		tenant := fmt.Sprintf("t%d", i)
		req, _ := http.NewRequest(http.MethodPost, "/invocations", strings.NewReader(body))
		req.Header.Set("X-Amzn-SageMaker-Prefix-Aware-Id", tenant)
		got, err := h.r.Choose("ep", req)
		if err != nil {
			t.Fatal(err)
		}
		if got == id {
			return tenant
		}
	}
	t.Fatalf("no tenant maps to %s", id)
	return ""
}

func TestDeadBackendSkippedAndBreaker(t *testing.T) {
	bs := []*backend{newBackend(t, "i-a"), newBackend(t, "i-b")}
	// The open timeout outlasts the test: the breaker must stay open while
	// the test checks that the instance is skipped without a dial.
	h := newHarness(t, hopts{cfg: prefixCfg(10), breaker: overload.BreakerOptions{ConsecutiveFailures: 2, OpenTimeout: time.Hour}}, bs...)
	dead := deadAddr(t)
	h.ep.Instances = append(h.ep.Instances, fleet.Instance{ID: "i-dead", Addr: "http://" + dead})
	h.update()
	body := "prompt for the dead one"
	hdr := map[string]string{"X-Amzn-SageMaker-Prefix-Aware-Id": tenantFor(t, h, body, "i-dead")}
	retries := func() float64 { return counterValue(h.r.metrics.retries.WithLabelValues("ep")) }
	for k := range 2 {
		res := h.mustDo("/invocations", body, hdr)
		if res.status != 200 || res.instance == "i-dead" || res.decision != DecisionSpill {
			t.Fatalf("try %d: status %d instance %s decision %s", k, res.status, res.instance, res.decision)
		}
		if got := retries(); got != float64(k+1) {
			t.Fatalf("retries %v, want %d", got, k+1)
		}
	}
	st := h.state("i-dead")
	if st.Status().Breaker != gobreaker.StateOpen {
		t.Fatalf("breaker %v after 2 dial errors", st.Status().Breaker)
	}
	// Open: skipped without a dial.
	res := h.mustDo("/invocations", body, hdr)
	if res.status != 200 || res.instance == "i-dead" || retries() != 2 {
		t.Fatalf("open breaker: status %d instance %s retries %v", res.status, res.instance, retries())
	}
}

// TestBreakerProbeReachesRevivedInstance: a dead instance's breaker opens;
// the instance comes back on the same address, and after the open timeout
// the router's probe reaches it, which closes the breaker and restores
// affinity. gobreaker reads the real clock and the router is tested over
// real sockets (no synctest bubble), so the open timeout is kept at 20 ms:
// the test waits that long, not more, for the transition (the breaker's
// own transitions are tested on a fake clock in overload).
func TestBreakerProbeReachesRevivedInstance(t *testing.T) {
	bs := []*backend{newBackend(t, "i-a"), newBackend(t, "i-b")}
	h := newHarness(t, hopts{cfg: prefixCfg(10), breaker: overload.BreakerOptions{ConsecutiveFailures: 2, OpenTimeout: 20 * time.Millisecond}}, bs...)
	dead := deadAddr(t)
	h.ep.Instances = append(h.ep.Instances, fleet.Instance{ID: "i-dead", Addr: "http://" + dead})
	h.update()
	body := "prompt for the dead one"
	hdr := map[string]string{"X-Amzn-SageMaker-Prefix-Aware-Id": tenantFor(t, h, body, "i-dead")}
	for k := range 2 {
		if res := h.mustDo("/invocations", body, hdr); res.status != 200 || res.instance == "i-dead" {
			t.Fatalf("try %d: status %d instance %s", k, res.status, res.instance)
		}
	}
	st := h.state("i-dead")
	// Open, or already half-open if the run is slow: not closed.
	if b := st.Status().Breaker; b == gobreaker.StateClosed {
		t.Fatal("breaker closed after 2 dial errors")
	}
	l, err := net.Listen("tcp", dead)
	if err != nil {
		t.Skipf("cannot re-listen on %s: %v", dead, err)
	}
	revived := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"id":"i-dead"}`)
	}))
	revived.Listener = l
	revived.Start()
	defer revived.Close()
	took := testsupport.Eventually(t, 10*time.Second, "probe to the revived instance", func() bool {
		return h.mustDo("/invocations", body, hdr).instance == "i-dead"
	})
	t.Logf("revived instance reached %v after it came back (open timeout 20ms)", took)
	// The proxy reports the probe's outcome after the client has the
	// response: wait for that event, not for time.
	testsupport.Eventually(t, 10*time.Second, "breaker closed after the successful probe", func() bool {
		return st.Status().Breaker == gobreaker.StateClosed
	})
	if res := h.mustDo("/invocations", body, hdr); res.instance != "i-dead" || res.decision != DecisionAffinity {
		t.Fatalf("after recovery: %s %s", res.instance, res.decision)
	}
}

func TestStreamingChunkByChunk(t *testing.T) {
	for _, tc := range []struct{ path, ctype string }{
		{"/v1/chat/completions", "text/event-stream"},
		{"/endpoints/ep/invocations-response-stream", "application/jsonlines"},
		// Neither SSE nor an event stream: chunked without a length.
		{"/v1/chat/completions", "application/x-ndjson"},
	} {
		t.Run(tc.ctype, func(t *testing.T) {
			got1 := make(chan struct{})
			b := newBackend(t, "i-s")
			b.handler = func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				fmt.Fprint(w, "data: one\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-got1: // the client holds chunk 1 before chunk 2 exists
				case <-time.After(5 * time.Second):
					// Chunk 1 never reached the client: the router buffers.
					fmt.Fprint(w, "data: buffered\n\n")
					return
				}
				fmt.Fprint(w, "data: two\n\n")
			}
			h := newHarness(t, hopts{cfg: prefixCfg(10)}, b)
			body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
			resp, err := h.client.Post(h.srv.URL+tc.path, "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if strings.Contains(tc.path, "response-stream") {
				// One PayloadPart event per upstream chunk, as it arrives.
				if ct := resp.Header.Get("Content-Type"); ct != ContentTypeEventStream || resp.Header.Get(HeaderSageMakerContentType) != tc.ctype {
					t.Fatalf("content types %q, %q", ct, resp.Header.Get(HeaderSageMakerContentType))
				}
				dec := eventstream.NewDecoder()
				for i, want := range []string{"data: one\n\n", "data: two\n\n"} {
					msg, err := dec.Decode(resp.Body, nil)
					if err != nil {
						t.Fatalf("event %d: %v", i, err)
					}
					if typ := msg.Headers.Get(":event-type"); typ == nil || typ.String() != "PayloadPart" || string(msg.Payload) != want {
						t.Fatalf("event %d: %v %q", i, typ, msg.Payload)
					}
					if i == 0 {
						close(got1)
					}
				}
				if _, err := dec.Decode(resp.Body, nil); err != io.EOF {
					t.Fatalf("after the last event: %v", err)
				}
				return
			}
			br := bufio.NewReader(resp.Body)
			line, err := br.ReadString('\n')
			if err != nil || line != "data: one\n" {
				t.Fatalf("chunk 1: %q, %v", line, err)
			}
			close(got1)
			rest, err := io.ReadAll(br)
			if err != nil || string(rest) != "\ndata: two\n\n" {
				t.Fatalf("rest: %q, %v", rest, err)
			}
			if resp.Header.Get(HeaderInstance) != "i-s" {
				t.Fatalf("instance header %q", resp.Header.Get(HeaderInstance))
			}
		})
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// parseRequest is parseRoute on a body read whole.
func parseRequest(kind apiKind, h http.Header, body []byte, prefixLen int) (routeRequest, *routeError) {
	return parseRoute(kind, h, body, prefixLen, false)
}

// pickKey runs step 8 of the routing sequence for key in set of ev, as
// the data plane does after the earlier steps.
func (r *Router) pickKey(ev *endpointView, set *lora.Set, key uint64, hc hotChoice, replicas int, skip bitset) (pick, bool) {
	snap := *r.view.Load().snap
	snap.Replicas = replicas
	return r.pick(&route{view: &view{snap: &snap}, ev: ev, set: set, key: key, hot: hc}, skip)
}
