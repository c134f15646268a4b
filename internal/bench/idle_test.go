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

// idleMode is a routing configuration of the load-free model.
type idleMode struct {
	name string
	// fixed keeps SageMaker's fixed-length keys; hot adds hot-key
	// replication to them. Neither: adaptive keys (issue 21).
	fixed, hot bool
	// prefixLen is PrefixLength; 0 means the mode's default.
	prefixLen int
	// publishEvery is how many requests of the stream pass between two
	// publications of the replicas' popularity (adaptive keys): the
	// replica's interval (5 s) at the demo's rate (7 req/s) is 35.
	publishEvery int
	// sameStream feeds every request to every replica (each picks it, and
	// the picks are compared) instead of alternating as DNS would.
	sameStream bool
}

// The modes the issue compares: today's default, today's opt-in and the
// new default.
var (
	modeFixed    = idleMode{name: "fixed k=1", fixed: true}
	modeFixedHot = idleMode{name: "fixed+hot", fixed: true, hot: true}
	modeAdaptive = idleMode{name: "adaptive", publishEvery: 35}
)

// idleResult is what one load-free run measured.
type idleResult struct {
	hit    float64   // token hit rate of the measured requests
	shares []float64 // each instance's share of the measured requests
	// agree is the share of measured requests on which the other replica,
	// asked where it would send the request (Explain), names the instance
	// that served it; 1 with one replica.
	agree float64
}

// idleRun routes p's stream through replicas real routers (in process,
// ext_proc's Pick, no HTTP and no load: each request is released before
// the next) over the demo's fleet shape, and feeds each instance's block
// LRU cache (as BaselineRun). With two replicas the stream alternates
// between them, as DNS would spread it, and each request is explained by
// the other replica. With adaptive keys the replicas publish their
// popularity every mode.publishEvery requests and both route on the merge,
// as they would through etcd. Load-free, so it shows what the routing alone
// does to hits and balance, free of the timing noise of a shared machine.
func idleRun(t *testing.T, p Preset, mode idleMode, replicas, instances, kvTokens, warmup, requests int) idleResult {
	t.Helper()
	return idleRunWith(t, p, mode, replicas, instances, kvTokens, warmup, requests, 1)
}

func idleRunSeed(t *testing.T, p Preset, mode idleMode, replicas int, seed int64) idleResult {
	return idleRunWith(t, p, mode, replicas, 7, 300_000, 200, 1000, seed)
}

func idleRunWith(t *testing.T, p Preset, mode idleMode, replicas, instances, kvTokens, warmup, requests int, seed int64) idleResult {
	t.Helper()
	cfg := fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{
		PrefixLength: mode.prefixLen, HotKeyReplication: mode.hot, FixedLengthKeys: mode.fixed,
	}}
	ep := fleet.Endpoint{Name: "ep", Config: cfg}
	for i := range instances {
		ep.Instances = append(ep.Instances, fleet.Instance{ID: fmt.Sprintf("sim-%d", i), Addr: fmt.Sprintf("http://10.0.0.%d:8000", i+1)})
	}
	rs := make([]*router.Router, replicas)
	for i := range rs {
		r, err := router.New(router.Options{DefaultEndpoint: "ep"})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		r.Update(fleet.NewSnapshot([]fleet.Endpoint{ep}, 0, replicas, time.Now()))
		rs[i] = r
	}
	// The replicas publish every 5 s of a clock that moves only here, and
	// write a view only when it moved since the last one they wrote, as
	// their publisher does (fleet.Popularity.Moved).
	now := time.Unix(1_700_000_000, 0)
	written := make([]fleet.Popularity, len(rs))
	publish := func() {
		now = now.Add(5 * time.Second)
		var ps []fleet.Popularity
		for i, r := range rs {
			if pop, ok := r.Popularity("ep", now); ok && pop.Moved(written[i]) {
				written[i] = pop
			}
			ps = append(ps, written[i])
		}
		e := ep
		e.Popular, e.Served = fleet.MergePopularity(ps), fleet.MergeServed(ps)
		s := fleet.NewSnapshot([]fleet.Endpoint{e}, 0, replicas, time.Now())
		for _, r := range rs {
			r.Update(s)
		}
	}
	s, err := p.NewStream(seed, StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	caches := map[string]*lruCache{}
	count := map[string]int{}
	var cached, prompt int64
	agreed := 0
	for i := range warmup + requests {
		if mode.publishEvery > 0 && i > 0 && i%mode.publishEvery == 0 {
			publish()
		}
		req := s.Next()
		body, err := req.Body(sim.DefaultBaseModel)
		if err != nil {
			t.Fatal(err)
		}
		pr := router.PickRequest{Path: "/v1/chat/completions", Header: http.Header{}, Body: body, Complete: true}
		r := rs[i%replicas]
		pk, err := r.Pick(pr)
		if err != nil {
			t.Fatal(err)
		}
		pk.Done(http.StatusOK)
		same := true
		for j := 1; j < replicas; j++ {
			other := rs[(i+j)%replicas]
			var at string
			if mode.sameStream {
				opk, err := other.Pick(pr)
				if err != nil {
					t.Fatal(err)
				}
				opk.Done(http.StatusOK)
				at = opk.Instance
			} else {
				ex, err := other.Explain(t.Context(), pr)
				if err != nil {
					t.Fatal(err)
				}
				at = ex.Instance
			}
			same = same && at == pk.Instance
		}
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
			if same {
				agreed++
			}
		}
	}
	var shares []float64
	for _, n := range count {
		shares = append(shares, float64(n)/float64(requests))
	}
	return idleResult{hit: ratio(cached, prompt), shares: shares, agree: float64(agreed) / float64(requests)}
}

