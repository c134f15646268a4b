package ring

import (
	"math"
	"math/bits"
	"slices"
	"sync"
)

// Large sets use multi-probe consistent hashing (Appleton and O'Reilly,
// "Multi-probe consistent hashing", 2015) instead of scoring every member:
// each seed of a member puts pointsPerSeed points on a 64-bit circle, a key
// throws numProbes probes on it, and a member's distance from the key is the
// clockwise distance from a probe to one of its points, the smallest over
// its points and the probes. The owner is the nearest member and the spill
// order is by increasing distance (ties to the lower member index).
//
// Like a rendezvous score, that distance depends only on the key and the
// member's own id, so the properties docs/ring.md relies on carry over:
// replicas with the same members agree, a join moves keys only to the new
// member and a leave only away from the one leaving, and a change only
// inserts or deletes that member in every key's spill order. What the
// probes buy is the lookup: numProbes searches of a sorted array (one table
// step each) instead of one score per member. What they cost is balance: a
// member's share depends on where its points fell, between about 0.7 and
// numProbes/(numProbes−1) of the mean (docs/ring.md gives the measured
// spread).
const (
	// numProbes bounds the largest share: a probe that lands in the gap
	// before a point, d from it, wins when the other numProbes−1 probes are
	// all farther from their next points, with probability about
	// e^{−(numProbes−1)d} (d in mean gaps), so a point before a gap of g
	// wins ∝ 1 − e^{−(numProbes−1)g}, which averages (numProbes−1)/numProbes
	// of its limit. A member's share is then at most numProbes/(numProbes−1)
	// of the mean, and a join or a leave moves at most that much of the
	// ideal 1/N: 1.050 with the paper's 21 probes, exactly issue 22's
	// bound (single events measured up to 1.058); 32 probes put it at 1.032,
	// and single events measured 1.039 at most (standard errors 0.3–0.5 %),
	// for 1.6 times the lookup: Candidates(key, 4) 1.42 µs of CPU at 16,384
	// members against 0.90 µs (docs/ring.md, "Large sets").
	numProbes = 32
	// pointsPerSeed narrows the spread below the mean: a share is the mean
	// of its points' shares. 8 points with 21 probes: shares spread 5.5 %
	// around the mean, the smallest at 0.67 of it; 4 points: 7.7 % and
	// 0.55, for 0.6 times the memory (docs/ring.md).
	pointsPerSeed = 8
)

// RendezvousLimit is the largest set (in seeds: the sum of the members'
// weights after dividing by their GCD) ranked by rendezvous scores; a larger
// one uses multi-probe hashing. Below it lookups cost one score per seed;
// above it a lookup costs the same at any size. Crossing the limit (a join
// from RendezvousLimit seeds to more, or a leave back) changes the algorithm,
// so it moves nearly every key once (docs/ring.md).
const RendezvousLimit = 256

// golden is 2^64 / φ, an odd constant whose multiples are well spread: the
// i-th probe of a key and the i-th point of a seed are derived from it.
const golden = 0x9e3779b97f4a7c15

// probeTable is the circle of a large ring: every point's position and
// owner, sorted by position (then owner), and a table that finds the first
// point at or after a position in one step.
type probeTable struct {
	pts []point
	// start[b] is the index of the first point whose top bits (pos >>
	// shift) are at least b; len(start) is 1<<(64-shift) + 1.
	start []int32
	shift uint
}

// newProbeTable places pointsPerSeed points for every seed; seedOwner[j]
// is the member of seeds[j].
// point is one point on the circle; position and owner share a cache line.
type point struct {
	pos   uint64
	owner int32
}

func newProbeTable(seeds []uint64, seedOwner func(j int) int32) *probeTable {
	n := len(seeds) * pointsPerSeed
	// About one point per table slot: a lookup reads one slot and a point
	// or two.
	b := max(bits.Len(uint(n-1)), 1)
	t := &probeTable{pts: make([]point, n), start: make([]int32, 1<<b+1), shift: uint(64 - b)}
	// A counting sort by slot, then an insertion sort of each slot's few
	// points by (position, owner): O(points), no comparison sort.
	at := func(c, j int) point {
		return point{Mix64(seeds[j] + uint64(c+1)*golden), seedOwner(j)}
	}
	for j := range seeds {
		for c := range pointsPerSeed {
			t.start[at(c, j).pos>>t.shift+1]++
		}
	}
	for slot := 1; slot < len(t.start); slot++ {
		t.start[slot] += t.start[slot-1]
	}
	fill := slices.Clone(t.start[:len(t.start)-1])
	for j := range seeds {
		for c := range pointsPerSeed {
			p := at(c, j)
			slot := p.pos >> t.shift
			t.pts[fill[slot]] = p
			fill[slot]++
		}
	}
	for slot := 0; slot+1 < len(t.start); slot++ {
		lo, hi := int(t.start[slot]), int(t.start[slot+1])
		for i := lo + 1; i < hi; i++ {
			for k := i; k > lo && pointLess(t.pts[k], t.pts[k-1]); k-- {
				t.pts[k], t.pts[k-1] = t.pts[k-1], t.pts[k]
			}
		}
	}
	return t
}

func pointLess(a, b point) bool { return a.pos < b.pos || (a.pos == b.pos && a.owner < b.owner) }

// probe returns key's i-th probe position.
func probe(key uint64, i int) uint64 { return Mix64(key + uint64(i+1)*golden) }

