package demo

import (
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/internal/bench"
	"github.com/prefixrouter/prefixrouter/internal/sim"
)

func run(label, preset string, p50, p90, hit, rps float64) *bench.Result {
	r := &bench.Result{Label: label, Preset: preset, SuccessRate: 1, ThroughputRPS: rps, UsageHitRate: hit,
		UsagePromptTokens: 8175 * 100, UsageRequests: 100}
	r.TTFT.P50, r.TTFT.P90 = p50, p90
	r.Oracle.HitRate = 0.85
	return r
}

func TestHeadline(t *testing.T) {
	prof, err := sim.LookupProfile(sim.ProfileH200Llama8B)
	if err != nil {
		t.Fatal(err)
	}
	meets := &bench.Comparison{Runs: []*bench.Result{
		run("RANDOM", "shared-8k", 300, 600, 0.25, 4), run("PREFIX_AWARE", "shared-8k", 50, 300, 0.82, 4.1),
	}}
	notes := strings.Join(headline(meets, prof), "\n")
	if strings.Contains(notes, "SHORT") || strings.Contains(notes, "why") || !strings.Contains(notes, "−83%") {
		t.Fatalf("a run that meets every figure:\n%s", notes)
	}
	short := &bench.Comparison{Runs: []*bench.Result{
		run("RANDOM", "shared-8k", 200, 500, 0.55, 4), run("PREFIX_AWARE", "shared-8k", 120, 360, 0.81, 3.9),
	}}
	notes = strings.Join(headline(short, prof), "\n")
	for _, want := range []string{"SHORT: P50 TTFT cut 40%", "SHORT: P90 TTFT cut 28%", "meets: KV hit rate", "SHORT: throughput 0.97×", "why:", "itself mostly served from cache"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	uniform := run("PREFIX_AWARE", "shared-8k-uniform", 100, 300, 0.8, 5)
	uniform.Instances = []bench.InstanceShare{{Instance: "a", Share: 0.12}, {Instance: "b", Share: 0.15}}
	notes = strings.Join(headline(&bench.Comparison{Runs: []*bench.Result{run("RANDOM", "shared-8k-uniform", 400, 900, 0.14, 5), uniform}}, prof), "\n")
	if !strings.Contains(notes, "SHORT: per-instance share 12.0–15.0%") {
		t.Errorf("share check:\n%s", notes)
	}
}

// TestHeadlineHotAndSeed: the seed-regime preset checks RANDOM's hit rate,
// and PREFIX_AWARE (adaptive keys) is compared side by side with the
// fixed-length k = 1 run and the PREFIX_AWARE+hot run.
func TestHeadlineHotAndSeed(t *testing.T) {
	prof, err := sim.LookupProfile(sim.ProfileH200Llama8BRoofline)
	if err != nil {
		t.Fatal(err)
	}
	pa := run("PREFIX_AWARE", "shared-8k-seed", 60, 300, 0.82, 4.1)
	pa.Balance = bench.Balance{Instances: 7, MaxShare: 0.31, Gini: 0.25}
	hot := run(HotLabel, "shared-8k-seed", 55, 250, 0.81, 4.2)
	hot.Balance = bench.Balance{Instances: 7, MaxShare: 0.2, Gini: 0.1}
	fixed := run(FixedLabel, "shared-8k-seed", 70, 320, 0.7, 4.0)
	fixed.Balance = bench.Balance{Instances: 7, MaxShare: 0.4, Gini: 0.3}
	notes := strings.Join(headline(&bench.Comparison{Runs: []*bench.Result{run("RANDOM", "shared-8k-seed", 300, 600, 0.35, 4), pa, fixed, hot}}, prof), "\n")
	for _, want := range []string{"SHORT: the seed's regime: RANDOM hit rate 35.0% (20–30%)",
		"PREFIX_AWARE (adaptive keys) vs PREFIX_AWARE fixed (k = 1): KV hit rate 82.0% vs 70.0%, largest instance 31.0% vs 40.0%",
		"PREFIX_AWARE (adaptive keys) vs PREFIX_AWARE+hot: KV hit rate 82.0% vs 81.0%, largest instance 31.0% vs 20.0%"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
}

func TestCapacityNotes(t *testing.T) {
	res := func(label string, rate float64) *bench.CapacityResult {
		c := &bench.CapacityResult{Label: label, Preset: "shared-8k-seed", TargetP90Ms: 2000, Rate: 3 * rate, Goodput: rate * 0.95, BestGoodput: rate, BestRate: 2 * rate, Step: -1}
		if rate > 0 {
			c.Step = 0
			c.Steps = []bench.CapacityStep{{Rate: rate, Held: true}}
		}
		return c
	}
	for _, tt := range []struct {
		pa, rnd float64
		want    string
	}{
		{12, 10, "meets: the seed's throughput gain of +16 %: +20 %"},
		{11, 10, "SHORT: the seed's throughput gain of +16 %: +10 %"},
		{11, 0, "no rate held the latency target"},
	} {
		cmp := &bench.Comparison{Capacity: []*bench.CapacityResult{res("RANDOM", tt.rnd), res("PREFIX_AWARE", tt.pa)}}
		notes := strings.Join(capacityNotes(cmp), "\n")
		if !strings.Contains(notes, tt.want) {
			t.Errorf("PREFIX_AWARE %g vs RANDOM %g: notes %q, want %q", tt.pa, tt.rnd, notes, tt.want)
		}
	}
	if n := capacityNotes(&bench.Comparison{}); n != nil {
		t.Errorf("no search, notes %q", n)
	}
}
