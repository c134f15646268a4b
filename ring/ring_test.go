package ring

import (
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"testing"
)

func TestEmpty(t *testing.T) {
	r := mustNew(nil)
	if r.Len() != 0 || r.Primary(1) != -1 || r.Index("x") != -1 {
		t.Fatalf("empty ring: Len %d Primary %d Index %d", r.Len(), r.Primary(1), r.Index("x"))
	}
	dst := []int{7}
	if got := r.Candidates(1, 3, dst); !slices.Equal(got, []int{7}) {
		t.Fatalf("Candidates on empty ring = %v, want dst unchanged", got)
	}
}

func TestNewNormalizes(t *testing.T) {
	tests := []struct {
		name string
		in   []Member
		want []Member
	}{
		{"sorted by id", []Member{{"b", 1}, {"a", 1}, {"c", 1}}, []Member{{"a", 1}, {"b", 1}, {"c", 1}}},
		{"weight below 1 counts as 1", []Member{{"a", 0}, {"b", -3}, {"c", 2}}, []Member{{"a", 1}, {"b", 1}, {"c", 2}}},
		{"duplicate ids keep the first given", []Member{{"b", 1}, {"a", 3}, {"a", 5}}, []Member{{"a", 3}, {"b", 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(tt.in)
			r := mustNew(in)
			if !reflect.DeepEqual(r.Members(), tt.want) {
				t.Fatalf("Members() = %v, want %v", r.Members(), tt.want)
			}
			if !reflect.DeepEqual(in, tt.in) {
				t.Fatalf("New modified its input: %v", in)
			}
			for i, m := range tt.want {
				if got := r.Index(m.ID); got != i {
					t.Fatalf("Index(%q) = %d, want %d", m.ID, got, i)
				}
			}
			if r.Index("zz") != -1 || r.Index("") != -1 {
				t.Fatal("Index of an absent id is not -1")
			}
		})
	}
}

// Ties (equal scores) must resolve the same way everywhere: lowest member
// index first. A constant id hash makes every score (and every multi-probe
// distance) equal.
func TestTiesGoToLowestIndex(t *testing.T) {
	for _, limit := range []int{RendezvousLimit, 0} {
		r := mustNew(equalMembers(vllmIDs(20)), WithHash(func(string) uint64 { return 12345 }), withLimit(limit))
		for _, key := range testKeys()[:100] {
			if p := r.Primary(key); p != 0 {
				t.Fatalf("limit %d: Primary = %d, want 0 on all-equal scores", limit, p)
			}
			for _, max := range []int{3, 20} { // stack or merge path, and the long-list path
				got := r.Candidates(key, max, nil)
				for i := range got {
					if got[i] != i {
						t.Fatalf("limit %d: Candidates(max %d) = %v, want 0,1,2,...", limit, max, got)
					}
				}
			}
		}
	}
}

func TestWithHashIsUsed(t *testing.T) {
	// With injected seeds the owner is computable by hand: the member whose
	// seed maximizes Score(key, seed).
	seeds := map[string]uint64{"a": 1, "b": 2, "c": 3}
	r := mustNew(equalMembers([]string{"c", "a", "b"}), WithHash(func(id string) uint64 { return seeds[id] }))
	for _, key := range testKeys()[:1000] {
		want, best := "", uint64(0)
		for _, id := range []string{"a", "b", "c"} {
			if s := Score(key, seeds[id]); want == "" || s > best {
				want, best = id, s
			}
		}
		if got := r.Members()[r.Primary(key)].ID; got != want {
			t.Fatalf("Primary(%#x) = %s, want %s", key, got, want)
		}
	}
}

// The contract of Candidates, for rendezvous rings and (limit 0) multi-probe
// rings of the same members.
func TestCandidatesContract(t *testing.T) {
	for _, limit := range []int{RendezvousLimit, 0} {
		for _, n := range []int{1, 2, 7, 20, 64} {
			for _, weighted := range []bool{false, true} {
				ms := equalMembers(vllmIDs(n))
				if weighted {
					for i := range ms {
						ms[i].Weight = 1 + i%3
					}
				}
				checkCandidates(t, mustNew(ms, withLimit(limit)))
			}
		}
	}
}

func checkCandidates(t *testing.T, r *Ring) {
	t.Helper()
	n := r.Len()
	for _, key := range testKeys()[:500] {
		full := r.Candidates(key, n, nil)
		for _, max := range []int{0, 1, 3, topStack, topStack + 1, n, n + 5} {
			dst := r.Candidates(key, max, []int{-7})
			if dst[0] != -7 {
				t.Fatalf("Candidates overwrote dst's existing element")
			}
			got := dst[1:]
			if want := min(max, n); len(got) != want {
				t.Fatalf("n=%d max=%d: %d candidates, want %d", n, max, len(got), want)
			}
			seen := map[int]bool{}
			for _, i := range got {
				if i < 0 || i >= n || seen[i] {
					t.Fatalf("n=%d max=%d: candidates %v not distinct member indexes", n, max, got)
				}
				seen[i] = true
			}
			if len(got) > 0 && got[0] != r.Primary(key) {
				t.Fatalf("first candidate %d != Primary %d", got[0], r.Primary(key))
			}
			// A shorter list is a prefix of a longer one.
			if !slices.Equal(full[:len(got)], got) {
				t.Fatalf("n=%d max=%d: %v is not a prefix of %v", n, max, got, full)
			}
			// Both ranking paths of each algorithm agree: rendezvous'
			// stack and selection, multi-probe's merge and full order.
			var other []int
			if r.probes == nil {
				other = r.candidatesSelect(key, len(got), nil)
			} else {
				other = r.probes.fullOrder(key, n, len(got), nil)
			}
			if !slices.Equal(other, got) {
				t.Fatalf("n=%d max=%d: the other ranking path gives %v, not %v", n, max, other, got)
			}
		}
	}
}

// Same members in any order → identical structure and identical candidate
// order for every key.
func TestOrderIndependent(t *testing.T) {
	for _, ids := range [][]string{vllmIDs(64), uuidIDs(64), uuidIDs(RendezvousLimit)} { // the last is multi-probe (weights)
		ms := equalMembers(ids)
		for i := range ms {
			ms[i].Weight = 1 + i%4
		}
		a := mustNew(ms)
		shuffled := slices.Clone(ms)
		rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		b := mustNew(shuffled)
		if !reflect.DeepEqual(a, b) {
			t.Fatal("rings built from the same members in another order differ")
		}
		if len(ids) == RendezvousLimit && a.probes == nil {
			t.Fatal("640 seeds: not a multi-probe ring")
		}
		ba, bb := make([]int, 0, 3), make([]int, 0, 3)
		for _, key := range testKeys() {
			if x, y := a.Candidates(key, 3, ba[:0]), b.Candidates(key, 3, bb[:0]); !slices.Equal(x, y) {
				t.Fatalf("key %#x: candidates %v vs %v", key, x, y)
			}
		}
	}
}

// Removing a member moves only its keys and deletes it from every candidate
// order; adding one moves keys only to it (at most 1.05/(N+1) of them) and
// only inserts it into candidate orders.
func TestMovement(t *testing.T) {
	keys := testKeys()
	for _, tc := range []struct {
		name string
		ids  []string
	}{
		{"vllm/N=7", vllmIDs(8)},
		{"vllm/N=64", vllmIDs(65)},
		{"uuid/N=7", uuidIDs(8)},
		{"uuid/N=64", uuidIDs(65)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := len(tc.ids) - 1
			small := mustNew(equalMembers(tc.ids[:n]))
			big := mustNew(equalMembers(tc.ids))
			added := tc.ids[n]

			moved, collateral := movement(small, big, keys, added, "")
			limit := 1.05 * float64(len(keys)) / float64(n+1)
			if collateral != 0 || float64(moved) > limit {
				t.Errorf("adding %s to %d: moved %d keys (limit %.0f), %d between old members", added, n, moved, limit, collateral)
			}
			removed := tc.ids[n/2]
			less := mustNew(equalMembers(without(tc.ids[:n], removed)))
			if _, collateral := movement(small, less, keys, "", removed); collateral != 0 {
				t.Errorf("removing %s from %d: %d keys of other members moved", removed, n, collateral)
			}

			// Candidate orders: 3 deep over all keys, full depth over some.
			check := keys
			if testing.Short() {
				check = keys[:10_000]
			}
			if bad := orderViolations(small, less, check, removed, 3); bad != 0 {
				t.Errorf("removing %s: %d keys' first 3 candidates changed beyond its deletion", removed, bad)
			}
			if bad := orderViolations(big, small, check, added, 3); bad != 0 {
				t.Errorf("adding %s: %d keys' first 3 candidates changed beyond its insertion", added, bad)
			}
			if bad := orderViolations(small, less, keys[:2000], removed, n-1); bad != 0 {
				t.Errorf("removing %s: %d keys' full candidate order changed beyond its deletion", removed, bad)
			}
		})
	}
}

