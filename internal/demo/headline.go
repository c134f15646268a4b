package demo

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/bench"
	"github.com/prefixrouter/prefixrouter/internal/sim"
)

// The seed benchmark's headline (SageMaker's long-context benchmark, 8,000-token
// shared prefixes) and the balance it reported with equally popular documents.
const (
	targetP50Cut      = 0.77
	targetP90Cut      = 0.33
	targetHitRate     = 0.80
	targetHitVsOracle = 0.90
	// targetThroughput is the seed's throughput gain of PREFIX_AWARE over
	// RANDOM (+16 %), read here as the gain in the rate a fleet sustains
	// within a latency target.
	targetThroughput = 1.16
	shareLow         = 0.130
	shareHigh        = 0.156
)

// headline compares PREFIX_AWARE with RANDOM per workload against the seed's
// figures, and says why where a figure falls short, from the measurements
// and the simulator's cost model rather than from prose written in advance.
func headline(cmp *bench.Comparison, prof sim.Profile) []string {
	notes := capacityNotes(cmp, prof)
	for _, preset := range cmp.Presets() {
		pa, rnd := runOf(cmp, preset, fleet.PrefixAware), runOf(cmp, preset, fleet.Random)
		if pa == nil || rnd == nil || rnd.TTFT.P50 <= 0 || rnd.TTFT.P90 <= 0 {
			continue
		}
		cut50 := 1 - pa.TTFT.P50/rnd.TTFT.P50
		cut90 := 1 - pa.TTFT.P90/rnd.TTFT.P90
		hit, rndHit := hitRate(pa), hitRate(rnd)
		thr := 0.0
		if rnd.ThroughputRPS > 0 {
			thr = pa.ThroughputRPS / rnd.ThroughputRPS
		}
		line := fmt.Sprintf("`%s`, PREFIX_AWARE vs RANDOM: P50 TTFT %s, P90 TTFT %s, KV hit rate %.1f%% (RANDOM %.1f%%, oracle %.1f%%), throughput %.2f×, success %.1f%%.",
			preset, change(cut50), change(cut90), 100*hit, 100*rndHit, 100*pa.Oracle.HitRate, thr, 100*pa.SuccessRate)
		notes = append(notes, line)
		fixed := runOfLabel(cmp, preset, FixedLabel)
		if fixed != nil {
			notes = append(notes, modeLine(preset, "PREFIX_AWARE (adaptive keys)", FixedLabel+" (k = 1)", pa, fixed))
		}
		if hot := runOfLabel(cmp, preset, HotLabel); hot != nil {
			notes = append(notes, modeLine(preset, "PREFIX_AWARE (adaptive keys)", HotLabel, pa, hot))
		}
		switch preset {
		case "shared-8k-seed":
			rh := hitRate(rnd)
			notes = append(notes, "  - "+verdict(rh >= 0.20 && rh <= 0.30, fmt.Sprintf("the seed's regime: RANDOM hit rate %.1f%% (20–30%%)", 100*rh)))
			notes = append(notes, sharedChecks(pa, rnd, cut50, cut90, hit, thr, prof)...)
		case "shared-8k":
			notes = append(notes, sharedChecks(pa, rnd, cut50, cut90, hit, thr, prof)...)
		case "shared-8k-uniform":
			notes = append(notes, shareCheck(pa))
		}
	}
	return notes
}

