package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Capacity (issue 22). Below a fleet's capacity every routing strategy
// finishes the same requests, so throughput at a fixed offered rate says
// nothing about what cache hits buy: cached prompts skip prefill, and the
// gain shows as a higher rate the same fleet sustains within a latency
// target. Capacity searches for that rate (or, in a closed loop, the
// number of requests in flight), one run per step: the load grows
// geometrically while the target holds, then bisects between the last load
// that held and the first that did not.
//
// Throughput and goodput are measured over the run's busy window, from the
// first measured send to the last (busyWindow), not until the last answer:
// the drain after the last send lasts as long as the run's longest answer
// (2,048 output tokens, about 30 s of decode in the demo), whatever the
// fleet, so counting it capped every step at N / (N/rate + drain) and
// measured the run's length, not the fleet (issue 22).

// CapacityOptions configure a search.
type CapacityOptions struct {
	// Run is the run at each step; the search sets its Rate. Set
	// ResetPrefixCache and a Warmup so that each step starts alike.
	Run Options
	// TargetP90 is the latency target: TTFT p90 (in server time) at most
	// this. Zero means DefaultCapacityTarget.
	TargetP90 time.Duration
	// MinSuccess is the success rate a step must also reach (0: 0.99).
	MinSuccess float64
	// StartRate is the first offered rate (requests/s, server time);
	// MaxRate bounds the search (0: 64 × StartRate).
	StartRate, MaxRate float64
	// StartConcurrency, if set, searches a closed loop instead of a
	// rate: each step keeps that many requests in flight (Run.Rate 0,
	// Run.Concurrency the step's), as the seed's fixed-concurrency
	// comparison did, from StartConcurrency up to MaxConcurrency (0: 64 ×
	// StartConcurrency). A closed loop cannot be offered more than the
	// fleet finishes, so a short run measures the fleet, not a backlog;
	// StartRate and MaxRate are then unused.
	StartConcurrency, MaxConcurrency int
	// Growth multiplies the rate after a step that held (0: 1.5).
	Growth float64
	// Refine is the number of bisection steps after the first step that
	// failed (0: 3; negative: none).
	Refine int
	// Progress receives a line per step; nil discards.
	Progress io.Writer

	run func(context.Context, Options) (*Result, error) // Run; tests replace it
}

// DefaultCapacityTarget is the latency target when none is given: TTFT p90
// of 2 s, an interactive chat's patience.
const DefaultCapacityTarget = 2 * time.Second

// CapacityStep is one run of the search.
// Throughput and Goodput are over the busy window (busyWindow);
// RunThroughput is over the whole measured run, drain included, for
// comparison with earlier reports.
type CapacityStep struct {
	Rate float64 `json:"rate"`
	// Concurrency is the closed loop's requests in flight (0: open loop).
	Concurrency   int     `json:"concurrency,omitempty"`
	TTFTP50Ms     float64 `json:"ttft_p50_ms"`
	TTFTP90Ms     float64 `json:"ttft_p90_ms"`
	Throughput    float64 `json:"throughput_rps"`
	Goodput       float64 `json:"goodput_rps"`
	RunThroughput float64 `json:"run_throughput_rps"`
	SuccessRate   float64 `json:"success_rate"`
	HitRate       float64 `json:"hit_rate"`
	// PromptTokens and OutputTokens are the mean per successful request
	// (from the answers' usage), for the service-time model (CacheCeiling).
	PromptTokens float64 `json:"prompt_tokens,omitempty"`
	OutputTokens float64 `json:"output_tokens,omitempty"`
	// InFlight is the mean number of requests in flight: the closed loop's
	// concurrency, or an open loop's throughput × mean E2E (Little's law).
	InFlight float64 `json:"in_flight,omitempty"`
	Held     bool    `json:"held"`
}

