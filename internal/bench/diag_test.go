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

func TestDiagAgent(t *testing.T) {
	p, _ := LookupPreset("agent")
	cfg := fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware}
	ep := fleet.Endpoint{Name: "ep", Config: cfg}
	for i := range 7 {
		ep.Instances = append(ep.Instances, fleet.Instance{ID: fmt.Sprintf("sim-%d", i), Addr: fmt.Sprintf("http://10.0.0.%d:8000", i+1)})
	}
	r0, _ := router.New(router.Options{DefaultEndpoint: "ep"})
	defer r0.Close()
	r1, _ := router.New(router.Options{DefaultEndpoint: "ep"})
	defer r1.Close()
	rs := []*router.Router{r0, r1}
	for _, r := range rs {
		r.Update(fleet.NewSnapshot([]fleet.Endpoint{ep}, 0, 1, time.Now()))
	}
	s, _ := p.NewStream(1, StreamOptions{})
	last := map[int]string{}
	caches := map[string]*lruCache{}
	orc := NewOracle()
	lossByTurn := map[int]int{}
	lossMoved, lossStay, total := 0, 0, 0
	moves := map[int]int{}
	lens := map[int][]int{}
	for i := range 1200 {
		if i > 0 && i%35 == 0 {
			pop0, _ := r0.Popularity("ep", time.Unix(int64(i), 0))
			pop1, _ := r1.Popularity("ep", time.Unix(int64(i), 0))
			e := ep
			e.Popular = fleet.MergePopularity([]fleet.Popularity{pop0, pop1})
			if i <= 350 {
				t.Logf("i=%d popular %d", i, len(e.Popular))
				for _, k := range e.Popular {
					t.Logf("  %x parent %x level %d share %.3f k %d", k.Key, k.Parent, k.Level, k.Share, k.K)
				}
			}
			for _, r := range rs {
				r.Update(fleet.NewSnapshot([]fleet.Endpoint{e}, 0, 1, time.Now()))
			}
		}
		r := rs[i%2]
		req := s.Next()
		body, _ := req.Body(sim.DefaultBaseModel)
		pk, err := r.Pick(router.PickRequest{Path: "/v1/chat/completions", Header: http.Header{}, Body: body, Complete: true})
		if err != nil {
			t.Fatal(err)
		}
		pk.Done(200)
		moved := false
		if l, ok := last[req.Session]; ok && l != pk.Instance {
			moves[req.Turn]++
			moved = true
			if req.Turn >= 2 && i >= 200 {
				t.Logf("move at i=%d session %d turn %d %s->%s", i, req.Session, req.Turn, l, pk.Instance)
			}
		}
		c := caches[pk.Instance]
		if c == nil {
			c = newLRUCache(300000)
			caches[pk.Instance] = c
		}
		text := req.Prompt()
		hit := c.observe(sim.BlockHashes(req.Adapter, req.Tenant, text)) * sim.BlockTokens
		oc, pt := orc.Observe(req.Adapter, req.Tenant, text, i >= 200)
		if i >= 200 {
			total += pt
			lossByTurn[req.Turn] += oc - hit
			if moved {
				lossMoved += oc - hit
			} else {
				lossStay += oc - hit
			}
		}
		last[req.Session] = pk.Instance
		if req.Turn < 3 {
			lens[req.Turn] = append(lens[req.Turn], len([]rune(req.Prompt())))
		}
	}
	t.Logf("moves by turn: %v", moves)
	t.Logf("loss vs oracle (tokens): by turn %v; moved %d, stayed %d, of %d prompt tokens", lossByTurn, lossMoved, lossStay, total)
	for tn := 0; tn < 3; tn++ {
		l := lens[tn]
		short := 0
		for _, x := range l {
			if x < 16384 {
				short++
			}
		}
		t.Logf("turn %d: %d prompts, %d under 16384 chars", tn, len(l), short)
	}
}

func TestDiagAgent2(t *testing.T) {
	p, _ := LookupPreset("agent")
	for _, reps := range []int{1, 2} {
		r := idleRun(t, p, modeAdaptive, reps, 7, 300_000, 200, 1000)
		t.Logf("replicas %d: hit %.4f max %.3f agree %.4f", reps, r.hit, balanceOf(r.shares, 7).MaxShare, r.agree)
	}
	orc, _, _ := OracleRun(p, 1, StreamOptions{}, 200, 1000)
	t.Logf("oracle %.4f", orc.HitRate)
}

