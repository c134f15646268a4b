package hotkey

import (
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/prefixrouter/prefixrouter/ring"
)

// zipfStream returns n keys drawn from docs keys with Zipf(s) popularity
// (s = 0: uniform); key i is a fixed pseudo-random 64-bit value.
func zipfStream(rng *rand.Rand, docs int, s float64, n int) []uint64 {
	keys := make([]uint64, docs)
	for i := range keys {
		keys[i] = rand.New(rand.NewPCG(uint64(i), 42)).Uint64()
	}
	out := make([]uint64, n)
	if s == 0 {
		for i := range out {
			out[i] = keys[rng.IntN(docs)]
		}
		return out
	}
	z := rand.NewZipf(rng, s+1e-9, 1, uint64(docs-1))
	if s <= 1 {
		// rand.Zipf needs s > 1: draw by inverse CDF instead.
		cdf := make([]float64, docs)
		var sum float64
		for i := range docs {
			sum += 1 / pow(float64(i+1), s)
			cdf[i] = sum
		}
		for i := range out {
			u := rng.Float64() * sum
			lo := 0
			for cdf[lo] < u {
				lo++
			}
			out[i] = keys[lo]
		}
		return out
	}
	for i := range out {
		out[i] = keys[z.Uint64()]
	}
	return out
}

func pow(x, y float64) float64 { return math.Pow(x, y) }

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		o  Options
		ok bool
	}{
		{Options{}, true},
		{Options{Threshold: 0.5, Hysteresis: 0.3, HalfLife: 2048}, true},
		{Options{Threshold: -1}, false},
		{Options{Threshold: 17}, false},
		{Options{Hysteresis: 0.6}, false},
		{Options{HalfLife: 100}, false},
		{Options{HalfLife: maxHalfLife + 1}, false},
	} {
		err := tc.o.Validate()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("%+v: Validate() = %v, want ok=%v", tc.o, err, tc.ok)
		}
	}
}

// TestReplicationFactor, threshold 1: under a stream with one key at 40 %,
// that key gets ceil(0.4 × n / (threshold × 1.2)) instances and a key at
// 1 % keeps one.
func TestReplicationFactor(t *testing.T) {
	s, err := New(Options{Threshold: 1})
	if err != nil {
		t.Fatal(err)
	}
	const n = 7
	hot, warm := uint64(0xdeadbeef00000000), uint64(0x1234567800000000)
	rng := rand.New(rand.NewPCG(1, 2))
	var kHot, kWarm int
	for i := range 20000 {
		switch u := rng.Float64(); {
		case u < 0.40:
			kHot = s.Observe(hot, n)
		case u < 0.41:
			kWarm = s.Observe(warm, n)
		default:
			s.Observe(rng.Uint64(), n)
		}
		if i == minMass-10 && kHot != 1 {
			t.Errorf("k = %d after %d requests, want 1 below the evidence floor", kHot, i)
		}
	}
	// 0.4 × 7 / 1.2 = 2.33 → 3.
	if kHot != 3 || s.K(hot, n) != 3 {
		t.Errorf("hot key (40 %%): k = %d (K %d), want 3; share estimate %.3f", kHot, s.K(hot, n), s.Share(hot))
	}
	if kWarm != 1 {
		t.Errorf("1 %% key: k = %d, want 1", kWarm)
	}
	if got := s.K(hot, 2); got != 1 && got > 2 {
		t.Errorf("k %d exceeds a set of 2", got)
	}
}

// TestHysteresis, 7 instances, threshold 1: a key at 12 % (x = 0.84, below the 1.2 that
// asks for a second instance) keeps k = 1; at 25 % (x = 1.75) it gets 2; back
// at 13 % (x = 0.91: one instance would carry more than 0.8) it keeps 2; at
// 8 % (x = 0.56) it drops to 1. (At 10 %, x = 0.7 is within the evidence
// band of the 0.8 boundary: three standard errors over the ~3,000 requests
// the estimate weighs are 1.6 points of share, so k stays.)
func TestHysteresis(t *testing.T) {
	s, _ := New(Options{Threshold: 1, HalfLife: 2048})
	const n = 7
	key := uint64(0xabcdef0100000000)
	rng := rand.New(rand.NewPCG(3, 4))
	run := func(share float64, reqs int) int {
		k := 0
		for range reqs {
			if rng.Float64() < share {
				k = s.Observe(key, n)
			} else {
				s.Observe(rng.Uint64(), n)
			}
		}
		return k
	}
	if k := run(0.12, 20000); k != 1 {
		t.Fatalf("at 12 %%: k = %d, want 1", k)
	}
	if k := run(0.25, 20000); k != 2 {
		t.Fatalf("at 25 %%: k = %d, want 2", k)
	}
	if k := run(0.13, 20000); k != 2 {
		t.Errorf("at 13 %% (inside the band): k = %d, want 2 kept", k)
	}
	if k := run(0.08, 20000); k != 1 {
		t.Errorf("at 8 %%: k = %d, want 1", k)
	}
}

