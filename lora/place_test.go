package lora

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
)

func placeFleet(n, slots int, adapters ...fleet.Adapter) *fleet.Endpoint {
	var insts []fleet.Instance
	for i := range n {
		insts = append(insts, fleet.Instance{ID: fmt.Sprintf("i-%d", i), Addr: "http://x", MaxAdapters: slots})
	}
	return fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Instances: insts, Adapters: adapters}}, 1, 1, time.Time{}).Endpoint("ep")
}

func catalogue(n int, min, max int) []fleet.Adapter {
	var out []fleet.Adapter
	for i := range n {
		out = append(out, fleet.Adapter{Name: fmt.Sprintf("a-%02d", i), Source: "s", MinReplicas: min, MaxReplicas: max})
	}
	return out
}

func TestPlaceDeterministicAndCapped(t *testing.T) {
	ep := placeFleet(6, 4, catalogue(12, 1, 3)...)
	p := Place(ep)
	// The same fleet listed in another order (another replica's watch
	// history) places identically.
	shuffled := *ep
	shuffled.Instances = slices.Clone(ep.Instances)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled.Instances), func(i, j int) {
		shuffled.Instances[i], shuffled.Instances[j] = shuffled.Instances[j], shuffled.Instances[i]
	})
	if q := Place(&shuffled); !p.Equal(q) {
		t.Fatal("placement depends on the order of the instances")
	}
	for _, a := range ep.Adapters {
		if got := len(p.Set(a.Name)); got != 1 {
			t.Errorf("%s: set of %d, want min replicas 1", a.Name, got)
		}
	}
	for _, in := range ep.Instances {
		if n := len(p.Assigned(in.ID)); n > 4 {
			t.Errorf("%s holds %d adapters, more than its 4 slots", in.ID, n)
		}
	}
	if p.Set("not-catalogued") != nil {
		t.Error("a name outside the catalogue has a set")
	}
}

func TestPlaceGrowthAddsTheNextChoice(t *testing.T) {
	for k := 1; k < 5; k++ {
		a := fleet.Adapter{Name: "busy", Source: "s", MinReplicas: 1, MaxReplicas: 6, Replicas: k}
		small := Place(placeFleet(8, 0, a)).Set("busy")
		a.Replicas = k + 1
		big := Place(placeFleet(8, 0, a)).Set("busy")
		if len(small) != k || len(big) != k+1 || !slices.Equal(small, big[:k]) {
			t.Fatalf("k=%d: %v → %v, want the same first %d plus one", k, small, big, k)
		}
	}
}

func TestPlaceGrowthNeverDisplacesMinimumSets(t *testing.T) {
	ads := catalogue(12, 1, 3)
	base := Place(placeFleet(6, 4, ads...))
	for i := range ads {
		ads[i].Replicas = 3 // everything busy: 36 wanted, 24 slots
	}
	grown := Place(placeFleet(6, 4, ads...))
	used := 0
	for _, a := range ads {
		if got := grown.Set(a.Name); len(got) == 0 || got[0] != base.Set(a.Name)[0] {
			t.Errorf("%s: minimum set moved from %v to %v", a.Name, base.Set(a.Name), got)
		}
		used += len(grown.Set(a.Name))
	}
	if used != 24 {
		t.Errorf("%d slots used, want all 24", used)
	}
}

func TestPlaceSlotsAndDraining(t *testing.T) {
	ep := placeFleet(3, 2, catalogue(3, 2, 2)...)
	// i-0 holds an adapter outside the catalogue: one slot left. i-1 drains.
	ep.Instances[0].Adapters = []string{"by-hand"}
	ep.Instances[1].Draining = true
	p := Place(ep)
	if n := len(p.Assigned("i-0")); n > 1 {
		t.Errorf("i-0 assigned %v, but one of its 2 slots is taken", p.Assigned("i-0"))
	}
	if n := len(p.Assigned("i-1")); n != 0 {
		t.Errorf("draining i-1 assigned %v", p.Assigned("i-1"))
	}
	total := 0
	for _, a := range ep.Adapters {
		total += len(p.Set(a.Name))
	}
	if total != 3 { // 1 + 0 + 2 free slots
		t.Errorf("%d placements, want the 3 free slots", total)
	}
}

