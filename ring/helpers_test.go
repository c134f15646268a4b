package ring

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// picker is what both measured algorithms offer; the quality checks run
// against either.
type picker interface {
	Len() int
	Members() []Member
	Primary(key uint64) int
	Candidates(key uint64, max int, dst []int) []int
}

var (
	_ picker = (*Ring)(nil)
	_ picker = (*ketama)(nil)
)

// numKeys is the size of the fixed key set of every quality check.
const numKeys = 100_000

var (
	keysOnce sync.Once
	keys     []uint64
)

// testKeys returns the fixed key set: xxhash.Sum64String("key-<i>") for i in
// [0, numKeys).
func testKeys() []uint64 {
	keysOnce.Do(func() {
		keys = make([]uint64, numKeys)
		for i := range keys {
			keys[i] = xxhash.Sum64String("key-" + strconv.Itoa(i))
		}
	})
	return keys
}

// vllmIDs returns "vllm-0" .. "vllm-<n-1>", ids as a Kubernetes StatefulSet
// would name them.
func vllmIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "vllm-" + strconv.Itoa(i)
	}
	return ids
}

// uuidIDs returns n deterministic uuid-like ids (version 4 layout), as
// instances named by a cloud provider would look.
func uuidIDs(n int) []string {
	r := rand.New(rand.NewPCG(42, 7))
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%08x-%04x-4%03x-%04x-%012x",
			r.Uint32(), r.Uint32()&0xffff, r.Uint32()&0xfff, 0x8000|r.Uint32()&0x3fff, r.Uint64()&0xffffffffffff)
	}
	return ids
}

func equalMembers(ids []string) []Member {
	ms := make([]Member, len(ids))
	for i, id := range ids {
		ms[i] = Member{ID: id, Weight: 1}
	}
	return ms
}

// primaryIDs returns the id owning each key.
func primaryIDs(p picker, keys []uint64) []string {
	out := make([]string, len(keys))
	ms := p.Members()
	for i, k := range keys {
		out[i] = ms[p.Primary(k)].ID
	}
	return out
}

// shares counts the keys each member id owns.
func shares(p picker, keys []uint64) map[string]int {
	c := make(map[string]int, p.Len())
	for _, id := range primaryIDs(p, keys) {
		c[id]++
	}
	return c
}

// maxOverMean is the largest member's share over the mean share (equal weights).
func maxOverMean(p picker, keys []uint64) float64 {
	mx := 0
	for _, n := range shares(p, keys) {
		mx = max(mx, n)
	}
	return float64(mx) / (float64(len(keys)) / float64(p.Len()))
}

// movement compares owners before and after a change: moved is how many keys
// changed owner, collateral how many of those moved neither to added nor away
// from removed (the keys that did not have to move).
func movement(before, after picker, keys []uint64, added, removed string) (moved, collateral int) {
	a, b := primaryIDs(before, keys), primaryIDs(after, keys)
	for i := range keys {
		if a[i] == b[i] {
			continue
		}
		moved++
		if b[i] != added && a[i] != removed {
			collateral++
		}
	}
	return moved, collateral
}

// orderIDs returns key's first max candidates as ids.
func orderIDs(p picker, key uint64, max int, buf []int) []string {
	ms := p.Members()
	var out []string
	for _, i := range p.Candidates(key, max, buf[:0]) {
		out = append(out, ms[i].ID)
	}
	return out
}

// without returns ids minus id, in order.
func without(ids []string, id string) []string {
	out := make([]string, 0, len(ids))
	for _, x := range ids {
		if x != id {
			out = append(out, x)
		}
	}
	return out
}

// orderViolations counts keys whose first k candidates after removing (or,
// with before and after swapped, adding) a member are not the first k of the
// old order with that member deleted.
func orderViolations(big, small picker, keys []uint64, id string, k int) int {
	bad := 0
	buf := make([]int, 0, k+1)
	for _, key := range keys {
		want := without(orderIDs(big, key, k+1, buf), id)
		if len(want) > k {
			want = want[:k]
		}
		got := orderIDs(small, key, k, buf)
		if !slices.Equal(got, want) {
			bad++
		}
	}
	return bad
}

// mustNew is New for members the test knows to be valid.
func mustNew(members []Member, opts ...Option) *Ring {
	r, err := New(members, opts...)
	if err != nil {
		panic(err)
	}
	return r
}

// withLimit moves RendezvousLimit: 0 makes every ring multi-probe,
// math.MaxInt every ring rendezvous (the ring before issue 22).
func withLimit(n int) Option { return func(o *options) { o.limit = n } }
