package router

import (
	"slices"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/overload"
	"github.com/prefixrouter/prefixrouter/ring"
)

// firstCandidates is how many ring candidates a PREFIX_AWARE pick ranks
// before it needs the full order: the primary and a few spill targets cover
// all but overloaded fleets, and ranking all n costs O(n) per candidate.
const firstCandidates = 4

// maxHotCandidates caps a hot key's k: ring.Candidates ranks up to 16 on the
// stack in one pass, beyond which ranking costs O(n) per candidate (tens of
// microseconds for 50 of 64). A key that needs more than 16 instances is
// spread over 16 and the threshold and bounded loads spill the rest.
const maxHotCandidates = 16

// pick is an admitted choice: the instance, its ring index in the model's
// set, the done callback that releases its slot, and the decision label.
type pick struct {
	iv       *instanceView
	idx      int
	done     overload.Done
	decision string
	spill    spill // PREFIX_AWARE: why the ring primary was passed over
}

// hotChoice is what popularity adds to a PREFIX_AWARE pick. With fixed
// keys and hot-key replication: k, how many leading candidates of the
// key's ring order share it (0 or 1: the primary alone), and spread, a hash
// of the request that breaks load ties among them the same way on every
// replica. With adaptive keys (popular.go): the instances the request
// prefers (lead), before the ring order of key, the depth it routes on;
// byLoad when the lead share the request by load (k = nlead, ivs their
// views), as hot keys do.
type hotChoice struct {
	k      int
	spread uint64

	key    uint64
	level  int
	lead   [maxHotCandidates]int
	nlead  int
	byLoad bool
	ivs    []*instanceView
}

// spreadTail is how much of the end of a body the spread hash reads: the
// part that differs between requests sharing a prefix (the question, the
// last turn), at a cost independent of the body's size.
const spreadTail = 256

// newHotChoice counts the request's key in the endpoint's sketch, when the
// endpoint replicates hot keys, and returns the key's replication for it.
func newHotChoice(ev *endpointView, set *lora.Set, key uint64, body []byte) hotChoice {
	if ev.hot == nil {
		return hotChoice{}
	}
	k := ev.hot.Observe(key, set.Len())
	if k <= 1 {
		return hotChoice{k: 1}
	}
	return hotChoice{k: k, spread: spreadHash(body)}
}

// hotOrder is a hot key's ring order in one set (its first
// min(n, maxHotCandidates) candidates) with their views, cached per view:
// a hot key's requests are by definition frequent, and ranking its
// candidates (O(n) hashes and insertions) plus a map lookup per candidate
// dominated their pick at 64 instances. Immutable once published.
type hotOrder struct {
	set *lora.Set
	key uint64
	idx []int
	ivs []*instanceView // ev.instance(set, idx[j]); nil where it cannot be picked
}

// hotOrderSlots bounds the cache: a hot key carries more than 1.2
// thresholds of one instance's fair share, so at most n / (1.2 × threshold)
// keys of a set of n are hot (107 at n = 64 and the default 0.5); 1,024
// slots, two probed per key, rarely collide. It is allocated only for endpoints that
// replicate hot keys (8 KiB per view).
const hotOrderSlots = 1024

type hotOrders [hotOrderSlots]atomic.Pointer[hotOrder]

// hotOrder returns key's cached order in set, ranking and storing it on a
// miss (the only allocation, once per hot key and view; a collision
// overwrites the first probed slot). Lock-free: concurrent misses each store
// an equal value.
func (ev *endpointView) hotOrder(set *lora.Set, key uint64) *hotOrder {
	i := int(key % hotOrderSlots)
	j := (i + 1) % hotOrderSlots
	for _, s := range [2]int{i, j} {
		if o := ev.orders[s].Load(); o != nil && o.key == key && o.set == set {
			return o
		}
	}
	n := min(set.Len(), maxHotCandidates)
	o := &hotOrder{set: set, key: key, idx: set.Ring().Candidates(key, n, make([]int, 0, n)), ivs: make([]*instanceView, n)}
	for c, idx := range o.idx {
		o.ivs[c] = ev.instance(set, idx)
	}
	if ev.orders[i].Load() != nil && ev.orders[j].Load() == nil {
		i = j
	}
	ev.orders[i].Store(o)
	return o
}

// spreadHash is the hash of the body's last spreadTail bytes.
func spreadHash(body []byte) uint64 { return xxhash.Sum64(body[max(0, len(body)-spreadTail):]) }

// bitset marks set indexes (tried or refused instances) without allocating
// for sets of up to 64 instances.
type bitset struct {
	w    uint64
	more []uint64
}

func (b *bitset) empty() bool {
	if b.w != 0 {
		return false
	}
	for _, w := range b.more {
		if w != 0 {
			return false
		}
	}
	return true
}

func (b *bitset) has(i int) bool {
	if i < 64 {
		return b.w&(1<<uint(i)) != 0
	}
	j := i/64 - 1
	return j < len(b.more) && b.more[j]&(1<<uint(i%64)) != 0
}

