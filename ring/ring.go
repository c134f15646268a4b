// Package ring implements deterministic weighted consistent hashing over instance ids: rendezvous hashing, and multi-probe hashing for sets beyond RendezvousLimit.
package ring

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// MaxWeight bounds a member's weight. A member of weight w costs w seeds in
// memory and w hashes per lookup, so an unbounded weight from one record
// (weight 1e9) would make every replica allocate gigabytes (issue 12).
// fleet.MaxWeight is the same bound on instance records.
const MaxWeight = 100

// ErrWeight is returned by New for a member whose weight exceeds MaxWeight.
var ErrWeight = errors.New("ring: weight out of range")

// Member is one ring member: an instance id and its weight, at most
// MaxWeight. A Weight below 1 counts as 1.
type Member struct {
	ID     string
	Weight int
}

// Option configures New.
type Option func(*options)

type options struct {
	hash  func(string) uint64
	limit int // RendezvousLimit; tests and benchmarks move it
}

// WithHash replaces the function that hashes member ids (default
// xxhash.Sum64String). Tests use it to force collisions and ties; every
// replica of a fleet must use the same function.
func WithHash(h func(string) uint64) Option {
	return func(o *options) {
		if h != nil {
			o.hash = h
		}
	}
}

// Ring is an immutable rendezvous-hash (highest random weight) structure over
// weighted members. A key's owner is the member with the highest score
// Score(key, seed); a member of weight w has w virtual seeds and scores the
// best of them, so it owns about w/W of the keys. Scores depend only on the
// key and the member's own id, which is why removing a member moves only its
// keys and adding one moves keys only to it. Beyond RendezvousLimit seeds the
// score is a multi-probe distance (probe.go), which keeps those properties
// and makes a lookup cost the same at any size. Build one with New and share
// it: its methods are safe for concurrent use.
type Ring struct {
	members []Member // sorted by ID, unique; weights normalized to >= 1
	// seeds[off[i]:off[i+1]] are member i's virtual seeds. When every
	// weight is equal (after dividing by their GCD) each member has exactly
	// one seed and off is nil: the fast path.
	seeds []uint64
	off   []int32
	owner []int32 // owner[j] is the member of seeds[j]; nil when off is nil
	// probes is the multi-probe circle of a set of more than
	// RendezvousLimit seeds; nil below, where keys are scored.
	probes *probeTable
}

// New builds a ring from members. It copies them and sorts them by ID, so the
// same members in any order build an identical ring. When an ID appears more
// than once the first occurrence (in the order given) is kept and the others
// are ignored; fleet snapshots never contain duplicates, so this only guards
// against misuse. Weights are divided by their greatest common divisor, so
// {2,2,4} hashes exactly like {1,1,2}; lookups cost O(sum of normalized
// weights). A weight above MaxWeight is refused with ErrWeight.
func New(members []Member, opts ...Option) (*Ring, error) {
	for _, m := range members {
		if m.Weight > MaxWeight {
			return nil, fmt.Errorf("%w: member %q has weight %d, above %d", ErrWeight, m.ID, m.Weight, MaxWeight)
		}
	}
	o := options{hash: xxhash.Sum64String, limit: RendezvousLimit}
	for _, opt := range opts {
		opt(&o)
	}
	ms := make([]Member, len(members))
	copy(ms, members)
	// A stable sort keeps input order among equal ids, so "keep first"
	// below means first as given.
	byID := func(a, b Member) int { return strings.Compare(a.ID, b.ID) }
	if !slices.IsSortedFunc(ms, byID) { // snapshots list instances sorted already
		slices.SortStableFunc(ms, byID)
	}
	uniq := ms[:0]
	for _, m := range ms {
		if len(uniq) > 0 && uniq[len(uniq)-1].ID == m.ID {
			continue
		}
		if m.Weight < 1 {
			m.Weight = 1
		}
		uniq = append(uniq, m)
	}
	ms = uniq[:len(uniq):len(uniq)]

	g := 0
	for _, m := range ms {
		g = gcd(g, m.Weight)
	}
	r := &Ring{members: ms}
	if len(ms) == 0 {
		return r, nil
	}
	uniform := true
	total := 0
	for _, m := range ms {
		w := m.Weight / g
		total += w
		if w != 1 {
			uniform = false
		}
	}
	r.seeds = make([]uint64, 0, total)
	if !uniform {
		r.off = make([]int32, 0, len(ms)+1)
	}
	for _, m := range ms {
		if !uniform {
			r.off = append(r.off, int32(len(r.seeds)))
		}
		r.seeds = append(r.seeds, o.hash(m.ID))
		for j := 1; j < m.Weight/g; j++ {
			// Extra seeds derive from the id alone so a weight change
			// adds or removes virtual seeds without touching the others.
			r.seeds = append(r.seeds, o.hash(m.ID+"#"+strconv.Itoa(j)))
		}
	}
	if !uniform {
		r.off = append(r.off, int32(len(r.seeds)))
		r.owner = make([]int32, len(r.seeds))
		for i := range ms {
			for j := r.off[i]; j < r.off[i+1]; j++ {
				r.owner[j] = int32(i)
			}
		}
	}
	if len(r.seeds) > o.limit {
		r.probes = newProbeTable(r.seeds, r.seedOwner)
	}
	return r, nil
}

// seedOwner is the member of seeds[j].
func (r *Ring) seedOwner(j int) int32 {
	if r.owner == nil {
		return int32(j)
	}
	return r.owner[j]
}

