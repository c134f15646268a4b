package overload

import "math"

// Limit is what admission compares an instance's load with: the endpoint's
// per-instance ConcurrencyThreshold, which holds fleet-wide, and this
// replica's share of it, the most of its own requests it puts on one
// instance. Each replica sees only its own in-flight requests, so the share
// is what keeps R replicas together near the threshold (docs/concurrency.md).
type Limit struct {
	Threshold int
	Share     int
}

// Whole is the limit of a replica that routes alone: the whole threshold.
func Whole(threshold int) Limit { return Limit{Threshold: threshold, Share: threshold} }

// TrafficShare returns a replica's share of a per-instance threshold t
// weighted by the traffic it carries: ceil(t × own/total), at least 1 and at
// most t, where own is this replica's request rate and total the rate of
// all replicas together (own included). When every replica's requests
// spread over the instances alike, an instance's load from the replicas is
// about t × Σ own/total = t; a replica that carries most of the traffic (a
// skewed DNS share) may put most of t on an instance, where ReplicaShare
// would cap it at t/r. Rounding up adds less than one request per replica.
// A total that is not positive gives t (nothing to share with).
func TrafficShare(t int, own, total float64) int {
	if t < 1 {
		return 1
	}
	if !(total > 0) || own >= total {
		return t
	}
	if !(own > 0) {
		return 1
	}
	// The epsilon keeps an exact quotient (t × 1/2 = 4.000000001) from
	// rounding up to the next request.
	return min(t, max(1, int(math.Ceil(float64(t)*own/total-1e-9))))
}
