// Package hotkey estimates which routing keys are hot and how many
// instances each should warm: a decayed count-min sketch of request counts
// per key, a small table of replication factors with hysteresis and one of
// popular prefixes for a replica to publish (popular.go), all of fixed size
// and updated with atomics only.
//
// A key whose share of the requests is s, in a set of n instances, asks for
// x = s × n / Threshold instances' worth of capacity. Its replication
// factor k (1 for a cold key: one instance, the most cache hits) moves only
// when the key leaves a band around it: up to ceil(x / (1 + Hysteresis))
// when that is larger (its k instances would each carry more than 1 + h of
// the threshold), down to ceil(x / (1 - Hysteresis)) when that is smaller
// (k - 1 instances would each carry less than 1 - h). An estimate that
// hovers near a boundary therefore never flaps. k rises only when the
// share's lower confidence bound (three standard errors) asks for it and
// falls only when its upper bound does, so a replica does not move k on
// its own sampling noise. Shares, not rates, are compared, so router
// replicas that each see a part of the same stream reach the same k
// without talking to each other.
package hotkey

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"

	"github.com/prefixrouter/prefixrouter/ring"
)

// Defaults of Options, used where a field is zero.
const (
	// DefaultThreshold: a key gets a second instance once it alone carries
	// more than (1 + Hysteresis) × half of one instance's fair share. Each
	// of a hot key's instances also carries its 1/n of the other keys, so
	// with half a fair share of the key on top it stays near 1.5 × the
	// mean load (the bounded-load factor replication replaces); at a
	// threshold of 1 an instance could carry 1.2 fair shares of one key
	// plus its share of the rest, 2.2 × the mean (docs/balance.md).
	DefaultThreshold = 0.5
	// DefaultHysteresis: k rises when its instances would each carry 20 %
	// more than the threshold and falls when one fewer would carry 20 % less.
	DefaultHysteresis = 0.2
	// DefaultHalfLife is the number of observations after which every
	// count is halved: the estimate follows the last few thousand requests
	// of this replica, and its noise on a 10 % share is about 3 % of it.
	DefaultHalfLife = 4096
)

// Sketch dimensions: depth rows of width counters (32 KiB) and a table of
// tableSize hot keys (8 KiB); probe is how many table slots a key may use.
// A count-min sketch of width w overestimates a share by at most e/w (0.27 %
// here) with probability 1 - e^-depth: below the shares that make a key hot
// (above 0.6/n of the traffic at the default threshold, 0.94 % at n = 64).
const (
	depth     = 4
	width     = 1024
	tableSize = 1024
	probe     = 8
	// minMass is the number of (decayed) observations below which no key
	// is hot: the first few requests of a fresh replica. Beyond it the
	// evidence bound (see bounds) guards against early noise, so a replica
	// can replicate a hot key within its first few hundred requests.
	minMass = 64
	// maxK is the largest k the table stores (8 bits of a slot).
	maxK = 255
	// minHalfLife keeps the decayed sample large enough for shares to be
	// measured within about a percent.
	minHalfLife = 1024
	// maxHalfLife keeps a count (at most 2 × HalfLife observations) within
	// the integer bits of a counter.
	maxHalfLife = 1 << 22
)

// A counter is one atomic uint64: the epoch it was last brought up to (the
// high epochBits) and its count decayed to that epoch, in fixed point with
// fracBits fractional bits (the low countBits). An epoch is HalfLife
// observations; a count is worth half as much one epoch later. Decay is
// lazy: a counter is halved once per epoch it missed when it is next
// updated or read, so no sweep over the sketch ever runs, and every
// observation adds exactly one to its counters and to the mass whatever
// other goroutines do at the same time (concurrent observers can shift an
// observation across an epoch boundary, an error of one half per racing
// observer, never more).
const (
	epochBits = 24
	countBits = 64 - epochBits
	fracBits  = 16
	one       = 1 << fracBits
	countMask = 1<<countBits - 1
	epochMask = 1<<epochBits - 1
)

// counter is a lazily decayed count (see above).
type counter struct{ v atomic.Uint64 }

// ahead reports whether epoch a is later than epoch b (modulo 2^epochBits).
func ahead(a, b uint64) bool {
	d := (a - b) & epochMask
	return d != 0 && d < 1<<(epochBits-1)
}