// CapacityResult is a search's outcome for one fleet and strategy.
type CapacityResult struct {
	Label       string  `json:"label"`
	Preset      string  `json:"preset"`
	TargetP90Ms float64 `json:"target_p90_ms"`
	// Instances is the fleet's size as the runs saw it (0: unknown).
	Instances int `json:"instances,omitempty"`
	// LoadAverage is the machine's load average (1, 5 and 15 minutes) at
	// the search's start and end, where the system reports it: with the
	// simulator's time scale, a busy machine's delays in the client and
	// router count many times over.
	LoadAverage [2]string      `json:"load_average,omitzero"`
	Steps       []CapacityStep `json:"steps"`
	// Rate is the highest offered rate at which the target held (0: none
	// did; in a closed loop, Concurrency is the highest concurrency),
	// Goodput the requests per second that met the TTFT target there, and
	// Step its index in Steps (-1: none).
	Rate        float64 `json:"rate"`
	Concurrency int     `json:"concurrency,omitempty"`
	Goodput     float64 `json:"goodput_rps"`
	Step        int     `json:"step"`
	// Bounded is true when the search stopped at MaxRate with the target
	// still holding: the capacity is at least Rate.
	Bounded bool `json:"bounded,omitempty"`
	// BestGoodput is the most requests per second that met the target in
	// any step that held, and BestStep its index in Steps. An open-loop run
	// of a few hundred requests offered above what the fleet finishes can
	// still hold the TTFT target (prefill goes first, decode slows, the run
	// ends before the backlog shows), so the offered rate overstates
	// capacity; goodput does not.
	BestGoodput float64 `json:"best_goodput_rps"`
	BestRate    float64 `json:"best_goodput_rate"`
	BestStep    int     `json:"best_goodput_step"`
}

// closed reports whether the search ran a closed loop.
func (c *CapacityResult) closed() bool {
	return c.Concurrency > 0 || len(c.Steps) > 0 && c.Steps[0].Concurrency > 0
}

// x is the step's load as a number: its rate or its concurrency.
func (s CapacityStep) x() float64 {
	if s.Concurrency > 0 {
		return float64(s.Concurrency)
	}
	return s.Rate
}

// Load names a step's load: "23.6 req/s" or "48 in flight".
func (s CapacityStep) Load() string {
	if s.Concurrency > 0 {
		return fmt.Sprintf("%d in flight", s.Concurrency)
	}
	return fmt.Sprintf("%.3g req/s", s.Rate)
}

func (o *CapacityOptions) withDefaults() error {
	o.TargetP90 = cmp.Or(o.TargetP90, DefaultCapacityTarget)
	o.MinSuccess = cmp.Or(o.MinSuccess, 0.99)
	o.Growth = cmp.Or(o.Growth, 1.5)
	o.Refine = cmp.Or(o.Refine, 3)
	o.MaxRate = cmp.Or(o.MaxRate, 64*o.StartRate)
	o.MaxConcurrency = cmp.Or(o.MaxConcurrency, 64*o.StartConcurrency)
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.run == nil {
		o.run = Run
	}
	switch {
	case o.TargetP90 < 0, o.MinSuccess < 0, o.MinSuccess > 1:
		return fmt.Errorf("bench: capacity: target %v and success rate %g must be positive (success at most 1)", o.TargetP90, o.MinSuccess)
	case o.StartConcurrency < 0 || o.MaxConcurrency < o.StartConcurrency:
		return fmt.Errorf("bench: capacity: start concurrency %d must not be negative and at most the max concurrency %d", o.StartConcurrency, o.MaxConcurrency)
	case o.StartConcurrency == 0 && (!(o.StartRate > 0) || o.MaxRate < o.StartRate):
		return fmt.Errorf("bench: capacity: start rate %g must be positive and at most the max rate %g", o.StartRate, o.MaxRate)
	case !(o.Growth > 1):
		return fmt.Errorf("bench: capacity: growth %g must exceed 1", o.Growth)
	}
	return nil
}

