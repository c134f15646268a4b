package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/overload"
)

// TestExplainMatchesDataPlane sends real requests and checks that the
// instance that answered (with no load, so by affinity) is Explain's, and
// that the explanation describes the request.
func TestExplainMatchesDataPlane(t *testing.T) {
	bs := threeBackends(t)
	h := newHarness(t, hopts{cfg: prefixCfg(10), labels: map[string]string{"model": "base"}, adapters: []string{"sql"}}, bs...)
	long := strings.Repeat("x", 3000)
	chat := func(model, tenant, text string) string {
		return fmt.Sprintf(`{"model":%q,"prompt_cache_key":%q,"messages":[{"role":"user","content":%q}]}`, model, tenant, text)
	}
	tests := []struct {
		name, path, body string
		hdr              map[string]string
		model, tenant    string
	}{
		{name: "invoke", path: "/invocations", body: "hello " + long},
		{name: "invoke scoped tenant adapter", path: "/endpoints/ep/invocations", body: "hello " + long,
			hdr: map[string]string{HeaderTenant: "t-1", HeaderTargetModel: "sql"}, model: "sql", tenant: "t-1"},
		{name: "chat", path: "/v1/chat/completions", body: chat("base", "t-2", "hi "+long), model: "base", tenant: "t-2"},
		{name: "chat scoped", path: "/endpoints/ep/openai/v1/chat/completions", body: chat("sql", "t-3", "yo"), model: "sql", tenant: "t-3"},
		{name: "completions", path: "/v1/completions", body: `{"model":"base","prompt":"once upon a time"}`, model: "base"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hdr := http.Header{}
			for k, v := range tc.hdr {
				hdr.Set(k, v)
			}
			ex, err := h.r.Explain(context.Background(), PickRequest{Endpoint: "ep", Path: tc.path, Header: hdr, Body: []byte(tc.body)})
			if err != nil {
				t.Fatal(err)
			}
			if ex.Strategy != fleet.PrefixAware || ex.PrefixLength != 1024 || ex.Model != tc.model || ex.Tenant != tc.tenant {
				t.Fatalf("explanation %+v, want strategy PREFIX_AWARE, prefix 1024, model %q, tenant %q", ex, tc.model, tc.tenant)
			}
			rr, rerr := parseRequest(kindForPath(tc.path), hdr, []byte(tc.body), 1024)
			if rerr != nil || rr.key != ex.Key {
				t.Fatalf("key %x, parseRequest %x (%v)", ex.Key, rr.key, rerr)
			}
			got := slices.Sorted(slices.Values(ex.Candidates))
			if !slices.Equal(got, []string{"i-a", "i-b", "i-c"}) || ex.Candidates[0] != ex.Instance {
				t.Fatalf("candidates %v, instance %s", ex.Candidates, ex.Instance)
			}
			for range 3 {
				res := h.mustDo(tc.path, tc.body, tc.hdr)
				if res.status != http.StatusOK || res.instance != ex.Instance || res.decision != DecisionAffinity {
					t.Fatalf("data plane: status %d instance %s (%s), Explain %s", res.status, res.instance, res.decision, ex.Instance)
				}
			}
			req, _ := http.NewRequest(http.MethodPost, tc.path, strings.NewReader(tc.body))
			for k, v := range tc.hdr {
				req.Header.Set(k, v)
			}
			id, err := h.r.Choose("ep", req)
			if err != nil || id != ex.Instance {
				t.Fatalf("Choose %s (%v), Explain %s", id, err, ex.Instance)
			}
			if b, _ := io.ReadAll(req.Body); string(b) != tc.body {
				t.Fatal("Choose did not restore the body")
			}
		})
	}
}

