package hotkey

import (
	"cmp"
	"slices"
	"sync/atomic"

	"github.com/prefixrouter/prefixrouter/ring"
)

// Popular prefixes (issue 21). A request's prompt is keyed at a ladder of
// depths; the router counts its shallowest prefix, and each deeper one
// while the one above it is popular (a prefix's share is at most its
// parent's, so a deeper key cannot be popular under a parent that is not).
// The popular ones are kept in a small table with what a replica publishes
// of them: parent, depth and model, so that every replica can rebuild the
// prompt tree from the merged view and place it alike.

// DefaultWarmShare is the share of one instance's fair share above which a
// prefix is popular: a prefix with more than 1/8 of an instance's traffic
// is worth placing (in a set of 7, 1.8 % of the requests); below it the
// long tail hashes, and its imbalance averages out over many keys.
const DefaultWarmShare = 0.125

// popSize is the number of popular prefixes the table holds (popProbe slots
// probed per key). In a set of n instances at most n / WarmShare prefixes of
// one depth are popular (56 at n = 7); a hot document's chain of depths
// takes one slot per depth.
const (
	popSize  = 512
	popProbe = 8
)

// Entry is a popular prefix as a replica sees it.
type Entry struct {
	// Key is the prefix's routing key; Parent the key of the prefix one
	// depth shallower (0 at the shallowest depth), Level the depth's
	// index in the ladder.
	Key, Parent uint64
	Level       int
	// Model is the request's model (its sticky set), N the set's size
	// when the prefix was last counted.
	Model string
	N     int
	// Share is the prefix's estimated share of the recent requests, K its
	// replication factor (1: one instance is enough).
	Share float64
	K     int
}

// Begin counts one request in the mass and returns the epoch to pass to
// Count for each of its prefixes, so that a request counts once in the
// shares however many depths of it are counted.
func (s *Sketch) Begin() uint64 {
	e := s.epoch(s.seen.Add(1))
	s.mass.add(e)
	return e
}

// Seen returns the number of requests (and observations) counted so far.
func (s *Sketch) Seen() uint64 { return s.seen.Load() }

// Count counts the prefix key of a request begun at epoch e (its parent
// one depth shallower, at ladder index level) in a set of n instances. It
// returns whether the prefix is popular (its estimated share at least
// WarmShare / n: count the next depth) and its replication factor. A
// popular prefix is remembered for Popular.
func (s *Sketch) Count(e, key, parent uint64, level int, model string, n int) (popular bool, k int) {
	t := tag(key)
	h := ring.Mix64(t)
	var vs [depth + 1]uint64
	for i := range depth {
		vs[i] = s.counts[i][index(h, i)].add(e)
	}
	vs[depth] = s.mass.v.Load()
	est, mass := estimate(vs, e)
	k = s.decide(t, float64(est), float64(mass), n, true)
	// The next depth is counted on the point estimate, from the first
	// request: a deeper prefix counted only once this one had evidence
	// would start behind it and show a smaller share for a half-life,
	// though every request of the one is a request of the other (a hot
	// prompt's depths would then reach their k one after another, each
	// step moving its sessions).
	if float64(est)*float64(n) < s.warm*float64(mass) {
		return false, k
	}
	if mass >= minMass*one {
		s.remember(h, Entry{Key: key, Parent: parent, Level: level, Model: model, N: n})
	}
	return true, k
}

// remember stores e in its probe window unless it is there (with the same
// fields; Share and K stay zero in the table): in an empty
// slot, or one whose prefix cooled below half the popular share. A full
// window of popular prefixes leaves e out (the table bounds the memory).
// It allocates once per prefix that becomes popular.
func (s *Sketch) remember(h uint64, e Entry) {
	start := int(h>>40) % popSize
	for p := range popProbe {
		slot := &s.pop[(start+p)%popSize]
		if o := slot.Load(); o != nil && o.Key == e.Key {
			if *o != e {
				// The set's size changed (or, rarely, the parent: a
				// key collision): keep the latest.
				ne := e
				slot.CompareAndSwap(o, &ne)
			}
			return
		}
	}
	for p := range popProbe {
		slot := &s.pop[(start+p)%popSize]
		o := slot.Load()
		if o != nil && o.Key != e.Key && !s.cooled(o) {
			continue
		}
		ne := e
		if slot.CompareAndSwap(o, &ne) {
			return
		}
	}
}

// cooled reports whether a remembered prefix's share fell below half the
// popular share (its slot may be reused).
func (s *Sketch) cooled(o *Entry) bool {
	est, mass := s.read(tag(o.Key))
	return mass == 0 || 2*float64(est)*float64(o.N) < s.warm*float64(mass)
}

// Popular returns up to limit popular prefixes, the most popular first
// (ties by key): those whose share's lower confidence bound (see bounds)
// is at least WarmShare / N, with their current share and k.
func (s *Sketch) Popular(limit int) []Entry {
	var out []Entry
	for i := range s.pop {
		o := s.pop[i].Load()
		if o == nil {
			continue
		}
		t := tag(o.Key)
		est, mass := s.read(t)
		lo, _ := s.bounds(float64(est), float64(mass))
		if lo*float64(o.N) < s.warm {
			continue
		}
		e := *o
		e.Share = float64(est) / float64(mass)
		e.K = s.K(o.Key, o.N)
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if c := cmp.Compare(b.Share, a.Share); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	return out[:min(len(out), limit)]
}

// popTable is the table of popular prefixes.
type popTable [popSize]atomic.Pointer[Entry]
