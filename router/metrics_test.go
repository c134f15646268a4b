package router

import (
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// seriesOf gathers the registry and returns each sample of the named
// families as `name{label="value",...}` (labels sorted) and its value; a
// histogram gives its sample count.
func seriesOf(t *testing.T, h *harness, names ...string) map[string]float64 {
	t.Helper()
	fams, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if !slices.Contains(names, f.GetName()) {
			continue
		}
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(ls)
			v := m.GetCounter().GetValue()
			if hg := m.GetHistogram(); hg != nil {
				v = float64(hg.GetSampleCount())
			}
			out[f.GetName()+"{"+strings.Join(ls, ",")+"}"] = v
		}
	}
	return out
}

// TestKnownSeriesStartAtZero: before any request, the counters a dashboard
// panel reads exist at 0 for every label value the fleet already tells (the
// endpoint, the strategy's decisions, every error kind and wait outcome, the
// instances); a strategy change and a new instance add theirs.
func TestKnownSeriesStartAtZero(t *testing.T) {
	h := newHarness(t, hopts{cfg: prefixCfg(10)}, newBackend(t, "i-a"), newBackend(t, "i-b"))
	names := []string{
		"prefixrouter_requests_total", "prefixrouter_retries_total", "prefixrouter_upstream_errors_total",
		"prefixrouter_stale_adapter_retries_total", "prefixrouter_adapter_waits_total", "prefixrouter_keys_moved_ratio",
		"prefixrouter_pick_duration_seconds", "prefixrouter_prompt_tokens_total", "prefixrouter_cached_prompt_tokens_total",
	}
	want := []string{
		"prefixrouter_retries_total{endpoint=ep}",
		"prefixrouter_stale_adapter_retries_total{endpoint=ep}",
		"prefixrouter_keys_moved_ratio{endpoint=ep}",
		"prefixrouter_pick_duration_seconds{strategy=PREFIX_AWARE}",
	}
	for _, k := range []string{"body", "dial", "other", "status", "timeout"} {
		want = append(want, "prefixrouter_upstream_errors_total{endpoint=ep,kind="+k+"}")
	}
	for _, o := range []string{"client_gone", "loaded", "queue_full", "timeout"} {
		want = append(want, "prefixrouter_adapter_waits_total{endpoint=ep,outcome="+o+"}")
	}
	tokens := func(id string, decisions ...string) {
		for _, d := range decisions {
			for _, n := range []string{"prefixrouter_prompt_tokens_total", "prefixrouter_cached_prompt_tokens_total"} {
				want = append(want, n+"{decision="+d+",endpoint=ep,instance="+id+",model=}")
			}
		}
	}
	for _, d := range []string{DecisionAffinity, DecisionFallback, DecisionSpill} {
		want = append(want, "prefixrouter_requests_total{code=200,decision="+d+",endpoint=ep,strategy=PREFIX_AWARE}")
	}
	tokens("i-a", DecisionAffinity, DecisionSpill, DecisionFallback)
	tokens("i-b", DecisionAffinity, DecisionSpill, DecisionFallback)
	check := func(when string) {
		t.Helper()
		got := seriesOf(t, h, names...)
		var keys []string
		for k, v := range got {
			keys = append(keys, k)
			if v != 0 {
				t.Errorf("%s: %s = %v before any request, want 0", when, k, v)
			}
		}
		slices.Sort(keys)
		slices.Sort(want)
		if !slices.Equal(keys, want) {
			t.Fatalf("%s: series\n%s\nwant\n%s", when, strings.Join(keys, "\n"), strings.Join(want, "\n"))
		}
	}
	check("first snapshot")

	h.ep.Config.RoutingStrategy = fleet.Random
	h.update()
	want = append(want, "prefixrouter_pick_duration_seconds{strategy=RANDOM}",
		"prefixrouter_requests_total{code=200,decision=random,endpoint=ep,strategy=RANDOM}")
	tokens("i-a", DecisionRandom)
	tokens("i-b", DecisionRandom)
	check("strategy changed to RANDOM")

	h.ep.Instances = append(h.ep.Instances, fleet.Instance{ID: "i-c", Addr: "http://127.0.0.1:1"})
	h.update()
	tokens("i-c", DecisionRandom)
	// The membership change is observed: the histogram counts it.
	got := seriesOf(t, h, "prefixrouter_keys_moved_ratio")
	if got["prefixrouter_keys_moved_ratio{endpoint=ep}"] != 1 {
		t.Fatalf("keys moved %v, want one observation after i-c joined", got)
	}
	names = slices.DeleteFunc(names, func(n string) bool { return n == "prefixrouter_keys_moved_ratio" })
	want = slices.DeleteFunc(want, func(n string) bool { return strings.HasPrefix(n, "prefixrouter_keys_moved_ratio") })
	check("i-c joined")
}
