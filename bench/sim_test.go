package bench

import (
	"net/http/httptest"
	"testing"

	"github.com/prefixrouter/prefixrouter/sim"
)

func newSim(t *testing.T, id string, kvTokens int) *httptest.Server {
	t.Helper()
	s, err := sim.New(sim.Config{ID: id, KVCapacityTokens: kvTokens, TimeScale: 50, Adapters: []string{"lora-a"}})
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
			res, err := Run(t.Context(), Config{
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