// TestHotReplicationIdle compares PREFIX_AWARE's fixed-length keys with
// and without hot-key replication on every preset, load-free (idleRun),
// over the demo's fleet: 7 instances with 300k-token caches, 200 warm-up +
// 1,000 measured requests, seed 1. It checks issue 10's hot-key line where
// load plays no part (no instance above 25 %, hit rate ≥ 85 %), the Zipf
// line (≥ 80 %, ≤ 25 %), and that replication changes nothing where no key
// is hot (identical routing, so identical figures). The agent presets are
// only logged: their sessions share one fixed-length key (the tool prompt),
// which replication spreads, and its spread hash (the body's end, a new
// turn each time) moves a session between instances: balance won, hits
// lost (docs/balance.md, which quotes the logged table). Adaptive keys
// answer that (TestAdaptiveKeysIdle).
func TestHotReplicationIdle(t *testing.T) {
	if testing.Short() {
		t.Skip("routes 24,000 requests through LRU models")
	}
	for _, name := range PresetNames() {
		p, err := LookupPreset(name)
		if err != nil {
			t.Fatal(err)
		}
		one := idleRun(t, p, modeFixed, 1, 7, 300_000, 200, 1000)
		k := idleRun(t, p, modeFixedHot, 1, 7, 300_000, 200, 1000)
		hit1, hitK := one.hit, k.hit
		b1, bK := balanceOf(one.shares, 7), balanceOf(k.shares, 7)
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

// TestAdaptiveKeysIdle compares, load-free (idleRun) over the demo's fleet
// (7 instances, 300k-token caches, 200 warm-up + 1,000 measured requests,
// seed 1), today's fixed-length keys (k = 1, and with hot-key replication)
// with adaptive keys, the default of issue 21, routed by two replicas that
// each see half of the stream (and, for agreement, both the whole stream)
// and publish their popularity every 35 requests. It logs the table docs/balance.md quotes and checks issue 21's
// lines where load plays no part: hit rate at least fixed k = 1's minus one
// point, the largest instance at most 1.5 fair shares (21.5 %) where the
// oracle shows the load can be spread, the agent preset within five points
// of the oracle, and the two replicas agreeing on at least 99.9 % of the
// requests.
func TestAdaptiveKeysIdle(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("routes 60,000 requests through LRU models: run without -short and -race (make test-models)")
	}
	t.Log("| preset | oracle | fixed k=1: hit / largest | fixed+hot: hit / largest | adaptive: hit / largest | agreement: halves / same stream |")
	for _, name := range PresetNames() {
		p, err := LookupPreset(name)
		if err != nil {
			t.Fatal(err)
		}
		orc, _, err := OracleRun(p, 1, StreamOptions{}, 200, 1000)
		if err != nil {
			t.Fatal(err)
		}
		one := idleRun(t, p, modeFixed, 1, 7, 300_000, 200, 1000)
		hot := idleRun(t, p, modeFixedHot, 1, 7, 300_000, 200, 1000)
		ad := idleRun(t, p, modeAdaptive, 2, 7, 300_000, 200, 1000)
		same := modeAdaptive
		same.sameStream = true
		adSame := idleRun(t, p, same, 2, 7, 300_000, 200, 1000)
		b1, bH, bA := balanceOf(one.shares, 7), balanceOf(hot.shares, 7), balanceOf(ad.shares, 7)
		t.Logf("| %s | %.1f %% | %.1f %% / %.1f %% | %.1f %% / %.1f %% | %.1f %% / %.1f %% | %.2f %% / %.2f %% |", name, 100*orc.HitRate,
			100*one.hit, 100*b1.MaxShare, 100*hot.hit, 100*bH.MaxShare, 100*ad.hit, 100*bA.MaxShare, 100*ad.agree, 100*adSame.agree)
		if ad.hit < one.hit-0.01 {
			t.Errorf("%s: adaptive hit rate %.1f %% below fixed k = 1's %.1f %% minus a point", name, 100*ad.hit, 100*one.hit)
		}
		// agentic holds 8 sessions of 20-40 turns open at once, each an
		// eighth of the traffic and kept on its instance (its history is
		// there): by the session's key alone, which instance holds two was
		// the hash's luck (22-26 %); the weighted placement of a hot
		// prefix's new children is what holds it to the line.
		if bA.MaxShare > 1.5/7 {
			t.Errorf("%s: adaptive largest instance %.1f %% above 1.5 fair shares (21.4 %%)", name, 100*bA.MaxShare)
		}
		if name == "agent" && ad.hit < orc.HitRate-0.05 {
			t.Errorf("%s: adaptive hit rate %.1f %% more than 5 points below the oracle's %.1f %%", name, 100*ad.hit, 100*orc.HitRate)
		}
		if ad.agree < 0.999 || adSame.agree < 0.999 {
			t.Errorf("%s: two replicas agree on %.2f %% (halves) and %.2f %% (same stream) of requests, want ≥ 99.9 %%", name, 100*ad.agree, 100*adSame.agree)
		}
	}
}

// TestAdaptiveSeeds is docs/balance.md's 12-seed table for the session
// presets: the load-free model of TestAdaptiveKeysIdle (two replicas, 7
// instances, 200 + 1,000 requests) over stream seeds 1-12. It logs the mean
// and worst largest-instance share and the mean hit rate, and fails when a
// seed puts more than 1.5 fair shares on one instance.
func TestAdaptiveSeeds(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("routes 28,800 requests through LRU models: run without -short and -race (make test-models)")
	}
	t.Log("| preset | largest: mean / worst | seeds above 1.5 fair shares | hit rate: mean |")
	for _, name := range []string{"agentic", "agent"} {
		p, err := LookupPreset(name)
		if err != nil {
			t.Fatal(err)
		}
		var sum, worst, hits float64
		over := 0
		for seed := int64(1); seed <= 12; seed++ {
			r := idleRunSeed(t, p, modeAdaptive, 2, seed)
			largest := balanceOf(r.shares, 7).MaxShare
			sum, hits, worst = sum+largest, hits+r.hit, max(worst, largest)
			if largest > 1.5/7 {
				over++
				t.Errorf("%s seed %d: largest instance %.1f %% above 1.5 fair shares (21.4 %%)", name, seed, 100*largest)
			}
		}
		t.Logf("| %s | %.1f %% / %.1f %% | %d | %.2f %% |", name, 100*sum/12, 100*worst, over, 100*hits/12)
	}
}