func (b *bitset) set(i int) {
	if i < 64 {
		b.w |= 1 << uint(i)
		return
	}
	j := i/64 - 1
	for len(b.more) <= j {
		b.more = append(b.more, 0)
	}
	b.more[j] |= 1 << uint(i%64)
}

// instance returns the view of the set's i-th instance, or nil if it cannot
// be picked (an addr that does not parse).
func (ev *endpointView) instance(set *lora.Set, i int) *instanceView {
	iv := ev.byPtr[set.Instance(i)]
	if iv == nil || iv.target == nil {
		return nil
	}
	return iv
}

// pick is the routing sequence's last step (route.go): it chooses and
// admits an instance of rt's set for rt's key by the endpoint's strategy,
// skipping the indexes in skip (instances already tried or excluded). ok
// is false when no instance can take the request. It never blocks and
// takes no lock beyond the chosen breaker's own.
func (r *Router) pick(rt *route, skip bitset) (pick, bool) {
	ev, set, key, hc := rt.ev, rt.set, rt.key, rt.hot
	h := healthFilter{ev: ev, set: set}
	switch ev.strategy {
	case fleet.Random:
		return r.pickRandom(ev, set, skip, &h)
	case fleet.LeastOutstanding:
		return r.pickLeast(ev, set, skip, &h, DecisionLeastOutstanding)
	default:
		return r.pickPrefix(ev, set, key, hc, r.limit(rt.view, ev), skip, &h)
	}
}

// healthFilter decides whether a pick skips an instance that active health
// checks marked down. It fails open twice: when more of the endpoint is out
// than its ejection cap allows, the endpoint panics and no instance is
// marked down (State.MarkedDown, decided once per state change); and if no
// instance of the set is healthy, health is ignored, so that a broken
// health endpoint (or a checker that cannot reach the fleet) does not take
// the whole set down; the breakers still guard against instances that
// really fail. The set is scanned at most once per pick, and only when an
// instance marked down is met.
type healthFilter struct {
	ev      *endpointView
	set     *lora.Set
	decided bool
	ignore  bool
}

func (h *healthFilter) skip(iv *instanceView) bool {
	if !iv.state.MarkedDown() {
		return false
	}
	if !h.decided {
		h.decided = true
		h.ignore = true
		for i := 0; i < h.set.Len(); i++ {
			if o := h.ev.instance(h.set, i); o != nil && o.state.Healthy() {
				h.ignore = false
				break
			}
		}
	}
	return !h.ignore
}

// pickPrefix is PREFIX_AWARE: the ring's primary (for a hot key, the least
// loaded of its first hc.k candidates; with adaptive keys, the first of the
// instances the key's depth prefers, hc.lead); else the next candidate in
// that order, then in the key's ring order, with room under the threshold
// (and, with a balance factor, a load below the balance bound) and a
// breaker that lets it through; else the least loaded instance whose
// breaker is closed.
func (r *Router) pickPrefix(ev *endpointView, set *lora.Set, key uint64, hc hotChoice, limit overload.Limit, skip bitset, h *healthFilter) (pick, bool) {
	n := set.Len()
	var bound int64 // 0: no balance bound
	// An endpoint that replicates hot keys balances them with warm copies
	// (k instances by load); bounded loads would also move cold keys off
	// their only warm instance whenever a burst lifts it above the bound,
	// paying a prefill and a duplicate copy each time (docs/balance.md,
	// "Replication instead of bounded loads"). The threshold and the
	// breakers remain its safety nets.
	if r.balance > 0 && ev.hot == nil {
		bound = balanceBound(r.balance, ev.setLoad(set), n)
	}
	var buf [2 * maxHotCandidates]int
	var cands []int
	switch k := min(hc.k, n, maxHotCandidates); {
	case hc.nlead > 0:
		cands = append(buf[:0], hc.lead[:hc.nlead]...)
		if hc.byLoad {
			toFront(cands, hotPick(hc.ivs, cands, hc.spread, skip, h))
		}
		// Then the key's ring order: where its prefix spills.
		var more [maxHotCandidates]int
		for _, i := range set.Ring().Candidates(key, min(n, len(cands)+firstCandidates, maxHotCandidates), more[:0]) {
			if !slices.Contains(cands, i) {
				cands = append(cands, i)
			}
		}
	case k > 1 && ev.orders != nil:
		o := ev.hotOrder(set, key)
		cands = append(buf[:0], o.idx...)
		// The chosen one goes first; the others keep their ring order, so
		// the key's spill targets stay its warm candidates.
		toFront(cands[:k], hotPick(o.ivs[:k], cands[:k], hc.spread, skip, h))
	default:
		cands = set.Ring().Candidates(key, min(n, firstCandidates), buf[:0])
	}
	var why spill
	for j, ranked := 0, false; ; j++ {
		if j == len(cands) {
			if ranked || len(cands) >= n {
				break
			}
			// Every early candidate is full: the rest of the ring order
			// (rare).
			ranked = true
			for _, i := range set.Ring().Candidates(key, n, make([]int, 0, n)) {
				if !slices.Contains(cands[:j], i) {
					cands = append(cands, i)
				}
			}
			if j == len(cands) {
				break
			}
		}
		i := cands[j]
		if skip.has(i) {
			if j == 0 {
				why = spillTried
			}
			continue
		}
		iv := ev.instance(set, i)
		if iv == nil || h.skip(iv) {
			if j == 0 {
				why = spillHealth
			}
			continue
		}
		if done, ok := iv.state.TryAcquireBounded(limit, bound); ok {
			d := DecisionSpill
			if j == 0 {
				d = DecisionAffinity
			}
			return pick{iv: iv, idx: i, done: done, decision: d, spill: why}, true
		}
		if j == 0 {
			why = spillReason(iv.state, limit, bound)
		}
	}
	p, ok := r.pickLeast(ev, set, skip, h, DecisionFallback)
	p.spill = why
	return p, ok
}