func sharedChecks(pa, rnd *bench.Result, cut50, cut90, hit, thr float64, prof sim.Profile) []string {
	vsOracle := 0.0
	if pa.Oracle.HitRate > 0 {
		vsOracle = hit / pa.Oracle.HitRate
	}
	checks := []string{
		verdict(cut50 >= targetP50Cut, fmt.Sprintf("P50 TTFT cut %.0f%% (seed: ≥ %.0f%%)", 100*cut50, 100*targetP50Cut)),
		verdict(cut90 >= targetP90Cut, fmt.Sprintf("P90 TTFT cut %.0f%% (seed: ≥ %.0f%%)", 100*cut90, 100*targetP90Cut)),
		verdict(hit >= targetHitRate && vsOracle >= targetHitVsOracle, fmt.Sprintf("KV hit rate %.1f%%, %.2f of the oracle (≥ 80%% and ≥ 0.9)", 100*hit, vsOracle)),
		verdict(thr >= 1, fmt.Sprintf("throughput %.2f× RANDOM's (≥ 1)", thr)),
		verdict(pa.SuccessRate == 1, fmt.Sprintf("success %.1f%% (100%%)", 100*pa.SuccessRate)),
	}
	var out []string
	for _, c := range checks {
		out = append(out, "  - "+c)
	}
	if cut50 >= targetP50Cut && cut90 >= targetP90Cut {
		return out
	}
	// Why: what a cached request costs in the cost model, against what it
	// measured; and how often RANDOM's requests were cache hits already.
	if p, err := bench.LookupPreset(pa.Preset); err == nil && pa.UsageRequests > 0 && p.DocumentTokens > 0 {
		prompt := int(pa.UsagePromptTokens / int64(pa.UsageRequests))
		doc := p.DocumentTokens / sim.BlockTokens * sim.BlockTokens
		hitCost, missCost := prof.PrefillDuration(prompt, min(doc, prompt)), prof.PrefillDuration(prompt, 0)
		out = append(out, fmt.Sprintf("  - why: a mean request here has %d prompt tokens; its prefill costs %s in the simulator's cost model when its document is cached and %s when not, "+
			"yet PREFIX_AWARE's P50 TTFT is %.0f ms: the rest is waiting for scheduler steps shared with other requests' prefills and decodes. "+
			"The profile's decode step grows with the context the batch holds (%s for 8 sequences of 2,048 tokens, %s for 64 of 4,096), "+
			"so a cached request on an instance busy with 8,000-token contexts still waits for long steps.",
			prompt, hitCost.Round(100*time.Microsecond), missCost.Round(100*time.Microsecond), pa.TTFT.P50,
			prof.DecodeDuration(8, 2048).Round(100*time.Microsecond), prof.DecodeDuration(64, 4096).Round(100*time.Microsecond)))
	}
	out = append(out, fmt.Sprintf("  - why: RANDOM's hit rate is %.1f%% here (the seed's baseline was about 25%%): with Zipf-popular documents and these caches, "+
		"RANDOM's median request is %s, which bounds how much its median can be cut.", 100*hitRate(rnd), medianKind(hitRate(rnd))))
	return out
}

// modeLine compares two PREFIX_AWARE modes on the same stream: hit rate,
// the largest instance's share, TTFT.
func modeLine(preset, aName, bName string, a, b *bench.Result) string {
	return fmt.Sprintf("`%s`, %s vs %s: KV hit rate %.1f%% vs %.1f%%, largest instance %.1f%% vs %.1f%% of requests (Gini %.3f vs %.3f), P50 TTFT %.0f vs %.0f ms, P90 %.0f vs %.0f ms.",
		preset, aName, bName, 100*hitRate(a), 100*hitRate(b), 100*a.Balance.MaxShare, 100*b.Balance.MaxShare,
		a.Balance.Gini, b.Balance.Gini, a.TTFT.P50, b.TTFT.P50, a.TTFT.P90, b.TTFT.P90)
}

func shareCheck(pa *bench.Result) string {
	lo, hi := 1.0, 0.0
	for _, is := range pa.Instances {
		lo, hi = min(lo, is.Share), max(hi, is.Share)
	}
	ok := len(pa.Instances) > 0 && lo >= shareLow && hi <= shareHigh
	return "  - " + verdict(ok, fmt.Sprintf("per-instance share %.1f–%.1f%% (equal documents; seed 13.3–15.4%%, accepted 13.0–15.6%%)", 100*lo, 100*hi))
}

func medianKind(rndHit float64) string {
	if rndHit > 0.5 {
		return "itself mostly served from cache"
	}
	return "a cache miss"
}

func verdict(ok bool, what string) string {
	if ok {
		return "meets: " + what
	}
	return "SHORT: " + what
}

func change(cut float64) string {
	if cut >= 0 {
		return fmt.Sprintf("−%.0f%%", 100*cut)
	}
	return fmt.Sprintf("+%.0f%%", -100*cut)
}

func hitRate(r *bench.Result) float64 {
	if r.MetricsHitRate != nil {
		return *r.MetricsHitRate
	}
	return r.UsageHitRate
}

func runOf(cmp *bench.Comparison, preset string, st fleet.Strategy) *bench.Result {
	return runOfLabel(cmp, preset, string(st))
}

