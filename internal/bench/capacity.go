package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Capacity (issue 22). Below a fleet's capacity every routing strategy
// finishes the same requests, so throughput at a fixed offered rate says
// nothing about what cache hits buy: cached prompts skip prefill, and the
// gain shows as a higher rate the same fleet sustains within a latency
// target. Capacity searches for that rate, one run per step: the offered
// rate grows geometrically while the target holds, then bisects between
// the last rate that held and the first that did not.

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
type CapacityStep struct {
	Rate        float64 `json:"rate"`
	TTFTP50Ms   float64 `json:"ttft_p50_ms"`
	TTFTP90Ms   float64 `json:"ttft_p90_ms"`
	Throughput  float64 `json:"throughput_rps"`
	Goodput     float64 `json:"goodput_rps"`
	SuccessRate float64 `json:"success_rate"`
	HitRate     float64 `json:"hit_rate"`
	Held        bool    `json:"held"`
}

// CapacityResult is a search's outcome for one fleet and strategy.
type CapacityResult struct {
	Label       string         `json:"label"`
	Preset      string         `json:"preset"`
	TargetP90Ms float64        `json:"target_p90_ms"`
	Steps       []CapacityStep `json:"steps"`
	// Rate is the highest offered rate at which the target held (0: none
	// did), Goodput the requests per second that met the TTFT target at
	// that rate, and Step its index in Steps (-1: none).
	Rate    float64 `json:"rate"`
	Goodput float64 `json:"goodput_rps"`
	Step    int     `json:"step"`
	// Bounded is true when the search stopped at MaxRate with the target
	// still holding: the capacity is at least Rate.
	Bounded bool `json:"bounded,omitempty"`
	// BestGoodput is the most requests per second that met the target in
	// any step that held, and BestRate the offered rate of that step. An
	// open-loop run of a few hundred requests offered above what the
	// fleet finishes can still hold the TTFT target (prefill goes first,
	// decode slows, the run ends before the backlog shows), so the
	// offered rate overstates capacity; goodput does not.
	BestGoodput float64 `json:"best_goodput_rps"`
	BestRate    float64 `json:"best_goodput_rate"`
}

