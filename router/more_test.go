package router

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

func TestStrategiesSwitchLive(t *testing.T) {
	bs := threeBackends(t)
	h := newHarness(t, hopts{cfg: prefixCfg(10)}, bs...)
	if res := h.mustDo("/invocations", "same", nil); res.decision != DecisionAffinity {
		t.Fatalf("decision %q", res.decision)
	}
	h.ep.Config = fleet.RoutingConfig{RoutingStrategy: fleet.Random}
	h.update()
	seen := map[string]bool{}
	for range 60 {
		res := h.mustDo("/invocations", "same", nil)
		if res.status != 200 || res.decision != DecisionRandom {
			t.Fatalf("status %d decision %q", res.status, res.decision)
		}
		seen[res.instance] = true
	}
	// P(one of 3 never chosen in 60) < 3*(2/3)^60 ≈ 1e-10.
	if len(seen) != 3 {
		t.Fatalf("RANDOM used only %v", seen)
	}
	h.ep.Config = fleet.RoutingConfig{RoutingStrategy: fleet.LeastOutstanding}
	h.update()
	// Block one request on whichever instance it lands on; the next
	// requests must avoid that instance.
	var wg sync.WaitGroup
	wg.Add(1)
	var first result
	go func() {
		defer wg.Done()
		first, _ = h.do(t.Context(), "/invocations", "same", map[string]string{"X-Test-Block": "1"})
	}()
	var busy *backend
	testsupport.Eventually(t, 10*time.Second, "a blocked request", func() bool {
		for _, b := range bs {
			if b.blocked.Load() == 1 {
				busy = b
				return true
			}
		}
		return false
	})
	for range 20 {
		res := h.mustDo("/invocations", "same", nil)
		if res.decision != DecisionLeastOutstanding || res.instance == busy.id {
			t.Fatalf("LOR went to %s (%s) while %s was busy", res.instance, res.decision, busy.id)
		}
	}
	close(busy.release)
	wg.Wait()
	if first.instance != busy.id || first.decision != DecisionLeastOutstanding {
		t.Fatalf("blocked request: %+v", first)
	}
}

func TestReplicaShareLowersThreshold(t *testing.T) {
	bs := threeBackends(t)
	h := newHarness(t, hopts{cfg: prefixCfg(4)}, bs...)
	// Four replicas share a threshold of 4: this one admits 1 per instance.
	h.r.Update(fleet.NewSnapshot([]fleet.Endpoint{h.ep}, 0, 4, time.Now()))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		h.do(t.Context(), "/invocations", "p", map[string]string{"X-Test-Block": "1"})
	}()
	var busy *backend
	testsupport.Eventually(t, 10*time.Second, "blocked", func() bool {
		for _, b := range bs {
			if b.blocked.Load() == 1 {
				busy = b
				return true
			}
		}
		return false
	})
	res := h.mustDo("/invocations", "p", nil)
	if res.instance == busy.id || res.decision != DecisionSpill {
		t.Fatalf("with share 1 the second request went to %s (%s)", res.instance, res.decision)
	}
	close(busy.release)
	wg.Wait()
}