// Capacity runs the search. A step whose run fails outright (not a
// request: the run) ends the search with that error and the steps so far.
func Capacity(ctx context.Context, o CapacityOptions) (*CapacityResult, error) {
	if err := o.withDefaults(); err != nil {
		return nil, err
	}
	res := &CapacityResult{Label: o.Run.Label, Preset: o.Run.Preset, TargetP90Ms: ms(o.TargetP90), Step: -1, BestStep: -1}
	res.LoadAverage[0] = loadAverage()
	defer func() { res.LoadAverage[1] = loadAverage() }()
	closed := o.StartConcurrency > 0
	// The load x is a rate, or a concurrency (a whole number) in a closed
	// loop.
	start, limit := o.StartRate, o.MaxRate
	grow := func(x float64) float64 { return math.Min(x*o.Growth, limit) }
	mid := func(lo, hi float64) float64 { return math.Sqrt(lo * hi) }
	if closed {
		start, limit = float64(o.StartConcurrency), float64(o.MaxConcurrency)
		grow = func(x float64) float64 { return math.Min(math.Max(math.Ceil(x*o.Growth), x+1), limit) }
		mid = func(lo, hi float64) float64 { return math.Round(math.Sqrt(lo * hi)) }
	}
	highest := 0.0 // the highest load that held
	step := func(x float64) (bool, error) {
		run := o.Run
		run.Rate, run.Progress = x, nil
		if closed {
			run.Rate, run.Concurrency = 0, int(x)
		}
		r, err := o.run(ctx, run)
		if err != nil {
			return false, fmt.Errorf("bench: capacity step at %s: %w", CapacityStep{Rate: run.Rate, Concurrency: run.Concurrency}.Load(), err)
		}
		s := capacityStep(r, run.Rate, run.Concurrency, o.TargetP90, o.MinSuccess)
		res.Steps = append(res.Steps, s)
		res.Instances = cmp.Or(res.Instances, r.Regime.Instances)
		fmt.Fprintf(o.Progress, "capacity %s %s: %s: TTFT p90 %.0f ms, goodput %.3g req/s (throughput %.3g), success %.1f%% → %s\n",
			res.Label, res.Preset, s.Load(), s.TTFTP90Ms, s.Goodput, s.Throughput, 100*s.SuccessRate, map[bool]string{true: "held", false: "missed"}[s.Held])
		if s.Held && x >= highest {
			highest = x
			res.Rate, res.Concurrency, res.Goodput, res.Step = run.Rate, run.Concurrency, s.Goodput, len(res.Steps)-1
		}
		if s.Held && s.Goodput > res.BestGoodput {
			res.BestGoodput, res.BestRate, res.BestStep = s.Goodput, run.Rate, len(res.Steps)-1
		}
		return s.Held, nil
	}
	lo, hi := 0.0, 0.0
	for x := start; ; x = grow(x) {
		held, err := step(x)
		if err != nil {
			return res, err
		}
		if !held {
			hi = x
			break
		}
		lo = x
		if x >= limit {
			res.Bounded = true
			return res, nil
		}
	}
	if lo == 0 {
		return res, nil // even the start missed the target
	}
	for range max(o.Refine, 0) {
		m := mid(lo, hi)
		if m <= lo || m >= hi {
			break // a closed loop's concurrencies are adjacent
		}
		held, err := step(m)
		if err != nil {
			return res, err
		}
		if held {
			lo = m
		} else {
			hi = m
		}
	}
	return res, nil
}