func runOfLabel(cmp *bench.Comparison, preset, label string) *bench.Result {
	for _, r := range cmp.Runs {
		if r.Preset == preset && r.Label == label {
			return r
		}
	}
	return nil
}

// capacityNotes compares the capacity searches: PREFIX_AWARE's best
// goodput within the target against RANDOM's, beside the seed's +16 %, and
// what the simulator's cost model says cache hits can buy at those points.
func capacityNotes(cmp *bench.Comparison, prof sim.Profile) []string {
	var pa, rnd *bench.CapacityResult
	for _, c := range cmp.Capacity {
		switch fleet.Strategy(c.Label) {
		case fleet.PrefixAware:
			pa = c
		case fleet.Random:
			rnd = c
		}
	}
	if pa == nil || rnd == nil {
		return nil
	}
	gain, err := bench.CapacityGain(pa, rnd)
	if err != nil {
		return []string{fmt.Sprintf("Capacity on `%s` at TTFT p90 ≤ %.0f ms: %v (PREFIX_AWARE %d steps, RANDOM %d).", pa.Preset, pa.TargetP90Ms, err, len(pa.Steps), len(rnd.Steps))}
	}
	ps, rs := pa.Steps[pa.BestStep], rnd.Steps[rnd.BestStep]
	line := fmt.Sprintf("Capacity on `%s` at TTFT p90 ≤ %.0f ms: PREFIX_AWARE's best goodput %.3g req/s (at %s, hit rate %.1f%%), RANDOM's %.3g req/s (at %s, hit rate %.1f%%): %.2f× the goodput at the same latency target.",
		pa.Preset, pa.TargetP90Ms, pa.BestGoodput, ps.Load(), 100*ps.HitRate, rnd.BestGoodput, rs.Load(), 100*rs.HitRate, gain)
	if pa.Bounded {
		line += " PREFIX_AWARE's search stopped at its cap still holding: its capacity is at least that."
	}
	notes := []string{line, "  - " + verdict(gain >= targetThroughput, fmt.Sprintf("the seed's throughput gain of +16 %%: %+.0f %%", 100*(gain-1)))}
	if why := ceilingNote(pa, rnd, prof); why != "" {
		notes = append(notes, "  - why: "+why)
	}
	if eq := equalLoadNote(pa, rnd, prof); eq != "" {
		notes = append(notes, "  - "+eq)
	}
	if pa.LoadAverage[0] != "" && rnd.LoadAverage[0] != "" {
		line := fmt.Sprintf("  - the machine's load average (1, 5, 15 min) over the searches: RANDOM %s → %s, PREFIX_AWARE %s → %s; "+
			"the servers run faster than real time, so a busy machine's delays in the client and router count that many times over.",
			rnd.LoadAverage[0], rnd.LoadAverage[1], pa.LoadAverage[0], pa.LoadAverage[1])
		if busiest := maxLoad(rnd.LoadAverage[:], pa.LoadAverage[:]); busiest > float64(runtime.NumCPU()) {
			line += fmt.Sprintf(" BUSY: a 1-minute load of %.1f on %d CPUs: the machine's delays may have moved these capacity figures "+
				"(docs/benchmarks.md: rerun on a quiet machine, or with a lower --time-scale).", busiest, runtime.NumCPU())
		}
		notes = append(notes, line)
	}
	return notes
}

