package router

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/overload"
)

// newAdapterHarness is newHarness with the adapter options set and the
// catalogue holding "lora-x".
func newAdapterHarness(t *testing.T, o Options, backends ...*backend) *harness {
	t.Helper()
	reg := prometheus.NewRegistry()
	tr := NewTransport(0)
	o.DefaultEndpoint, o.Registry, o.Transport = "ep", reg, tr
	r, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, r: r, reg: reg, bySrvID: map[string]*backend{}}
	h.ep = fleet.Endpoint{Name: "ep", Adapters: []fleet.Adapter{{Name: "lora-x", Source: "/m/x"}}}
	for _, b := range backends {
		h.ep.Instances = append(h.ep.Instances, fleet.Instance{ID: b.id, Addr: b.srv.URL})
		h.bySrvID[b.id] = b
	}
	h.update()
	h.srv = httptest.NewServer(r)
	h.client = &http.Client{Transport: &http.Transport{}}
	t.Cleanup(func() {
		h.srv.Close()
		tr.CloseIdleConnections()
		h.assertIdle()
		_ = r.Close()
	})
	return h
}

// setAdapters changes one record, bumping its revision as etcd would.
func (h *harness) setAdapters(id string, adapters ...string) {
	for i := range h.ep.Instances {
		if in := &h.ep.Instances[i]; in.ID == id {
			in.Adapters = adapters
			in.Revision++
		}
	}
	h.update()
}

const loraChat = `{"model":"lora-x","messages":[{"role":"user","content":"%s"}]}`

func TestAdapterWaitsUntilLoaded(t *testing.T) {
	bs := threeBackends(t)
	h := newAdapterHarness(t, Options{AdapterWait: 10 * time.Second}, bs...)
	done := make(chan result, 1)
	go func() {
		res, _ := h.do(context.Background(), "/v1/chat/completions", fmt.Sprintf(loraChat, "hi"), nil)
		done <- res
	}()
	testsupport.Eventually(t, 5*time.Second, "the request waits", func() bool { return h.r.waiting.Load() == 1 })
	for _, b := range bs {
		if b.hits.Load() != 0 {
			t.Fatalf("%s got the request before it had the adapter", b.id)
		}
	}
	h.setAdapters("i-b", "lora-x")
	res := <-done
	if res.status != http.StatusOK || res.instance != "i-b" {
		t.Fatalf("after the load: %d from %q, want 200 from i-b", res.status, res.instance)
	}
}

func TestAdapterWaitBounds(t *testing.T) {
	bs := threeBackends(t)
	h := newAdapterHarness(t, Options{AdapterWait: 50 * time.Millisecond, AdapterWaitQueue: 1}, bs...)
	for _, path := range []string{"/v1/chat/completions", "/invocations"} {
		hdr := map[string]string{"X-Amzn-SageMaker-Target-Model": "lora-x"}
		res := h.mustDo(path, fmt.Sprintf(loraChat, "hi"), hdr)
		kind := kindChat
		if path == "/invocations" {
			kind = kindInvoke
		}
		if res.status != statusModelNotReady(kind) || res.header.Get(HeaderError) != codeModelNotReady {
			t.Fatalf("%s past the wait: %d %q %s", path, res.status, res.header.Get(HeaderError), res.body)
		}
		if kind == kindInvoke && res.header.Get(HeaderErrorType) != "ModelNotReadyException" {
			t.Fatalf("invoke past the wait: type %q", res.header.Get(HeaderErrorType))
		}
	}
	// The queue holds one: a second waiter is refused at once.
	h2 := newAdapterHarness(t, Options{AdapterWait: 10 * time.Second, AdapterWaitQueue: 1}, bs...)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = h2.do(ctx, "/v1/chat/completions", fmt.Sprintf(loraChat, "a"), nil)
	}()
	testsupport.Eventually(t, 5*time.Second, "one waits", func() bool { return h2.r.waiting.Load() == 1 })
	start := time.Now()
	res := h2.mustDo("/v1/chat/completions", fmt.Sprintf(loraChat, "b"), nil)
	if res.status != http.StatusServiceUnavailable || !strings.Contains(string(res.body), "too many requests waiting") || time.Since(start) > 5*time.Second {
		t.Fatalf("over the queue: %d %s", res.status, res.body)
	}
	cancel()
	wg.Wait()
}

