package overload

import "testing"

func TestObserveProbe(t *testing.T) {
	for _, tc := range []struct {
		name      string
		threshold int
		probes    string // o ok, x failed
		healthy   bool
		changes   int
	}{
		{"fresh", 2, "", true, 0},
		{"one failure", 2, "x", true, 0},
		{"two failures", 2, "xx", false, 1},
		{"failures not consecutive", 2, "xoxox", true, 0},
		{"up after one success", 2, "xxxo", true, 2},
		{"threshold 1", 1, "x", false, 1},
		{"threshold 0 means 1", 0, "x", false, 1},
		{"down again", 3, "xxxoxxx", false, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewState("i", BreakerOptions{})
			changes := 0
			for _, p := range tc.probes {
				if s.ObserveProbe(p == 'o', tc.threshold) {
					changes++
				}
			}
			if s.Healthy() != tc.healthy || changes != tc.changes {
				t.Fatalf("healthy %v after %d changes, want %v after %d", s.Healthy(), changes, tc.healthy, tc.changes)
			}
		})
	}
}
