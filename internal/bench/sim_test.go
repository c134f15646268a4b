package bench

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/internal/sim"
)

func newSim(t *testing.T, id string, kvTokens int) *httptest.Server {
	t.Helper()
	s, err := sim.New(sim.Options{ID: id, KVCapacityTokens: kvTokens, TimeScale: 50, Adapters: []string{"lora-a"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(func() {
		srv.Close()
		s.Close()
	})
	return srv
}

// The simulator and the oracle hash the same rendered prompt with the same
// adapter and salt: one simulated instance with room for the whole stream,
// fed one request at a time, must report exactly the oracle's hits.
func TestSimulatorAgreesWithOracle(t *testing.T) {
	srv := newSim(t, "sim-0", 1<<20)
	for _, api := range []string{APIOpenAI, APIInvoke} {
		t.Run(api, func(t *testing.T) {
			p := &Preset{Name: "sim-check", Kind: KindSharedPrefix, Documents: 3, DocumentTokens: 300, Zipf: 1,
				QuestionTokens: IntRange{20, 40}, Output: LengthDist{Median: 4}}
			seed := int64(1)
			if api == APIInvoke {
				seed = 2 // a fresh stream: the cache is shared between the subtests
			}
			res, err := Run(t.Context(), Options{
				Targets: []string{srv.URL}, MetricsURLs: []string{srv.URL + "/metrics"}, Workload: p,
				Requests: 25, Warmup: 5, Seed: seed, Concurrency: 1, Tenants: 2, AdapterMix: 0.3, Adapters: []string{"lora-a"}, API: api,
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Succeeded != 25 {
				t.Fatalf("ok %d, errors %v %v", res.Succeeded, res.Errors, res.Samples[0].ErrorText)
			}
			for _, s := range res.Samples {
				if s.CachedTokens != s.OracleCached || s.PromptTokens != s.OraclePrompt || s.Instance != "sim-0" {
					t.Fatalf("request %d: sim cached %d of %d, oracle %d of %d (instance %q)",
						s.Index, s.CachedTokens, s.PromptTokens, s.OracleCached, s.OraclePrompt, s.Instance)
				}
			}
			if res.MetricsHitRate == nil || *res.MetricsHitRate != res.Oracle.HitRate || res.Oracle.HitRate == 0 {
				t.Fatalf("metrics hit %v, oracle %.4f, errors %v", res.MetricsHitRate, res.Oracle.HitRate, res.MetricsErrors)
			}
		})
	}
}

// Back-to-back runs on one simulated fleet, as the demo does with one run
// per strategy: with ResetPrefixCache every run starts cold and repeats
// the first exactly; without it the second run hits the first one's cache
// and its hit rate exceeds the oracle's.
func TestResetPrefixCacheStartsRunsCold(t *testing.T) {
	a, b := newSim(t, "sim-0", 1<<20), newSim(t, "sim-1", 1<<19)
	p := &Preset{Name: "reset-check", Kind: KindSharedPrefix, Documents: 3, DocumentTokens: 300, Zipf: 1,
		QuestionTokens: IntRange{20, 40}, Output: LengthDist{Median: 4}}
	run := func(reset bool) *Result {
		t.Helper()
		res, err := Run(t.Context(), Options{
			Targets: []string{a.URL, b.URL}, MetricsURLs: []string{a.URL + "/metrics", b.URL + "/metrics"}, Workload: p,
			Requests: 20, Warmup: 4, Seed: 3, Concurrency: 1, ResetPrefixCache: reset,
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Succeeded != 20 || res.MetricsHitRate == nil || res.Oracle.HitRate == 0 {
			t.Fatalf("ok %d, metrics %v, oracle %v, errors %v %v", res.Succeeded, res.MetricsHitRate, res.Oracle.HitRate, res.Errors, res.MetricsErrors)
		}
		return res
	}
	first := run(true)
	if *first.MetricsVsOracle > 1 || first.UsageHitRate != *first.MetricsHitRate {
		t.Fatalf("cold run: metrics/oracle %.4f, usage %.4f, metrics %.4f", *first.MetricsVsOracle, first.UsageHitRate, *first.MetricsHitRate)
	}
	// Capacities come from each sim's vllm:cache_config_info.
	if g := first.Regime; g.InstanceKVTokens != 1<<19 || g.Instances != 2 || g.FleetKVTokens != 1<<20+1<<19 || g.Class != RegimeFitsOne {
		t.Fatalf("regime %+v", g)
	}
	warm := run(false)
	if *warm.MetricsVsOracle <= 1 {
		t.Fatalf("a warm rerun hit %.4f of the oracle, want above 1 (else this test proves nothing)", *warm.MetricsVsOracle)
	}
	again := run(true)
	if again.UsageHitRate != first.UsageHitRate || *again.MetricsHitRate != *first.MetricsHitRate {
		t.Fatalf("reset rerun: usage %.4f metrics %.4f, first run %.4f %.4f", again.UsageHitRate, *again.MetricsHitRate, first.UsageHitRate, *first.MetricsHitRate)
	}
}

func TestResetPrefixCacheFailures(t *testing.T) {
	noReset := newFake(t, "no-reset", nil) // answers 404, like a vLLM without VLLM_SERVER_DEV_MODE
	closed := newFake(t, "closed", nil)
	closed.Close()
	sim0 := newSim(t, "sim-0", 1<<16)
	tests := []struct {
		name    string
		metrics []string
		want    string
	}{
		{"404", []string{sim0.URL + "/metrics", noReset.URL + "/metrics"}, "status 404 (vLLM serves it only with VLLM_SERVER_DEV_MODE=1)"},
		{"refused", []string{closed.URL + "/metrics"}, "reset prefix cache " + closed.URL + "/reset_prefix_cache"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := noReset.count()
			res, err := Run(t.Context(), Options{
				Targets: []string{noReset.URL}, MetricsURLs: tt.metrics, Workload: smallPreset(),
				Requests: 3, Warmup: 1, ResetPrefixCache: true,
			})
			if err == nil || res != nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("result %v, error %v: want a failed run mentioning %q", res, err, tt.want)
			}
			if n := noReset.count() - before; n != 0 {
				t.Errorf("%d requests sent after a failed reset", n)
			}
		})
	}
}

func TestRegimeCapacityUnknown(t *testing.T) {
	f := newFake(t, "old", func(f *fakeServer) { f.noCacheInfo = true })
	res, err := Run(t.Context(), Options{
		Targets: []string{f.URL}, MetricsURLs: []string{f.URL + "/metrics"}, Workload: smallPreset(), Requests: 3, Seed: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if g := res.Regime; g.Class != RegimeUnknown || g.InstanceKVTokens != 0 || g.Instances != 1 || res.MetricsHitRate == nil {
		t.Fatalf("regime %+v, metrics hit rate %v", g, res.MetricsHitRate)
	}
}