// TestPlaceJoinMovesLittle: an instance joining enters at most the sets it
// ranks in, displacing one member of each, and no other set changes.
func TestPlaceJoinMovesLittle(t *testing.T) {
	ads := catalogue(40, 2, 2)
	before := Place(placeFleet(8, 0, ads...))
	after := Place(placeFleet(9, 0, ads...))
	changed := 0
	for _, a := range ads {
		b, c := before.Set(a.Name), after.Set(a.Name)
		if slices.Equal(b, c) {
			continue
		}
		changed++
		if !slices.Contains(c, "i-8") {
			t.Errorf("%s changed from %v to %v without the new instance", a.Name, b, c)
		}
		kept := 0
		for _, id := range c {
			if slices.Contains(b, id) {
				kept++
			}
		}
		if kept != len(b)-1 {
			t.Errorf("%s: %v → %v moved more than one member", a.Name, b, c)
		}
	}
	// Each set of 2 of 9 contains the newcomer with probability 2/9: about
	// 9 of 40; far more would mean the order is not rendezvous.
	if changed == 0 || changed > 20 {
		t.Errorf("%d of 40 sets changed on a join, want about 9", changed)
	}
}

func TestDecide(t *testing.T) {
	now := time.Unix(1000, 0)
	saturate := func(ep *fleet.Endpoint, ids ...string) {
		for i := range ep.Instances {
			in := &ep.Instances[i]
			in.Saturated = slices.Contains(ids, in.ID)
			in.BusyAdapters = nil
			if in.Saturated {
				in.BusyAdapters = []string{"a"}
			}
		}
	}
	load := func(ep *fleet.Endpoint, p *Placement) {
		for i := range ep.Instances {
			in := &ep.Instances[i]
			in.Adapters = slices.Clone(p.Assigned(in.ID))
		}
	}
	t.Run("all members saturated grows by one", func(t *testing.T) {
		ep := placeFleet(4, 0, fleet.Adapter{Name: "a", Source: "s", MaxReplicas: 3, PlacementRevision: 7})
		p := Place(ep)
		load(ep, p)
		saturate(ep, p.Set("a")...)
		got := Decide(ep, p, now, ScaleOptions{})
		if len(got) != 1 || got[0] != (Scale{Adapter: "a", From: 1, To: 2, Revision: 7}) {
			t.Fatalf("Decide = %+v", got)
		}
	})
	t.Run("a member not saturated: no growth", func(t *testing.T) {
		ep := placeFleet(4, 0, fleet.Adapter{Name: "a", Source: "s", Replicas: 2, MaxReplicas: 3})
		p := Place(ep)
		load(ep, p)
		saturate(ep, p.Set("a")[0])
		for i := range ep.Instances {
			ep.Instances[i].ActiveAdapters = []string{"a"}
		}
		if got := Decide(ep, p, now, ScaleOptions{}); len(got) != 0 {
			t.Fatalf("Decide = %+v", got)
		}
	})
	t.Run("saturated by another adapter: no growth", func(t *testing.T) {
		ep := placeFleet(4, 0, fleet.Adapter{Name: "a", Source: "s", MaxReplicas: 3})
		p := Place(ep)
		load(ep, p)
		saturate(ep, p.Set("a")...)
		for i := range ep.Instances {
			if ep.Instances[i].Saturated {
				ep.Instances[i].BusyAdapters = []string{"b"}
			}
		}
		if got := Decide(ep, p, now, ScaleOptions{}); len(got) != 0 {
			t.Fatalf("Decide = %+v", got)
		}
	})
	t.Run("saturated but not yet loaded: no growth", func(t *testing.T) {
		ep := placeFleet(4, 0, fleet.Adapter{Name: "a", Source: "s", MaxReplicas: 3})
		p := Place(ep)
		saturate(ep, p.Set("a")...)
		if got := Decide(ep, p, now, ScaleOptions{}); len(got) != 0 {
			t.Fatalf("Decide = %+v", got)
		}
	})
	t.Run("at max: no growth", func(t *testing.T) {
		ep := placeFleet(4, 0, fleet.Adapter{Name: "a", Source: "s", Replicas: 2, MaxReplicas: 2})
		p := Place(ep)
		load(ep, p)
		saturate(ep, p.Set("a")...)
		if got := Decide(ep, p, now, ScaleOptions{}); len(got) != 0 {
			t.Fatalf("Decide = %+v", got)
		}
	})
	t.Run("within the cooldown: nothing", func(t *testing.T) {
		ep := placeFleet(4, 0, fleet.Adapter{Name: "a", Source: "s", MaxReplicas: 3, ScaledAt: now.Add(-time.Second)})
		p := Place(ep)
		load(ep, p)
		saturate(ep, p.Set("a")...)
		if got := Decide(ep, p, now, ScaleOptions{Cooldown: 2 * time.Second}); len(got) != 0 {
			t.Fatalf("Decide = %+v", got)
		}
		if got := Decide(ep, p, now.Add(time.Second), ScaleOptions{Cooldown: 2 * time.Second}); len(got) != 1 {
			t.Fatalf("after the cooldown: Decide = %+v", got)
		}
	})
	t.Run("cold shrinks to min, active or busy does not", func(t *testing.T) {
		ep := placeFleet(4, 0, fleet.Adapter{Name: "a", Source: "s", MinReplicas: 1, Replicas: 3, MaxReplicas: 3, PlacementRevision: 9})
		p := Place(ep)
		load(ep, p)
		if got := Decide(ep, p, now, ScaleOptions{}); len(got) != 1 || got[0] != (Scale{Adapter: "a", From: 3, To: 1, Revision: 9}) {
			t.Fatalf("cold: Decide = %+v", got)
		}
		ep.Instances[3].ActiveAdapters = []string{"a"}
		if got := Decide(ep, p, now, ScaleOptions{}); len(got) != 0 {
			t.Fatalf("active somewhere: Decide = %+v", got)
		}
		ep.Instances[3].ActiveAdapters = nil
		saturate(ep, p.Set("a")[1])
		if got := Decide(ep, p, now, ScaleOptions{}); len(got) != 0 {
			t.Fatalf("a member saturated: Decide = %+v", got)
		}
	})
}