// TestUniformStaysCold: no key of a uniform stream over 256 keys (0.4 %
// each) is ever replicated.
func TestUniformStaysCold(t *testing.T) {
	s, _ := New(Options{})
	rng := rand.New(rand.NewPCG(5, 6))
	for i, key := range zipfStream(rng, 256, 0, 50000) {
		if k := s.Observe(key, 7); k != 1 {
			t.Fatalf("request %d: uniform key got k = %d", i, k)
		}
	}
}

// TestTableChurn: hot keys that all map to the same probe window, each
// hot for a while and then gone, reuse the window's slots (memory stays
// bounded and new hot keys still get k > 1). Each is half of the requests
// for 2,000 of them, about two HalfLives (1,024), so its decayed share
// reaches about 0.37 (x ≈ 3 of 8 instances) while the key before it has
// cooled to a quarter of that.
func TestTableChurn(t *testing.T) {
	s, _ := New(Options{HalfLife: 1024})
	rng := rand.New(rand.NewPCG(7, 8))
	// Keys whose probe windows start at the same slot, distinct tags.
	var keys []uint64
	for k := uint64(1); len(keys) < 4*probe; k++ {
		if key := k << 8; slot(ring.Mix64(tag(key))) == 77 {
			keys = append(keys, key)
		}
	}
	for phase, key := range keys {
		k := 0
		for range 2000 {
			if rng.IntN(2) == 0 {
				k = s.Observe(key, 8)
			} else {
				s.Observe(rng.Uint64(), 8)
			}
		}
		if k < 2 {
			t.Fatalf("phase %d: hot key (50 %%) got k = %d", phase, k)
		}
	}
}

// TestLazyDecay: a count is worth half as much one HalfLife of
// observations later, exactly (to the counters' fixed point), however the
// observations fall around epoch boundaries: the shares of two keys seen
// one after the other match the weights computed observation by
// observation.
func TestLazyDecay(t *testing.T) {
	const half = 1024
	s, _ := New(Options{HalfLife: half})
	a, b := uint64(0xaaaa000000000000), uint64(0xbbbb000000000000)
	var wa, wb []uint64 // epoch of each observation
	for i := range 5*half + 37 {
		seen := uint64(i + 1)
		if i < 4*half+100 {
			s.Observe(a, 7)
			wa = append(wa, seen/half)
		} else {
			s.Observe(b, 7)
			wb = append(wb, seen/half)
		}
	}
	now := uint64(5*half+37) / half
	weight := func(es []uint64) (w float64) {
		for _, e := range es {
			w += math.Ldexp(1, -int(now-e))
		}
		return w
	}
	wantA := weight(wa) / (weight(wa) + weight(wb))
	if got := s.Share(a); math.Abs(got-wantA) > 1e-3 {
		t.Errorf("share of a = %.5f, want %.5f", got, wantA)
	}
	if got := s.Share(b); math.Abs(got-(1-wantA)) > 1e-3 {
		t.Errorf("share of b = %.5f, want %.5f", got, 1-wantA)
	}
}

