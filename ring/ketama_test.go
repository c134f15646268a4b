package ring

import (
	"sort"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// ketama is the measured alternative to Ring (see docs/ring.md): a classic
// consistent-hash circle with vnodes*weight points per member and a binary
// search per lookup. It lives in a test file because it lost the comparison;
// it is kept so the measurement can be rerun.
type ketama struct {
	members []Member
	points  []uint64 // sorted
	owner   []int32  // owner[i] is the member index of points[i]
}

func newKetama(members []Member, vnodes int) *ketama {
	base := mustNew(members) // reuse the sort, dedupe and weight normalization
	k := &ketama{members: base.members}
	type pt struct {
		h uint64
		o int32
	}
	var pts []pt
	for i, m := range k.members {
		for j := 0; j < vnodes*m.Weight; j++ {
			pts = append(pts, pt{xxhash.Sum64String(m.ID + "#" + strconv.Itoa(j)), int32(i)})
		}
	}
	// Ties on the point hash break by member index, so the circle is
	// independent of input order.
	sort.Slice(pts, func(a, b int) bool {
		if pts[a].h != pts[b].h {
			return pts[a].h < pts[b].h
		}
		return pts[a].o < pts[b].o
	})
	k.points = make([]uint64, len(pts))
	k.owner = make([]int32, len(pts))
	for i, p := range pts {
		k.points[i], k.owner[i] = p.h, p.o
	}
	return k
}

func (k *ketama) Len() int          { return len(k.members) }
func (k *ketama) Members() []Member { return k.members }

// search returns the first point >= key, wrapping to 0.
func (k *ketama) search(key uint64) int {
	lo, hi := 0, len(k.points)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if k.points[mid] < key {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == len(k.points) {
		return 0
	}
	return lo
}

func (k *ketama) Primary(key uint64) int {
	if len(k.points) == 0 {
		return -1
	}
	return int(k.owner[k.search(key)])
}

func (k *ketama) Candidates(key uint64, max int, dst []int) []int {
	if max > len(k.members) {
		max = len(k.members)
	}
	if max <= 0 {
		return dst
	}
	base := len(dst)
	start := k.search(key)
	for s := 0; s < len(k.points) && len(dst)-base < max; s++ {
		o := int(k.owner[(start+s)%len(k.points)])
		dup := false
		for _, d := range dst[base:] {
			if d == o {
				dup = true
				break
			}
		}
		if !dup {
			dst = append(dst, o)
		}
	}
	return dst
}
