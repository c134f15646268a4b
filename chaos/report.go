package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is the outcome of a run.
type Report struct {
	Config   ReportConfig  `json:"config"`
	Started  time.Time     `json:"started"`
	Duration time.Duration `json:"duration_ns"`
	Results  []*Result     `json:"results"`
}

// ReportConfig is the configuration a report was produced with.
type ReportConfig struct {
	Instances          int           `json:"instances"`
	Replicas           int           `json:"replicas"`
	Keys               int           `json:"keys"`
	TimeScale          float64       `json:"time_scale"`
	LoadRate           float64       `json:"load_rate"`
	Long               bool          `json:"long"`
	Seed               int64         `json:"seed"`
	TTL                time.Duration `json:"ttl_ns"`
	LoadWindow         time.Duration `json:"load_window_ns"`
	OutageWindow       time.Duration `json:"outage_window_ns"`
	Cycles             int           `json:"cycles"`
	BreakerOpenTimeout time.Duration `json:"breaker_open_timeout_ns"`
}

func reportConfig(c Options) ReportConfig {
	return ReportConfig{Instances: c.Instances, Replicas: c.Replicas, Keys: c.Keys, TimeScale: c.TimeScale,
		LoadRate: c.LoadRate, Long: c.Long, Seed: c.Seed, TTL: c.TTL, LoadWindow: c.LoadWindow,
		OutageWindow: c.OutageWindow, Cycles: c.Cycles, BreakerOpenTimeout: c.BreakerOpenTimeout}
}

// Passed reports whether every scenario completed and every check passed.
func (r *Report) Passed() bool {
	for _, res := range r.Results {
		if !res.Passed() {
			return false
		}
	}
	return len(r.Results) > 0
}

