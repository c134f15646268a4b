package demo

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// TestDemoSmall runs the whole demo path (etcd, agents, sims, two replicas,
// live strategy switches, bench, reports) at a tiny size.
func TestDemoSmall(t *testing.T) {
	cfg := Default()
	cfg.Instances = 3
	cfg.KVCapacityTokens = 100_000
	cfg.TimeScale = 50
	cfg.Workloads = []Workload{{Preset: "bot", Rate: 20, Warmup: 10, Requests: 40}}
	cfg.Strategies = []fleet.Strategy{fleet.Random, fleet.PrefixAware}
	// A target of an hour (server time, which the time scale multiplies
	// the client's own overhead into): every step holds on a loaded machine.
	// A closed loop, as the default: 2, then 3 in flight (the cap).
	cfg.Capacity = &Capacity{Preset: "bot", TargetP90: time.Hour, StartConcurrency: 2, MaxConcurrency: 3, Warmup: 5, Requests: 30,
		Strategies: []fleet.Strategy{fleet.Random, fleet.PrefixAware}}
	cfg.OutDir = t.TempDir()
	var out, progress bytes.Buffer
	cfg.Out, cfg.Progress = &out, &progress
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmp, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, progress.String())
	}
	if len(cmp.Runs) != 4 || cmp.Runs[2].Label != FixedLabel || cmp.Runs[3].Label != HotLabel {
		t.Fatalf("%d runs, want RANDOM, PREFIX_AWARE, %s and %s", len(cmp.Runs), FixedLabel, HotLabel)
	}
	for _, r := range cmp.Runs {
		if r.Succeeded != 40 {
			t.Errorf("%s: %d of 40 succeeded (%v)", r.Label, r.Succeeded, r.Errors)
		}
	}
	if len(cmp.Overheads) != 2 || cmp.Overheads[0].Routed.N != cfg.OverheadProbes {
		t.Errorf("router overhead per strategy: %+v", cmp.Overheads)
	}
	// The strategy really switched between runs: decisions say so.
	if cmp.Runs[0].Decisions["random"] != 40 {
		t.Errorf("RANDOM run decisions = %v", cmp.Runs[0].Decisions)
	}
	for _, r := range cmp.Runs[1:] {
		if n := r.Decisions["affinity"] + r.Decisions["spill"] + r.Decisions["fallback"]; n != 40 {
			t.Errorf("%s run decisions = %v", r.Label, r.Decisions)
		}
		if r.Balance.Instances != 3 {
			t.Errorf("%s: balance over %d instances, want 3", r.Label, r.Balance.Instances)
		}
	}
	// Two capacity steps per strategy, each held up
	// to the cap.
	if len(cmp.Capacity) != 2 {
		t.Fatalf("%d capacity searches, want RANDOM and PREFIX_AWARE", len(cmp.Capacity))
	}
	for _, c := range cmp.Capacity {
		if len(c.Steps) != 2 || !c.Bounded || c.Concurrency != 3 || c.Rate != 0 || c.Goodput <= 0 || c.Instances != 3 {
			t.Errorf("capacity of %s: %+v", c.Label, c)
		}
	}
	// The notes compare the two at each concurrency, with the cost model.
	if notes := strings.Join(cmp.Notes, "\n"); !strings.Contains(notes, "throughput at equal concurrency") || !strings.Contains(notes, "2: ") ||
		!strings.Contains(notes, "why: in the simulator's cost model") {
		t.Errorf("capacity notes:\n%s", notes)
	}
	if !strings.Contains(out.String(), "Capacity at the latency target") {
		t.Errorf("the comparison must show the capacity search:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "Hit rate and balance by mode") {
		t.Errorf("the comparison must lay the modes side by side:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "SIMULATED") || !strings.Contains(out.String(), "PREFIX_AWARE") {
		t.Errorf("the printed comparison must say the servers are simulated and name the strategies:\n%s", out.String())
	}
	for _, name := range []string{"report.md", "report.json", "report.html"} {
		b, err := os.ReadFile(filepath.Join(cfg.OutDir, name))
		if err != nil || len(b) == 0 {
			t.Errorf("%s: %v (%d bytes)", name, err, len(b))
		}
	}
}