func TestDiagAgentic(t *testing.T) {
	p, _ := LookupPreset("agentic")
	cfg := fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware}
	ep := fleet.Endpoint{Name: "ep", Config: cfg}
	for i := range 7 {
		ep.Instances = append(ep.Instances, fleet.Instance{ID: fmt.Sprintf("sim-%d", i), Addr: fmt.Sprintf("http://10.0.0.%d:8000", i+1)})
	}
	var rs []*router.Router
	for range 2 {
		r, _ := router.New(router.Options{DefaultEndpoint: "ep"})
		defer r.Close()
		r.Update(fleet.NewSnapshot([]fleet.Endpoint{ep}, 0, 1, time.Now()))
		rs = append(rs, r)
	}
	s, _ := p.NewStream(1, StreamOptions{})
	sess := map[int][]string{}
	count := map[string]int{}
	var popular []fleet.PopularKey
	for i := range 1200 {
		if i > 0 && i%35 == 0 {
			var ps []fleet.Popularity
			for _, r := range rs {
				pop, _ := r.Popularity("ep", time.Unix(int64(i), 0))
				ps = append(ps, pop)
			}
			e := ep
			e.Popular = fleet.MergePopularity(ps)
			popular = e.Popular
			for _, r := range rs {
				r.Update(fleet.NewSnapshot([]fleet.Endpoint{e}, 0, 1, time.Now()))
			}
		}
		req := s.Next()
		body, _ := req.Body(sim.DefaultBaseModel)
		pk, _ := rs[i%2].Pick(router.PickRequest{Path: "/v1/chat/completions", Header: http.Header{}, Body: body, Complete: true})
		pk.Done(200)
		sess[req.Session] = append(sess[req.Session], fmt.Sprintf("%d:%s", i, pk.Instance[4:]))
		if i >= 200 {
			count[pk.Instance]++
		}
	}
	t.Logf("counts %v", count)
	for id := 0; id < len(sess); id++ {
		t.Logf("session %d: %v", id, sess[id])
	}
	for _, k := range popular {
		t.Logf("  %x parent %x level %d share %.3f k %d since %d", k.Key, k.Parent, k.Level, k.Share, k.K, k.Since)
	}
}

func TestDiagSeeds(t *testing.T) {
	for _, name := range []string{"shared-8k-uniform", "agentic", "bot"} {
		p, _ := LookupPreset(name)
		for seed := int64(1); seed <= 5; seed++ {
			res := []string{}
			for _, m := range []idleMode{modeFixed, modeAdaptive} {
				r := idleRunSeed(t, p, m, 2, seed)
				res = append(res, fmt.Sprintf("%s %.1f/%.1f", m.name, 100*r.hit, 100*balanceOf(r.shares, 7).MaxShare))
			}
			t.Logf("%s seed %d: %v", name, seed, res)
		}
	}
}

func TestDiagUniform(t *testing.T) {
	p, _ := LookupPreset("shared-8k-uniform")
	cfg := fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware}
	ep := fleet.Endpoint{Name: "ep", Config: cfg}
	for i := range 7 {
		ep.Instances = append(ep.Instances, fleet.Instance{ID: fmt.Sprintf("sim-%d", i), Addr: fmt.Sprintf("http://10.0.0.%d:8000", i+1)})
	}
	var rs []*router.Router
	for range 2 {
		r, _ := router.New(router.Options{DefaultEndpoint: "ep"})
		defer r.Close()
		r.Update(fleet.NewSnapshot([]fleet.Endpoint{ep}, 0, 1, time.Now()))
		rs = append(rs, r)
	}
	s, _ := p.NewStream(2, StreamOptions{})
	for i := range 1200 {
		if i > 0 && i%35 == 0 {
			var ps []fleet.Popularity
			for _, r := range rs {
				pop, _ := r.Popularity("ep", time.Unix(int64(i), 0))
				ps = append(ps, pop)
			}
			e := ep
			e.Popular = fleet.MergePopularity(ps)
			if len(e.Popular) > 0 {
				t.Logf("i=%d: %d popular, e.g. %+v", i, len(e.Popular), e.Popular[0])
			}
			for _, r := range rs {
				r.Update(fleet.NewSnapshot([]fleet.Endpoint{e}, 0, 1, time.Now()))
			}
		}
		req := s.Next()
		body, _ := req.Body(sim.DefaultBaseModel)
		pk, _ := rs[i%2].Pick(router.PickRequest{Path: "/v1/chat/completions", Header: http.Header{}, Body: body, Complete: true})
		pk.Done(200)
	}
}

func TestDiagUniformLen(t *testing.T) {
	p, _ := LookupPreset("shared-8k-uniform")
	for seed := int64(1); seed <= 3; seed++ {
		var out []string
		for _, l := range []int{1024, 2048, 4096, 8192, 16384} {
			m := idleMode{name: "fixed", fixed: true, prefixLen: l}
			r := idleRunSeed(t, p, m, 1, seed)
			out = append(out, fmt.Sprintf("%d: %.1f/%.1f", l, 100*r.hit, 100*balanceOf(r.shares, 7).MaxShare))
		}
		t.Logf("seed %d: %v", seed, out)
	}
}