func TestExplainErrors(t *testing.T) {
	bs := threeBackends(t)
	h := newHarness(t, hopts{cfg: prefixCfg(10), labels: map[string]string{"model": "base"}, maxBody: 1 << 10}, bs...)
	tests := []struct {
		name, endpoint, path, body string
		hdr                        http.Header
		want                       error
	}{
		{"unknown endpoint", "nope", "/invocations", "x", nil, ErrUnknownEndpoint},
		{"bad json", "ep", "/v1/chat/completions", `{"messages":`, nil, ErrInvalidRequest},
		{"bad tenant header", "ep", "/invocations", "x", http.Header{HeaderTenant: {strings.Repeat("t", 65)}}, ErrInvalidRequest},
		{"bad prompt_cache_key", "ep", "/v1/completions", `{"model":"base","prompt":"p","prompt_cache_key":""}`, nil, ErrInvalidRequest},
		{"body over the limit", "ep", "/invocations", strings.Repeat("x", 1<<10+1), nil, ErrInvalidRequest},
		{"unknown model", "ep", "/v1/chat/completions", `{"model":"other","messages":[]}`, nil, lora.ErrUnknownModel},
		{"unknown adapter header", "ep", "/invocations", "x", http.Header{HeaderTargetModel: {"other"}}, lora.ErrUnknownModel},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.r.Explain(context.Background(), PickRequest{Endpoint: tc.endpoint, Path: tc.path, Header: tc.hdr, Body: []byte(tc.body)})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			// Choose reports the same errors.
			req, _ := http.NewRequest(http.MethodPost, tc.path, strings.NewReader(tc.body))
			for k, v := range tc.hdr {
				req.Header[k] = v
			}
			if _, err := h.r.Choose(tc.endpoint, req); !errors.Is(err, tc.want) {
				t.Fatalf("Choose err %v, want %v", err, tc.want)
			}
		})
	}

	// Every instance draining: nothing can serve.
	for i := range h.ep.Instances {
		h.ep.Instances[i].Draining = true
	}
	h.update()
	if _, err := h.r.Explain(context.Background(), PickRequest{Endpoint: "ep", Path: "/invocations", Header: nil, Body: []byte("x")}); !errors.Is(err, fleet.ErrNoInstance) || !errors.Is(err, fleet.ErrNoInstance) {
		t.Fatalf("all draining: %v", err)
	}

	// Before the first snapshot.
	r, err := New(Options{DefaultEndpoint: "ep"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Explain(context.Background(), PickRequest{Endpoint: "ep", Path: "/invocations", Header: nil, Body: nil}); !errors.Is(err, fleet.ErrNoInstance) {
		t.Fatalf("no snapshot: %v", err)
	}
	if _, ok := r.Status("ep", "i-a"); ok {
		t.Fatal("Status ok with no snapshot")
	}
}

// TestExplainCandidatesBounded checks the cap and that the order is the
// ring's spill order.
func TestExplainCandidatesBounded(t *testing.T) {
	for _, n := range []int{1, 16, 40} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			r, err := New(Options{DefaultEndpoint: "ep"})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			ep := fleet.Endpoint{Name: "ep"}
			for i := range n {
				ep.Instances = append(ep.Instances, fleet.Instance{ID: fmt.Sprintf("i-%02d", i), Addr: fmt.Sprintf("http://127.0.0.1:%d", 20000+i)})
			}
			r.Update(fleet.NewSnapshot([]fleet.Endpoint{ep}, 0, 1, time.Now()))
			ex, err := r.Explain(context.Background(), PickRequest{Endpoint: "ep", Path: "/invocations", Header: nil, Body: []byte("some prompt")})
			if err != nil {
				t.Fatal(err)
			}
			set, _ := r.view.Load().endpoints["ep"].table.Set("")
			var want []string
			for _, i := range set.Ring().Candidates(ex.Key, n, nil) {
				want = append(want, set.Instance(i).ID)
			}
			want = want[:min(n, MaxExplainCandidates)]
			if !slices.Equal(ex.Candidates, want) {
				t.Fatalf("candidates %v, want %v", ex.Candidates, want)
			}
		})
	}
}

func TestStatus(t *testing.T) {
	bs := []*backend{newBackend(t, "i-a"), newBackend(t, "i-b")}
	h := newHarness(t, hopts{cfg: prefixCfg(10), breaker: overload.BreakerOptions{ConsecutiveFailures: 1, OpenTimeout: time.Minute}}, bs...)
	h.ep.Instances = append(h.ep.Instances, fleet.Instance{ID: "i-dead", Addr: "http://" + deadAddr(t)})
	h.update()

	for _, tc := range []struct{ endpoint, id string }{{"nope", "i-a"}, {"ep", "nope"}} {
		if _, ok := h.r.Status(tc.endpoint, tc.id); ok {
			t.Fatalf("Status(%q, %q) ok", tc.endpoint, tc.id)
		}
	}
	want := overload.Status{ID: "i-a", InFlight: 0, ExternalLoad: -1, Breaker: gobreaker.StateClosed, Healthy: true}
	if st, ok := h.r.Status("ep", "i-a"); !ok || st != want {
		t.Fatalf("idle: %+v %v, want %+v", st, ok, want)
	}

	// A blocked request holds a slot on its instance.
	var body string
	var ex Explanation
	for i := 0; ex.Instance == "" || ex.Instance == "i-dead"; i++ {
		body = fmt.Sprint("block me ", i)
		var err error
		if ex, err = h.r.Explain(context.Background(), PickRequest{Endpoint: "ep", Path: "/invocations", Header: nil, Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan result, 1)
	go func() {
		res, _ := h.do(t.Context(), "/invocations", body, map[string]string{"X-Test-Block": "1"})
		done <- res
	}()
	testsupport.Eventually(t, 10*time.Second, "blocked request", func() bool { return h.bySrvID[ex.Instance].blocked.Load() == 1 })
	if st, ok := h.r.Status("ep", ex.Instance); !ok || st.InFlight != 1 {
		t.Fatalf("blocked: %+v %v, want 1 in flight", st, ok)
	}
	close(h.bySrvID[ex.Instance].release)
	if res := <-done; res.status != http.StatusOK {
		t.Fatalf("blocked request: status %d", res.status)
	}
	testsupport.Eventually(t, 10*time.Second, "slot released", func() bool { st, _ := h.r.Status("ep", ex.Instance); return st.InFlight == 0 })

	// One dial failure opens the dead instance's breaker (the request is
	// retried elsewhere).
	tenant := tenantFor(t, h, "x", "i-dead")
	if res := h.mustDo("/invocations", "x", map[string]string{HeaderTenant: tenant}); res.status != http.StatusOK {
		t.Fatalf("status %d", res.status)
	}
	if st, ok := h.r.Status("ep", "i-dead"); !ok || st.Breaker != gobreaker.StateOpen {
		t.Fatalf("dead instance: %+v %v, want breaker open", st, ok)
	}
}
