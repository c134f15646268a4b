// Package hotkey estimates which routing keys are hot and how many
// instances each should warm: a decayed count-min sketch of request counts
// per key and a small table of replication factors with hysteresis, both of
// fixed size and updated with atomics only.
//
// A key whose share of the requests is s, in a set of n instances, asks for
// x = s × n / Threshold instances' worth of capacity. Its replication
// factor k (1 for a cold key: one instance, the most cache hits) moves only
// when the key leaves a band around it: up to ceil(x / (1 + Hysteresis))
// when that is larger (its k instances would each carry more than 1 + h of
// the threshold), down to ceil(x / (1 - Hysteresis)) when that is smaller
// (k - 1 instances would each carry less than 1 - h). An estimate that
// hovers near a boundary therefore never flaps. Shares, not rates, are
// compared, so router replicas that each see a part of the same stream
// reach the same k without talking to each other.
package hotkey

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
)

// Defaults of Options, used where a field is zero.
const (
	// DefaultThreshold: a key gets a second instance once it alone carries
	// more than one instance's fair share of the requests.
	DefaultThreshold = 1.0
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
const (
	depth     = 4
	width     = 2048
	tableSize = 1024
	probe     = 8
	// minMass is the evidence (decayed observations) below which no key is
	// hot: the first requests of a fresh replica would otherwise each look
	// like 100 % of the traffic.
	minMass = 512
	// maxK is the largest k the table stores (8 bits of a slot).
	maxK = 255
)

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
	// HalfLife is the number of observations between halvings of every
	// count; zero means DefaultHalfLife. It must be at least 2 × minMass
	// (1,024) so that the evidence never falls below minMass after a
	// halving.
	HalfLife int
}

