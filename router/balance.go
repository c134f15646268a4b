package router

import (
	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/overload"
)

// balanceBound is the bounded-loads limit of consistent hashing with bounded
// loads (Mirrokni, Thorup, Zadimoghaddam 2018): ceil(c × (total+1) / n) for a
// factor c given in thousandths, total the set's load without this request
// and n the set's size. An instance is admitted while its load is below it.
// Integer arithmetic keeps replicas in exact agreement and avoids float
// rounding pushing an exact quotient (1.1 × 10 / 11) to the next integer.
// With c ≥ 1 the bound is ≥ 1, so an idle instance always passes, and not
// every instance of the set can be at or above it: n × bound ≥ c × (total+1)
// > total.
func balanceBound(milli, total int64, n int) int64 {
	if n <= 0 {
		return 0
	}
	d := 1000 * int64(n)
	return (milli*(total+1) + d - 1) / d
}

// setLoad sums the load (own in-flight plus known external, as State.Load)
// of the set's instances: one pair of atomic loads per instance over a slice
// cached per set. Concurrent picks may read it mid-change; the bound is soft.
func (ev *endpointView) setLoad(set *lora.Set) int64 {
	var total int64
	for _, st := range ev.statesOf(set) {
		total += st.Load()
	}
	return total
}

// statesOf returns the states of the set's instances, building the slice on
// the set's first use in this view.
func (ev *endpointView) statesOf(set *lora.Set) []*overload.State {
	if v, ok := ev.setStates.Load(set); ok {
		return v.([]*overload.State)
	}
	states := make([]*overload.State, 0, set.Len())
	for i := range set.Len() {
		if iv := ev.byPtr[set.Instance(i)]; iv != nil && iv.state != nil {
			states = append(states, iv.state)
		}
	}
	v, _ := ev.setStates.LoadOrStore(set, states)
	return v.([]*overload.State)
}
