package bench

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"sort"
	"strings"
)

// Comparison is several runs side by side (strategies × workloads).
type Comparison struct {
	Title string `json:"title"`
	// Environment is the caller's free-text note on what served the runs
	// (e.g. "simulated model servers, profile h200-llama8b").
	Environment string    `json:"environment"`
	Runs        []*Result `json:"runs"`
	// Notes are Markdown lines the caller adds under "Summary" (e.g. how the
	// runs compare with a published headline).
	Notes []string `json:"notes,omitempty"`
	// Overheads, if measured, are the latency the router adds per strategy.
	Overheads []Overhead `json:"router_overhead,omitempty"`
	// Capacity, if searched, is each strategy's highest rate within a
	// latency target (capacity.go).
	Capacity []*CapacityResult `json:"capacity,omitempty"`
}

// modeTable lays the runs out with one row per preset and one column per
// mode (run label): hit rate, max share and Gini side by side.
func (c *Comparison) modeTable() (header []string, rows [][]string) {
	var modes []string
	seen := map[string]bool{}
	for _, r := range c.Runs {
		if !seen[r.Label] {
			seen[r.Label] = true
			modes = append(modes, r.Label)
		}
	}
	header = append([]string{"preset"}, modes...)
	for _, p := range c.Presets() {
		row := []string{p}
		for _, m := range modes {
			cell := "—"
			for _, r := range c.Runs {
				if r.Preset == p && r.Label == m {
					hit := r.UsageHitRate
					if r.MetricsHitRate != nil {
						hit = *r.MetricsHitRate
					}
					cell = fmt.Sprintf("%s / %s / %.3f", pct(hit), pct(r.Balance.MaxShare), r.Balance.Gini)
				}
			}
			row = append(row, cell)
		}
		rows = append(rows, row)
	}
	return header, rows
}

// overheadRows renders the overhead table's rows (wall-clock ms).
func (c *Comparison) overheadRows() [][]string {
	var rows [][]string
	for _, o := range c.Overheads {
		rows = append(rows, []string{o.Label, fmt.Sprint(o.Requests),
			fmt.Sprintf("%.2f", o.Direct.P50), fmt.Sprintf("%.2f", o.Routed.P50),
			fmt.Sprintf("%.2f", o.AddedP50Ms), fmt.Sprintf("%.2f", o.AddedP90Ms)})
	}
	return rows
}

var overheadHeader = []string{"strategy", "requests", "direct p50 ms", "via router p50 ms", "added p50 ms", "added p90 ms"}

const overheadNote = "Router overhead: tiny requests (one output token, distinct text) sent one at a time on the idle fleet, alternately straight to the instances and through the router replicas; wall-clock milliseconds, not scaled."

// WriteJSON writes the comparison as indented JSON.
func (c *Comparison) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(c)
}

// Presets returns the runs' presets in first-seen order.
func (c *Comparison) Presets() []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range c.Runs {
		if !seen[r.Preset] {
			seen[r.Preset] = true
			out = append(out, r.Preset)
		}
	}
	return out
}

func (c *Comparison) regimeOf(preset string) string {
	for _, r := range c.Runs {
		if r.Preset == preset {
			return r.Regime.String()
		}
	}
	return ""
}

