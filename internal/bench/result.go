package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Sample is one measured request.
type Sample struct {
	Index  int    `json:"index"`
	Target string `json:"target"`
	// StartMs is when it was sent, from the run's start; DelayMs how late
	// that was against its scheduled arrival (the concurrency cap or a
	// session's previous turn held it back). Like TTFTMs and E2EMs, both
	// are in server time (wall time × the run's TimeScale).
	StartMs float64 `json:"start_ms"`
	DelayMs float64 `json:"delay_ms"`
	// TTFTMs is the time to the first non-empty content token; 0 if none.
	TTFTMs    float64 `json:"ttft_ms"`
	E2EMs     float64 `json:"e2e_ms"`
	Error     string  `json:"error,omitempty"`
	ErrorText string  `json:"error_text,omitempty"`
	Instance  string  `json:"instance,omitempty"`
	Decision  string  `json:"decision,omitempty"`
	// Token counts from the usage chunk (HasUsage false: none came).
	PromptTokens int  `json:"prompt_tokens"`
	CachedTokens int  `json:"cached_tokens"`
	OutputTokens int  `json:"output_tokens"`
	HasUsage     bool `json:"has_usage"`
	// The oracle's view of the same prompt.
	OraclePrompt int    `json:"oracle_prompt_tokens"`
	OracleCached int    `json:"oracle_cached_tokens"`
	Document     int    `json:"document"`
	Session      int    `json:"session"`
	Tenant       string `json:"tenant,omitempty"`
	Adapter      string `json:"adapter,omitempty"`
}

// Quantiles of a latency in milliseconds (nearest rank).
type Quantiles struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Mean float64 `json:"mean"`
	Max  float64 `json:"max"`
	N    int     `json:"n"`
}