// Result returns the first result of the scenario, or nil.
func (r *Report) Result(scenario string) *Result {
	for _, res := range r.Results {
		if res.Scenario == scenario {
			return res
		}
	}
	return nil
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func ms(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	if d < 10*time.Millisecond {
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	if d < 10*time.Second {
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

func pct(f float64) string { return fmt.Sprintf("%.2f %%", 100*f) }

// row is the table line of a result.
func (res *Result) row() []string {
	name := res.Scenario
	if res.Cycle > 1 {
		name += fmt.Sprintf(" #%d", res.Cycle)
	}
	cells := []string{name, fmt.Sprintf("%d→%d", res.InstancesBefore, res.InstancesAfter), ms(res.Convergence)}
	if m := res.Movement; m != nil {
		cells = append(cells, pct(m.MovedFraction), pct(m.Ideal), fmt.Sprintf("%.3f", m.Ratio), fmt.Sprint(m.Collateral), pct(m.AgreementAfter))
	} else {
		cells = append(cells, "–", "–", "–", "–", "–")
	}
	if l := res.Load; l != nil {
		cells = append(cells, fmt.Sprint(l.Sent), fmt.Sprint(l.OK), fmt.Sprintf("%d / %d", l.FailedInFlight, l.FailedOther))
	} else {
		cells = append(cells, "–", "–", "–")
	}
	verdict := "pass"
	if !res.Passed() {
		verdict = "FAIL"
	}
	return append(cells, verdict)
}

var header = []string{"scenario", "N", "convergence", "moved", "ideal", "moved/ideal", "collateral", "agreement", "requests", "ok", "failed in-flight / other", "checks"}

// WriteTable writes one aligned line per result.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, res := range r.Results {
		fmt.Fprintln(tw, strings.Join(res.row(), "\t"))
	}
	return tw.Flush()
}

// WriteMarkdown writes the configuration, the summary table and each
// scenario's details and checks.
func (r *Report) WriteMarkdown(w io.Writer) error {
	c := r.Config
	var b strings.Builder
	fmt.Fprintf(&b, "Fleet: %d instances, %d router replicas, lease TTL %v; %d probe keys; load %g req/s at time scale %g; load window %v; etcd outage %v; breaker open timeout %v; seed %d; %d cycle(s); run took %.1f s.\n\n",
		c.Instances, c.Replicas, c.TTL, c.Keys, c.LoadRate, c.TimeScale, c.LoadWindow, c.OutageWindow, c.BreakerOpenTimeout, c.Seed, c.Cycles, r.Duration.Seconds())
	fmt.Fprintf(&b, "| %s |\n|%s\n", strings.Join(header, " | "), strings.Repeat("---|", len(header)))
	for _, res := range r.Results {
		fmt.Fprintf(&b, "| %s |\n", strings.Join(res.row(), " | "))
	}
	for _, res := range r.Results {
		fmt.Fprintf(&b, "\n### %s", res.Scenario)
		if res.Cycle > 1 {
			fmt.Fprintf(&b, " #%d", res.Cycle)
		}
		fmt.Fprintf(&b, "\n\n%s.\n\n", res.Event)
		if res.Removed > 0 {
			fmt.Fprintf(&b, "- routed around after %s (every replica sees it draining), removed after %s\n", ms(res.Convergence), ms(res.Removed))
		}
		if m := res.Movement; m != nil {
			fmt.Fprintf(&b, "- movement: %d of %d keys moved (%s); ideal %s, nominal %s (σ %s); collateral %d; agreement before %s, after %s\n",
				m.Moved, m.Keys, pct(m.MovedFraction), pct(m.Ideal), pct(m.Nominal), pct(m.Sigma), m.Collateral, pct(m.AgreementBefore), pct(m.AgreementAfter))
		}
		if m := res.Adapter; m != nil {
			fmt.Fprintf(&b, "- adapter %s: set %v → %v; %d of %d of its keys moved (%s, bound %s); %d of %d keys of other adapters moved; agreement %s\n",
				m.Adapter, m.SetBefore, m.SetAfter, m.Moved, m.Keys, pct(m.MovedFraction), pct(m.Bound), m.OtherMoved, m.OtherKeys, pct(m.AgreementAfter))
		}
		if l := res.Load; l != nil {
			fmt.Fprintf(&b, "- load: %d requests in %.1f s, %d ok (%d spilled), %d failed (%d in flight at a crash, %d other), %d ticks skipped%s\n",
				l.Sent, l.Seconds, l.OK, l.Spilled, l.Failed, l.FailedInFlight, l.FailedOther, l.Skipped, kinds(l.ByKind))
			for _, e := range l.Examples {
				fmt.Fprintf(&b, "  - `%s`\n", strings.ReplaceAll(e, "`", "'"))
			}
		}
		if o := res.Outage; o != nil {
			fmt.Fprintf(&b, "- outage: every replica listed %d–%d instances while etcd was down %v (%d replicas' sets changed); etcd restarted in %s; fewest instances during recovery %d; restart → converged with the added instance %s\n",
				o.MinInstances, o.MaxInstances, o.Window, o.SnapshotsChanged, ms(o.Restart), o.RecoveryMinInstances, ms(o.Recovered))
		}
		if br := res.Breaker; br != nil {
			fmt.Fprintf(&b, "- breaker of %s (opens after %d consecutive failures, open timeout %v): open on every replica after %s; 5xx that reached clients before it opened %d, after (failed half-open probes) %d; closed on every replica %s after the fault cleared\n",
				br.Instance, br.ConsecutiveFailures, br.OpenTimeout, ms(br.Opened), br.ErrorsBeforeOpen, br.ErrorsAfterOpen, ms(br.Closed))
		}
		if hg := res.Hang; hg != nil {
			fmt.Fprintf(&b, "- hang of %s (health checks every %v, timeout %v, down after %d failures): down on every replica after %s; %d requests sent to it before that waited for the unfreeze (longest %s); %d of %d requests sent after detection went to it; up on every replica %s after the unfreeze\n",
				hg.Instance, hg.Interval, hg.Timeout, hg.UnhealthyThreshold, ms(hg.Detected), hg.Stuck, ms(hg.StuckLongest), hg.RoutedToIt, hg.AfterDetection, ms(hg.Recovered))
		}
		for _, ch := range res.Checks {
			mark := "pass"
			if !ch.Pass {
				mark = "**FAIL**"
			}
			fmt.Fprintf(&b, "- %s: %s — %s\n", mark, ch.Name, ch.Detail)
		}
		if res.Err != "" {
			fmt.Fprintf(&b, "- **error**: %s\n", res.Err)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func kinds(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s: %d", k, m[k]))
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// summary is the progress line of a result.
func (res *Result) summary() string {
	s := fmt.Sprintf("%s: %s; convergence %s", res.Scenario, res.Event, ms(res.Convergence))
	if m := res.Movement; m != nil {
		s += fmt.Sprintf("; moved %s (ideal %s), collateral %d, agreement %s", pct(m.MovedFraction), pct(m.Ideal), m.Collateral, pct(m.AgreementAfter))
	}
	if m := res.Adapter; m != nil {
		s += fmt.Sprintf("; %s %v→%v moved %s (bound %s), others moved %d", m.Adapter, m.SetBefore, m.SetAfter, pct(m.MovedFraction), pct(m.Bound), m.OtherMoved)
	}
	if l := res.Load; l != nil {
		s += fmt.Sprintf("; %d requests, %d failed (%d in flight at a crash)", l.Sent, l.Failed, l.FailedInFlight)
	}
	if res.Passed() {
		return s + "; pass"
	}
	return s + "; FAIL"
}
