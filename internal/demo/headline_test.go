package demo

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

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
	prof, err := sim.LookupProfile(sim.ProfileH200Llama8BRoofline)
	if err != nil {
		t.Fatal(err)
	}
	res := func(label string, goodput, hit float64) *bench.CapacityResult {
		c := &bench.CapacityResult{Label: label, Preset: "shared-8k-seed", TargetP90Ms: 2000, Instances: 7, Step: -1, BestStep: -1,
			LoadAverage: [2]string{"0.50 0.40 0.30", "0.90 0.60 0.35"}}
		if goodput > 0 {
			c.Step, c.BestStep, c.Concurrency, c.Goodput, c.BestGoodput = 0, 0, 21, goodput, goodput
			c.Steps = []bench.CapacityStep{{Concurrency: 21, InFlight: 21, Held: true, Goodput: goodput, Throughput: goodput,
				HitRate: hit, PromptTokens: 8182, OutputTokens: 217}}
		}
		return c
	}
	for _, tt := range []struct {
		pa, rnd float64
		want    []string
	}{
		{12, 10, []string{"meets: the seed's throughput gain of +16 %: +20 %", "PREFIX_AWARE's best goodput 12 req/s (at 21 in flight, hit rate 83.0%)",
			"RANDOM 0.50 0.40 0.30 → 0.90 0.60 0.35"}},
		// 21 in flight over 7 instances: 3 per instance. Prefill 260 ms on
		// a miss, 9.6 ms on a hit; decode 217 × (5.461 ms / 3 + 8,290.5 ×
		// 36.4 ns) = 460.5 ms. RANDOM (28 % of tokens: 28.6 % of requests
		// hit) 188.3 + 460.5 = 648.8 ms, 29 % of it prefill; PREFIX_AWARE
		// (83 %: 84.9 % hit) 47.5 + 460.5 = 508 ms: 1.28×.
		{11, 10, []string{"SHORT: the seed's throughput gain of +16 %: +10 %", "260 ms of prefill on a miss and 10 ms on a hit",
			"461 ms at RANDOM's 3.0 requests in flight per instance", "Prefill is 29% of RANDOM's service time (649 ms at its hit rate of 28.0%)",
			"a ceiling of 1.28×", "the goodput gain 1.10×"}},
		{11, 0, []string{"no rate held the latency target"}},
	} {
		cmp := &bench.Comparison{Capacity: []*bench.CapacityResult{res("RANDOM", tt.rnd, 0.28), res("PREFIX_AWARE", tt.pa, 0.83)}}
		notes := strings.Join(capacityNotes(cmp, prof), "\n")
		for _, want := range tt.want {
			if !strings.Contains(notes, want) {
				t.Errorf("PREFIX_AWARE %g vs RANDOM %g: notes lack %q:\n%s", tt.pa, tt.rnd, want, notes)
			}
		}
	}
	// Equal concurrency: two loads both searches ran, one only RANDOM ran.
	rnd, pa := res("RANDOM", 10, 0.28), res("PREFIX_AWARE", 12, 0.83)
	step := func(c int, thr, hit float64) bench.CapacityStep {
		return bench.CapacityStep{Concurrency: c, InFlight: float64(c), Throughput: thr, HitRate: hit, PromptTokens: 8182, OutputTokens: 217}
	}
	rnd.Steps = append(rnd.Steps, step(7, 4, 0.28), step(35, 12, 0.28))
	pa.Steps = append(pa.Steps, step(7, 4.6, 0.83))
	notes := strings.Join(capacityNotes(&bench.Comparison{Capacity: []*bench.CapacityResult{rnd, pa}}, prof), "\n")
	// At 1 request per instance: decode 217 × 5.763 ms = 1,250.6 ms; RANDOM
	// 188.3 + 1,250.6 = 1,438.9 ms, PREFIX_AWARE 47.5 + 1,250.6 = 1,298.1:
	// 1.11×. At 21 in flight, 1.28× (above).
	if want := "7: 1.15× (model 1.11×), 21: 1.20× (model 1.28×)."; !strings.Contains(notes, want) {
		t.Errorf("notes lack %q:\n%s", want, notes)
	}
	if strings.Contains(notes, "BUSY") {
		t.Errorf("a load of 0.9 called busy:\n%s", notes)
	}
	pa.LoadAverage[1] = fmt.Sprintf("%d.5 1.0 1.0", runtime.NumCPU()) // above the CPUs at the end of one search
	notes = strings.Join(capacityNotes(&bench.Comparison{Capacity: []*bench.CapacityResult{rnd, pa}}, prof), "\n")
	if want := fmt.Sprintf("BUSY: a 1-minute load of %d.5 on %d CPUs", runtime.NumCPU(), runtime.NumCPU()); !strings.Contains(notes, want) {
		t.Errorf("notes lack %q:\n%s", want, notes)
	}
	if maxLoad([]string{"", "x y z", "0.5 9 9"}) != 0.5 {
		t.Error("maxLoad must read the 1-minute figures and skip unreadable ones")
	}
	if n := capacityNotes(&bench.Comparison{}, prof); n != nil {
		t.Errorf("no search, notes %q", n)
	}
}

// TestServiceModel checks the model against the profile's own step costs.
func TestServiceModel(t *testing.T) {
	prof, err := sim.LookupProfile(sim.ProfileH200Llama8BRoofline)
	if err != nil {
		t.Fatal(err)
	}
	const prompt, output, doc = 8176, 200, 8000
	for _, batch := range []int{1, 4, 32} {
		m := newServiceModel(prof, prompt, output, doc, float64(batch))
		// One request's share of output decode steps of batch sequences,
		// each at the mean context.
		want := time.Duration(output) * prof.DecodeDuration(batch, prompt+output/2) / time.Duration(batch)
		if d := m.Decode - want; d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("batch %d: decode %v, want %v", batch, m.Decode, want)
		}
		if m.MissPrefill != prof.PrefillDuration(prompt, 0) || m.HitPrefill != prof.PrefillDuration(prompt, doc) {
			t.Errorf("batch %d: prefill %v / %v", batch, m.MissPrefill, m.HitPrefill)
		}
		miss, missShare := m.Service(0)
		if miss != m.MissPrefill+m.Decode || math.Abs(missShare-float64(m.MissPrefill)/float64(miss)) > 1e-9 {
			t.Errorf("batch %d: at no hit %v (prefill %.3f)", batch, miss, missShare)
		}
		// A token hit rate of doc/prompt is every request hitting.
		all, _ := m.Service(float64(doc) / prompt)
		if d := all - (m.HitPrefill + m.Decode); d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("batch %d: every request hitting %v, want %v", batch, all, m.HitPrefill+m.Decode)
		}
		if over, _ := m.Service(1); over != all {
			t.Errorf("batch %d: a hit rate past every request hitting gave %v, want %v", batch, over, all)
		}
	}
	// More requests per instance share the weight reads: decode per request
	// falls, so prefill (what a hit saves) weighs more.
	small, large := newServiceModel(prof, prompt, output, doc, 1), newServiceModel(prof, prompt, output, doc, 32)
	_, s1 := small.Service(0.3)
	_, s32 := large.Service(0.3)
	if !(large.Decode < small.Decode && s32 > s1) {
		t.Errorf("batch 1: decode %v, prefill share %.2f; batch 32: %v, %.2f", small.Decode, s1, large.Decode, s32)
	}
}