func (o *CapacityOptions) withDefaults() error {
	o.TargetP90 = cmp.Or(o.TargetP90, DefaultCapacityTarget)
	o.MinSuccess = cmp.Or(o.MinSuccess, 0.99)
	o.Growth = cmp.Or(o.Growth, 1.5)
	o.Refine = cmp.Or(o.Refine, 3)
	o.MaxRate = cmp.Or(o.MaxRate, 64*o.StartRate)
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.run == nil {
		o.run = Run
	}
	switch {
	case o.TargetP90 < 0, o.MinSuccess < 0, o.MinSuccess > 1:
		return fmt.Errorf("bench: capacity: target %v and success rate %g must be positive (success at most 1)", o.TargetP90, o.MinSuccess)
	case !(o.StartRate > 0) || o.MaxRate < o.StartRate:
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
	res := &CapacityResult{Label: o.Run.Label, Preset: o.Run.Preset, TargetP90Ms: ms(o.TargetP90), Step: -1}
	step := func(rate float64) (bool, error) {
		run := o.Run
		run.Rate = rate
		run.Progress = nil
		r, err := o.run(ctx, run)
		if err != nil {
			return false, fmt.Errorf("bench: capacity step at %.3g req/s: %w", rate, err)
		}
		s := capacityStep(r, rate, o.TargetP90, o.MinSuccess)
		res.Steps = append(res.Steps, s)
		fmt.Fprintf(o.Progress, "capacity %s %s: %.3g req/s: TTFT p90 %.0f ms, goodput %.3g req/s, success %.1f%% → %s\n",
			res.Label, res.Preset, rate, s.TTFTP90Ms, s.Goodput, 100*s.SuccessRate, map[bool]string{true: "held", false: "missed"}[s.Held])
		if s.Held && rate >= res.Rate {
			res.Rate, res.Goodput, res.Step = rate, s.Goodput, len(res.Steps)-1
		}
		if s.Held && s.Goodput > res.BestGoodput {
			res.BestGoodput, res.BestRate = s.Goodput, rate
		}
		return s.Held, nil
	}
	lo, hi := 0.0, 0.0
	for rate := o.StartRate; ; rate = math.Min(rate*o.Growth, o.MaxRate) {
		held, err := step(rate)
		if err != nil {
			return res, err
		}
		if !held {
			hi = rate
			break
		}
		lo = rate
		if rate >= o.MaxRate {
			res.Bounded = true
			return res, nil
		}
	}
	if lo == 0 {
		return res, nil // even the start rate missed the target
	}
	for range max(o.Refine, 0) {
		mid := math.Sqrt(lo * hi)
		held, err := step(mid)
		if err != nil {
			return res, err
		}
		if held {
			lo = mid
		} else {
			hi = mid
		}
	}
	return res, nil
}

// capacityStep judges one run against the target. Goodput counts the
// measured requests that succeeded with TTFT within the target, per
// second of the measured window.
func capacityStep(r *Result, rate float64, target time.Duration, minSuccess float64) CapacityStep {
	s := CapacityStep{Rate: rate, TTFTP50Ms: r.TTFT.P50, TTFTP90Ms: r.TTFT.P90, Throughput: r.ThroughputRPS, SuccessRate: r.SuccessRate, HitRate: r.UsageHitRate}
	if r.MetricsHitRate != nil {
		s.HitRate = *r.MetricsHitRate
	}
	good := 0
	for _, x := range r.Samples {
		if x.Error == "" && x.TTFTMs > 0 && x.TTFTMs <= ms(target) {
			good++
		}
	}
	if r.DurationSec > 0 {
		s.Goodput = float64(good) / r.DurationSec
	}
	s.Held = r.Succeeded > 0 && r.TTFT.P90 <= ms(target) && r.SuccessRate >= minSuccess
	return s
}

// WriteTable writes the search's steps and its outcome.
func (c *CapacityResult) WriteTable(w io.Writer) error {
	if _, err := fmt.Fprintf(w, "capacity of %s on %s at TTFT p90 ≤ %.0f ms: ", c.Label, c.Preset, c.TargetP90Ms); err != nil {
		return err
	}
	switch {
	case c.Step < 0:
		fmt.Fprintln(w, "no rate tried held the target")
	case c.Bounded:
		fmt.Fprintf(w, "at least %.3g req/s (the search's cap), goodput %.3g req/s\n", c.Rate, c.Goodput)
	default:
		fmt.Fprintf(w, "%.3g req/s, goodput %.3g req/s\n", c.Rate, c.Goodput)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "step\toffered req/s\tTTFT p50 ms\tTTFT p90 ms\tthroughput req/s\tgoodput req/s\tsuccess\thit rate\ttarget\t")
	for i, s := range c.Steps {
		fmt.Fprintf(tw, "%d\t%.3g\t%.1f\t%.1f\t%.3g\t%.3g\t%.1f%%\t%.1f%%\t%s\t\n", i+1, s.Rate, s.TTFTP50Ms, s.TTFTP90Ms, s.Throughput, s.Goodput,
			100*s.SuccessRate, 100*s.HitRate, map[bool]string{true: "held", false: "missed"}[s.Held])
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
	capacityHeader     = []string{"strategy", "preset", "target TTFT p90 ms", "highest offered req/s held", "goodput there req/s", "TTFT p90 there ms", "hit rate there", "best goodput req/s (offered)", "steps"}
	capacityStepHeader = []string{"strategy", "step", "offered req/s", "TTFT p50 ms", "TTFT p90 ms", "throughput req/s", "goodput req/s", "success", "hit rate", "target"}
)

func (c *Comparison) capacityRows() [][]string {
	var rows [][]string
	for _, r := range c.Capacity {
		row := []string{r.Label, r.Preset, fmt.Sprintf("%.0f", r.TargetP90Ms), "none held", "-", "-", "-", "-", fmt.Sprint(len(r.Steps))}
		if r.Step >= 0 {
			s := r.Steps[r.Step]
			row[3] = fmt.Sprintf("%.3g", r.Rate)
			if r.Bounded {
				row[3] = "≥ " + row[3]
			}
			row[4], row[5], row[6] = fmt.Sprintf("%.3g", r.Goodput), fmt.Sprintf("%.0f", s.TTFTP90Ms), pct(s.HitRate)
			row[7] = fmt.Sprintf("%.3g (%.3g)", r.BestGoodput, r.BestRate)
		}
		rows = append(rows, row)
	}
	return rows
}

func (c *Comparison) capacitySteps() [][]string {
	var rows [][]string
	for _, r := range c.Capacity {
		for i, s := range r.Steps {
			rows = append(rows, []string{r.Label, fmt.Sprint(i + 1), fmt.Sprintf("%.3g", s.Rate), fmt.Sprintf("%.1f", s.TTFTP50Ms), fmt.Sprintf("%.1f", s.TTFTP90Ms),
				fmt.Sprintf("%.3g", s.Throughput), fmt.Sprintf("%.3g", s.Goodput), pct(s.SuccessRate), pct(s.HitRate), map[bool]string{true: "held", false: "missed"}[s.Held]})
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
	b.WriteString("The highest offered rate at which TTFT p90 stayed within the target (and 99 % of requests succeeded), " +
		"and the best goodput (requests that met the target, per second) of the steps that held: the comparison uses goodput, " +
		"since a short open-loop run offered above what the fleet finishes can still hold the TTFT target. The rate grows ×1.5 " +
		"while the target holds, then bisects between the last rate that held and the first that did not.\n\n")
	mdTable(capacityHeader, rows)
	b.WriteString("\n### The search's steps\n\n")
	mdTable(capacityStepHeader, c.capacitySteps())
}

// capChart plots each search's TTFT p90 against the offered rate, both on
// log axes, with the target as a dashed line.
type capChart struct {
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
			xlo, xhi = math.Min(xlo, s.Rate), math.Max(xhi, s.Rate)
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
	ch := &capChart{TargetY: round1(y(c.Capacity[0].TargetP90Ms))}
	for i, r := range c.Capacity {
		steps := append([]CapacityStep(nil), r.Steps...)
		sort.Slice(steps, func(a, b int) bool { return steps[a].Rate < steps[b].Rate })
		var path strings.Builder
		for j, s := range steps {
			cmd := "L"
			if j == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&path, "%s%.1f,%.1f ", cmd, x(s.Rate), y(s.TTFTP90Ms))
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