func TestBalanceEqualWeights(t *testing.T) {
	keys := testKeys()
	for _, tc := range []struct {
		n     int
		limit float64
	}{{7, 1.05}, {64, 1.10}} {
		for name, ids := range map[string][]string{"vllm": vllmIDs(tc.n), "uuid": uuidIDs(tc.n)} {
			if got := maxOverMean(mustNew(equalMembers(ids)), keys); got > tc.limit {
				t.Errorf("%s N=%d: largest share %.3f × mean, limit %.2f", name, tc.n, got, tc.limit)
			}
		}
	}
}

// A member of weight w owns about w/W of the keys. Each member's count is
// binomial(numKeys, w/W); the tolerance is 4.5 standard deviations, so a
// correct ring fails this for a given key set with probability below 1e-4
// per member, while a ring that ignored weights (off by 2× for weight 2)
// misses by dozens of deviations.
func TestWeights(t *testing.T) {
	keys := testKeys()
	for _, weights := range [][]int{
		{2, 1, 1, 1, 1, 1, 1},
		{1, 2, 3, 4, 1, 2, 3, 4},
		{3, 6, 3, 3}, // normalized by the GCD to {1,2,1,1}
	} {
		ms := equalMembers(vllmIDs(len(weights)))
		total := 0
		for i, w := range weights {
			ms[i].Weight = w
			total += w
		}
		r := mustNew(ms)
		got := shares(r, keys)
		for i, w := range weights {
			p := float64(w) / float64(total)
			mean := p * float64(len(keys))
			tol := 4.5 * math.Sqrt(float64(len(keys))*p*(1-p))
			if c := float64(got[ms[i].ID]); math.Abs(c-mean) > tol {
				t.Errorf("weights %v: %s (w=%d) owns %.0f keys, want %.0f ± %.0f", weights, ms[i].ID, w, c, mean, tol)
			}
		}
	}
}

