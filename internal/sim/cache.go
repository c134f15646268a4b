package sim

// kvCache is a paged KV cache of fixed-size blocks with vLLM's automatic
// prefix caching (vllm/v1/core/block_pool.py, kv_cache_manager.py):
//
//   - a block whose BlockTokens prompt tokens have been computed is
//     registered under its chained hash; a later request reuses the longest
//     run of its leading blocks that are registered;
//   - a block is pinned (ref > 0) while a running request holds it and is
//     never evicted then;
//   - blocks no request holds sit in the free queue, still registered;
//     allocation pops the head of the queue and evicts the block's hash
//     (LRU over unpinned blocks);
//   - a finished request frees its blocks in reverse order to the tail, so
//     its deepest blocks are evicted before its head blocks, which are the
//     ones other requests share.
//
// Blocks are addressed by index; the free queue is a doubly linked list
// over the indices. Not safe for concurrent use: the engine goroutine owns it.
type kvCache struct {
	blocks []kvBlock
	byHash map[uint64]int32
	// head is evicted first; -1 when the queue is empty.
	head, tail int32
	nfree      int
}

type kvBlock struct {
	hash       uint64
	hashed     bool
	ref        int32
	prev, next int32
	free       bool
}

func newKVCache(nblocks int) *kvCache {
	c := &kvCache{blocks: make([]kvBlock, nblocks), byHash: make(map[uint64]int32), head: -1, tail: -1}
	for i := range c.blocks {
		c.pushTail(int32(i))
	}
	return c
}

// usage is vLLM's kv_cache_usage_perc: the share of blocks not in the free
// queue (cached but unpinned blocks count as free, as in vLLM).
func (c *kvCache) usage() float64 {
	if len(c.blocks) == 0 {
		return 0
	}
	return 1 - float64(c.nfree)/float64(len(c.blocks))
}

// lookup returns how many leading hashes are registered.
func (c *kvCache) lookup(hashes []uint64) int {
	for i, h := range hashes {
		if _, ok := c.byHash[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// allocate pins the blocks of the first hit hashes (which lookup found)
// and takes total-hit fresh blocks from the head of the free queue. It
// allocates nothing and returns false when the free queue, without the hit
// blocks it holds, is too short.
func (c *kvCache) allocate(hashes []uint64, hit, total int) ([]int32, bool) {
	inQueue := 0
	for _, h := range hashes[:hit] {
		if c.blocks[c.byHash[h]].ref == 0 {
			inQueue++
		}
	}
	if c.nfree-inQueue < total-hit {
		return nil, false
	}
	out := make([]int32, 0, total)
	for _, h := range hashes[:hit] {
		i := c.byHash[h]
		b := &c.blocks[i]
		if b.ref == 0 {
			c.unlink(i)
		}
		b.ref++
		out = append(out, i)
	}
	for len(out) < total {
		i := c.head
		c.unlink(i)
		b := &c.blocks[i]
		if b.hashed {
			// Eviction: the block is reused for other content.
			if c.byHash[b.hash] == i {
				delete(c.byHash, b.hash)
			}
			b.hashed, b.hash = false, 0
		}
		b.ref = 1
		out = append(out, i)
	}
	return out, true
}

// commit registers block i, whose tokens are now computed, under hash h,
// unless another block already holds h (two requests computed the same
// prefix concurrently; vLLM keeps the first and leaves the duplicate
// unregistered).
func (c *kvCache) commit(i int32, h uint64) {
	if _, ok := c.byHash[h]; ok {
		return
	}
	b := &c.blocks[i]
	b.hash, b.hashed = h, true
	c.byHash[h] = i
}

// release unpins a request's blocks, deepest first, so the deepest block
// lands nearest the head of the free queue and is evicted first.
func (c *kvCache) release(ids []int32) {
	for k := len(ids) - 1; k >= 0; k-- {
		i := ids[k]
		b := &c.blocks[i]
		b.ref--
		if b.ref == 0 {
			c.pushTail(i)
		}
	}
}

// dropUnpinned unregisters every cached block no request holds, so no
// later request hits it, and returns how many it dropped. Pinned blocks
// keep their hashes: a running request still owns them and registers the
// rest of its prompt as it computes it. The free queue order is unchanged.
func (c *kvCache) dropUnpinned() int {
	n := 0
	for i := range c.blocks {
		b := &c.blocks[i]
		if b.ref > 0 || !b.hashed {
			continue
		}
		if c.byHash[b.hash] == int32(i) {
			delete(c.byHash, b.hash)
		}
		b.hashed, b.hash = false, 0
		n++
	}
	return n
}

func (c *kvCache) pushTail(i int32) {
	b := &c.blocks[i]
	b.prev, b.next, b.free = c.tail, -1, true
	if c.tail >= 0 {
		c.blocks[c.tail].next = i
	} else {
		c.head = i
	}
	c.tail = i
	c.nfree++
}

func (c *kvCache) unlink(i int32) {
	b := &c.blocks[i]
	if b.prev >= 0 {
		c.blocks[b.prev].next = b.next
	} else {
		c.head = b.next
	}
	if b.next >= 0 {
		c.blocks[b.next].prev = b.prev
	} else {
		c.tail = b.prev
	}
	b.prev, b.next, b.free = -1, -1, false
	c.nfree--
}
