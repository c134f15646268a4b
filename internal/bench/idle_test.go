package bench

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/sim"
	"github.com/prefixrouter/prefixrouter/router"
)

// idleRun routes p's stream through a real router (in process, ext_proc's
// Pick, no HTTP and no load: each request is released before the next)
// over the demo's fleet shape, and feeds each instance's block LRU cache
// (as BaselineRun). It returns the token hit rate and each instance's share
// of the measured requests. Load-free, so it shows what the routing alone
// does to hits and balance, free of the timing noise of a shared machine.
func idleRun(t *testing.T, p Preset, hot bool, instances, kvTokens, warmup, requests int) (float64, []float64) {
	t.Helper()
	r, err := router.New(router.Options{DefaultEndpoint: "ep"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cfg := fleet.DefaultRoutingConfig()
	cfg.PrefixAwareRoutingConfig.HotKeyReplication = hot
	ep := fleet.Endpoint{Name: "ep", Config: cfg}
	for i := range instances {
		ep.Instances = append(ep.Instances, fleet.Instance{ID: fmt.Sprintf("sim-%d", i), Addr: fmt.Sprintf("http://10.0.0.%d:8000", i+1)})
	}
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{ep}, 0, 1, time.Now()))
	s, err := p.NewStream(1, StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	caches := map[string]*lruCache{}
	count := map[string]int{}
	var cached, prompt int64
	for i := range warmup + requests {
		req := s.Next()
		body, err := req.Body(sim.DefaultBaseModel)
		if err != nil {
			t.Fatal(err)
		}
		pk, err := r.Pick(router.PickRequest{Path: "/v1/chat/completions", Header: http.Header{}, Body: body, Complete: true})
		if err != nil {
			t.Fatal(err)
		}
		pk.Done(http.StatusOK)
		c := caches[pk.Instance]
		if c == nil {
			c = newLRUCache(kvTokens)
			caches[pk.Instance] = c
		}
		text := req.Prompt()
		hit := c.observe(sim.BlockHashes(req.Adapter, req.Tenant, text))
		if i >= warmup {
			cached += int64(hit * sim.BlockTokens)
			prompt += int64(sim.CountTokens(text))
			count[pk.Instance]++
		}
	}
	var shares []float64
	for _, n := range count {
		shares = append(shares, float64(n)/float64(requests))
	}
	return ratio(cached, prompt), shares
}

// TestHotReplicationIdle compares PREFIX_AWARE with and without hot-key
// replication on every preset, load-free (idleRun), over the demo's fleet:
// 7 instances with 300k-token caches, 200 warm-up + 1,000 measured
// requests, seed 1. It checks issue 10's hot-key line where load plays no
// part (no instance above 25 %, hit rate ≥ 85 %), the Zipf line (≥ 80 %,
// ≤ 25 %), and that replication changes nothing where no key is hot
// (identical routing, so identical figures). agentic is only logged: its
// sessions share one routing key (the tool prompt), which replication
// spreads, and its spread hash (the body's end, a new turn each time) moves
// a session between instances: balance won, hits lost (docs/balance.md,
// which quotes the logged table).
func TestHotReplicationIdle(t *testing.T) {
	if testing.Short() {
		t.Skip("routes 21,600 requests through LRU models")
	}
	for _, name := range PresetNames() {
		p, err := LookupPreset(name)
		if err != nil {
			t.Fatal(err)
		}
		hit1, sh1 := idleRun(t, p, false, 7, 300_000, 200, 1000)
		hitK, shK := idleRun(t, p, true, 7, 300_000, 200, 1000)
		b1, bK := balanceOf(sh1, 7), balanceOf(shK, 7)
		t.Logf("| %s | %.1f %% | %.1f %% | %.3f | %.1f %% | %.1f %% | %.3f |", name,
			100*hit1, 100*b1.MaxShare, b1.Gini, 100*hitK, 100*bK.MaxShare, bK.Gini)
		switch name {
		case "shared-8k-hot":
			if bK.MaxShare > 0.25 || hitK < 0.85 {
				t.Errorf("%s with replication: largest instance %.1f %%, hit rate %.1f %%; want ≤ 25 %% and ≥ 85 %%", name, 100*bK.MaxShare, 100*hitK)
			}
			if b1.MaxShare <= 0.25 {
				t.Errorf("%s with k = 1: largest instance %.1f %%: the top document (40 %%) should overload one instance", name, 100*b1.MaxShare)
			}
		case "shared-8k":
			if bK.MaxShare > 0.25 || hitK < 0.80 {
				t.Errorf("%s with replication: largest instance %.1f %%, hit rate %.1f %%; want ≤ 25 %% and ≥ 80 %%", name, 100*bK.MaxShare, 100*hitK)
			}
		case "shared-8k-uniform", "shared-8k-seed", "bot", "gsp", "chat", "sharegpt-like":
			if hitK != hit1 || bK != b1 {
				t.Errorf("%s: replication changed routing where no key is hot: hit %.4f vs %.4f, balance %+v vs %+v", name, hitK, hit1, bK, b1)
			}
		}
	}
}
