package ring

import (
	"math"
	"slices"
	"testing"
)

// The algorithm follows the size: up to RendezvousLimit seeds a ring scores
// every member (the ring before issue 22, so small fleets route and move
// exactly as before), beyond it the multi-probe circle.
func TestLimitChoosesAlgorithm(t *testing.T) {
	for _, tc := range []struct {
		members []Member
		probes  bool
	}{
		{equalMembers(vllmIDs(RendezvousLimit)), false},
		{equalMembers(vllmIDs(RendezvousLimit + 1)), true},
		// Seeds count, not members: 200 members of weights 2 and 1 are 300 seeds...
		{weighted(vllmIDs(200), 2, 1), true},
		// ...unless the GCD divides them back: all of weight 2 is all of weight 1.
		{weighted(vllmIDs(200), 2, 2), false},
	} {
		r := mustNew(tc.members)
		if got := r.probes != nil; got != tc.probes {
			t.Errorf("%d members, %d seeds: multi-probe %v, want %v", len(tc.members), len(r.seeds), got, tc.probes)
		}
		if tc.probes {
			continue
		}
		old := mustNew(tc.members, withLimit(math.MaxInt))
		for _, key := range testKeys()[:2000] {
			if a, b := r.Candidates(key, 4, nil), old.Candidates(key, 4, nil); !slices.Equal(a, b) {
				t.Fatalf("%d members: %v, the rendezvous ring gives %v", len(tc.members), a, b)
			}
		}
	}
}

// weighted gives every member weight a, every other one weight b.
func weighted(ids []string, a, b int) []Member {
	ms := equalMembers(ids)
	for i := range ms {
		ms[i].Weight = a
		if i%2 == 1 {
			ms[i].Weight = b
		}
	}
	return ms
}

// The owner is the member nearest to one of the key's probes, clockwise,
// computed here the slow way from the definition.
func TestProbePrimaryIsNearest(t *testing.T) {
	ms := equalMembers(uuidIDs(40))
	ms[5].Weight = 3
	r := mustNew(ms, withLimit(0))
	for _, key := range testKeys()[:3000] {
		best, owner := uint64(math.MaxUint64), -1
		for m, mem := range r.Members() {
			for s := range mem.Weight {
				seed := r.seeds[m]
				if r.off != nil {
					seed = r.seeds[int(r.off[m])+s]
				}
				for c := range pointsPerSeed {
					pos := Mix64(seed + uint64(c+1)*golden)
					for i := range numProbes {
						if d := pos - probe(key, i); d < best || (d == best && m < owner) {
							best, owner = d, m
						}
					}
				}
			}
		}
		if got := r.Primary(key); got != owner {
			t.Fatalf("key %#x: Primary %d, nearest member %d", key, got, owner)
		}
	}
}

// Adding a member moves keys only to it and inserts it into candidate
// orders; removing one moves only its keys and deletes it. Sizes on both
// sides of RendezvousLimit, weighted and not.
func TestProbeMovement(t *testing.T) {
	keys := testKeys()
	if testing.Short() {
		keys = keys[:20_000]
	}
	for _, tc := range []struct {
		name string
		ms   []Member
		opts []Option
	}{
		{"forced/N=7", equalMembers(uuidIDs(8)), []Option{withLimit(0)}},
		{"forced/N=64/weighted", weighted(vllmIDs(65), 1, 3), []Option{withLimit(0)}},
		{"N=600", equalMembers(uuidIDs(601)), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := len(tc.ms) - 1
			small := mustNew(tc.ms[:n], tc.opts...)
			big := mustNew(tc.ms, tc.opts...)
			if small.probes == nil || big.probes == nil {
				t.Fatal("not multi-probe rings")
			}
			added := tc.ms[n].ID
			if _, collateral := movement(small, big, keys, added, ""); collateral != 0 {
				t.Errorf("adding %s: %d keys moved between old members", added, collateral)
			}
			removed := tc.ms[n/2].ID
			lessMs := slices.DeleteFunc(slices.Clone(tc.ms[:n]), func(m Member) bool { return m.ID == removed })
			less := mustNew(lessMs, tc.opts...)
			if _, collateral := movement(small, less, keys, "", removed); collateral != 0 {
				t.Errorf("removing %s: %d keys of other members moved", removed, collateral)
			}
			if bad := orderViolations(small, less, keys[:10_000], removed, 3); bad != 0 {
				t.Errorf("removing %s: %d keys' first 3 candidates changed beyond its deletion", removed, bad)
			}
			if bad := orderViolations(big, small, keys[:10_000], added, topStack); bad != 0 {
				t.Errorf("adding %s: %d keys' first 16 candidates changed beyond its insertion", added, bad)
			}
			if bad := orderViolations(small, less, keys[:50], removed, n-1); bad != 0 {
				t.Errorf("removing %s: %d keys' full candidate order changed beyond its deletion", removed, bad)
			}
		})
	}
}

// Weights: members of weight 2 own twice the keys of members of weight 1,
// on average. One member's share spreads by several percent around its
// expectation (where its points fell), so the check compares the mean over
// 350 members of each weight: the spread of a mean over 350 is below 1 %,
// and a ring that ignored weights is off by 100 %.
func TestProbeWeights(t *testing.T) {
	ms := weighted(uuidIDs(700), 1, 2)
	r := mustNew(ms)
	if r.probes == nil {
		t.Fatal("not a multi-probe ring")
	}
	sh := shares(r, testKeys())
	var w1, w2 float64
	for _, m := range ms {
		if m.Weight == 2 {
			w2 += float64(sh[m.ID])
		} else {
			w1 += float64(sh[m.ID])
		}
	}
	if ratio := w2 / w1; math.Abs(ratio-2) > 0.1 {
		t.Errorf("weight-2 members own %.3f × the keys of weight-1 members, want 2 ± 0.1", ratio)
	}
}

func TestProbeZeroAllocs(t *testing.T) {
	r := mustNew(equalMembers(uuidIDs(RendezvousLimit + 1)))
	key := testKeys()[0]
	buf := make([]int, 0, topStack)
	if a := testing.AllocsPerRun(100, func() { _ = r.Primary(key) }); a != 0 {
		t.Errorf("Primary allocates %.1f", a)
	}
	for _, max := range []int{3, topStack} {
		if a := testing.AllocsPerRun(100, func() { buf = r.Candidates(key, max, buf[:0]) }); a != 0 {
			t.Errorf("Candidates(max %d) allocates %.1f", max, a)
		}
	}
}