// decayed is the count of packed value v at epoch e, in fixed point; a
// value already at a later epoch than e (brought forward by a goroutine
// whose epoch is newer) counts as it is.
func decayed(v, e uint64) uint64 {
	ve := v >> countBits
	if ahead(ve, e) {
		return v & countMask
	}
	d := (e - ve) & epochMask
	if d >= countBits {
		return 0
	}
	return (v & countMask) >> d
}

// add counts one observation at epoch e and returns the packed value after
// it (at e, or at a later epoch another goroutine brought it to). The
// common case is one atomic add; once per epoch the counter is brought
// forward with a compare-and-swap. If another goroutine brings it forward
// first, this observation may be decayed with the old count (an error of
// at most one half per racing observer at an epoch boundary).
func (c *counter) add(e uint64) uint64 {
	v := c.v.Add(one)
	for {
		if ve := v >> countBits; ve == e || ahead(ve, e) {
			return v
		}
		// One of the ones in v is this observation, made at e: keep it
		// whole. (A goroutine with an epoch between v's and e may have
		// halved it already; never borrow from the epoch bits.)
		rest := v
		if v&countMask >= one {
			rest -= one
		}
		nv := e<<countBits | (decayed(rest, e) + one)
		if c.v.CompareAndSwap(v, nv) {
			return nv
		}
		v = c.v.Load()
	}
}

// ErrInvalid is wrapped by Options.Validate's errors.
var ErrInvalid = errors.New("hotkey: invalid options")

// Options configures a Sketch. The zero value means the defaults.
type Options struct {
	// Threshold is the multiple of one instance's fair share (1/n) that one
	// instance should carry of a single key; a key gets a second instance
	// once it carries (1 + Hysteresis) × Threshold fair shares. Zero means
	// DefaultThreshold; it must be in (0, 16].
	Threshold float64
	// Hysteresis is the half-width of the band, as a fraction of the
	// threshold, within which k does not move; zero means
	// DefaultHysteresis, and it must be in [0, 0.5].
	Hysteresis float64
	// HalfLife is the number of observations after which a count weighs
	// half; zero means DefaultHalfLife. It must be in [1,024, 2^22]: long
	// enough for shares to be measured within a percent or so, at most
	// what a counter's integer bits hold.
	HalfLife int
	// WarmShare is the multiple of one instance's fair share above which
	// a prefix is popular (Count, Popular); zero means DefaultWarmShare.
	// It must be in (0, 1].
	WarmShare float64
	// Evidence is how many standard errors a share's estimate must clear
	// before k moves (see bounds); zero means DefaultEvidence. It must be
	// in (0, 5]. Replicas that decide k each from their own half of a
	// stream need the default; replicas that route on an agreed view
	// (adaptive keys, issue 21) need only enough to keep k from flapping
	// on noise, and react sooner with less.
	Evidence float64
}

