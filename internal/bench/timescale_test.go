package bench

import (
	"bytes"
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/sim"
)

// With the simulator running k times faster than real time, the bench
// reports TTFT in the simulator's time. One instance, one request at a
// time, one document: the first request's prompt is uncached and fits one
// step, so its TTFT is one prefill step of the profile (PrefillDuration
// includes the step floor); the later ones hit the document. Unscaled, the
// k = 10 figure would be a tenth of the profile's and fail.
//
// The figures also carry the per-request overhead (HTTP, the simulator's
// JSON parsing and block hashing), multiplied by k: under -race on a slow
// machine that alone is about 20 % of the uncached prefill at k = 10. The
// cached requests have the same bytes and a known, small prefill, so the
// least of their excesses over the profile estimates that overhead, which
// the check subtracts.
func TestTimeScaleReportsServerTime(t *testing.T) {
	tests := []struct {
		name      string
		scale     float64
		profile   string
		docTokens int
	}{
		// 70B at ~7,850 tokens: ~300 ms simulated, ~30 ms of wall time.
		{"scale 10", 10, sim.ProfileH100x8Llama70B, 7800},
		// Real time, a small prompt: ~60 ms.
		{"real time", 0, sim.ProfileH200Llama8B, 2000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := sim.New(sim.Options{ID: "sim-0", Profile: tt.profile, TimeScale: max(tt.scale, 1)})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(s)
			t.Cleanup(func() {
				srv.Close()
				s.Close()
			})
			prof := s.Profile()
			p := &Preset{Name: "prefill", Kind: KindSharedPrefix, Documents: 1, DocumentTokens: tt.docTokens,
				QuestionTokens: IntRange{20, 40}, Output: LengthDist{Median: 2}}
			res, err := Run(t.Context(), Options{Targets: []string{srv.URL}, Workload: p, Requests: 4, Seed: 1,
				Concurrency: 1, TimeScale: tt.scale})
			if err != nil {
				t.Fatal(err)
			}
			if res.Succeeded != 4 {
				t.Fatalf("ok %d, errors %v", res.Succeeded, res.Errors)
			}
			if want := timeScaleOf(max(tt.scale, 1)); res.TimeScale != want {
				t.Fatalf("result time scale %v, want %v", res.TimeScale, want)
			}
			first := res.Samples[0]
			if first.Index != 0 || first.CachedTokens != 0 || first.PromptTokens > prof.TokenBudget {
				t.Fatalf("first request %+v: want an uncached prompt of one step (budget %d)", first, prof.TokenBudget)
			}
			overhead := math.Inf(1)
			for _, smp := range res.Samples[1:] {
				if smp.CachedTokens == 0 {
					t.Fatalf("request %d missed the document's cache", smp.Index)
				}
				overhead = math.Min(overhead, smp.TTFTMs-ms(prof.PrefillDuration(smp.PromptTokens, smp.CachedTokens)))
			}
			overhead = max(overhead, 0)
			want := ms(prof.PrefillDuration(first.PromptTokens, 0))
			t.Logf("uncached %d tokens: TTFT %.1f ms, profile %.1f ms, overhead (from the cached requests) %.1f ms",
				first.PromptTokens, first.TTFTMs, want, overhead)
			if got := first.TTFTMs - overhead; math.Abs(got-want) > 0.25*want {
				t.Fatalf("TTFT %.1f ms less overhead %.1f ms = %.1f ms for %d uncached tokens, profile prefill %.1f ms (±25%%)",
					first.TTFTMs, overhead, got, first.PromptTokens, want)
			}
		})
	}
}

// Rate, Duration and Timeout are in server time: at scale 10 a 2 s
// window at 20 req/s takes about 0.2 s of wall time and sends about 40
// requests, and a 1 s timeout fires after 0.1 s of wall time but is
// reported as 1 s.
func TestTimeScaleWallClock(t *testing.T) {
	f := newFake(t, "i", nil)
	start := time.Now()
	res, err := Run(t.Context(), Options{Targets: []string{f.URL}, Workload: smallPreset(), Rate: 20, Duration: 2 * time.Second, TimeScale: 10, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	wall := time.Since(start)
	// Poisson(40): below 15 or above 80 has negligible odds; unscaled
	// arrivals (20 req/s over 0.2 s wall) would send about 4.
	if res.Requests < 15 || res.Requests > 80 || wall > 1500*time.Millisecond {
		t.Fatalf("%d requests in %v of wall time", res.Requests, wall)
	}
	if res.DurationSec < 1.5 || res.DurationSec > 15 {
		t.Fatalf("measured window %.2f s of server time, want about 2", res.DurationSec)
	}
	if got := float64(res.Succeeded) / res.DurationSec; math.Abs(res.ThroughputRPS-got) > 1e-9 || res.ThroughputRPS > 60 {
		t.Fatalf("throughput %.2f req/s, %d ok over %.2f s", res.ThroughputRPS, res.Succeeded, res.DurationSec)
	}

	slow := newFake(t, "slow", func(f *fakeServer) { f.firstDelay = 5 * time.Second })
	start = time.Now()
	res, err = Run(t.Context(), Options{Targets: []string{slow.URL}, Workload: smallPreset(), Requests: 1, Timeout: time.Second, TimeScale: 10})
	if err != nil {
		t.Fatal(err)
	}
	wall = time.Since(start)
	if res.Errors[ErrKindTimeout] != 1 || wall > 900*time.Millisecond {
		t.Fatalf("errors %v after %v of wall time, want a timeout after about 100 ms", res.Errors, wall)
	}
	if e2e := res.Samples[0].E2EMs; e2e < 950 || e2e > 5000 {
		t.Fatalf("timed-out request reported at %.0f ms, want about 1000 (server time)", e2e)
	}
}

func TestTimeScaleInReports(t *testing.T) {
	const note = "time scale 10× (figures in simulated time)"
	fast := &Result{Label: "fast", Preset: "p", TimeScale: 10}
	rt := &Result{Label: "real", Preset: "p"}
	var tab bytes.Buffer
	if err := fast.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tab.String(), note) {
		t.Fatalf("table lacks %q:\n%s", note, tab.String())
	}
	tab.Reset()
	if err := rt.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(tab.String(), "time scale") {
		t.Fatalf("real-time table mentions a time scale:\n%s", tab.String())
	}
	tests := []struct {
		name string
		runs []*Result
		want []string
		not  []string
	}{
		{"mixed", []*Result{fast, rt}, []string{"fast / p: " + note}, []string{"real / p: time", "all runs"}},
		{"all scaled", []*Result{fast, {Label: "also", Preset: "p", TimeScale: 10}}, []string{"all runs: " + note}, []string{"fast / p: time"}},
		{"real time", []*Result{rt}, nil, []string{"time scale", "Time scale"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Comparison{Runs: tt.runs}
			var md, html bytes.Buffer
			if err := c.WriteMarkdown(&md); err != nil {
				t.Fatal(err)
			}
			if err := c.WriteHTML(&html); err != nil {
				t.Fatal(err)
			}
			for _, out := range []string{md.String(), html.String()} {
				for _, w := range tt.want {
					if !strings.Contains(out, w) {
						t.Fatalf("lacks %q:\n%s", w, out)
					}
				}
				for _, n := range tt.not {
					if strings.Contains(out, n) {
						t.Fatalf("has %q:\n%s", n, out)
					}
				}
			}
		})
	}
}