// toFront moves cands[c] to the front, the others keeping their order.
func toFront(cands []int, c int) {
	if c > 0 {
		i := cands[c]
		copy(cands[1:c+1], cands[:c])
		cands[0] = i
	}
}

// spreadScore ranks instance i of a set for a request with spread hash
// spread: among a hot key's candidates, the request prefers the highest
// score. It is rendezvous hashing over the k candidates, so replicas that
// disagree on k (one more instance) disagree only on the requests the extra
// instance wins, 1 / k of them, and a change of k moves only those (with
// spread mod k, nearly every request changed instance). The constant is
// 2^64 / φ, so consecutive indexes get unrelated seeds.
func spreadScore(spread uint64, i int) uint64 {
	return ring.Score(spread, uint64(i+1)*0x9e3779b97f4a7c15)
}

// hotPick returns the position in cands (a hot key's first k ring
// candidates, whose views are ivs) of the least loaded one that can be
// tried (power of k choices), equal loads going to the highest
// spreadScore: on an idle fleet a hot key's requests spread evenly over
// its k instances and every replica breaks the tie alike. 0 if none can be
// tried.
func hotPick(ivs []*instanceView, cands []int, spread uint64, skip bitset, h *healthFilter) int {
	best, bestLoad, bestScore := -1, int64(0), uint64(0)
	for c, i := range cands {
		if skip.has(i) {
			continue
		}
		iv := ivs[c]
		if iv == nil || iv.state.Ejected() || h.skip(iv) {
			continue
		}
		l := iv.state.Load()
		if best >= 0 && l > bestLoad {
			continue
		}
		if sc := spreadScore(spread, i); best < 0 || l < bestLoad || sc > bestScore {
			best, bestLoad, bestScore = c, l, sc
		}
	}
	return max(best, 0)
}

// spreadChoice is hotPick on an idle fleet: the position in cands of the
// highest spreadScore.
func spreadChoice(cands []int, spread uint64) int {
	best, bestScore := 0, uint64(0)
	for c, i := range cands {
		if sc := spreadScore(spread, i); c == 0 || sc > bestScore {
			best, bestScore = c, sc
		}
	}
	return best
}

// pickLeast admits the instance with the lowest load among those whose
// breaker is not open and that are not marked down (both ignored while the
// endpoint panics), ties broken at random.
func (r *Router) pickLeast(ev *endpointView, set *lora.Set, skip bitset, h *healthFilter, decision string) (pick, bool) {
	n := set.Len()
	for {
		best, ties := -1, 0
		var bestLoad int64
		var bestIV *instanceView
		for i := 0; i < n; i++ {
			if skip.has(i) {
				continue
			}
			iv := ev.instance(set, i)
			if iv == nil || iv.state.Ejected() || h.skip(iv) {
				continue
			}
			l := iv.state.Load()
			switch {
			case best < 0 || l < bestLoad:
				best, bestLoad, bestIV, ties = i, l, iv, 1
			case l == bestLoad:
				// Reservoir sampling: each tied instance ends up chosen
				// with probability 1/ties.
				ties++
				if r.rand(ties) == 0 {
					best, bestIV = i, iv
				}
			}
		}
		if best < 0 {
			return pick{}, false
		}
		if done, ok := bestIV.state.Acquire(); ok {
			return pick{iv: bestIV, idx: best, done: done, decision: decision}, true
		}
		skip.set(best) // half-open breaker already probing: try the next
	}
}

// pickRandom admits a uniformly random instance; if it is marked down or its
// breaker refuses, the next ones in set order.
func (r *Router) pickRandom(ev *endpointView, set *lora.Set, skip bitset, h *healthFilter) (pick, bool) {
	n := set.Len()
	if n == 0 {
		return pick{}, false
	}
	start := r.rand(n)
	for j := 0; j < n; j++ {
		i := (start + j) % n
		if skip.has(i) {
			continue
		}
		iv := ev.instance(set, i)
		if iv == nil || h.skip(iv) {
			continue
		}
		if done, ok := iv.state.Acquire(); ok {
			return pick{iv: iv, idx: i, done: done, decision: DecisionRandom}, true
		}
	}
	return pick{}, false
}