// Validate checks the ranges; its errors wrap ErrInvalid.
func (o Options) Validate() error {
	if !(o.Threshold >= 0 && o.Threshold <= 16) {
		return fmt.Errorf("%w: threshold %v outside (0, 16]", ErrInvalid, o.Threshold)
	}
	if !(o.Hysteresis >= 0 && o.Hysteresis <= 0.5) {
		return fmt.Errorf("%w: hysteresis %v outside [0, 0.5]", ErrInvalid, o.Hysteresis)
	}
	if !(o.Evidence >= 0 && o.Evidence <= 5) {
		return fmt.Errorf("%w: evidence %v outside (0, 5]", ErrInvalid, o.Evidence)
	}
	if !(o.WarmShare >= 0 && o.WarmShare <= 1) {
		return fmt.Errorf("%w: warm share %v outside (0, 1]", ErrInvalid, o.WarmShare)
	}
	if o.HalfLife != 0 && (o.HalfLife < minHalfLife || o.HalfLife > maxHalfLife) {
		return fmt.Errorf("%w: half-life %d outside [%d, %d] observations", ErrInvalid, o.HalfLife, minHalfLife, maxHalfLife)
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.Threshold == 0 {
		o.Threshold = DefaultThreshold
	}
	if o.Hysteresis == 0 {
		o.Hysteresis = DefaultHysteresis
	}
	if o.HalfLife == 0 {
		o.HalfLife = DefaultHalfLife
	}
	if o.WarmShare == 0 {
		o.WarmShare = DefaultWarmShare
	}
	if o.Evidence == 0 {
		o.Evidence = DefaultEvidence
	}
	return o
}

// Sketch counts keys and decides their replication factor. Its memory is
// fixed (about 40 KiB) whatever the number of keys; every method is safe
// for concurrent use, takes no lock and gives the same estimates as the
// same observations made one at a time (TestConcurrentAccuracy).
type Sketch struct {
	threshold, hysteresis float64
	warm                  float64 // WarmShare
	evidence              float64
	halfLife              uint64

	counts [depth][width]counter
	// mass is the decayed number of observations, decayed like a count, so
	// that a key's share is its count over the mass at the same epoch.
	mass counter
	// seen counts observations; seen / halfLife is the current epoch.
	seen atomic.Uint64
	// table holds the hot keys: tag (the key's high 56 bits) | k (low 8
	// bits); 0 is an empty slot.
	table [tableSize]atomic.Uint64
	// pop holds the popular prefixes (popular.go).
	pop popTable
}

// New returns an empty sketch; o must be valid (see Options.Validate).
func New(o Options) (*Sketch, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	return &Sketch{threshold: o.Threshold, hysteresis: o.Hysteresis, warm: o.WarmShare, evidence: o.Evidence, halfLife: uint64(o.HalfLife)}, nil
}

// tag is what the sketch knows of a key: its high 56 bits (never 0). The
// counters and the table are indexed from the tag alone, so a table entry
// can be looked up in the counters again (to reclaim cooled slots).
func tag(key uint64) uint64 {
	t := key &^ maxK
	if t == 0 {
		t = maxK + 1
	}
	return t
}

// index is the counter of row i for a mixed tag h (double hashing over its
// two halves). Tags are mixed (ring.Mix64) so that counters and table slots
// depend on every bit of them: keys that differ only in a few bits (tests,
// or a weak hash upstream) must not share all their counters.
func index(h uint64, i int) uint32 {
	lo, hi := uint32(h), uint32(h>>32)|1
	return (lo + uint32(i)*hi) % width
}

// slot is where t's probe window starts in the table.
func slot(h uint64) int { return int(h>>40) % tableSize }

// epoch is the epoch of the seen-th observation.
func (s *Sketch) epoch(seen uint64) uint64 { return seen / s.halfLife & epochMask }

// Observe counts one request of key and returns its replication factor in
// a set of n instances.
func (s *Sketch) Observe(key uint64, n int) int {
	e := s.epoch(s.seen.Add(1))
	t := tag(key)
	h := ring.Mix64(t)
	var vs [depth + 1]uint64
	for i := range depth {
		vs[i] = s.counts[i][index(h, i)].add(e)
	}
	vs[depth] = s.mass.add(e)
	est, mass := estimate(vs, e)
	return s.decide(t, float64(est), float64(mass), n, true)
}

// K returns key's current replication factor in a set of n instances
// without counting a request (for retries and explanations).
func (s *Sketch) K(key uint64, n int) int {
	t := tag(key)
	est, mass := s.read(t)
	return s.decide(t, float64(est), float64(mass), n, false)
}

// read returns t's count (the least of its counters, which only collisions
// can raise) and the mass, in fixed point at one epoch: the current one, or
// a later one a concurrent observer already brought a counter to.
func (s *Sketch) read(t uint64) (est, mass uint64) {
	e := s.epoch(s.seen.Load())
	h := ring.Mix64(t)
	var vs [depth + 1]uint64
	for i := range depth {
		vs[i] = s.counts[i][index(h, i)].v.Load()
	}
	vs[depth] = s.mass.v.Load()
	return estimate(vs, e)
}

// estimate brings a key's packed counters and the mass (last) to the latest
// epoch among them and e, and returns the least count and the mass there.
// Comparing them at one epoch matters: a goroutine delayed across an epoch
// boundary would otherwise set an undecayed count against a halved mass
// (twice the share).
func estimate(vs [depth + 1]uint64, e uint64) (est, mass uint64) {
	for _, v := range vs {
		if ve := v >> countBits; ahead(ve, e) {
			e = ve
		}
	}
	est = math.MaxUint64
	for _, v := range vs[:depth] {
		est = min(est, decayed(v, e))
	}
	return est, decayed(vs[depth], e)
}

// Share returns key's estimated share of the recent requests (a count-min
// estimate: never below the true decayed share, above it by at most 0.27 %
// of the traffic with high probability).
func (s *Sketch) Share(key uint64) float64 {
	est, mass := s.read(tag(key))
	if mass == 0 {
		return 0
	}
	return float64(est) / float64(mass)
}

// want returns the k asked for by a share at a load per instance of
// perInstance thresholds: ceil(x / perInstance) for x = share × n /
// threshold, clamped to [1, min(n, maxK)].
func (s *Sketch) want(share float64, n int, perInstance float64) int {
	if n <= 1 {
		return 1
	}
	x := share * float64(n) / s.threshold / perInstance
	k := int(math.Ceil(x - 1e-9))
	return max(1, min(k, n, maxK))
}

// DefaultEvidence is how many standard errors a share estimate must clear
// before k moves: k rises only if the share's lower bound asks for more
// instances and falls only if its upper bound does. Replicas that each see
// half of a stream then move k only on what both can see, not on their own
// sampling noise (which, early on or at large k where adjacent k are close,
// left two replicas at different k of one key and split its requests).
const DefaultEvidence = 3

// bounds returns the share estimate's confidence band: the Wilson score
// interval at evidence standard errors over mass observations (the decayed
// mass understates the effective sample of the decayed weights, about 1.5
// times it, so the band is conservative). Unlike est ± z·σ it stays honest
// on few observations: a key seen in all of 64 requests has a lower bound
// of 0.88, not 1. Below minMass no key has a share.
func (s *Sketch) bounds(est, mass float64) (lo, hi float64) {
	if mass < minMass*one {
		return 0, 0
	}
	p, m, z := est/mass, mass/one, s.evidence
	z2 := z * z
	center := p + z2/(2*m)
	half := z * math.Sqrt(p*(1-p)/m+z2/(4*m*m))
	d := 1 + z2/m
	return max(0, (center-half)/d), min(1, (center+half)/d)
}

// decide returns t's k, moving it (when update is set) as the estimate asks
// with hysteresis (see the package comment) and evidence.
func (s *Sketch) decide(t uint64, est, mass float64, n int, update bool) int {
	start := slot(ring.Mix64(t))
	for p := range probe {
		slot := &s.table[(start+p)%tableSize]
		v := slot.Load()
		if v&^maxK != t {
			continue
		}
		lo, hi := s.bounds(est, mass)
		cur := int(v & maxK)
		next := cur
		switch up, down := s.want(lo, n, 1+s.hysteresis), s.want(hi, n, 1-s.hysteresis); {
		case up > cur:
			next = up
		case down < cur:
			next = down
		}
		next = min(next, n, maxK)
		if update && next != int(v&maxK) {
			// A lost race means another request moved it: either is fine.
			slot.CompareAndSwap(v, t|uint64(next))
		}
		return max(next, 1)
	}
	// Not in the table: k is 1 unless the share's lower bound asks for
	// more. Most keys stop at the first test, which needs no square root
	// (the lower bound is below the share).
	if !update || mass < minMass*one || est/mass*float64(n) <= (1+s.hysteresis)*s.threshold {
		return 1
	}
	lo, _ := s.bounds(est, mass)
	up := s.want(lo, n, 1+s.hysteresis)
	if up <= 1 || !s.insert(t, start, up, n) {
		return 1
	}
	return up
}

// insert stores t with k in its probe window: an empty slot, one whose key
// cooled to k = 1, or one whose key's current estimate no longer asks for
// more than one instance (a key that stopped arriving). If the window is
// full of hot keys, t is not stored and stays at k = 1 from its next
// request: the table bounds the memory, the threshold and bounded loads
// remain the safety net.
func (s *Sketch) insert(t uint64, start, k, n int) bool {
	for p := range probe {
		slot := &s.table[(start+p)%tableSize]
		v := slot.Load()
		if v&^maxK == t {
			return true // inserted concurrently
		}
		free := v == 0 || v&maxK <= 1
		if !free {
			est, mass := s.read(v &^ maxK)
			_, hi := s.bounds(float64(est), float64(mass))
			free = s.want(hi, n, 1-s.hysteresis) <= 1
		}
		if free && slot.CompareAndSwap(v, t|uint64(k)) {
			return true
		}
	}
	return false
}