// Len returns the number of members.
func (r *Ring) Len() int { return len(r.members) }

// Members returns the members sorted by ID, weights normalized to at least 1.
// Member indexes returned by Primary, Candidates and Index index this slice.
// Callers must not modify it.
func (r *Ring) Members() []Member { return r.members }

// Index returns the index of the member with the given id, or -1.
func (r *Ring) Index(id string) int {
	i := sort.Search(len(r.members), func(i int) bool { return r.members[i].ID >= id })
	if i < len(r.members) && r.members[i].ID == id {
		return i
	}
	return -1
}

// Primary returns the index of the member that owns key, or -1 when the ring
// is empty.
func (r *Ring) Primary(key uint64) int {
	if len(r.seeds) == 0 {
		return -1
	}
	if r.probes != nil {
		return r.probes.primary(key)
	}
	// A member's score is the best of its seeds, so the best seed overall
	// belongs to the best member. Seeds are laid out in member order and
	// ties keep the first, so ties go to the lowest member index.
	best, bestScore := 0, Score(key, r.seeds[0])
	for i := 1; i < len(r.seeds); i++ {
		if sc := Score(key, r.seeds[i]); sc > bestScore {
			best, bestScore = i, sc
		}
	}
	if r.owner != nil {
		return int(r.owner[best])
	}
	return best
}

// topStack bounds the number of candidates Candidates ranks with a stack
// buffer; larger requests use a slower selection that needs no memory.
const topStack = 16

// Candidates appends to dst up to max distinct member indexes in key's spill
// order: the primary first, then the member with the next highest score, and
// so on. The order depends only on the key and the members, so replicas with
// the same members agree; removing a member only deletes it from every order,
// adding one only inserts it. It does not allocate when dst has room (a list
// longer than 16 of a multi-probe set borrows its scratch from a pool).
func (r *Ring) Candidates(key uint64, max int, dst []int) []int {
	n := len(r.members)
	if max > n {
		max = n
	}
	if max <= 0 {
		return dst
	}
	if max == 1 {
		return append(dst, r.Primary(key))
	}
	if r.probes != nil {
		if max > topStack {
			return r.probes.fullOrder(key, n, max, dst)
		}
		return r.probes.candidates(key, max, dst)
	}
	if max > topStack {
		return r.candidatesSelect(key, max, dst)
	}
	base := len(dst)
	var scores [topStack]uint64
	k := 0           // number ranked so far, held in dst[base:base+k] and scores[:k]
	var worst uint64 // scores[k-1] once k == max
	for i := 0; i < n; i++ {
		var sc uint64
		if r.off == nil {
			sc = Score(key, r.seeds[i])
		} else {
			sc = r.scoreWeighted(key, i)
		}
		if k == max && sc <= worst {
			// Not better than the worst kept (ties keep the lower index).
			continue
		}
		// Insert after every kept entry scoring >= sc, which keeps lower
		// indexes first among ties.
		p := k
		for p > 0 && scores[p-1] < sc {
			p--
		}
		if k < max {
			dst = append(dst, 0)
			k++
		}
		for j := k - 1; j > p; j-- {
			scores[j], dst[base+j] = scores[j-1], dst[base+j-1]
		}
		scores[p], dst[base+p] = sc, i
		worst = scores[k-1]
	}
	return dst
}

// candidatesSelect ranks by repeated selection: each round picks the best
// (score, index) strictly below the previous pick in spill order. O(n*max),
// no memory; used only for long candidate lists.
func (r *Ring) candidatesSelect(key uint64, max int, dst []int) []int {
	n := len(r.members)
	prevScore, prevIdx := uint64(0), -1
	for k := 0; k < max; k++ {
		best, bestScore := -1, uint64(0)
		for i := 0; i < n; i++ {
			sc := r.score(key, i)
			if prevIdx >= 0 && !(sc < prevScore || (sc == prevScore && i > prevIdx)) {
				continue // already picked or ranked before the previous pick
			}
			if best < 0 || sc > bestScore {
				best, bestScore = i, sc
			}
		}
		dst = append(dst, best)
		prevScore, prevIdx = bestScore, best
	}
	return dst
}

// score is member i's score for key.
func (r *Ring) score(key uint64, i int) uint64 {
	if r.off == nil {
		return Score(key, r.seeds[i])
	}
	return r.scoreWeighted(key, i)
}

func (r *Ring) scoreWeighted(key uint64, i int) uint64 {
	var best uint64
	for _, s := range r.seeds[r.off[i]:r.off[i+1]] {
		if sc := Score(key, s); sc > best {
			best = sc
		}
	}
	return best
}

// Mix64 is the 64-bit finalizer of MurmurHash3 (fmix64): a bijection with
// full avalanche, so values that differ in one bit map to unrelated ones.
// It is the one mixer of the code base: rendezvous scores here and in
// lora's placement, the router's hot-key spread and sample keys, and the
// hot-key sketch's counters all use it.
func Mix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// Score is the rendezvous score of a seed for key: Mix64(key ^ seed). Among
// seeds derived from distinct ids, ranking by Score for one key is a random
// order that depends only on the key and each id, which is what makes
// rendezvous hashing stable: a seed's score does not change when others
// come or go. A Ring's member scores the best of its weight's seeds.
func Score(key, seed uint64) uint64 { return Mix64(key ^ seed) }

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
