package replica

import "testing"

func TestRateMoved(t *testing.T) {
	tests := []struct {
		published, rate float64
		want            bool
	}{
		{0, 0, false},
		{0, 0.9, false}, // below the absolute floor
		{0, 1, true},
		{10, 11.9, false}, // within a fifth
		{10, 12.6, true},
		{10, 8.1, false},
		{10, 7.9, true},
		{1.2, 0.1, true},
		{100, 81, false},
		{100, 79, true},
	}
	for _, tc := range tests {
		if got := rateMoved(tc.published, tc.rate); got != tc.want {
			t.Errorf("rateMoved(%v, %v) = %v, want %v", tc.published, tc.rate, got, tc.want)
		}
	}
}

func TestRoundRate(t *testing.T) {
	for in, want := range map[float64]float64{0: 0, 12.3456: 12.3, 0.012345: 0.0123, 98765: 98800} {
		if got := roundRate(in); got != want {
			t.Errorf("roundRate(%v) = %v, want %v", in, got, want)
		}
	}
}
