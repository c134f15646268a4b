package bench

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestRunTTFTAndUsage(t *testing.T) {
	const delay = 30 * time.Millisecond
	f := newFake(t, "i-0", func(f *fakeServer) { f.firstDelay = delay })
	res, err := Run(t.Context(), Options{
		Targets: []string{f.URL}, Workload: smallPreset(), Rate: 0, Requests: 12, Warmup: 3, Seed: 1, Concurrency: 4,
		Model: "base",
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 12 || res.Succeeded != 12 || res.SuccessRate != 1 || f.count() != 15 {
		t.Fatalf("requests %d ok %d (%.2f), server saw %d", res.Requests, res.Succeeded, res.SuccessRate, f.count())
	}
	for _, s := range res.Samples {
		// The role chunk arrives at once; TTFT must wait for content.
		if s.TTFTMs < ms(delay) || s.E2EMs < s.TTFTMs {
			t.Fatalf("sample %d: TTFT %.1f ms, E2E %.1f ms, first content delayed %v", s.Index, s.TTFTMs, s.E2EMs, delay)
		}
		if s.Instance != "i-0" || !s.HasUsage || s.OutputTokens != 5 {
			t.Fatalf("sample %+v", s)
		}
		if s.Index < 3 {
			t.Fatalf("warmup request %d measured", s.Index)
		}
	}
	if res.TTFT.P50 < ms(delay) || res.TTFT.N != 12 {
		t.Fatalf("TTFT %+v", res.TTFT)
	}
	if len(res.Instances) != 1 || res.Instances[0].Share != 1 {
		t.Fatalf("instances %+v", res.Instances)
	}
}

// One fake instance with an unbounded cache serving the stream in order
// (concurrency 1) is the oracle: metrics, usage and oracle agree exactly.
func TestRunHitRatesMatchOracleOnOneInstance(t *testing.T) {
	f := newFake(t, "solo", nil)
	res, err := Run(t.Context(), Options{
		Targets: []string{f.URL}, MetricsURLs: []string{f.URL + "/metrics"}, Workload: smallPreset(),
		Requests: 30, Warmup: 10, Seed: 2, Concurrency: 1, Tenants: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.MetricsHitRate == nil || res.Oracle.HitRate <= 0 {
		t.Fatalf("metrics %v, oracle %v, errors %v", res.MetricsHitRate, res.Oracle.HitRate, res.MetricsErrors)
	}
	if *res.MetricsHitRate != res.Oracle.HitRate || res.UsageHitRate != res.Oracle.HitRate {
		t.Fatalf("metrics %.4f usage %.4f oracle %.4f", *res.MetricsHitRate, res.UsageHitRate, res.Oracle.HitRate)
	}
	if *res.MetricsVsOracle != 1 || *res.UsageVsOracle != 1 {
		t.Fatalf("vs oracle %v %v", *res.MetricsVsOracle, *res.UsageVsOracle)
	}
	if res.Regime.InstanceKVTokens != 16000 || res.Regime.Instances != 1 || res.Regime.WorkingSetTokens != 2*800 {
		t.Fatalf("regime %+v", res.Regime)
	}
	if res.Regime.Class != RegimeFitsOne {
		t.Fatalf("regime class %q", res.Regime.Class)
	}
	// Both tenants' keys went out.
	keys := map[string]bool{}
	f.mu.Lock()
	for _, b := range f.bodies {
		keys[b.PromptCacheKey] = true
		if !b.Stream || b.StreamOptions == nil || !b.StreamOptions.IncludeUsage || !b.IgnoreEOS {
			t.Errorf("body not streaming with usage and ignore_eos: %+v", b)
		}
	}
	f.mu.Unlock()
	if len(keys) != 2 {
		t.Fatalf("prompt_cache_keys %v", keys)
	}
}

// llama.cpp's llama-server reports cached tokens only through its timings
// and evaluated tokens on /metrics: both hit rates still equal the
// oracle's on one instance, and each /metrics URL reports what it
// evaluated.
func TestRunHitRatesOfLlamaCpp(t *testing.T) {
	f := newFake(t, "solo", func(f *fakeServer) { f.llama = true })
	res, err := Run(t.Context(), Options{
		Targets: []string{f.URL}, MetricsURLs: []string{f.URL + "/metrics"}, Workload: smallPreset(),
		Requests: 30, Warmup: 10, Seed: 2, Concurrency: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.MetricsHitRate == nil || res.Oracle.HitRate <= 0 || len(res.MetricsErrors) > 0 {
		t.Fatalf("metrics %v, oracle %v, errors %v", res.MetricsHitRate, res.Oracle.HitRate, res.MetricsErrors)
	}
	if *res.MetricsHitRate != res.Oracle.HitRate || res.UsageHitRate != res.Oracle.HitRate {
		t.Fatalf("metrics %.4f usage %.4f oracle %.4f", *res.MetricsHitRate, res.UsageHitRate, res.Oracle.HitRate)
	}
	want := float64(res.UsagePromptTokens - res.UsageCachedTokens)
	if len(res.Metrics) != 1 || res.Metrics[0].Evaluated != want || res.Metrics[0].Queries != 0 {
		t.Fatalf("metrics deltas %+v, want %v tokens evaluated", res.Metrics, want)
	}
	if len(res.Instances) != 1 || res.Instances[0].HitRate != res.Oracle.HitRate {
		t.Fatalf("per instance %+v", res.Instances)
	}
}

func TestRunErrorsCounted(t *testing.T) {
	f := newFake(t, "i-0", func(f *fakeServer) {
		f.fail = func(n int) int {
			if n%4 == 3 {
				return http.StatusServiceUnavailable
			}
			return 0
		}
	})
	res, err := Run(t.Context(), Options{Targets: []string{f.URL}, Workload: smallPreset(), Requests: 20, Seed: 3, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed != 5 || res.Errors["http_503"] != 5 || res.Succeeded != 15 || res.SuccessRate != 0.75 {
		t.Fatalf("failed %d %v ok %d rate %.2f", res.Failed, res.Errors, res.Succeeded, res.SuccessRate)
	}
	if res.TTFT.N != 15 {
		t.Fatalf("TTFT over %d requests, want the 15 successes", res.TTFT.N)
	}
}

func TestRunConnectErrorAndTimeout(t *testing.T) {
	f := newFake(t, "slow", func(f *fakeServer) { f.firstDelay = 5 * time.Second })
	res, err := Run(t.Context(), Options{Targets: []string{f.URL}, Workload: smallPreset(), Requests: 2, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors[ErrKindTimeout] != 2 {
		t.Fatalf("errors %v", res.Errors)
	}
	dead := newFake(t, "dead", nil)
	url := dead.URL
	dead.Close()
	res, err = Run(t.Context(), Options{Targets: []string{url}, Workload: smallPreset(), Requests: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors[ErrKindConnect] != 2 {
		t.Fatalf("errors %v", res.Errors)
	}
}

func TestRunRoundRobinAndRate(t *testing.T) {
	a, b := newFake(t, "a", nil), newFake(t, "b", nil)
	const rate, n = 100.0, 60
	start := time.Now()
	res, err := Run(t.Context(), Options{Targets: []string{a.URL, b.URL}, Workload: smallPreset(), Rate: rate, Requests: n, Seed: 4})
	if err != nil {
		t.Fatal(err)
	}
	el := time.Since(start)
	if a.count() != n/2 || b.count() != n/2 {
		t.Fatalf("targets got %d and %d", a.count(), b.count())
	}
	// 60 exponential gaps of mean 10 ms sum to 0.6 s (sd 0.08 s): well
	// above 0.2 s unless pacing is broken; the upper bound only says the
	// run ends.
	if el < 200*time.Millisecond || el > 20*time.Second {
		t.Fatalf("run took %v at %.0f req/s for %d requests", el, rate, n)
	}
	if res.ThroughputRPS <= 0 || res.ThroughputRPS > 3*rate {
		t.Fatalf("throughput %.1f req/s at offered %.0f", res.ThroughputRPS, rate)
	}
	if len(res.Instances) != 2 || res.Instances[0].Share != 0.5 {
		t.Fatalf("instances %+v", res.Instances)
	}
}

func TestRunDuration(t *testing.T) {
	f := newFake(t, "i", nil)
	start := time.Now()
	res, err := Run(t.Context(), Options{Targets: []string{f.URL}, Workload: smallPreset(), Rate: 50, Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// ~15 arrivals expected; Poisson(15) exceeds 60 with negligible odds.
	if res.Requests == 0 || res.Requests > 60 || time.Since(start) > 10*time.Second {
		t.Fatalf("%d requests in %v", res.Requests, time.Since(start))
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	f := newFake(t, "stuck", func(f *fakeServer) {
		f.block = true
		f.arrived = make(chan struct{}, 1)
	})
	ctx, cancel := context.WithCancel(t.Context())
	type ret struct {
		res *Result
		err error
	}
	done := make(chan ret, 1)
	go func() {
		res, err := Run(ctx, Options{Targets: []string{f.URL}, Workload: smallPreset(), Rate: 20, Requests: 1000})
		done <- ret{res, err}
	}()
	select {
	case <-f.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("no request arrived")
	}
	cancel()
	select {
	case r := <-done:
		if !errors.Is(r.err, context.Canceled) || r.res == nil || !r.res.Interrupted {
			t.Fatalf("err %v, result %v", r.err, r.res)
		}
		if r.res.Succeeded != 0 || r.res.Canceled == 0 || r.res.Failed != 0 {
			t.Fatalf("ok %d canceled %d failed %d", r.res.Succeeded, r.res.Canceled, r.res.Failed)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop after cancel")
	}
}

func TestRunSessionsWaitForPreviousTurn(t *testing.T) {
	f := newFake(t, "i", func(f *fakeServer) { f.firstDelay = 5 * time.Millisecond })
	p := &Preset{Name: "mini-chat", Kind: KindSessions, Sessions: 3, Turns: IntRange{3, 4}, TurnTokens: IntRange{20, 60}, Output: LengthDist{Median: 8}}
	res, err := Run(t.Context(), Options{Targets: []string{f.URL}, Workload: p, Rate: 0, Requests: 40, Seed: 5, Concurrency: 8})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := p.NewStream(5, StreamOptions{})
	byIndex := map[int]Sample{}
	for _, s := range res.Samples {
		byIndex[s.Index] = s
	}
	checked := 0
	for range 40 {
		r := st.Next()
		if r.After < 0 {
			continue
		}
		prev, cur := byIndex[r.After], byIndex[r.Index]
		if cur.StartMs < prev.StartMs+prev.E2EMs {
			t.Fatalf("turn %d sent at %.2f ms before turn %d ended at %.2f ms", r.Index, cur.StartMs, r.After, prev.StartMs+prev.E2EMs)
		}
		checked++
	}
	if checked == 0 || res.Succeeded != 40 {
		t.Fatalf("checked %d, ok %d", checked, res.Succeeded)
	}
	if res.UsageHitRate <= 0 || res.Oracle.HitRate <= 0 {
		t.Fatalf("history re-sent but no hits: usage %.3f oracle %.3f", res.UsageHitRate, res.Oracle.HitRate)
	}
}

func TestRunInvokeAPI(t *testing.T) {
	f := newFake(t, "i", nil)
	_, err := Run(t.Context(), Options{Targets: []string{f.URL}, Workload: smallPreset(), Requests: 4, API: APIInvoke, Tenants: 1,
		AdapterMix: 1, Adapters: []string{"lora-x"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(t.Context(), Options{Targets: []string{f.URL}, Workload: smallPreset(), Requests: 2, Endpoint: "ep1"})
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range 4 {
		if f.paths[i] != "/invocations" || f.headers[i].Get(HeaderPrefixAwareID) != "tenant-00" ||
			f.headers[i].Get(HeaderTargetModel) != "lora-x" || f.bodies[i].Model != "lora-x" {
			t.Fatalf("request %d: %s %v model %q", i, f.paths[i], f.headers[i], f.bodies[i].Model)
		}
	}
	if f.paths[4] != "/endpoints/ep1/openai/v1/chat/completions" {
		t.Fatalf("path %s", f.paths[4])
	}
}

func TestRunProgress(t *testing.T) {
	f := newFake(t, "i", nil)
	var buf strings.Builder
	if _, err := Run(t.Context(), Options{Targets: []string{f.URL}, Workload: smallPreset(), Requests: 3, Progress: &buf}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "100%") || !strings.Contains(buf.String(), "done 3") {
		t.Fatalf("progress %q", buf.String())
	}
}

func TestConfigValidation(t *testing.T) {
	tests := []struct {
		name string
		cfg  Options
	}{
		{"no target", Options{Preset: "bot", Requests: 1}},
		{"unbounded", Options{Targets: []string{"http://127.0.0.1:1"}, Preset: "bot"}},
		{"bad api", Options{Targets: []string{"http://127.0.0.1:1"}, Preset: "bot", Requests: 1, API: "grpc"}},
		{"bad url", Options{Targets: []string{"127.0.0.1:1"}, Preset: "bot", Requests: 1}},
		{"unknown preset", Options{Targets: []string{"http://127.0.0.1:1"}, Preset: "nope", Requests: 1}},
		{"negative rate", Options{Targets: []string{"http://127.0.0.1:1"}, Preset: "bot", Requests: 1, Rate: -1}},
		{"reset without metrics URLs", Options{Targets: []string{"http://127.0.0.1:1"}, Preset: "bot", Requests: 1, ResetPrefixCache: true}},
		{"reset with a bad metrics URL", Options{Targets: []string{"http://127.0.0.1:1"}, Preset: "bot", Requests: 1, ResetPrefixCache: true, MetricsURLs: []string{"127.0.0.1:1/metrics"}}},
		{"negative time scale", Options{Targets: []string{"http://127.0.0.1:1"}, Preset: "bot", Requests: 1, TimeScale: -2}},
		{"NaN time scale", Options{Targets: []string{"http://127.0.0.1:1"}, Preset: "bot", Requests: 1, TimeScale: math.NaN()}},
		{"infinite time scale", Options{Targets: []string{"http://127.0.0.1:1"}, Preset: "bot", Requests: 1, TimeScale: math.Inf(1)}},
		{"mix without adapters", Options{Targets: []string{"http://127.0.0.1:1"}, Preset: "bot", Requests: 1, AdapterMix: 0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Run(t.Context(), tt.cfg); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}
