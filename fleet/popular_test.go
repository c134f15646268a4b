package fleet

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestMergePopularity(t *testing.T) {
	a := Popularity{Rate: 3, Keys: []PopularKey{
		{Key: 9, Share: 0.4, K: 3, Since: 100},
		{Key: 5, Parent: 9, Level: 1, Model: "m", Share: 0.2, K: 1, Since: 120, At: "i-1"},
	}}
	b := Popularity{Rate: 1, Keys: []PopularKey{
		{Key: 9, Share: 0.8, K: 5, Since: 90},
		{Key: 7, Share: 0.1, K: 1, Since: 130},
		{Key: 5, Parent: 9, Level: 1, Model: "m", K: 1, Since: 125, At: "i-2"},
	}}
	got := MergePopularity([]Popularity{a, b})
	want := []PopularKey{
		{Key: 5, Parent: 9, Level: 1, Model: "m", Share: 0.15, K: 1, Since: 120, At: "i-1"}, // 3/4 × 0.2 + 1/4 × 0; the first publication's instance
		{Key: 7, Share: 0.025, K: 1, Since: 130},                                            // 1/4 × 0.1
		{Key: 9, Share: 0.5, K: 5, Since: 90},                                               // 3/4 × 0.4 + 1/4 × 0.8; the larger k, the earlier since
	}
	if len(got) != len(want) {
		t.Fatalf("merged %+v", got)
	}
	for i := range want {
		g := got[i]
		if math.Abs(g.Share-want[i].Share) > 1e-12 {
			t.Errorf("key %d: share %v, want %v", g.Key, g.Share, want[i].Share)
		}
		g.Share = want[i].Share
		if g != want[i] {
			t.Errorf("merged %+v, want %+v", got[i], want[i])
		}
	}
	// Without rates the replicas weigh alike.
	a.Rate, b.Rate = 0, 0
	if got := MergePopularity([]Popularity{a, b}); math.Abs(got[2].Share-0.6) > 1e-12 {
		t.Errorf("no rates: share %v, want 0.6", got[2].Share)
	}
	if MergePopularity(nil) != nil {
		t.Error("nothing published: want nil")
	}
}

// TestMergeServed: the instances' served shares merge as prefixes'
// shares do, weighted by the replicas' rates.
func TestMergeServed(t *testing.T) {
	a := Popularity{Rate: 3, Served: map[string]float64{"i-0": 0.5, "i-1": 0.5}}
	b := Popularity{Rate: 1, Served: map[string]float64{"i-1": 0.2, "i-2": 0.8}}
	got := MergeServed([]Popularity{a, b})
	want := map[string]float64{"i-0": 0.375, "i-1": 0.425, "i-2": 0.2}
	if len(got) != len(want) {
		t.Fatalf("merged %v, want %v", got, want)
	}
	for id, w := range want {
		if math.Abs(got[id]-w) > 1e-12 {
			t.Errorf("%s: %v, want %v", id, got[id], w)
		}
	}
	if MergeServed([]Popularity{{Rate: 1}}) != nil || MergeServed(nil) != nil {
		t.Error("nothing served: want nil")
	}
}

func TestPopularityValidate(t *testing.T) {
	many := make([]PopularKey, MaxPopularKeys+1)
	for _, tc := range []struct {
		name string
		p    Popularity
		ok   bool
	}{
		{"empty", Popularity{}, true},
		{"valid", Popularity{Rate: 12.5, Keys: []PopularKey{{Key: 1, Share: 0.3, K: 2, Level: 3, Model: "m"}}}, true},
		{"rate NaN", Popularity{Rate: math.NaN()}, false},
		{"rate negative", Popularity{Rate: -1}, false},
		{"rate infinite", Popularity{Rate: math.Inf(1)}, false},
		{"too many keys", Popularity{Keys: many}, false},
		{"share above 1", Popularity{Keys: []PopularKey{{Share: 1.5}}}, false},
		{"share NaN", Popularity{Keys: []PopularKey{{Share: math.NaN()}}}, false},
		{"k too large", Popularity{Keys: []PopularKey{{K: MaxPopularK + 1}}}, false},
		{"negative level", Popularity{Keys: []PopularKey{{Level: -1}}}, false},
		{"level too deep", Popularity{Keys: []PopularKey{{Level: MaxPopularLevel + 1}}}, false},
		{"model too long", Popularity{Keys: []PopularKey{{Model: strings.Repeat("m", MaxNameLength+1)}}}, false},
		{"instance too long", Popularity{Keys: []PopularKey{{At: strings.Repeat("i", MaxNameLength+1)}}}, false},
		{"served", Popularity{Served: map[string]float64{"i-0": 0.7, "i-1": 0.3}}, true},
		{"served above 1", Popularity{Served: map[string]float64{"i-0": 1.5}}, false},
		{"served NaN", Popularity{Served: map[string]float64{"i-0": math.NaN()}}, false},
		{"served id too long", Popularity{Served: map[string]float64{strings.Repeat("i", MaxNameLength+1): 0.1}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && (!errors.Is(err, ErrInvalidPopularity) || !errors.Is(err, ErrInvalid)) {
				t.Fatalf("error %v does not wrap ErrInvalidPopularity and ErrInvalid", err)
			}
		})
	}
}

// TestPopularityMoved: a view is written again only when it moved
// enough to matter.
func TestPopularityMoved(t *testing.T) {
	base := Popularity{Rate: 10, Keys: []PopularKey{{Key: 1, Share: 0.4, K: 3}, {Key: 2, Share: 0.02, K: 1}},
		Served: map[string]float64{"i-0": 0.6, "i-1": 0.4}}
	with := func(f func(*Popularity)) Popularity {
		p := base
		p.Keys = append([]PopularKey(nil), base.Keys...)
		p.Served = map[string]float64{"i-0": 0.6, "i-1": 0.4}
		f(&p)
		return p
	}
	for _, tc := range []struct {
		name string
		p    Popularity
		want bool
	}{
		{"same", with(func(*Popularity) {}), false},
		{"share drift under a tenth", with(func(p *Popularity) { p.Keys[0].Share = 0.43 }), false},
		{"small share drift under half a point", with(func(p *Popularity) { p.Keys[1].Share = 0.024 }), false},
		{"share moved", with(func(p *Popularity) { p.Keys[0].Share = 0.3 }), true},
		{"k moved", with(func(p *Popularity) { p.Keys[0].K = 4 }), true},
		{"key gone", with(func(p *Popularity) { p.Keys = p.Keys[:1] }), true},
		{"key replaced", with(func(p *Popularity) { p.Keys[1].Key = 3 }), true},
		{"rate drift", with(func(p *Popularity) { p.Rate = 12 }), false},
		{"rate moved", with(func(p *Popularity) { p.Rate = 20 }), true},
		{"instance set", with(func(p *Popularity) { p.Keys[1].At = "i-1" }), true},
		{"served drift", with(func(p *Popularity) { p.Served["i-0"], p.Served["i-1"] = 0.62, 0.38 }), false},
		{"served moved", with(func(p *Popularity) { p.Served["i-0"], p.Served["i-1"] = 0.5, 0.5 }), true},
		{"served instance gone", with(func(p *Popularity) { delete(p.Served, "i-1") }), true},
	} {
		if got := tc.p.Moved(base); got != tc.want {
			t.Errorf("%s: moved = %v, want %v", tc.name, got, tc.want)
		}
	}
}