func TestModelsHealthReady(t *testing.T) {
	h := newHarness(t, hopts{cfg: prefixCfg(10), labels: map[string]string{"model": "base"}, adapters: []string{"lora-1", "lora-2"}}, threeBackends(t)...)
	get := func(path string) (int, string) {
		resp, err := h.client.Get(h.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, path := range []string{"/v1/models", "/endpoints/ep/openai/v1/models"} {
		code, body := get(path)
		var list modelList
		if err := json.Unmarshal([]byte(body), &list); err != nil || code != 200 || list.Object != "list" {
			t.Fatalf("%s: %d %s", path, code, body)
		}
		var ids []string
		for _, m := range list.Data {
			ids = append(ids, m.ID)
			if m.Object != "model" {
				t.Fatalf("entry %+v", m)
			}
		}
		if strings.Join(ids, ",") != "base,lora-1,lora-2" {
			t.Fatalf("%s: models %v", path, ids)
		}
	}
	for _, path := range []string{"/ping", "/healthz"} {
		if code, body := get(path); code != 200 || body != "ok\n" {
			t.Fatalf("%s: %d %q", path, code, body)
		}
	}
	if code, body := get("/readyz"); code != 200 || body != "ok static fleet instances=3\n" {
		t.Fatalf("/readyz: %d %q", code, body)
	}
	// Every instance draining: not ready.
	for i := range h.ep.Instances {
		h.ep.Instances[i].Draining = true
	}
	h.update()
	if code, _ := get("/readyz"); code != 503 {
		t.Fatalf("readyz with all draining: %d", code)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("healthz: %d", code)
	}
}

func TestStatePersistsAcrossSnapshots(t *testing.T) {
	bs := threeBackends(t)
	h := newHarness(t, hopts{cfg: prefixCfg(10)}, bs...)
	st := h.state("i-a")
	d, ok := st.Acquire()
	if !ok {
		t.Fatal("not admitted")
	}
	h.ep.Instances = h.ep.Instances[:2] // i-c leaves
	h.update()
	if h.state("i-a") != st || st.InFlight() != 1 {
		t.Fatal("i-a lost its state")
	}
	if h.r.view.Load().endpoints["ep"].instances["i-c"] != nil {
		t.Fatal("i-c not dropped")
	}
	d(nil)
}

func TestMetrics(t *testing.T) {
	h := newHarness(t, hopts{cfg: prefixCfg(10)}, threeBackends(t)...)
	h.mustDo("/invocations", "x", nil)
	h.mustDo("/endpoints/nope/invocations", "x", nil)
	fams, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range fams {
		got[f.GetName()] = true
	}
	for _, name := range []string{
		"prefixrouter_requests_total", "prefixrouter_pick_duration_seconds",
		"prefixrouter_instance_in_flight", "prefixrouter_instance_breaker_state", "prefixrouter_instance_external_load",
	} {
		if !got[name] {
			t.Errorf("metric %s missing (have %v)", name, got)
		}
	}
	// A proxied request is counted after its answer went out: wait for it.
	okC := h.r.metrics.requests.WithLabelValues("ep", "PREFIX_AWARE", DecisionAffinity, "200")
	nfC := h.r.metrics.requests.WithLabelValues("unknown", "", decisionNone, "400")
	testsupport.Eventually(t, 10*time.Second, "both requests counted", func() bool { return counterValue(okC) >= 1 && counterValue(nfC) >= 1 })
	ok, nf := counterValue(okC), counterValue(nfC)
	if ok != 1 || nf != 1 {
		t.Fatalf("requests: affinity/200 %v, unknown/400 %v", ok, nf)
	}
}

func TestLoadPoller(t *testing.T) {
	b := newBackend(t, "i-a")
	b.handler = func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprint(w, "vllm:num_requests_running 7\nvllm:num_requests_waiting 2\n")
			return
		}
		fmt.Fprint(w, "ok")
	}
	tr := NewTransport(0)
	fc := testsupport.NewFakeClock()
	r, err := newRouter(Options{DefaultEndpoint: "ep", LoadPollInterval: time.Second, Transport: tr}, fc)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := testsupport.Context(t, 10*time.Second)
	if err := fc.BlockUntilContext(ctx, 1); err != nil { // the round at start, before the fleet
		t.Fatal(err)
	}
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Instances: []fleet.Instance{{ID: "i-a", Addr: b.srv.URL}}}}, 0, 1, time.Now()))
	fc.Advance(time.Second)
	if err := fc.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	st := r.view.Load().endpoints["ep"].instances["i-a"].state
	if got := st.ExternalLoad(); got != 9 {
		t.Fatalf("polled external load %d, want 9", got)
	}
	if st.HasRoom(9, 1) || !st.HasRoom(10, 1) {
		t.Fatal("external load not used for admission")
	}
}

func TestNewValidates(t *testing.T) {
	for _, o := range []Options{{}, {DefaultEndpoint: "e", MaxBodyBytes: -1}, {DefaultEndpoint: "e", LoadPollInterval: -1}} {
		if r, err := New(o); err == nil {
			r.Close()
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

// TestEarlyHintsReachTheClient: a 103 Early Hints from the instance goes to
// the client before the answer, as through net/http's transport.
func TestEarlyHintsReachTheClient(t *testing.T) {
	b := newBackend(t, "i-a")
	b.handler = func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Link", "</doc>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		fmt.Fprint(w, `{"ok":true}`)
	}
	h := newHarness(t, hopts{}, b)
	var hints []string
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, hdr textproto.MIMEHeader) error {
		hints = append(hints, fmt.Sprintf("%d %s", code, hdr.Get("Link")))
		return nil
	}}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), http.MethodPost, h.srv.URL+"/invocations", strings.NewReader(`{"inputs":"x"}`))
	resp, err := h.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(hints) != 1 || hints[0] != "103 </doc>; rel=preload" {
		t.Fatalf("status %d, hints %q; want 200 after one 103 with its Link", resp.StatusCode, hints)
	}
}
