package bench

import (
	"container/list"
	"fmt"
	"math/rand/v2"

	"github.com/prefixrouter/prefixrouter/internal/sim"
)

// lruCache is one instance's prefix cache in the baseline model: full
// blocks of sim.BlockHashes in least-recently-used order, capacity in
// blocks. Not safe for concurrent use.
type lruCache struct {
	cap   int
	order *list.List // front: most recent; values are block hashes
	at    map[uint64]*list.Element
}

func newLRUCache(tokens int) *lruCache {
	return &lruCache{cap: max(tokens/sim.BlockTokens, 1), order: list.New(), at: map[uint64]*list.Element{}}
}

// observe returns the leading blocks of hs already cached, then caches
// (and touches) all of them, evicting the least recently used.
func (c *lruCache) observe(hs []uint64) (hit int) {
	for hit < len(hs) {
		if _, ok := c.at[hs[hit]]; !ok {
			break
		}
		hit++
	}
	for _, h := range hs {
		if e, ok := c.at[h]; ok {
			c.order.MoveToFront(e)
			continue
		}
		c.at[h] = c.order.PushFront(h)
		if c.order.Len() > c.cap {
			old := c.order.Back()
			c.order.Remove(old)
			delete(c.at, old.Value.(uint64))
		}
	}
	return hit
}

// BaselineRun is the regime's baseline without sending anything: RANDOM
// routing of p's stream over instances LRU prefix caches of kvTokens each
// (block-level, like the simulator's, but with no running request pinning
// blocks, so a slight overestimate under load). It returns the token hit
// rate of the measured requests. The seed-regime preset is sized with it
// (docs/workloads.md): the regime is chosen from the baseline, never from
// the PREFIX_AWARE result.
func BaselineRun(p Preset, seed int64, o StreamOptions, instances, kvTokens, warmup, requests int) (float64, error) {
	if instances <= 0 || kvTokens <= 0 {
		return 0, fmt.Errorf("bench: baseline: instances %d and KV tokens %d must be > 0", instances, kvTokens)
	}
	s, err := p.NewStream(seed, o)
	if err != nil {
		return 0, err
	}
	caches := make([]*lruCache, instances)
	for i := range caches {
		caches[i] = newLRUCache(kvTokens)
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	var cached, prompt int64
	for i := 0; i < warmup+requests; i++ {
		r := s.Next()
		text := r.Prompt()
		hit := caches[rng.IntN(instances)].observe(sim.BlockHashes(r.Adapter, r.Tenant, text))
		if i >= warmup {
			cached += int64(hit * sim.BlockTokens)
			prompt += int64(sim.CountTokens(text))
		}
	}
	return ratio(cached, prompt), nil
}