// Multiplying every weight by a constant changes nothing (GCD normalization).
func TestWeightScaleInvariant(t *testing.T) {
	a := mustNew([]Member{{"a", 1}, {"b", 2}, {"c", 1}})
	b := mustNew([]Member{{"a", 3}, {"b", 6}, {"c", 3}})
	c := mustNew(equalMembers([]string{"a", "b", "c"}))
	d := mustNew([]Member{{"a", 5}, {"b", 5}, {"c", 5}})
	for _, key := range testKeys()[:10_000] {
		if a.Primary(key) != b.Primary(key) || c.Primary(key) != d.Primary(key) {
			t.Fatalf("key %#x: scaled weights changed the owner", key)
		}
	}
}

func TestZeroAllocs(t *testing.T) {
	for _, weighted := range []bool{false, true} {
		ms := equalMembers(vllmIDs(64))
		if weighted {
			ms[3].Weight = 2
		}
		r := mustNew(ms)
		key := testKeys()[0]
		buf := make([]int, 0, 64)
		if a := testing.AllocsPerRun(100, func() { _ = r.Primary(key) }); a != 0 {
			t.Errorf("weighted=%v: Primary allocates %.1f", weighted, a)
		}
		for _, max := range []int{3, 64} {
			if a := testing.AllocsPerRun(100, func() { buf = r.Candidates(key, max, buf[:0]) }); a != 0 {
				t.Errorf("weighted=%v: Candidates(max %d) allocates %.1f", weighted, max, a)
			}
		}
	}
}

// A weight beyond MaxWeight is refused before anything is allocated: one
// record of weight 1e9 must not make every replica allocate gigabytes.
func TestNewRefusesWeightBeyondMax(t *testing.T) {
	for _, w := range []int{MaxWeight + 1, 1e9, 1 << 31} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		r, err := New([]Member{{"a", 1}, {"b", w}})
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrWeight) || r != nil {
			t.Fatalf("New with weight %d = %v, %v; want ErrWeight", w, r, err)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
			t.Fatalf("New with weight %d allocated %d bytes before refusing", w, grew)
		}
	}
	if _, err := New([]Member{{"a", 1}, {"b", MaxWeight}}); err != nil {
		t.Fatalf("weight MaxWeight refused: %v", err)
	}
}