func TestTableCataloguedNotLoaded(t *testing.T) {
	ep := placeFleet(2, 0, fleet.Adapter{Name: "cat", Source: "s"})
	ep.Instances[1].Adapters = []string{"loaded"}
	tb := New(ep)
	if _, err := tb.Set("cat"); !errors.Is(err, ErrNotLoaded) {
		t.Fatalf("catalogued, loaded nowhere: %v, want ErrNotLoaded (not the base set)", err)
	}
	if s, err := tb.Set("loaded"); err != nil || s.Len() != 1 {
		t.Fatalf("loaded: %v %v", s, err)
	}
	if got := tb.Models(); !slices.Equal(got, []string{"cat", "loaded"}) {
		t.Fatalf("Models = %v", got)
	}
}

// An instance of weight 4 among seven of weight 1 owns 4/11 of the keys, and
// comes first in about 4/11 of the adapters' orders: binomial(400, 4/11),
// 145 ± 10 sets, where ignoring weights gives 400/8 = 50 ± 7.
func TestPlaceHonoursWeights(t *testing.T) {
	ep := placeFleet(8, 0, catalogue(400, 1, 1)...)
	ep.Instances[0].Weight = 4
	p := Place(ep)
	if got := len(p.Assigned("i-0")); got < 110 || got > 180 {
		t.Errorf("weight-4 i-0 holds %d of 400 adapters, want about 145 (4/11)", got)
	}
}

// Records are validated, but a snapshot built by hand may carry a weight
// beyond ring.MaxWeight: the catalogue is still placed, by equal weights.
func TestPlaceUnvalidatedWeight(t *testing.T) {
	ep := placeFleet(4, 0, catalogue(8, 1, 1)...)
	ep.Instances[2].Weight = 1_000_000
	p := Place(ep)
	for _, a := range ep.Adapters {
		if len(p.Set(a.Name)) != 1 {
			t.Fatalf("%s: set %v, want one instance", a.Name, p.Set(a.Name))
		}
	}
}

// TestPlaceSkipsStartOnlyEngines: llama-server loads adapters only at
// start, so placement never assigns it a catalogued adapter (it would wait
// for a load that cannot happen); SGLang and unknown engines load at run
// time and take their share (issue 20).
func TestPlaceSkipsStartOnlyEngines(t *testing.T) {
	ep := placeFleet(4, 0, catalogue(8, 2, 2)...)
	ep.Instances[0].Engine = "llamacpp"
	ep.Instances[1].Engine = "sglang"
	ep.Instances[2].Engine = "vllm"
	p := Place(ep)
	if got := p.Assigned("i-0"); len(got) != 0 {
		t.Fatalf("llama-server assigned %v", got)
	}
	for _, a := range ep.Adapters {
		if set := p.Set(a.Name); len(set) != 2 || slices.Contains(set, "i-0") {
			t.Errorf("%s: set %v, want 2 of i-1..i-3", a.Name, set)
		}
	}
	if len(p.Assigned("i-1")) == 0 || len(p.Assigned("i-3")) == 0 {
		t.Errorf("SGLang %v and an unknown engine %v took nothing", p.Assigned("i-1"), p.Assigned("i-3"))
	}
}
