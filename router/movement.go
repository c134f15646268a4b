package router

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/ring"
)

// keySample is how many routing keys the movement estimate follows. The
// fraction moved is a binomial proportion over the sample, so its standard
// error is at most 0.5/√4096 ≈ 0.8 percentage points; 4,096 ring lookups cost
// about 0.2 ms at 8 instances and 2 ms at 256, on the Update path only.
const keySample = 4096

// movement remembers, per endpoint, the base set's members and the primary
// of each sample key at the last Update, so that the next membership change
// can be measured as the fraction of keys whose PREFIX_AWARE primary
// changed: about 1/(N+1) when one instance joins N, the figure that says
// how much of the fleet's prefix cache a scale event costs. Owned by Update
// (under Router.mu).
type movement struct {
	members   []ring.Member
	primaries []string // instance id per sample key
}

// sampleKey returns the i-th sample routing key: the mixed i-th multiple of
// 2^64/φ (splitmix64's sequence), fixed and uniform over the 64-bit key
// space like the xxhash keys requests carry.
func sampleKey(i int) uint64 { return ring.Mix64(uint64(i+1) * 0x9e3779b97f4a7c15) }

// measureMovement compares table's base set (every non-draining instance:
// the set of requests that name no adapter) with prev and returns the new
// state and the fraction of sample keys whose primary changed. ok is false
// when there is nothing to report: the first snapshot, an unchanged member
// list (a config or adapter change moves no base key), or a side with no
// instance (every key loses or gains its owner, which says nothing of the
// ring). Adapter sets are not sampled.
func measureMovement(prev *movement, table *lora.Table) (next *movement, moved float64, ok bool) {
	set, err := table.Set("")
	if err != nil {
		return nil, 0, false
	}
	r := set.Ring()
	if prev != nil && slices.Equal(prev.members, r.Members()) {
		return prev, 0, false
	}
	next = &movement{members: slices.Clone(r.Members()), primaries: make([]string, keySample)}
	n := 0
	for i := range next.primaries {
		next.primaries[i] = set.Instance(r.Primary(sampleKey(i))).ID
		if prev != nil && prev.primaries[i] != next.primaries[i] {
			n++
		}
	}
	if prev == nil {
		return next, 0, false
	}
	return next, float64(n) / keySample, true
}

func newKeysMovedHistogram() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "prefixrouter_keys_moved_ratio",
		Help: "Per membership change of an endpoint's instances (join, leave, drain, weight), the fraction of a fixed sample of " +
			"4096 routing keys whose PREFIX_AWARE primary changed; about 1/(N+1) when one instance joins N.",
		Buckets: []float64{0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1},
	}, []string{"endpoint"})
}
