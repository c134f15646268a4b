package agent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/sim"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/membership/etcdtest"
)

// simFleet starts n simulated vLLM servers (maxLoras slots each) and an
// agent with placement beside each.
func simFleet(t *testing.T, cli *clientv3.Client, n, maxLoras int) []*sim.Server {
	var out []*sim.Server
	for i := range n {
		s, err := sim.New(sim.Options{ID: fmt.Sprintf("s-%d", i), MaxLoras: maxLoras, AdapterLoadTime: time.Millisecond, TimeScale: 1})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(s)
		t.Cleanup(func() { hs.Close(); s.Close() })
		start(t, Options{
			Client: cli, Options: membership.Options{TTL: 2 * time.Second, Logger: quiet},
			Endpoint: "ep", Instance: fleet.Instance{ID: s.ID(), Addr: hs.URL},
			HealthInterval: 10 * time.Millisecond, DrainGrace: time.Millisecond, DrainTimeout: time.Second,
			PlaceAdapters: true, LoadPollInterval: 20 * time.Millisecond,
			SaturationWindow: 100 * time.Millisecond, ActiveWindow: 300 * time.Millisecond, ScaleCooldown: 200 * time.Millisecond,
		})
		out = append(out, s)
	}
	return out
}

// converged reports whether every server holds exactly the adapters the
// placement of etcd's current state assigns to it, and every record says so.
func converged(t *testing.T, w *membership.Watcher, servers []*sim.Server) func() bool {
	return func() bool {
		ep := w.Snapshot().Endpoint("ep")
		if ep == nil || len(ep.Instances) != len(servers) {
			return false
		}
		p := lora.Place(ep)
		for i, s := range servers {
			want := p.Assigned(s.ID())
			if !slices.Equal(s.Adapters(), want) && !(len(want) == 0 && len(s.Adapters()) == 0) {
				return false
			}
			if !slices.Equal(ep.Instances[i].Adapters, s.Adapters()) {
				return false
			}
		}
		return true
	}
}

func TestPlacementLoadsAssignedAdapters(t *testing.T) {
	e := etcdtest.Start(t)
	cli := etcdtest.Client(t, e)
	ctx := testsupport.Context(t, 30*time.Second)
	l := membership.Layout{}
	w := membership.StartWatcher(cli, membership.WatcherOptions{Options: membership.Options{Logger: quiet}}, nil)
	t.Cleanup(func() { w.Close() })
	servers := simFleet(t, cli, 3, 2)
	for i := range 5 {
		if err := membership.PutAdapter(ctx, cli, l, "ep", fleet.Adapter{Name: fmt.Sprintf("a-%d", i), Source: "/m/a", MinReplicas: 1}); err != nil {
			t.Fatal(err)
		}
	}
	testsupport.Eventually(t, 10*time.Second, "every adapter loaded on its set, within the slots", converged(t, w, servers))
	total := 0
	for _, s := range servers {
		if n := len(s.Adapters()); n > 2 {
			t.Fatalf("%s holds %v, more than its 2 slots", s.ID(), s.Adapters())
		}
		total += len(s.Adapters())
	}
	if total != 5 {
		t.Fatalf("%d adapters loaded, want 5 (one replica each)", total)
	}
	// The slots vLLM reports (max_lora) are registered.
	testsupport.Eventually(t, 5*time.Second, "max adapters from max_lora", func() bool {
		for _, in := range w.Snapshot().Endpoint("ep").Instances {
			if in.MaxAdapters != 2 {
				return false
			}
		}
		return true
	})

	// Removing an adapter from the catalogue unloads it.
	if err := membership.DeleteAdapter(ctx, cli, l, "ep", "a-3"); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 10*time.Second, "a-3 unloaded", func() bool {
		for _, s := range servers {
			if slices.Contains(s.Adapters(), "a-3") {
				return false
			}
		}
		return converged(t, w, servers)()
	})

	// An adapter unloaded behind the agent's back: a router's stale mark
	// makes the agent poll at once; it sees the loss and loads it again.
	var holder *sim.Server
	for _, s := range servers {
		if slices.Contains(s.Adapters(), "a-0") {
			holder = s
		}
	}
	rest := slices.DeleteFunc(holder.Adapters(), func(a string) bool { return a == "a-0" })
	holder.SetAdapters(rest)
	if err := membership.MarkStale(ctx, cli, l, "ep", holder.ID(), "a-0", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 5*time.Second, "a-0 loaded again and the mark consumed", func() bool {
		resp, err := cli.Get(ctx, l.StaleKey("ep", holder.ID()))
		return err == nil && resp.Count == 0 && slices.Contains(holder.Adapters(), "a-0")
	})
}