func quantiles(v []float64) Quantiles {
	if len(v) == 0 {
		return Quantiles{}
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	return Quantiles{P50: rank(s, 0.50), P90: rank(s, 0.90), P99: rank(s, 0.99), Mean: sum / float64(len(s)), Max: s[len(s)-1], N: len(s)}
}

// rank is the nearest-rank percentile of sorted s.
func rank(s []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// InstanceShare is one serving instance's part of the measured requests.
type InstanceShare struct {
	Instance     string  `json:"instance"`
	Requests     int     `json:"requests"`
	Share        float64 `json:"share"`
	PromptTokens int64   `json:"prompt_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	HitRate      float64 `json:"hit_rate"`
}

// Balance is how evenly the measured requests spread over the instances.
type Balance struct {
	// Instances is the number counted: those that served a request, or the
	// fleet size when it is known and larger.
	Instances int `json:"instances"`
	// MaxShare is the largest instance's share and MaxOverMean that share
	// over the mean (1/Instances): 1 is perfectly even.
	MaxShare    float64 `json:"max_share"`
	MaxOverMean float64 `json:"max_over_mean"`
	// Gini is the Gini coefficient of the per-instance request counts: 0 is
	// perfectly even, (n-1)/n is everything on one instance.
	Gini float64 `json:"gini"`
}

// balanceOf summarises shares over n instances (n ≥ len(shares); the
// missing ones served nothing).
func balanceOf(shares []float64, n int) Balance {
	n = max(n, len(shares))
	if n == 0 {
		return Balance{}
	}
	xs := make([]float64, n)
	copy(xs, shares)
	sort.Float64s(xs)
	var sum, weighted float64
	for i, x := range xs {
		sum += x
		weighted += float64(i+1) * x
	}
	b := Balance{Instances: n, MaxShare: xs[n-1]}
	if sum > 0 {
		b.MaxOverMean = xs[n-1] / (sum / float64(n))
		// Sorted ascending: G = 2 Σ i·x_i / (n Σ x) − (n+1)/n.
		b.Gini = 2*weighted/(float64(n)*sum) - float64(n+1)/float64(n)
	}
	return b
}

// MetricsDelta is one /metrics URL's prefix-cache counters over the
// measured window (tokens).
type MetricsDelta struct {
	URL     string  `json:"url"`
	Hits    float64 `json:"hits"`
	Queries float64 `json:"queries"`
	HitRate float64 `json:"hit_rate"`
	// Evaluated is the prompt tokens a llama.cpp server evaluated (it
	// counts no hits nor queries; see probe.LlamaCppPromptTokens).
	Evaluated float64 `json:"evaluated,omitempty"`
}

// RegimeClass says where the working set sits against the KV capacities.
type RegimeClass string

// The regime classes, as reports print them.
const (
	RegimeUnknown    RegimeClass = "capacity unknown"
	RegimeFitsOne    RegimeClass = "fits one instance"
	RegimeFitsFleet  RegimeClass = "fits the fleet, not one instance"
	RegimeOverflows  RegimeClass = "exceeds the fleet"
	RegimeNoInstance RegimeClass = "no instances given"
)

// Regime states the working set against per-instance and fleet KV capacity.
type Regime struct {
	// WorkingSetTokens is the preset's working set times the tenants.
	WorkingSetTokens int64 `json:"working_set_tokens"`
	// StreamDistinctTokens is what the oracle cached over the whole run
	// (every distinct full block, unshared suffixes included).
	StreamDistinctTokens int64       `json:"stream_distinct_tokens"`
	InstanceKVTokens     int64       `json:"instance_kv_tokens"`
	Instances            int         `json:"instances"`
	FleetKVTokens        int64       `json:"fleet_kv_tokens"`
	Class                RegimeClass `json:"class"`
}

// classify places working set ws against one instance's capacity inst
// and the fleet's, fleet, over n instances.
func classify(ws, inst, fleet int64, n int) RegimeClass {
	switch {
	case inst <= 0:
		return RegimeUnknown
	case ws <= inst:
		return RegimeFitsOne
	case n <= 0:
		return RegimeNoInstance
	case ws <= fleet:
		return RegimeFitsFleet
	}
	return RegimeOverflows
}

// String is the one-line regime statement reports print.
func (g Regime) String() string {
	s := fmt.Sprintf("working set %s tokens (stream footprint %s)", tokens(g.WorkingSetTokens), tokens(g.StreamDistinctTokens))
	if g.InstanceKVTokens > 0 {
		s += fmt.Sprintf("; KV capacity %s per instance", tokens(g.InstanceKVTokens))
		if g.Instances > 0 {
			s += fmt.Sprintf(", %s over %d instances", tokens(g.FleetKVTokens), g.Instances)
		}
	}
	return s + ": " + string(g.Class)
}

func tokens(n int64) string {
	switch {
	case n >= 1_000_000:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	case n >= 10_000:
		return fmt.Sprintf("%.0fk", float64(n)/1e3)
	}
	return fmt.Sprintf("%d", n)
}

// OracleSummary is the unbounded single cache's result over the measured
// requests (warmup included in its cache).
type OracleSummary struct {
	PromptTokens int64   `json:"prompt_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	HitRate      float64 `json:"hit_rate"`
}

// Result is one run's summary. Rates are fractions in [0, 1]; latencies
// milliseconds. Optional figures are nil when unmeasured.
type Result struct {
	Label      string   `json:"label"`
	Preset     string   `json:"preset"`
	API        string   `json:"api"`
	Targets    []string `json:"targets"`
	Seed       int64    `json:"seed"`
	Rate       float64  `json:"rate"`
	Burstiness float64  `json:"burstiness,omitempty"`
	Tenants    int      `json:"tenants,omitempty"`
	AdapterMix float64  `json:"adapter_mix,omitempty"`
	Warmup     int      `json:"warmup"`
	// TimeScale is Config.TimeScale when it is not real time (0, omitted,
	// for real time): every duration and throughput of the result is then
	// in the servers' simulated time.
	TimeScale float64 `json:"time_scale,omitempty"`
	// DurationSec is the measured window: first measured arrival to the
	// last measured response.
	DurationSec float64 `json:"duration_sec"`

	Requests    int            `json:"requests"`
	Succeeded   int            `json:"succeeded"`
	Failed      int            `json:"failed"`
	Canceled    int            `json:"canceled"`
	SuccessRate float64        `json:"success_rate"`
	Errors      map[string]int `json:"errors,omitempty"`
	// ClientDelayed counts requests sent over 10 ms of wall-clock time
	// after their scheduled arrival (the open loop was not kept); with a
	// TimeScale k that is a DelayMs over 10·k.
	ClientDelayed int `json:"client_delayed"`

	TTFT               Quantiles `json:"ttft_ms"`
	E2E                Quantiles `json:"e2e_ms"`
	ThroughputRPS      float64   `json:"throughput_rps"`
	OutputTokensPerSec float64   `json:"output_tokens_per_sec"`

	// Usage-based hit rate: cached_tokens / prompt_tokens summed over the
	// successful requests that reported usage (UsageRequests of them).
	UsagePromptTokens int64   `json:"usage_prompt_tokens"`
	UsageCachedTokens int64   `json:"usage_cached_tokens"`
	UsageRequests     int     `json:"usage_requests"`
	UsageHitRate      float64 `json:"usage_hit_rate"`
	// Metrics-based hit rate over the measured window, all URLs summed.
	MetricsHitRate *float64       `json:"metrics_hit_rate,omitempty"`
	Metrics        []MetricsDelta `json:"metrics,omitempty"`
	MetricsErrors  []string       `json:"metrics_errors,omitempty"`

	Oracle OracleSummary `json:"oracle"`
	// UsageVsOracle and MetricsVsOracle are the hit rates over the
	// oracle's (nil when the oracle is 0 or the rate is unmeasured).
	UsageVsOracle   *float64 `json:"usage_vs_oracle,omitempty"`
	MetricsVsOracle *float64 `json:"metrics_vs_oracle,omitempty"`

	Instances []InstanceShare `json:"instances"`
	// Balance summarises Instances over the whole fleet (instances that
	// served nothing count as 0).
	Balance   Balance        `json:"balance"`
	Decisions map[string]int `json:"decisions,omitempty"`
	Regime    Regime         `json:"regime"`

	Interrupted bool     `json:"interrupted,omitempty"`
	Samples     []Sample `json:"samples,omitempty"`
}

func (r *runner) result(wallWindow time.Duration, before, after []scrape, metricsErrs []string) *Result {
	cfg := r.cfg
	r.mu.Lock()
	samples := append([]Sample(nil), r.samples...)
	r.mu.Unlock()
	sort.Slice(samples, func(i, j int) bool { return samples[i].Index < samples[j].Index })
	window := time.Duration(float64(wallWindow) * r.scale) // server time
	res := &Result{
		Label: cfg.Label, Preset: r.preset.Name, API: cfg.API, Targets: cfg.Targets, Seed: cfg.Seed,
		Rate: cfg.Rate, Burstiness: cfg.Burstiness, Tenants: cfg.Tenants, AdapterMix: cfg.AdapterMix,
		Warmup: cfg.Warmup, DurationSec: window.Seconds(), Samples: samples,
		TimeScale: timeScaleOf(r.scale),
		Errors:    map[string]int{}, Decisions: map[string]int{},
	}
	var ttft, e2e []float64
	var outTokens int64
	byInst := map[string]*InstanceShare{}
	withInst := 0
	for _, s := range samples {
		res.Requests++
		if s.DelayMs/r.scale > 10 { // wall time: a late client, whatever the servers' speed
			res.ClientDelayed++
		}
		switch s.Error {
		case "":
			res.Succeeded++
			ttft = append(ttft, s.TTFTMs)
			e2e = append(e2e, s.E2EMs)
			outTokens += int64(s.OutputTokens)
			if s.HasUsage {
				res.UsageRequests++
				res.UsagePromptTokens += int64(s.PromptTokens)
				res.UsageCachedTokens += int64(s.CachedTokens)
			}
		case ErrKindCanceled:
			res.Canceled++
			res.Errors[s.Error]++
		default:
			res.Failed++
			res.Errors[s.Error]++
		}
		if s.Decision != "" {
			res.Decisions[s.Decision]++
		}
		if s.Instance != "" {
			withInst++
			is := byInst[s.Instance]
			if is == nil {
				is = &InstanceShare{Instance: s.Instance}
				byInst[s.Instance] = is
			}
			is.Requests++
			if s.Error == "" && s.HasUsage {
				is.PromptTokens += int64(s.PromptTokens)
				is.CachedTokens += int64(s.CachedTokens)
			}
		}
		res.Oracle.PromptTokens += int64(s.OraclePrompt)
		res.Oracle.CachedTokens += int64(s.OracleCached)
	}
	res.SuccessRate = fraction(res.Succeeded, res.Succeeded+res.Failed)
	res.TTFT, res.E2E = quantiles(ttft), quantiles(e2e)
	if sec := window.Seconds(); sec > 0 {
		res.ThroughputRPS = float64(res.Succeeded) / sec
		res.OutputTokensPerSec = float64(outTokens) / sec
	}
	res.UsageHitRate = ratio(res.UsageCachedTokens, res.UsagePromptTokens)
	res.Oracle.HitRate = ratio(res.Oracle.CachedTokens, res.Oracle.PromptTokens)
	for _, is := range byInst {
		is.Share = fraction(is.Requests, withInst)
		is.HitRate = ratio(is.CachedTokens, is.PromptTokens)
		res.Instances = append(res.Instances, *is)
	}
	sort.Slice(res.Instances, func(i, j int) bool { return res.Instances[i].Instance < res.Instances[j].Instance })

	res.MetricsErrors = metricsErrs
	if len(before) == len(cfg.MetricsURLs) && len(after) == len(before) && len(metricsErrs) == 0 && len(before) > 0 {
		var hits, queries, evaluated float64
		llama := 0
		for i, u := range cfg.MetricsURLs {
			if after[i].evaluatedOnly {
				llama++
				d := MetricsDelta{URL: u, Evaluated: after[i].evaluated - before[i].evaluated}
				evaluated += d.Evaluated
				res.Metrics = append(res.Metrics, d)
				continue
			}
			d := MetricsDelta{URL: u, Hits: after[i].hits - before[i].hits, Queries: after[i].queries - before[i].queries}
			if d.Queries > 0 {
				d.HitRate = d.Hits / d.Queries
			}
			hits += d.Hits
			queries += d.Queries
			res.Metrics = append(res.Metrics, d)
		}
		switch {
		case llama == 0 && queries > 0:
			h := hits / queries
			res.MetricsHitRate = &h
		case llama == len(cfg.MetricsURLs) && res.UsagePromptTokens > 0 && res.UsageRequests == res.Succeeded && res.Failed == 0 && res.Canceled == 0:
			// The engines' word on what they evaluated against the prompt
			// tokens their answers reported: every answer must carry usage.
			h := max(1-evaluated/float64(res.UsagePromptTokens), 0)
			res.MetricsHitRate = &h
		}
	}
	if res.Oracle.HitRate > 0 {
		if res.UsageRequests > 0 {
			v := res.UsageHitRate / res.Oracle.HitRate
			res.UsageVsOracle = &v
		}
		if res.MetricsHitRate != nil {
			v := *res.MetricsHitRate / res.Oracle.HitRate
			res.MetricsVsOracle = &v
		}
	}

	g := Regime{
		WorkingSetTokens:     r.preset.WorkingSetTokens() * int64(max(cfg.Tenants, 1)),
		StreamDistinctTokens: r.oracle.DistinctTokens(),
		InstanceKVTokens:     cfg.InstanceKVTokens,
		Instances:            cfg.Instances,
	}
	if g.Instances == 0 {
		g.Instances = len(cfg.MetricsURLs)
	}
	g.FleetKVTokens = g.InstanceKVTokens * int64(g.Instances)
	if g.InstanceKVTokens == 0 {
		g.InstanceKVTokens = r.instanceKV
		g.FleetKVTokens = g.InstanceKVTokens * int64(g.Instances)
		if g.Instances == len(cfg.MetricsURLs) {
			// The instances read are the fleet: add up their real sizes.
			g.FleetKVTokens = r.fleetKV
		}
	}
	g.Class = classify(g.WorkingSetTokens, g.InstanceKVTokens, g.FleetKVTokens, g.Instances)
	res.Regime = g
	shares := make([]float64, len(res.Instances))
	for i, is := range res.Instances {
		shares[i] = is.Share
	}
	res.Balance = balanceOf(shares, g.Instances)
	// Empty collections are nil, so a result survives a JSON round trip
	// (omitempty) unchanged.
	if len(res.Errors) == 0 {
		res.Errors = nil
	}
	if len(res.Decisions) == 0 {
		res.Decisions = nil
	}
	if len(res.MetricsErrors) == 0 {
		res.MetricsErrors = nil
	}
	return res
}

func fraction(a, b int) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

func optPct(f *float64) string {
	if f == nil {
		return "-"
	}
	return pct(*f)
}

func optRatio(f *float64) string {
	if f == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f", *f)
}

// kv renders a map as "k=v k=v" in key order.
func kv(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

// Name is "label / preset", or the preset alone.
func (res *Result) Name() string {
	if res.Label == "" {
		return res.Preset
	}
	return res.Label + " / " + res.Preset
}

// timeScaleOf is the Result.TimeScale of a run at scale k: 0 for real time.
func timeScaleOf(k float64) float64 {
	if k == 1 {
		return 0
	}
	return k
}

// TimeScaleNote is "time scale k× (figures in simulated time)" for a run
// whose servers did not run in real time, else "".
func (res *Result) TimeScaleNote() string {
	if res.TimeScale == 0 || res.TimeScale == 1 {
		return ""
	}
	return fmt.Sprintf("time scale %s× (figures in simulated time)", strconv.FormatFloat(res.TimeScale, 'g', -1, 64))
}

// WriteTable writes an aligned text summary of the run.
func (res *Result) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, format string, a ...any) { fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, a...)...) }
	row("run", "%s (seed %d, %s API, %.3g req/s offered)", res.Name(), res.Seed, res.API, res.Rate)
	if n := res.TimeScaleNote(); n != "" {
		row("time", "%s", n)
	}
	row("requests", "%d measured (+%d warmup) over %.1f s; %d ok, %d failed, %d canceled; success %s",
		res.Requests, res.Warmup, res.DurationSec, res.Succeeded, res.Failed, res.Canceled, pct(res.SuccessRate))
	row("errors", "%s", kv(res.Errors))
	row("client-delayed", "%d requests sent >10 ms after their arrival time", res.ClientDelayed)
	row("TTFT ms", "p50 %.1f  p90 %.1f  p99 %.1f  mean %.1f", res.TTFT.P50, res.TTFT.P90, res.TTFT.P99, res.TTFT.Mean)
	row("E2E ms", "p50 %.1f  p90 %.1f  p99 %.1f  mean %.1f", res.E2E.P50, res.E2E.P90, res.E2E.P99, res.E2E.Mean)
	row("throughput", "%.2f req/s  %.0f output tok/s", res.ThroughputRPS, res.OutputTokensPerSec)
	row("KV hit rate", "metrics %s  usage %s  oracle %s", optPct(res.MetricsHitRate), pct(res.UsageHitRate), pct(res.Oracle.HitRate))
	row("hit / oracle", "metrics %s  usage %s", optRatio(res.MetricsVsOracle), optRatio(res.UsageVsOracle))
	for _, m := range res.Metrics {
		if m.Queries == 0 && m.Evaluated > 0 {
			row("  metrics", "%s  prompt tokens evaluated %.0f", m.URL, m.Evaluated)
			continue
		}
		row("  metrics", "%s  hits %.0f / queries %.0f = %s", m.URL, m.Hits, m.Queries, pct(m.HitRate))
	}
	for _, e := range res.MetricsErrors {
		row("  metrics error", "%s", e)
	}
	row("regime", "%s", res.Regime)
	for _, is := range res.Instances {
		row("  instance", "%s  %d requests (%s)  usage hit %s", is.Instance, is.Requests, pct(is.Share), pct(is.HitRate))
	}
	row("balance", "max share %s over %d instances, max/mean %.2f, Gini %.3f", pct(res.Balance.MaxShare), res.Balance.Instances, res.Balance.MaxOverMean, res.Balance.Gini)
	row("decisions", "%s", kv(res.Decisions))
	if res.Interrupted {
		row("note", "interrupted: partial result")
	}
	return tw.Flush()
}

// WriteJSON writes the result, samples included, as indented JSON.
func (res *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}
