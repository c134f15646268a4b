package sim

import (
	"fmt"
	"strings"
	"testing"
)

// doc returns text of n full blocks whose content depends on name.
func doc(name string, blocks int) string {
	var b strings.Builder
	for i := 0; b.Len() < blocks*BlockChars; i++ {
		fmt.Fprintf(&b, "%s-%d ", name, i)
	}
	return b.String()[:blocks*BlockChars]
}

// fill allocates and commits all blocks of hashes (after the hits) and
// returns the block ids.
func fill(t *testing.T, c *kvCache, hashes []uint64) []int32 {
	t.Helper()
	hit := c.lookup(hashes)
	ids, ok := c.allocate(hashes, hit, len(hashes))
	if !ok {
		t.Fatalf("allocate %d blocks (hit %d) with %d free: no room", len(hashes), hit, c.nfree)
	}
	for i := hit; i < len(hashes); i++ {
		c.commit(ids[i], hashes[i])
	}
	return ids
}

func TestKVCache(t *testing.T) {
	a := BlockHashes("", "", doc("a", 4))
	b := BlockHashes("", "", doc("b", 4))
	tests := []struct {
		name string
		cap  int
		run  func(t *testing.T, c *kvCache)
	}{
		{"longest leading prefix hits", 16, func(t *testing.T, c *kvCache) {
			c.release(fill(t, c, a))
			// Same first 2 blocks, then different text.
			q := BlockHashes("", "", doc("a", 4)[:2*BlockChars]+doc("z", 2))
			if got := c.lookup(q); got != 2 {
				t.Errorf("hit %d blocks, want 2", got)
			}
			if got := c.lookup(b); got != 0 {
				t.Errorf("unrelated prompt hit %d blocks", got)
			}
			// A change in the first block misses everything after it, as
			// the hashes chain.
			q = BlockHashes("", "", "X"+doc("a", 4)[1:])
			if got := c.lookup(q); got != 0 {
				t.Errorf("prompt differing in block 0 hit %d blocks", got)
			}
		}},
		{"deepest blocks of a request are evicted first", 8, func(t *testing.T, c *kvCache) {
			c.release(fill(t, c, a)) // queue: 4 5 6 7 a3 a2 a1 a0
			fill(t, c, BlockHashes("", "", doc("c", 6)))
			if got := c.lookup(a); got != 2 {
				t.Errorf("after evicting 2 of a's blocks, a hits %d, want its 2 head blocks", got)
			}
		}},
		{"least recently released request is evicted first", 8, func(t *testing.T, c *kvCache) {
			c.release(fill(t, c, a))
			c.release(fill(t, c, b)) // queue: a3 a2 a1 a0 b3 b2 b1 b0
			fill(t, c, BlockHashes("", "", doc("c", 4)))
			if got := c.lookup(a); got != 0 {
				t.Errorf("a hits %d blocks, want 0 (released first, evicted first)", got)
			}
			if got := c.lookup(b); got != 4 {
				t.Errorf("b hits %d blocks, want 4", got)
			}
		}},
		{"a hit refreshes the blocks", 8, func(t *testing.T, c *kvCache) {
			c.release(fill(t, c, a))
			c.release(fill(t, c, b))
			c.release(fill(t, c, a)) // a is reused: now the most recent
			fill(t, c, BlockHashes("", "", doc("c", 4)))
			if got := c.lookup(a); got != 4 {
				t.Errorf("a hits %d blocks, want 4", got)
			}
			if got := c.lookup(b); got != 0 {
				t.Errorf("b hits %d blocks, want 0", got)
			}
		}},
		{"pinned blocks are never evicted", 8, func(t *testing.T, c *kvCache) {
			held := fill(t, c, a)
			if _, ok := c.allocate(nil, 0, 5); ok {
				t.Fatal("allocated 5 blocks with 4 pinned of 8")
			}
			ids, ok := c.allocate(nil, 0, 4)
			if !ok {
				t.Fatal("no room for the 4 unpinned blocks")
			}
			if got := c.lookup(a); got != 4 {
				t.Errorf("pinned a hits %d blocks, want 4", got)
			}
			if u := c.usage(); u != 1 {
				t.Errorf("usage %v with every block pinned", u)
			}
			c.release(ids)
			c.release(held)
			if u := c.usage(); u != 0 {
				t.Errorf("usage %v after releasing everything", u)
			}
		}},
		{"hit blocks in the free queue are not counted as room", 8, func(t *testing.T, c *kvCache) {
			c.release(fill(t, c, a)) // 8 free, 4 of them a's
			// a's 4 blocks plus 5 fresh ones: 9 > 8.
			if _, ok := c.allocate(a, 4, 9); ok {
				t.Fatal("allocated 9 blocks from 8")
			}
			ids, ok := c.allocate(a, 4, 8)
			if !ok {
				t.Fatal("a's 4 blocks plus 4 fresh ones do not fit in 8")
			}
			if got := c.lookup(a); got != 4 {
				t.Errorf("a hits %d, want 4: its pinned blocks were evicted", got)
			}
			c.release(ids)
		}},
		{"salt and adapter separate caches", 32, func(t *testing.T, c *kvCache) {
			text := doc("a", 4)
			c.release(fill(t, c, BlockHashes("", "tenant-1", text)))
			for _, k := range [][2]string{{"", ""}, {"", "tenant-2"}, {"lora-1", "tenant-1"}, {"lora-1", ""}} {
				if got := c.lookup(BlockHashes(k[0], k[1], text)); got != 0 {
					t.Errorf("adapter %q salt %q hits %d blocks of salt tenant-1", k[0], k[1], got)
				}
			}
			if got := c.lookup(BlockHashes("", "tenant-1", text)); got != 4 {
				t.Errorf("same salt hits %d, want 4", got)
			}
		}},
		{"reset drops unpinned blocks only", 16, func(t *testing.T, c *kvCache) {
			c.release(fill(t, c, a))
			held := fill(t, c, b)
			if n := c.dropUnpinned(); n != 4 {
				t.Errorf("dropped %d blocks, want a's 4", n)
			}
			if got := c.lookup(a); got != 0 {
				t.Errorf("a hits %d blocks after the reset", got)
			}
			if got := c.lookup(b); got != 4 {
				t.Errorf("b, pinned, hits %d blocks after the reset, want 4", got)
			}
			if u := c.usage(); u != 4.0/16 {
				t.Errorf("usage %v, want b's 4 of 16 blocks", u)
			}
			c.release(held)
			if n := c.dropUnpinned(); n != 4 {
				t.Errorf("second reset dropped %d blocks, want b's 4", n)
			}
			if got := c.lookup(b); got != 0 || len(c.byHash) != 0 || c.nfree != 16 {
				t.Errorf("after both resets: b hits %d, %d hashes, %d free", got, len(c.byHash), c.nfree)
			}
			// The cache works as before.
			c.release(fill(t, c, a))
			if got := c.lookup(a); got != 4 {
				t.Errorf("a refilled hits %d, want 4", got)
			}
		}},
		{"duplicate computation keeps the first block", 16, func(t *testing.T, c *kvCache) {
			x, _ := c.allocate(a, 0, 4)
			y, _ := c.allocate(a, 0, 4)
			for i := range a {
				c.commit(x[i], a[i])
				c.commit(y[i], a[i])
			}
			c.release(y)
			c.release(x)
			// Queue: 8 never-used blocks, y (unregistered), x. Taking 12
			// evicts y entirely; x must still answer for a.
			fill(t, c, BlockHashes("", "", doc("c", 12)))
			if got := c.lookup(a); got != 4 {
				t.Errorf("a hits %d, want 4 (x keeps the hashes)", got)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, newKVCache(tt.cap)) })
	}
}
