package proxybench

import (
	"os"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	tests := []struct {
		name, line string
		want       time.Duration
		bad        bool
	}{
		// A real line of a Go process (fields 14/15: 1234 and 567 ticks).
		{"plain", "4242 (prefixrouter) S 1 4242 4242 0 -1 4194560 900 0 0 0 1234 567 0 0 20 0 7 0 100 1000 200 18446744073709551615", 1801 * 10 * time.Millisecond, false},
		// The name may hold spaces and parentheses: count from the last ')'.
		{"odd name", "7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 1 1", 70 * time.Millisecond, false},
		{"no name", "7 a R 1", 0, true},
		{"short", "7 (x) R 1 2 3", 0, true},
		{"not a number", "7 (x) R 1 7 7 0 -1 0 0 0 0 0 x 4 0", 0, true},
	}
	for _, tc := range tests {
		got, err := parseStat([]byte(tc.line))
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("%s: parseStat = %v, %v; want %v (error %v)", tc.name, got, err, tc.want, tc.bad)
		}
	}
}

// TestCPUTimeOfThisProcess reads the test's own /proc entry after burning
// CPU: the figure must be positive and grow.
func TestCPUTimeOfThisProcess(t *testing.T) {
	pid := os.Getpid()
	before, err := cpuTime(pid)
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	after := before
	for x := 0; after <= before && time.Now().Before(deadline); x++ {
		for i := range 1_000_000 {
			x ^= i * x
		}
		if after, err = cpuTime(pid); err != nil {
			t.Fatal(err)
		}
	}
	if after <= before {
		t.Errorf("cpu time did not grow in 5 s of busy loop: %v then %v", before, after)
	}
}

func TestPercentileAndMedian(t *testing.T) {
	ms := func(xs ...int) []time.Duration {
		out := make([]time.Duration, len(xs))
		for i, x := range xs {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	lat := ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 5 * time.Millisecond}, {0.99, 10 * time.Millisecond}, {0.1, time.Millisecond}, {1, 10 * time.Millisecond}} {
		if got := percentile(lat, tc.q); got != tc.want {
			t.Errorf("percentile(1..10 ms, %v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("percentile of nothing = %v", got)
	}
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median(3,1,2) = %v", got)
	}
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median(4,1,3,2) = %v", got)
	}
}