// TestConcurrentAccuracy: observers in parallel estimate as well as one
// observer would. Four goroutines each send 20,000 requests, 40 % of them
// on one key, into one sketch of 7 instances at threshold 1
// (TestReplicationFactor's stream, in parallel). The estimate weighs the last few HalfLives of
// requests: an effective sample of 2 × 4,096 / ln 2 ≈ 11,800, so the
// share's standard deviation is sqrt(0.4 × 0.6 / 11,800) ≈ 0.0045; the
// tolerance, ±0.025, is five of them (plus the sketch's overestimate of at
// most 0.003). The key must then hold k = 3 (x = 0.4 × 7 = 2.8; ceil(2.8 /
// 1.2) = 3, and k = 4 would need x > 3.6 once). Before the counters decayed
// lazily, 30 runs under -race gave a 45 % key estimates from 0 to 0.43:
// halvings raced with each other and with the increments.
func TestConcurrentAccuracy(t *testing.T) {
	s, _ := New(Options{Threshold: 1})
	const key, goroutines, each = 42 << 8, 4, 20000
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			<-start
			for range each {
				if rng.Float64() < 0.40 {
					s.Observe(key, 7)
				} else {
					s.Observe(rng.Uint64(), 7)
				}
				if rng.IntN(64) == 0 {
					_ = s.K(key, 7) // readers race with the writers too
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	sh, k := s.Share(key), s.K(key, 7)
	t.Logf("after %d concurrent observers: share of a 40 %% key %.4f, k %d", goroutines, sh, k)
	if math.Abs(sh-0.40) > 0.025 {
		t.Errorf("share %.4f, want 0.40 ± 0.025", sh)
	}
	if k != 3 {
		t.Errorf("k = %d, want 3", k)
	}
	// The mass is every observation, decayed: between one and two
	// HalfLives' worth (4,096 to 8,192) in steady state.
	_, mass := s.read(tag(key))
	if m := float64(mass) / one; m < DefaultHalfLife || m > 2*DefaultHalfLife {
		t.Errorf("decayed mass %.1f outside [%d, %d]", m, DefaultHalfLife, 2*DefaultHalfLife)
	}
}

// TestMemoryBounded: the sketch's size is fixed, whatever the keys seen.
func TestMemoryBounded(t *testing.T) {
	size := unsafe.Sizeof(Sketch{})
	t.Logf("Sketch: %d bytes", size)
	if size > 48<<10 {
		t.Errorf("Sketch is %d bytes, want ≤ 48 KiB", size)
	}
}

func BenchmarkObserve(b *testing.B) {
	s, _ := New(Options{})
	keys := zipfStream(rand.New(rand.NewPCG(1, 1)), 200, 1, 1<<16)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.Observe(keys[i&(1<<16-1)], 7)
		i++
	}
}

// BenchmarkObserveParallel is Observe from every core at once on one
// sketch (the replica's request goroutines): the hot key's counters and the
// mass are shared cache lines.
func BenchmarkObserveParallel(b *testing.B) {
	s, _ := New(Options{})
	keys := zipfStream(rand.New(rand.NewPCG(1, 1)), 200, 1, 1<<16)
	b.ReportAllocs()
	var next atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		i := next.Add(1 << 12)
		for pb.Next() {
			s.Observe(keys[i&(1<<16-1)], 7)
			i++
		}
	})
}

// BenchmarkObserveDistinct is the memory bound: every observation is a new
// key, yet nothing is allocated and the sketch stays its fixed size
// (reported as sketch-bytes).
func BenchmarkObserveDistinct(b *testing.B) {
	s, _ := New(Options{})
	b.ReportAllocs()
	var key uint64
	for b.Loop() {
		key += 0x9e3779b97f4a7c15
		s.Observe(key, 7)
	}
	b.ReportMetric(float64(unsafe.Sizeof(*s)), "sketch-bytes")
}

// TestCountChain: a request counts once in the mass however many of its
// depths are counted, so a prompt that half the requests share shows half
// at each of its depths, with its parents; the others' single depth is
// counted and stays unlisted, and past the first requests (where any key
// has a large share of a small mass, and deeper depths are counted from
// the start) a key seen once is not popular: its deeper depths are not
// counted.
func TestCountChain(t *testing.T) {
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 5))
	chain := []uint64{0x1111_0000_0000_0000, 0x2222_0000_0000_0000, 0x3333_0000_0000_0000}
	const n = 7
	for i := range 3000 {
		e := s.Begin()
		if rng.IntN(2) == 0 {
			var parent uint64
			for lvl, key := range chain {
				popular, _ := s.Count(e, key, parent, lvl, "m", n)
				if !popular {
					t.Fatalf("level %d of a prompt with half the requests is not popular", lvl)
				}
				parent = key
			}
			continue
		}
		if popular, _ := s.Count(e, rng.Uint64(), 0, 0, "m", n); popular && i >= minMass {
			t.Fatalf("request %d: a key seen once is popular", i)
		}
	}
	got := s.Popular(100)
	if len(got) != len(chain) {
		t.Fatalf("popular %+v, want the chain's %d depths", got, len(chain))
	}
	for _, e := range got {
		lvl := -1
		for i, k := range chain {
			if e.Key == k {
				lvl = i
			}
		}
		var parent uint64
		if lvl > 0 {
			parent = chain[lvl-1]
		}
		if lvl < 0 || e.Level != lvl || e.Parent != parent || e.Model != "m" || e.N != n {
			t.Fatalf("entry %+v: not the chain's depth %d", e, lvl)
		}
		// Half the requests, at one standard error of the decayed sample.
		if math.Abs(e.Share-0.5) > 0.03 || e.K < 5 {
			t.Errorf("depth %d: share %.3f, k %d; want 0.5 ± 0.03 and k ≥ 5 (x = 0.5 × 7 / 0.5 = 7)", lvl, e.Share, e.K)
		}
	}
	if s.Seen() != 3000 {
		t.Errorf("seen %d requests, want 3000", s.Seen())
	}
}