// capacityStep judges one run against the target. In a closed loop the
// first concurrency requests are sent at once into an idle fleet (the
// warm-up has drained), a burst that steady operation never sees: the
// target is judged on the requests sent after them, each sent as an
// earlier one finished.
func capacityStep(r *Result, rate float64, concurrency int, target time.Duration, minSuccess float64) CapacityStep {
	s := CapacityStep{Rate: rate, Concurrency: concurrency, TTFTP50Ms: r.TTFT.P50, TTFTP90Ms: r.TTFT.P90, RunThroughput: r.ThroughputRPS,
		SuccessRate: r.SuccessRate, HitRate: r.UsageHitRate}
	if r.MetricsHitRate != nil {
		s.HitRate = *r.MetricsHitRate
	}
	if r.UsageRequests > 0 {
		s.PromptTokens = float64(r.UsagePromptTokens) / float64(r.UsageRequests)
	}
	if r.Succeeded > 0 {
		s.OutputTokens = r.OutputTokensPerSec * r.DurationSec / float64(r.Succeeded)
	}
	w := busyWindow(r.Samples, concurrency, target)
	s.Throughput, s.Goodput = w.Throughput, w.Goodput
	s.InFlight = s.Throughput * r.E2E.Mean / 1000
	if concurrency > 0 {
		s.TTFTP50Ms, s.TTFTP90Ms = w.TTFT.P50, w.TTFT.P90
		s.InFlight = float64(concurrency)
	}
	s.Held = r.Succeeded > 0 && s.TTFTP90Ms <= ms(target) && r.SuccessRate >= minSuccess
	return s
}

// Busy is a run's busy window: from its first measured send to its last.
type Busy struct {
	Sec float64
	// Completed is the requests that succeeded within the window;
	// Throughput is Completed per second.
	Completed  int
	Throughput float64
	// Attainment is the share of the judged requests (all of them, or in
	// a closed loop those sent after the first burst) that succeeded with
	// TTFT within the target; Goodput is Throughput × Attainment.
	Attainment float64
	Goodput    float64
	// TTFT is the judged requests' (successful ones).
	TTFT Quantiles
}

// busyWindow measures samples (times in server time) over the busy window.
// In a closed loop of c requests in flight every send after the first c
// answers a completion, so the window holds n − c completions at a
// constant load: its throughput is the fleet's at that concurrency,
// exactly. An open loop's window is its arrival span; the answers still in
// flight at its end are not counted, so below capacity its throughput is
// low by about the mean E2E over the span. Either way the drain after the
// last send, whose length is the run's longest answer, is left out.
func busyWindow(samples []Sample, c int, target time.Duration) Busy {
	var b Busy
	if len(samples) == 0 {
		return b
	}
	byStart := slices.Clone(samples)
	slices.SortStableFunc(byStart, func(x, y Sample) int { return cmp.Compare(x.StartMs, y.StartMs) })
	first, last := byStart[0].StartMs, byStart[len(byStart)-1].StartMs
	b.Sec = (last - first) / 1000
	for _, x := range byStart {
		if x.Error == "" && x.StartMs+x.E2EMs <= last {
			b.Completed++
		}
	}
	judged := byStart[min(c, len(byStart)-1):]
	var ttft []float64
	good := 0
	for _, x := range judged {
		if x.Error != "" {
			continue
		}
		ttft = append(ttft, x.TTFTMs)
		if x.TTFTMs > 0 && x.TTFTMs <= ms(target) {
			good++
		}
	}
	b.TTFT = quantiles(ttft)
	b.Attainment = fraction(good, len(judged))
	if b.Sec > 0 {
		b.Throughput = float64(b.Completed) / b.Sec
		b.Goodput = b.Throughput * b.Attainment
	}
	return b
}