// ceilingNote explains the measured gain with the cost model at the best
// steps' own lengths, hit rates and requests in flight per instance.
func ceilingNote(pa, rnd *bench.CapacityResult, prof sim.Profile) string {
	ps, rs := pa.Steps[pa.BestStep], rnd.Steps[rnd.BestStep]
	n := float64(cmp.Or(rnd.Instances, pa.Instances))
	p, err := bench.LookupPreset(rnd.Preset)
	if err != nil || n == 0 || p.DocumentTokens == 0 || rs.PromptTokens == 0 || ps.PromptTokens == 0 || rs.InFlight == 0 || ps.InFlight == 0 {
		return ""
	}
	doc := p.DocumentTokens / sim.BlockTokens * sim.BlockTokens
	rm := newServiceModel(prof, rs.PromptTokens, rs.OutputTokens, doc, rs.InFlight/n)
	pm := newServiceModel(prof, ps.PromptTokens, ps.OutputTokens, doc, ps.InFlight/n)
	rSvc, rShare := rm.Service(rs.HitRate)
	pSvc, pShare := pm.Service(ps.HitRate)
	sameBatch, _ := rm.Service(ps.HitRate)
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/1e6) }
	return fmt.Sprintf("in the simulator's cost model a request here (%.0f prompt tokens, %.0f output) costs an instance %s of prefill on a miss and %s on a hit; "+
		"its share of the decode steps is %s at RANDOM's %.1f requests in flight per instance (a step reads the weights once for the whole batch, so few requests per instance make decode dear) "+
		"and %s at PREFIX_AWARE's %.1f. Prefill is %.0f%% of RANDOM's service time (%s at its hit rate of %.1f%%) and %.0f%% of PREFIX_AWARE's (%s at %.1f%%). "+
		"A fleet kept busy finishes instances ÷ service time: %.3g vs %.3g req/s, a ceiling of %.2f× (%.2f× from the hit rates alone, at RANDOM's batch); "+
		"the measured throughputs there were %.3g vs %.3g req/s and the goodput gain %.2f×.",
		rs.PromptTokens, rs.OutputTokens, ms(rm.MissPrefill), ms(rm.HitPrefill),
		ms(rm.Decode), rm.Batch, ms(pm.Decode), pm.Batch,
		100*rShare, ms(rSvc), 100*rs.HitRate, 100*pShare, ms(pSvc), 100*ps.HitRate,
		n/pSvc.Seconds(), n/rSvc.Seconds(), float64(rSvc)/float64(pSvc), float64(rSvc)/float64(sameBatch),
		ps.Throughput, rs.Throughput, pa.BestGoodput/rnd.BestGoodput)
}

// equalLoadNote compares the two searches' throughput at each closed-loop
// concurrency both ran (the seed's own comparison: a fixed number of
// requests in flight), with the cost model's ratio at that load beside
// it. It needs no latency judgement, so it is steadier than the best
// goodput, which a single slow step can move.
func equalLoadNote(pa, rnd *bench.CapacityResult, prof sim.Profile) string {
	n := float64(cmp.Or(rnd.Instances, pa.Instances))
	p, err := bench.LookupPreset(rnd.Preset)
	if err != nil || n == 0 || p.DocumentTokens == 0 {
		return ""
	}
	doc := p.DocumentTokens / sim.BlockTokens * sim.BlockTokens
	byC := map[int]bench.CapacityStep{}
	for _, s := range pa.Steps {
		if s.Concurrency > 0 {
			byC[s.Concurrency] = s
		}
	}
	var parts []string
	seen := map[int]bool{}
	steps := slices.Clone(rnd.Steps)
	slices.SortFunc(steps, func(a, b bench.CapacityStep) int { return a.Concurrency - b.Concurrency })
	for _, rs := range steps {
		ps, ok := byC[rs.Concurrency]
		if rs.Concurrency == 0 || !ok || seen[rs.Concurrency] || rs.Throughput <= 0 || rs.PromptTokens == 0 || ps.PromptTokens == 0 {
			continue
		}
		seen[rs.Concurrency] = true
		b := float64(rs.Concurrency) / n
		rSvc, _ := newServiceModel(prof, rs.PromptTokens, rs.OutputTokens, doc, b).Service(rs.HitRate)
		pSvc, _ := newServiceModel(prof, ps.PromptTokens, ps.OutputTokens, doc, b).Service(ps.HitRate)
		parts = append(parts, fmt.Sprintf("%d: %.2f× (model %.2f×)", rs.Concurrency, ps.Throughput/rs.Throughput, float64(rSvc)/float64(pSvc)))
	}
	if len(parts) == 0 {
		return ""
	}
	return "throughput at equal concurrency (requests in flight: PREFIX_AWARE's over RANDOM's, whether or not the target held): " + strings.Join(parts, ", ") + "."
}

// maxLoad is the highest 1-minute figure of the load averages given
// ("1.5 0.9 0.7"); unreadable ones count 0.
func maxLoad(lists ...[]string) float64 {
	var m float64
	for _, l := range lists {
		for _, la := range l {
			if f := strings.Fields(la); len(f) > 0 {
				if v, err := strconv.ParseFloat(f[0], 64); err == nil {
					m = max(m, v)
				}
			}
		}
	}
	return m
}