// timeScaleNotes are the header lines for runs whose servers did not run
// in real time: one line if every run shares the scale, else one per such
// run.
func (c *Comparison) timeScaleNotes() []string {
	var notes []string
	same := len(c.Runs) > 0
	for _, r := range c.Runs {
		if n := r.TimeScaleNote(); n != "" {
			notes = append(notes, r.Name()+": "+n)
		}
		same = same && r.TimeScale == c.Runs[0].TimeScale
	}
	if same && len(notes) > 1 {
		return []string{"all runs: " + c.Runs[0].TimeScaleNote()}
	}
	return notes
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// WriteMarkdown writes a summary table, the regimes, the environment and
// each run's per-instance share.
func (c *Comparison) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	title := c.Title
	if title == "" {
		title = "prefixrouter benchmark"
	}
	fmt.Fprintf(&b, "# %s\n\n", title)
	if c.Environment != "" {
		fmt.Fprintf(&b, "**Environment:** %s\n\n", c.Environment)
	}
	for _, n := range c.timeScaleNotes() {
		fmt.Fprintf(&b, "**Time scale:** %s\n\n", mdEscape(n))
	}
	if len(c.Notes) > 0 {
		b.WriteString("## Summary\n\n")
		for _, n := range c.Notes {
			if strings.HasPrefix(n, "  ") {
				b.WriteString(n + "\n")
			} else {
				b.WriteString("- " + n + "\n")
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("## Regimes\n\n")
	for _, p := range c.Presets() {
		fmt.Fprintf(&b, "- `%s`: %s\n", p, c.regimeOf(p))
	}
	b.WriteString("\n## Results\n\n")
	b.WriteString("| run | preset | requests | ok | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | E2E p50 ms | E2E p90 ms | req/s | out tok/s | hit (metrics) | hit (usage) | oracle | hit/oracle | errors |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, r := range c.Runs {
		vs := r.MetricsVsOracle
		if vs == nil {
			vs = r.UsageVsOracle
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.0f | %s | %s | %s | %s | %s |\n",
			mdEscape(r.Label), mdEscape(r.Preset), r.Requests, pct(r.SuccessRate),
			r.TTFT.P50, r.TTFT.P90, r.TTFT.P99, r.E2E.P50, r.E2E.P90, r.ThroughputRPS, r.OutputTokensPerSec,
			optPct(r.MetricsHitRate), pct(r.UsageHitRate), pct(r.Oracle.HitRate), optRatio(vs), mdEscape(kv(r.Errors)))
	}
	b.WriteString("\nhit/oracle uses the metrics hit rate when scraped, else the usage one.\n")
	if hdr, rows := c.modeTable(); len(rows) > 0 {
		b.WriteString("\n## Hit rate and balance by mode\n\n")
		b.WriteString("Each cell: KV hit rate / largest instance's share of requests / Gini of the per-instance requests (0 = even).\n\n")
		b.WriteString("| " + strings.Join(hdr, " | ") + " |\n|---" + strings.Repeat("|--:", len(hdr)-1) + "|\n")
		for _, r := range rows {
			cells := make([]string, len(r))
			for i, c := range r {
				cells[i] = mdEscape(c)
			}
			b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
		}
	}
	b.WriteString("\n## Per-instance share of requests\n\n")
	for _, r := range c.Runs {
		fmt.Fprintf(&b, "- %s: ", mdEscape(r.Name()))
		if len(r.Instances) == 0 {
			b.WriteString("no instance header")
		}
		for i, is := range r.Instances {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "`%s` %s", is.Instance, pct(is.Share))
		}
		if r.Balance.Instances > 0 {
			fmt.Fprintf(&b, "; max/mean %.2f, Gini %.3f", r.Balance.MaxOverMean, r.Balance.Gini)
		}
		if len(r.Decisions) > 0 {
			fmt.Fprintf(&b, "; decisions %s", kv(r.Decisions))
		}
		b.WriteString("\n")
	}
	c.capacityMarkdown(&b)
	if rows := c.overheadRows(); len(rows) > 0 {
		b.WriteString("\n## Router overhead\n\n")
		b.WriteString("| " + strings.Join(overheadHeader, " | ") + " |\n|---|--:|--:|--:|--:|--:|\n")
		for _, r := range rows {
			cells := make([]string, len(r))
			for i, c := range r {
				cells[i] = mdEscape(c)
			}
			b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
		}
		b.WriteString("\n" + overheadNote + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Chart geometry (SVG user units).
const (
	chartW, chartH               = 640.0, 300.0
	padL, padR, padT, padB       = 56.0, 16.0, 16.0, 40.0
	barH, barGap, barLabelW      = 16.0, 6.0, 160.0
	maxCDFPoints                 = 200
	shareChartW                  = 640.0
	shareBarMax                  = shareChartW - barLabelW - 60
	palette                      = "#1f77b4 #d62728 #2ca02c #ff7f0e #9467bd #8c564b #e377c2 #7f7f7f"
	minTTFTms, ttftTickPerDecade = 0.1, 3
)

type svgLine struct {
	Label, Color, Path string
	N                  int
}

type svgTick struct {
	X, Y  float64
	Label string
}

type cdfChart struct {
	Preset, Regime string
	Lines          []svgLine
	XTicks, YTicks []svgTick
}

type svgBar struct {
	Label, Value string
	Y, W         float64
}

type shareChart struct {
	Name   string
	Height float64
	Bars   []svgBar
}

type htmlRow struct {
	Run, Preset, Requests, OK, TTFT50, TTFT90, TTFT99, E2E50, E2E90, RPS, TPS, HitM, HitU, Oracle, Vs, Errors string
}

type htmlView struct {
	Title, Environment string
	TimeScales         []string
	Rows               []htmlRow
	CDFs               []cdfChart
	Shares             []shareChart
	W, H, PadL, PadT   float64
	PlotR, PlotB       float64
	ShareW, LabelW     float64
	Notes              []htmlNote
	Overhead           [][]string
	OverheadHeader     []string
	ModeHeader         []string
	ModeRows           [][]string
	OverheadNote       string
	CapHeader          []string
	CapRows            [][]string
	CapSteps           [][]string
	CapChart           *capChart
}

// htmlNote is one summary line; Sub lines are details of the line above.
type htmlNote struct {
	Text string
	Sub  bool
}

func (c *Comparison) view() htmlView {
	v := htmlView{Title: c.Title, Environment: c.Environment, W: chartW, H: chartH, PadL: padL, PadT: padT,
		PlotR: chartW - padR, PlotB: chartH - padB, ShareW: shareChartW, LabelW: barLabelW}
	if v.Title == "" {
		v.Title = "prefixrouter benchmark"
	}
	v.TimeScales = c.timeScaleNotes()
	for _, n := range c.Notes {
		text := strings.ReplaceAll(strings.TrimPrefix(strings.TrimSpace(n), "- "), "`", "")
		v.Notes = append(v.Notes, htmlNote{Text: text, Sub: strings.HasPrefix(n, "  ")})
	}
	v.Overhead, v.OverheadHeader, v.OverheadNote = c.overheadRows(), overheadHeader, overheadNote
	v.ModeHeader, v.ModeRows = c.modeTable()
	v.CapHeader, v.CapRows, v.CapSteps = capacityHeader, c.capacityRows(), c.capacitySteps()
	v.CapChart = c.capacityChart(strings.Fields(palette))
	for _, r := range c.Runs {
		vs := r.MetricsVsOracle
		if vs == nil {
			vs = r.UsageVsOracle
		}
		v.Rows = append(v.Rows, htmlRow{
			Run: r.Label, Preset: r.Preset, Requests: fmt.Sprint(r.Requests), OK: pct(r.SuccessRate),
			TTFT50: fmt.Sprintf("%.1f", r.TTFT.P50), TTFT90: fmt.Sprintf("%.1f", r.TTFT.P90), TTFT99: fmt.Sprintf("%.1f", r.TTFT.P99),
			E2E50: fmt.Sprintf("%.1f", r.E2E.P50), E2E90: fmt.Sprintf("%.1f", r.E2E.P90),
			RPS: fmt.Sprintf("%.2f", r.ThroughputRPS), TPS: fmt.Sprintf("%.0f", r.OutputTokensPerSec),
			HitM: optPct(r.MetricsHitRate), HitU: pct(r.UsageHitRate), Oracle: pct(r.Oracle.HitRate), Vs: optRatio(vs),
			Errors: kv(r.Errors),
		})
	}
	colors := strings.Fields(palette)
	for _, p := range c.Presets() {
		var runs []*Result
		for _, r := range c.Runs {
			if r.Preset == p {
				runs = append(runs, r)
			}
		}
		v.CDFs = append(v.CDFs, ttftCDF(p, c.regimeOf(p), runs, colors))
	}
	for _, r := range c.Runs {
		sc := shareChart{Name: r.Name()}
		for i, is := range r.Instances {
			w := round1(is.Share * shareBarMax)
			sc.Bars = append(sc.Bars, svgBar{Label: is.Instance, Value: pct(is.Share), Y: float64(i) * (barH + barGap), W: w})
		}
		sc.Height = math.Max(float64(len(sc.Bars))*(barH+barGap), barH+barGap)
		v.Shares = append(v.Shares, sc)
	}
	return v
}

// ttftCDF plots each run's successful TTFTs as an empirical CDF on a log
// axis: routing moves TTFT by an order of magnitude (cached prefill is
// ~10× faster), which a linear axis squashes.
func ttftCDF(preset, regime string, runs []*Result, colors []string) cdfChart {
	ch := cdfChart{Preset: preset, Regime: regime}
	lo, hi := math.Inf(1), math.Inf(-1)
	series := make([][]float64, len(runs))
	for i, r := range runs {
		for _, s := range r.Samples {
			if s.Error == "" && s.TTFTMs > 0 {
				series[i] = append(series[i], math.Max(s.TTFTMs, minTTFTms))
			}
		}
		sort.Float64s(series[i])
		if n := len(series[i]); n > 0 {
			lo, hi = math.Min(lo, series[i][0]), math.Max(hi, series[i][n-1])
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	l0, l1 := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if l1 <= l0 {
		l1 = l0 + 1
	}
	pw, ph := chartW-padL-padR, chartH-padT-padB
	x := func(ms float64) float64 { return round1(padL + (math.Log10(ms)-l0)/(l1-l0)*pw) }
	y := func(q float64) float64 { return round1(padT + (1-q)*ph) }
	for d := l0; d <= l1; d++ {
		for _, m := range []float64{1, 2, 5}[:ttftTickPerDecade] {
			val := m * math.Pow(10, d)
			if math.Log10(val) > l1+1e-9 {
				break
			}
			ch.XTicks = append(ch.XTicks, svgTick{X: x(val), Y: chartH - padB, Label: trimFloat(val)})
		}
	}
	for _, q := range []float64{0, 0.25, 0.5, 0.75, 0.9, 1} {
		ch.YTicks = append(ch.YTicks, svgTick{X: padL, Y: y(q), Label: fmt.Sprintf("%.0f%%", q*100)})
	}
	for i, s := range series {
		var b strings.Builder
		n := len(s)
		step := max(1, n/maxCDFPoints)
		for k := 0; k < n; k += step {
			cmd := "L"
			if k == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&b, "%s%.1f,%.1f ", cmd, x(s[k]), y(float64(k+1)/float64(n)))
		}
		if n > 0 {
			fmt.Fprintf(&b, "L%.1f,%.1f", x(s[n-1]), y(1))
		}
		label := runs[i].Label
		if label == "" {
			label = fmt.Sprintf("run %d", i+1)
		}
		ch.Lines = append(ch.Lines, svgLine{Label: label, Color: colors[i%len(colors)], Path: b.String(), N: n})
	}
	return ch
}

func round1(v float64) float64 { return math.Round(v*10) / 10 }

func trimFloat(v float64) string {
	if v >= 1 {
		return fmt.Sprintf("%.0f", v)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
}

var htmlPage = template.Must(template.New("page").Funcs(template.FuncMap{
	"add":           func(a, b float64) float64 { return a + b },
	"sub":           func(a, b float64) float64 { return a - b },
	"legendY":       func(i int) float64 { return padT + 8 + float64(i)*16 },
	"capStepHeader": func([]string) []string { return capacityStepHeader },
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{{.Title}}</title>
<style>
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em;color:#222;max-width:1100px}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ccc;padding:3px 6px;text-align:right}
th:first-child,td:first-child,td:nth-child(2){text-align:left}th{background:#f3f3f3}
svg{font-size:11px;font-family:inherit}.note{color:#555}li.sub{margin-left:2em;list-style:circle}
</style></head><body>
<h1>{{.Title}}</h1>
{{if .Environment}}<p><b>Environment:</b> {{.Environment}}</p>{{end}}
{{range .TimeScales}}<p><b>Time scale:</b> {{.}}</p>
{{end}}{{if .Notes}}<h2>Summary</h2><ul>{{range .Notes}}<li{{if .Sub}} class="sub"{{end}}>{{.Text}}</li>{{end}}</ul>{{end}}
<h2>Results</h2>
<table><tr><th>run</th><th>preset</th><th>requests</th><th>ok</th><th>TTFT p50 ms</th><th>TTFT p90 ms</th><th>TTFT p99 ms</th><th>E2E p50 ms</th><th>E2E p90 ms</th><th>req/s</th><th>out tok/s</th><th>hit (metrics)</th><th>hit (usage)</th><th>oracle</th><th>hit/oracle</th><th>errors</th></tr>
{{range .Rows}}<tr><td>{{.Run}}</td><td>{{.Preset}}</td><td>{{.Requests}}</td><td>{{.OK}}</td><td>{{.TTFT50}}</td><td>{{.TTFT90}}</td><td>{{.TTFT99}}</td><td>{{.E2E50}}</td><td>{{.E2E90}}</td><td>{{.RPS}}</td><td>{{.TPS}}</td><td>{{.HitM}}</td><td>{{.HitU}}</td><td>{{.Oracle}}</td><td>{{.Vs}}</td><td>{{.Errors}}</td></tr>
{{end}}</table>
<p class="note">hit/oracle uses the metrics hit rate when scraped, else the usage one. The oracle is one unbounded prefix cache seeing the same stream.</p>
{{if .ModeRows}}<h2>Hit rate and balance by mode</h2>
<p class="note">Each cell: KV hit rate / largest instance's share of requests / Gini of the per-instance requests (0 = even).</p>
<table><tr>{{range .ModeHeader}}<th>{{.}}</th>{{end}}</tr>
{{range .ModeRows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>{{end}}
<h2>TTFT distribution</h2>
{{range .CDFs}}{{$c := .}}
<h3>{{.Preset}}</h3><p class="note">Regime: {{.Regime}}</p>
<svg width="{{$.W}}" height="{{$.H}}" viewBox="0 0 {{$.W}} {{$.H}}" role="img" aria-label="TTFT CDF for {{.Preset}}">
<rect x="{{$.PadL}}" y="{{$.PadT}}" width="{{sub $.PlotR $.PadL}}" height="{{sub $.PlotB $.PadT}}" fill="none" stroke="#999"/>
{{range .XTicks}}<line x1="{{.X}}" y1="{{$.PadT}}" x2="{{.X}}" y2="{{.Y}}" stroke="#eee"/><text x="{{.X}}" y="{{add .Y 14}}" text-anchor="middle">{{.Label}}</text>
{{end}}{{range .YTicks}}<line x1="{{.X}}" y1="{{.Y}}" x2="{{$.PlotR}}" y2="{{.Y}}" stroke="#eee"/><text x="{{sub .X 4}}" y="{{add .Y 4}}" text-anchor="end">{{.Label}}</text>
{{end}}<text x="{{add $.PadL 200}}" y="{{sub $.H 6}}">TTFT (ms, log scale)</text>
{{range $i, $l := .Lines}}<path d="{{$l.Path}}" fill="none" stroke="{{$l.Color}}" stroke-width="1.8"/>
<rect x="{{add $.PadL 10}}" y="{{sub (legendY $i) 8}}" width="10" height="10" fill="{{$l.Color}}"/><text x="{{add $.PadL 24}}" y="{{legendY $i}}">{{$l.Label}} (n={{$l.N}})</text>
{{end}}</svg>
{{end}}
<h2>Per-instance share of requests</h2>
{{range .Shares}}<h3>{{.Name}}</h3>
{{if .Bars}}<svg width="{{$.ShareW}}" height="{{.Height}}" viewBox="0 0 {{$.ShareW}} {{.Height}}" role="img" aria-label="instance share for {{.Name}}">
{{range .Bars}}<text x="{{sub $.LabelW 6}}" y="{{add .Y 12}}" text-anchor="end">{{.Label}}</text><rect x="{{$.LabelW}}" y="{{.Y}}" width="{{.W}}" height="16" fill="#1f77b4"/><text x="{{add $.LabelW (add .W 4)}}" y="{{add .Y 12}}">{{.Value}}</text>
{{end}}</svg>{{else}}<p class="note">no instance header in the responses</p>{{end}}
{{end}}
{{if .CapRows}}<h2>Capacity at the latency target</h2>
<table><tr>{{range .CapHeader}}<th>{{.}}</th>{{end}}</tr>
{{range .CapRows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>
{{with .CapChart}}<svg width="{{$.W}}" height="{{$.H}}" viewBox="0 0 {{$.W}} {{$.H}}" role="img" aria-label="TTFT p90 against the load">
<rect x="{{$.PadL}}" y="{{$.PadT}}" width="{{sub $.PlotR $.PadL}}" height="{{sub $.PlotB $.PadT}}" fill="none" stroke="#999"/>
{{range .XTicks}}<line x1="{{.X}}" y1="{{$.PadT}}" x2="{{.X}}" y2="{{.Y}}" stroke="#eee"/><text x="{{.X}}" y="{{add .Y 14}}" text-anchor="middle">{{.Label}}</text>
{{end}}{{range .YTicks}}<line x1="{{.X}}" y1="{{.Y}}" x2="{{$.PlotR}}" y2="{{.Y}}" stroke="#eee"/><text x="{{sub .X 4}}" y="{{add .Y 4}}" text-anchor="end">{{.Label}}</text>
{{end}}<line x1="{{$.PadL}}" y1="{{.TargetY}}" x2="{{$.PlotR}}" y2="{{.TargetY}}" stroke="#000" stroke-dasharray="4 3"/><text x="{{sub $.PlotR 4}}" y="{{sub .TargetY 4}}" text-anchor="end">target</text>
<text x="{{add $.PadL 160}}" y="{{sub $.H 6}}">{{.XLabel}} → TTFT p90 (ms, log scale)</text>
{{range $i, $l := .Lines}}<path d="{{$l.Path}}" fill="none" stroke="{{$l.Color}}" stroke-width="1.8"/>
<rect x="{{add $.PadL 10}}" y="{{sub (legendY $i) 8}}" width="10" height="10" fill="{{$l.Color}}"/><text x="{{add $.PadL 24}}" y="{{legendY $i}}">{{$l.Label}}</text>
{{end}}</svg>{{end}}
<h3>The search's steps</h3>
<table><tr>{{range .CapHeader | capStepHeader}}<th>{{.}}</th>{{end}}</tr>
{{range .CapSteps}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>{{end}}
{{if .Overhead}}<h2>Router overhead</h2>
<table><tr>{{range .OverheadHeader}}<th>{{.}}</th>{{end}}</tr>
{{range .Overhead}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>
<p class="note">{{.OverheadNote}}</p>{{end}}
</body></html>
`))

// WriteHTML writes a self-contained page: the results table, a TTFT CDF
// per workload (one line per run) and per-instance share bars, as inline
// SVG with no scripts, fonts or links to fetch.
func (c *Comparison) WriteHTML(w io.Writer) error {
	return htmlPage.Execute(w, c.view())
}