// notFoundFor makes b answer vLLM's 404 for the adapter, as a server that
// unloaded it behind the router's back does.
func notFoundFor(b *backend, gone func() bool) {
	b.handler = func(w http.ResponseWriter, r *http.Request) {
		if gone() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"error":{"message":"The model `+"`lora-x`"+` does not exist.","type":"NotFoundError","code":404}}`)
			return
		}
		fmt.Fprintf(w, `{"id":%q}`, b.id)
	}
}

func TestStaleAdapterRetriedOnAnotherMember(t *testing.T) {
	bs := threeBackends(t)
	var mu sync.Mutex
	var marks []string
	h := newAdapterHarness(t, Options{OnStale: func(ep, inst, adapter string) {
		mu.Lock()
		marks = append(marks, ep+"/"+inst+"/"+adapter)
		mu.Unlock()
	}}, bs...)
	notFoundFor(bs[0], func() bool { return true })
	for _, b := range bs[1:] {
		notFoundFor(b, func() bool { return false })
	}
	h.setAdapters("i-a", "lora-x")
	h.setAdapters("i-b", "lora-x")
	for i := range 30 {
		res := h.mustDo("/v1/chat/completions", fmt.Sprintf(loraChat, fmt.Sprintf("prompt %d", i)), nil)
		if res.status != http.StatusOK || res.instance != "i-b" {
			t.Fatalf("request %d: %d from %q, want 200 from i-b", i, res.status, res.instance)
		}
	}
	if bs[0].hits.Load() == 0 {
		t.Fatal("the test never reached the stale instance")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(marks) != int(bs[0].hits.Load()) || marks[0] != "ep/i-a/lora-x" {
		t.Fatalf("stale reports %v for %d refusals", marks, bs[0].hits.Load())
	}
}

func TestStaleOnlyMemberWaitsForReload(t *testing.T) {
	bs := threeBackends(t)
	h := newAdapterHarness(t, Options{AdapterWait: 10 * time.Second}, bs...)
	var mu sync.Mutex
	unloaded := true
	notFoundFor(bs[0], func() bool { mu.Lock(); defer mu.Unlock(); return unloaded })
	h.setAdapters("i-a", "lora-x")
	done := make(chan result, 1)
	go func() {
		res, _ := h.do(context.Background(), "/v1/chat/completions", fmt.Sprintf(loraChat, "hi"), nil)
		done <- res
	}()
	testsupport.Eventually(t, 5*time.Second, "refused, then waiting", func() bool { return h.r.waiting.Load() == 1 })
	// The agent re-polls (the record drops the adapter), reloads it and
	// registers it again.
	h.setAdapters("i-a")
	mu.Lock()
	unloaded = false
	mu.Unlock()
	h.setAdapters("i-a", "lora-x")
	res := <-done
	if res.status != http.StatusOK || res.instance != "i-a" {
		t.Fatalf("after the reload: %d from %q %s, want 200 from i-a", res.status, res.instance, res.body)
	}
}

// TestCrashedOnlyHolderWaitsForPlacement: the only instance holding a
// catalogued adapter crashed (connections refused) and its record stays
// until the lease expires. Requests for the adapter neither fail with the
// dial error nor, once the breaker opened, with "no instance": they wait
// until another member reports the adapter loaded, then succeed there.
func TestCrashedOnlyHolderWaitsForPlacement(t *testing.T) {
	bs := threeBackends(t)
	h := newAdapterHarness(t, Options{AdapterWait: 20 * time.Second, Breaker: overload.BreakerOptions{ConsecutiveFailures: 2}}, bs...)
	h.setAdapters("i-a", "lora-x")
	bs[0].srv.Close() // the crash
	const n = 6
	results := make(chan result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := h.do(context.Background(), "/v1/chat/completions", fmt.Sprintf(loraChat, fmt.Sprintf("prompt %d", i)), nil)
			if err != nil {
				t.Error(err)
			}
			results <- res
		}()
		// One at a time, so that the first ones fail to dial (and open
		// the breaker) and the later ones meet the open breaker.
		testsupport.Eventually(t, 5*time.Second, "the request waits", func() bool { return h.r.waiting.Load() == int64(i+1) })
	}
	if !h.state("i-a").Open() {
		t.Fatal("the crashed holder's breaker is not open: the breaker path was not exercised")
	}
	// The lease expires: the record goes, the adapter is loaded nowhere
	// for a while; the requests keep waiting.
	h.ep.Instances = slices.DeleteFunc(h.ep.Instances, func(in fleet.Instance) bool { return in.ID == "i-a" })
	h.update()
	if got := h.r.waiting.Load(); got != n {
		t.Fatalf("%d requests waiting after the record expired, want %d", got, n)
	}
	// Placement moves the adapter; i-b's agent loads it.
	h.setAdapters("i-b", "lora-x")
	wg.Wait()
	close(results)
	for res := range results {
		if res.status != http.StatusOK || res.instance != "i-b" {
			t.Errorf("after the move: %d from %q %s, want 200 from i-b", res.status, res.instance, res.body)
		}
	}
}

// TestCrashedHolderWaitIsBounded: with no new holder, the wait ends after
// AdapterWait with model-not-ready, not the dial error.
func TestCrashedHolderWaitIsBounded(t *testing.T) {
	bs := threeBackends(t)
	h := newAdapterHarness(t, Options{AdapterWait: 100 * time.Millisecond}, bs...)
	h.setAdapters("i-a", "lora-x")
	bs[0].srv.Close()
	res := h.mustDo("/v1/chat/completions", fmt.Sprintf(loraChat, "hi"), nil)
	if res.status != statusModelNotReady(kindChat) || res.header.Get(HeaderError) != codeModelNotReady {
		t.Fatalf("past the wait: %d %q %s", res.status, res.header.Get(HeaderError), res.body)
	}
}