// TestAdaptiveDepth measures what the deepest depth (PrefixLength) should
// be once keys are adaptive (issue 21), load-free as TestAdaptiveKeysIdle:
// the agent preset (a 10 KB tool prompt), the same with a 24 KB tool prompt,
// and RAG over 16 KB documents (Zipf 1 over 200 documents of 4,000 tokens
// and a question), at each PrefixLength. It logs the table docs/balance.md
// quotes and checks that RAG meets on its documents at every depth (its hit
// rate within a point of the best), and that the default depth separates
// the agent preset's sessions (hit rate within 5 points of the oracle,
// largest instance at most 1.5 fair shares).
func TestAdaptiveDepth(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("routes 18,000 requests through LRU models: run without -short and -race (make test-models)")
	}
	agent, _ := LookupPreset("agent")
	agent24 := agent
	agent24.Name, agent24.SystemTokens = "agent, 24 KB tool prompt", 6000
	rag := Preset{Name: "rag-16k", Kind: KindSharedPrefix, Documents: 200, DocumentTokens: 4000, Zipf: 1,
		QuestionTokens: IntRange{50, 300}, Output: azureConv}
	depths := []int{4096, 8192, 16384, 32768, 65536}
	t.Log("| workload | oracle | PrefixLength 4096: hit / largest | 8192 | 16384 | 32768 | 65536 |")
	for _, p := range []Preset{agent, agent24, rag} {
		orc, _, err := OracleRun(p, 1, StreamOptions{}, 200, 1000)
		if err != nil {
			t.Fatal(err)
		}
		row := fmt.Sprintf("| %s | %.1f %% |", p.Name, 100*orc.HitRate)
		best := 0.0
		var hits []float64
		for _, d := range depths {
			m := modeAdaptive
			m.prefixLen = d
			r := idleRun(t, p, m, 2, 7, 300_000, 200, 1000)
			b := balanceOf(r.shares, 7)
			row += fmt.Sprintf(" %.1f %% / %.1f %% |", 100*r.hit, 100*b.MaxShare)
			hits = append(hits, r.hit)
			best = max(best, r.hit)
			if d == fleet.DefaultAdaptivePrefixLength && p.Name == "agent" && (r.hit < orc.HitRate-0.05 || b.MaxShare > 1.5/7) {
				t.Errorf("agent at the default depth %d: hit %.1f %% (oracle %.1f %%), largest %.1f %%", d, 100*r.hit, 100*orc.HitRate, 100*b.MaxShare)
			}
		}
		if p.Name == rag.Name {
			for i, h := range hits {
				if h < best-0.01 {
					t.Errorf("RAG at depth %d: hit %.1f %%, best %.1f %%: its requests do not meet on their documents", depths[i], 100*h, 100*best)
				}
			}
		}
		t.Log(row)
	}
}