// Validate checks the ranges; its errors wrap ErrInvalid.
func (o Options) Validate() error {
	if !(o.Threshold >= 0 && o.Threshold <= 16) {
		return fmt.Errorf("%w: threshold %v outside (0, 16]", ErrInvalid, o.Threshold)
	}
	if !(o.Hysteresis >= 0 && o.Hysteresis <= 0.5) {
		return fmt.Errorf("%w: hysteresis %v outside [0, 0.5]", ErrInvalid, o.Hysteresis)
	}
	if o.HalfLife != 0 && o.HalfLife < 2*minMass {
		return fmt.Errorf("%w: half-life %d below %d observations", ErrInvalid, o.HalfLife, 2*minMass)
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
	return o
}

// Sketch counts keys and decides their replication factor. Its memory is
// fixed (about 40 KiB) whatever the number of keys; every method is safe
// for concurrent use and takes no lock.
type Sketch struct {
	threshold, hysteresis float64
	halfLife              uint64

	counts [depth][width]atomic.Uint32
	// mass is the decayed number of observations: the sum of row 0.
	mass atomic.Int64
	// seen counts observations, to schedule the halvings.
	seen atomic.Uint64
	// table holds the hot keys: tag (the key's high 56 bits) | k (low 8
	// bits); 0 is an empty slot.
	table [tableSize]atomic.Uint64
}

// New returns an empty sketch; o must be valid (see Options.Validate).
func New(o Options) (*Sketch, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	return &Sketch{threshold: o.Threshold, hysteresis: o.Hysteresis, halfLife: uint64(o.HalfLife)}, nil
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

// mix scrambles a tag (splitmix64's finalizer), so that counters and table
// slots depend on every bit of it: keys that differ only in a few bits
// (tests, or a weak hash upstream) must not share all their counters.
func mix(t uint64) uint64 {
	t ^= t >> 30
	t *= 0xbf58476d1ce4e5b9
	t ^= t >> 27
	t *= 0x94d049bb133111eb
	return t ^ t>>31
}

// index is the counter of row i for a mixed tag h (double hashing over its
// two halves).
func index(h uint64, i int) uint32 {
	lo, hi := uint32(h), uint32(h>>32)|1
	return (lo + uint32(i)*hi) % width
}

// slot is where t's probe window starts in the table.
func slot(h uint64) int { return int(h>>40) % tableSize }

// Observe counts one request of key and returns its replication factor in
// a set of n instances. One in HalfLife calls also halves every count (about
// 8,000 atomic operations, some 20 µs, on the calling request).
func (s *Sketch) Observe(key uint64, n int) int {
	if s.seen.Add(1)%s.halfLife == 0 {
		s.decay()
	}
	t := tag(key)
	h := mix(t)
	est := uint32(math.MaxUint32)
	for i := range depth {
		est = min(est, s.counts[i][index(h, i)].Add(1))
	}
	mass := s.mass.Add(1)
	return s.decide(t, float64(est), float64(mass), n, true)
}

// K returns key's current replication factor in a set of n instances
// without counting a request (for retries and explanations).
func (s *Sketch) K(key uint64, n int) int {
	t := tag(key)
	return s.decide(t, float64(s.estimate(t)), float64(s.mass.Load()), n, false)
}

func (s *Sketch) estimate(t uint64) uint32 {
	h := mix(t)
	est := uint32(math.MaxUint32)
	for i := range depth {
		est = min(est, s.counts[i][index(h, i)].Load())
	}
	return est
}

// Share returns key's estimated share of the recent requests (a count-min
// estimate: never below the true decayed share, above it by at most a few
// hundredths of a percent with high probability).
func (s *Sketch) Share(key uint64) float64 {
	m := s.mass.Load()
	if m <= 0 {
		return 0
	}
	return float64(s.estimate(tag(key))) / float64(m)
}

// decay halves every count and the mass. Concurrent increments are kept
// (each counter is decremented by half of what it held, not overwritten),
// and the mass, which is the sum of row 0, loses exactly what row 0 loses,
// counter by counter: requests counted while the halving runs then weigh
// the same in a key's count and in the mass, so shares stay unbiased.
func (s *Sketch) decay() {
	epoch := int(s.seen.Load() / s.halfLife)
	for i := range depth {
		for j := range width {
			c := &s.counts[i][j]
			// Odd counts lose the extra one on every other counter and
			// epoch: always rounding down would pin the many counts of 1
			// (keys seen once) and inflate the mass, always rounding up
			// would drain it; alternating halves on average.
			n := c.Load()
			v := n / 2
			if n&1 == 1 && (i+j+epoch)&1 == 0 {
				v++
			}
			if v > 0 {
				c.Add(^(v - 1)) // c -= v
				if i == 0 {
					s.mass.Add(-int64(v))
				}
			}
		}
	}
}

// want returns the k asked for by a share estimate at a load per instance
// of perInstance thresholds: ceil(x / perInstance) for x = share × n /
// threshold, clamped to [1, min(n, maxK)].
func (s *Sketch) want(est, mass float64, n int, perInstance float64) int {
	if mass < minMass || n <= 1 {
		return 1
	}
	x := est / mass * float64(n) / s.threshold / perInstance
	k := int(math.Ceil(x - 1e-9))
	return max(1, min(k, n, maxK))
}

// decide returns t's k, moving it (when update is set) as the estimate asks
// with hysteresis (see the package comment).
func (s *Sketch) decide(t uint64, est, mass float64, n int, update bool) int {
	up := s.want(est, mass, n, 1+s.hysteresis)
	down := s.want(est, mass, n, 1-s.hysteresis)
	start := slot(mix(t))
	for p := range probe {
		slot := &s.table[(start+p)%tableSize]
		v := slot.Load()
		if v&^maxK != t {
			continue
		}
		cur := int(v & maxK)
		next := cur
		switch {
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
	if up <= 1 || !update {
		return 1
	}
	if !s.insert(t, start, up, n) {
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
	mass := float64(s.mass.Load())
	for p := range probe {
		slot := &s.table[(start+p)%tableSize]
		v := slot.Load()
		if v&^maxK == t {
			return true // inserted concurrently
		}
		free := v == 0 || v&maxK <= 1 || s.want(float64(s.estimate(v&^maxK)), mass, n, 1-s.hysteresis) <= 1
		if free && slot.CompareAndSwap(v, t|uint64(k)) {
			return true
		}
	}
	return false
}
