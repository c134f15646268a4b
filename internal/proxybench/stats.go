package proxybench

import (
	"slices"
	"time"
)

// percentile is the nearest-rank q-quantile (0 < q ≤ 1) of sorted
// latencies; 0 for none.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(q*float64(len(sorted))+0.999999999) - 1 // ceil(q·n) − 1
	return sorted[max(0, min(rank, len(sorted)-1))]
}

// median of xs (the mean of the middle two for an even count); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