func TestPlacementGrowsSaturatedAndShrinksCold(t *testing.T) {
	e := etcdtest.Start(t)
	cli := etcdtest.Client(t, e)
	ctx := testsupport.Context(t, 60*time.Second)
	l := membership.Layout{}
	// Threshold 1: one long request in flight saturates an instance.
	if err := membership.PutConfig(ctx, cli, l, "ep", fleet.RoutingConfig{PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{ConcurrencyThreshold: 1}}); err != nil {
		t.Fatal(err)
	}
	w := membership.StartWatcher(cli, membership.WatcherOptions{Options: membership.Options{Logger: quiet}}, nil)
	t.Cleanup(func() { w.Close() })
	servers := simFleet(t, cli, 3, 0)
	if err := membership.PutAdapter(ctx, cli, l, "ep", fleet.Adapter{Name: "busy", Source: "/m/busy", MinReplicas: 1, MaxReplicas: 2}); err != nil {
		t.Fatal(err)
	}
	target := func() int {
		a, _ := w.Snapshot().Endpoint("ep").Adapter("busy")
		return a.Target()
	}
	testsupport.Eventually(t, 10*time.Second, "loaded on one instance", converged(t, w, servers))
	first := lora.Place(w.Snapshot().Endpoint("ep")).Set("busy")[0]
	var url string
	for _, in := range w.Snapshot().Endpoint("ep").Instances {
		if in.ID == first {
			url = in.Addr
		}
	}
	// A long generation on the only member keeps it at the threshold.
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(rctx, http.MethodPost, url+"/v1/completions",
			strings.NewReader(`{"model":"busy","prompt":"x","max_tokens":100000}`))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	testsupport.Eventually(t, 10*time.Second, "the set grows to 2 and the new member loads", func() bool {
		return target() == 2 && converged(t, w, servers)()
	})
	stop()
	<-done
	testsupport.Eventually(t, 10*time.Second, "cold: the set shrinks back to 1 and the extra copy is unloaded", func() bool {
		return target() == 1 && converged(t, w, servers)()
	})
}

func TestSaturationHysteresis(t *testing.T) {
	p := &placer{a: &agent{cfg: Options{SaturationWindow: 5 * time.Second}}}
	t0 := time.Unix(0, 0)
	steps := []struct {
		at        time.Duration
		busy      float64
		saturated bool
	}{
		{0, 10, false},               // at the threshold: the window starts
		{4 * time.Second, 12, false}, // not yet a whole window
		{5 * time.Second, 10, true},  // a whole window at or above
		{6 * time.Second, 6, true},   // between half and the threshold: stays saturated
		{7 * time.Second, 4, true},   // below half: the cool window starts
		{8 * time.Second, 7, true},   // back above half: it restarts
		{9 * time.Second, 3, true},
		{13 * time.Second, 0, true},
		{14 * time.Second, 0, false}, // a whole window below half
		{15 * time.Second, 9, false}, // below the threshold: not saturated
	}
	for _, s := range steps {
		p.saturationStep(s.busy, 10, t0.Add(s.at))
		if p.saturated != s.saturated {
			t.Fatalf("at %v with load %v: saturated = %v, want %v", s.at, s.busy, p.saturated, s.saturated)
		}
	}
}

func TestSparesEvictLeastRecentlyUsed(t *testing.T) {
	now := time.Unix(1000, 0)
	ep := &fleet.Endpoint{Name: "ep", Adapters: []fleet.Adapter{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "n"}, {Name: "m"}}}
	seen := map[string]time.Time{"a": now.Add(-time.Second), "b": now.Add(-5 * time.Second), "c": now.Add(-2 * time.Second), "hand": now}
	cases := []struct {
		name          string
		have, want    []string
		static        []string
		slots         int
		pending       int
		kept, evicted []string
		unload        []string
	}{
		{name: "room for every spare", have: []string{"a", "b", "c"}, slots: 4,
			kept: []string{"a", "c", "b"}},
		{name: "one load into a full instance evicts the least recently used", have: []string{"a", "b", "c"}, want: []string{"n"}, slots: 3, pending: 1,
			kept: []string{"a", "c"}, evicted: []string{"b"}, unload: []string{"b"}},
		{name: "two loads evict the two least recently used", have: []string{"a", "b", "c"}, want: []string{"n", "m"}, slots: 3, pending: 2,
			kept: []string{"a"}, evicted: []string{"b", "c"}, unload: []string{"b", "c"}},
		{name: "assigned and static adapters hold their slots", have: []string{"a", "b", "n", "s"}, want: []string{"n"}, static: []string{"s"}, slots: 3,
			kept: []string{"a"}, evicted: []string{"b"}, unload: []string{"b"}},
		{name: "unlimited slots keep no spare", have: []string{"a", "b"}, slots: 0,
			unload: []string{"a", "b"}},
		{name: "cold, never used and uncatalogued adapters go at once", have: []string{"a", "cold", "d", "hand"}, slots: 8,
			kept: []string{"a"}, unload: []string{"cold", "d", "hand"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := &placer{a: &agent{cfg: Options{ActiveWindow: 30 * time.Second}}, static: c.static, lastSeen: map[string]time.Time{}}
			for k, v := range seen {
				p.lastSeen[k] = v
			}
			p.lastSeen["cold"] = now.Add(-time.Minute)
			e := *ep
			e.Adapters = append(slices.Clone(ep.Adapters), fleet.Adapter{Name: "cold"})
			got, unload := p.spares(&e, fleet.Instance{ID: "i", Adapters: c.have, MaxAdapters: c.slots}, c.want, c.pending, now)
			if !slices.Equal(got.kept, c.kept) || !slices.Equal(got.evicted, c.evicted) || !slices.Equal(unload, c.unload) {
				t.Fatalf("kept %v evicted %v unload %v; want %v %v %v", got.kept, got.evicted, unload, c.kept, c.evicted, c.unload)
			}
		})
	}
}