// WriteTable writes the search's steps and its outcome.
func (c *CapacityResult) WriteTable(w io.Writer) error {
	if _, err := fmt.Fprintf(w, "capacity of %s on %s at TTFT p90 ≤ %.0f ms: ", c.Label, c.Preset, c.TargetP90Ms); err != nil {
		return err
	}
	switch {
	case c.Step < 0:
		fmt.Fprintln(w, "no load tried held the target")
	case c.Bounded:
		fmt.Fprintf(w, "at least %s (the search's cap), goodput %.3g req/s\n", c.Steps[c.Step].Load(), c.Goodput)
	default:
		fmt.Fprintf(w, "%s, goodput %.3g req/s; best goodput %.3g req/s at %s\n", c.Steps[c.Step].Load(), c.Goodput, c.BestGoodput, c.Steps[c.BestStep].Load())
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(capacityStepHeader[1:], "\t")+"\t")
	for _, row := range c.stepRows() {
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	return tw.Flush()
}

// ErrNoCapacity is returned by CapacityGain when a side has no rate that
// held the target.
var ErrNoCapacity = errors.New("bench: no rate held the latency target")

// CapacityGain is a's best goodput within the target over b's: the
// throughput gain at an equal latency target (the seed benchmark's "+16 %
// throughput"). Goodput, not the offered rate (see BestGoodput).
func CapacityGain(a, b *CapacityResult) (float64, error) {
	if a == nil || b == nil || a.Step < 0 || b.Step < 0 || b.BestGoodput <= 0 {
		return 0, ErrNoCapacity
	}
	return a.BestGoodput / b.BestGoodput, nil
}

var (
	capacityHeader     = []string{"strategy", "preset", "target TTFT p90 ms", "highest load held", "goodput there req/s", "TTFT p90 there ms", "hit rate there", "best goodput req/s", "at", "hit rate at best", "steps"}
	capacityStepHeader = []string{"strategy", "step", "load", "TTFT p50 ms", "TTFT p90 ms", "throughput req/s", "goodput req/s", "whole-run req/s", "success", "hit rate", "target"}
)

func (c *Comparison) capacityRows() [][]string {
	var rows [][]string
	for _, r := range c.Capacity {
		row := []string{r.Label, r.Preset, fmt.Sprintf("%.0f", r.TargetP90Ms), "none held", "-", "-", "-", "-", "-", "-", fmt.Sprint(len(r.Steps))}
		if r.Step >= 0 {
			s, best := r.Steps[r.Step], r.Steps[r.BestStep]
			row[3] = s.Load()
			if r.Bounded {
				row[3] = "≥ " + row[3]
			}
			row[4], row[5], row[6] = fmt.Sprintf("%.3g", r.Goodput), fmt.Sprintf("%.0f", s.TTFTP90Ms), pct(s.HitRate)
			row[7], row[8], row[9] = fmt.Sprintf("%.3g", r.BestGoodput), best.Load(), pct(best.HitRate)
		}
		rows = append(rows, row)
	}
	return rows
}

// stepRows are the search's steps under capacityStepHeader, less the
// strategy.
func (c *CapacityResult) stepRows() [][]string {
	var rows [][]string
	for i, s := range c.Steps {
		rows = append(rows, []string{fmt.Sprint(i + 1), s.Load(), fmt.Sprintf("%.1f", s.TTFTP50Ms), fmt.Sprintf("%.1f", s.TTFTP90Ms),
			fmt.Sprintf("%.3g", s.Throughput), fmt.Sprintf("%.3g", s.Goodput), fmt.Sprintf("%.3g", s.RunThroughput),
			pct(s.SuccessRate), pct(s.HitRate), map[bool]string{true: "held", false: "missed"}[s.Held]})
	}
	return rows
}

func (c *Comparison) capacitySteps() [][]string {
	var rows [][]string
	for _, r := range c.Capacity {
		for _, row := range r.stepRows() {
			rows = append(rows, append([]string{r.Label}, row...))
		}
	}
	return rows
}

func (c *Comparison) capacityMarkdown(b *strings.Builder) {
	rows := c.capacityRows()
	if len(rows) == 0 {
		return
	}
	mdTable := func(header []string, rows [][]string) {
		b.WriteString("| " + strings.Join(header, " | ") + " |\n|---" + strings.Repeat("|--:", len(header)-1) + "|\n")
		for _, r := range rows {
			cells := make([]string, len(r))
			for i, c := range r {
				cells[i] = mdEscape(c)
			}
			b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
		}
	}
	b.WriteString("\n## Capacity at the latency target\n\n")
	b.WriteString("The highest load (offered rate, or requests in flight in a closed loop) at which TTFT p90 stayed within the target " +
		"(and 99 % of requests succeeded), and the best goodput of the steps that held: requests per second that met the target, " +
		"measured from the first measured send to the last (the busy window), so that the drain after the last send, as long as the run's " +
		"longest answer whatever the fleet, does not count (\"whole-run req/s\" counts it). In a closed loop the target is judged on the requests " +
		"sent after the first burst. The load grows ×1.5 while the target holds, then bisects between the last load that held and the first that did not.\n\n")
	mdTable(capacityHeader, rows)
	b.WriteString("\n### The search's steps\n\n")
	mdTable(capacityStepHeader, c.capacitySteps())
}

// capChart plots each search's TTFT p90 against the offered rate, both on
// log axes, with the target as a dashed line.
type capChart struct {
	XLabel         string
	Lines          []svgLine
	XTicks, YTicks []svgTick
	TargetY        float64
}

func (c *Comparison) capacityChart(colors []string) *capChart {
	if len(c.Capacity) == 0 {
		return nil
	}
	xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, r := range c.Capacity {
		ylo, yhi = math.Min(ylo, r.TargetP90Ms), math.Max(yhi, r.TargetP90Ms)
		for _, s := range r.Steps {
			xlo, xhi = math.Min(xlo, s.x()), math.Max(xhi, s.x())
			if s.TTFTP90Ms > 0 {
				ylo, yhi = math.Min(ylo, s.TTFTP90Ms), math.Max(yhi, s.TTFTP90Ms)
			}
		}
	}
	if math.IsInf(xlo, 1) {
		return nil
	}
	lx, hx := math.Log10(xlo)-0.05, math.Log10(xhi)+0.05
	ly, hy := math.Log10(ylo)-0.1, math.Log10(yhi)+0.1
	x := func(v float64) float64 { return padL + (math.Log10(v)-lx)/(hx-lx)*(chartW-padR-padL) }
	y := func(v float64) float64 {
		return chartH - padB - (math.Log10(math.Max(v, ylo))-ly)/(hy-ly)*(chartH-padB-padT)
	}
	ch := &capChart{TargetY: round1(y(c.Capacity[0].TargetP90Ms)), XLabel: "offered rate (req/s, log scale)"}
	if c.Capacity[0].closed() {
		ch.XLabel = "requests in flight (log scale)"
	}
	for i, r := range c.Capacity {
		steps := append([]CapacityStep(nil), r.Steps...)
		sort.Slice(steps, func(a, b int) bool { return steps[a].x() < steps[b].x() })
		var path strings.Builder
		for j, s := range steps {
			cmd := "L"
			if j == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&path, "%s%.1f,%.1f ", cmd, x(s.x()), y(s.TTFTP90Ms))
		}
		ch.Lines = append(ch.Lines, svgLine{Label: r.Label, Color: colors[i%len(colors)], Path: strings.TrimSpace(path.String()), N: len(steps)})
	}
	for _, v := range []float64{1, 2, 5, 10, 20, 50, 100, 200, 500} {
		if v >= xlo*0.9 && v <= xhi*1.1 {
			ch.XTicks = append(ch.XTicks, svgTick{X: round1(x(v)), Y: chartH - padB, Label: trimFloat(v)})
		}
	}
	for _, v := range []float64{10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000} {
		if v >= ylo*0.8 && v <= yhi*1.25 {
			ch.YTicks = append(ch.YTicks, svgTick{X: padL, Y: round1(y(v)), Label: trimFloat(v)})
		}
	}
	return ch
}

// loadAverage is /proc/loadavg's 1, 5 and 15 minute figures, or "" where
// there is none.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return ""
}