// next returns the index of the first point at or after position x,
// wrapping to 0 past the last.
func (t *probeTable) next(x uint64) int {
	slot := x >> t.shift
	j, end := int(t.start[slot]), int(t.start[slot+1])
	for j < end && t.pts[j].pos < x {
		j++
	}
	if j == len(t.pts) {
		return 0
	}
	return j
}

// before reports whether (d1, o1) ranks before (d2, o2): nearer first,
// ties to the lower member index.
func before(d1 uint64, o1 int32, d2 uint64, o2 int32) bool {
	return d1 < d2 || (d1 == d2 && o1 < o2)
}

func (t *probeTable) primary(key uint64) int {
	var w walks
	t.walk(key, &w)
	b := 0
	for i := 1; i < numProbes; i++ {
		if before(w.dist[i], w.own[i], w.dist[b], w.own[b]) {
			b = i
		}
	}
	return int(w.own[b])
}

// walks are the probes' walks around the circle for one key: where each
// probe is, its next point, that point's distance from the probe and owner,
// and how many points the walk may still visit (one turn).
type walks struct {
	x    [numProbes]uint64
	at   [numProbes]int32
	dist [numProbes]uint64
	own  [numProbes]int32
	left [numProbes]int32
}

// walk places key's probes and finds each one's first point. The three
// passes keep the loads of different probes independent of each other, so
// the processor overlaps their cache misses.
func (t *probeTable) walk(key uint64, w *walks) {
	for i := range numProbes {
		w.x[i] = probe(key, i)
	}
	for i := range numProbes {
		w.at[i] = int32(t.next(w.x[i]))
	}
	for i := range numProbes {
		p := &t.pts[w.at[i]]
		w.dist[i], w.own[i], w.left[i] = p.pos-w.x[i], p.owner, int32(len(t.pts))
	}
}

// advance moves probe i's walk to its next point.
func (t *probeTable) advance(w *walks, i int) {
	w.left[i]--
	if w.at[i]++; int(w.at[i]) == len(t.pts) {
		w.at[i] = 0
	}
	p := &t.pts[w.at[i]]
	w.dist[i], w.own[i] = p.pos-w.x[i], p.owner
}

// candidates appends key's first max members (max ≤ topStack, at most the
// number of members) by merging the probes' walks: each probe walks
// clockwise from its position, and the nearest point not yet visited by
// any walk comes next (a heap of the walks, nearest on top). A member is
// emitted at its first point, which is its nearest. Each walk stops after
// one turn; by then it has passed every member, so the merge ends before
// every walk does.
func (t *probeTable) candidates(key uint64, max int, dst []int) []int {
	var w walks
	t.walk(key, &w)
	var h [numProbes]int8
	for i := range h {
		h[i] = int8(i)
	}
	less := func(a, b int8) bool { return before(w.dist[a], w.own[a], w.dist[b], w.own[b]) }
	size := numProbes
	down := func(i int) {
		for {
			c := 2*i + 1
			if c >= size {
				return
			}
			if c+1 < size && less(h[c+1], h[c]) {
				c++
			}
			if !less(h[c], h[i]) {
				return
			}
			h[i], h[c] = h[c], h[i]
			i = c
		}
	}
	for i := size/2 - 1; i >= 0; i-- {
		down(i)
	}
	base := len(dst)
	for len(dst)-base < max {
		b := int(h[0])
		if o := int(w.own[b]); !slices.Contains(dst[base:], o) {
			dst = append(dst, o)
		}
		if w.left[b] > 1 {
			t.advance(&w, b)
		} else {
			size--
			h[0] = h[size]
		}
		down(0)
	}
	return dst
}

// distances sets d[m] to member m's distance from key: for every point, the
// distance from the nearest probe before it (counter-clockwise), then the
// least over the member's points. O(points + probes²).
func (t *probeTable) distances(key uint64, d []uint64) {
	var xs [numProbes]uint64
	for i := range numProbes {
		xs[i] = probe(key, i)
	}
	slices.Sort(xs[:])
	for m := range d {
		d[m] = math.MaxUint64
	}
	// The nearest probe before a point is the last probe at or below its
	// position, or (for points before the first probe) the last probe,
	// across the wrap.
	p := -1 // index in xs of the last probe <= pos
	for _, pt := range t.pts {
		pos := pt.pos
		for p+1 < numProbes && xs[p+1] <= pos {
			p++
		}
		x := xs[numProbes-1]
		if p >= 0 {
			x = xs[p]
		}
		if dd := pos - x; dd < d[pt.owner] {
			d[pt.owner] = dd
		}
	}
}

// scratch holds the per-member distances and indexes of long candidate
// lists, so that a steady stream of them does not allocate.
type scratch struct {
	d   []uint64
	idx []int32
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// fullOrder appends key's first max members for any max: the distance of
// every member (n of them), then a sort by (distance, index).
// O(points + n log n).
func (t *probeTable) fullOrder(key uint64, n, max int, dst []int) []int {
	s := scratchPool.Get().(*scratch)
	defer scratchPool.Put(s)
	if cap(s.d) < n {
		s.d, s.idx = make([]uint64, n), make([]int32, n)
	}
	d, idx := s.d[:n], s.idx[:n]
	t.distances(key, d)
	for m := range idx {
		idx[m] = int32(m)
	}
	slices.SortFunc(idx, func(a, b int32) int {
		if d[a] != d[b] {
			if d[a] < d[b] {
				return -1
			}
			return 1
		}
		return int(a - b)
	})
	for _, m := range idx[:max] {
		dst = append(dst, int(m))
	}
	return dst
}
