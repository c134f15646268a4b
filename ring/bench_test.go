package ring

import (
	"strconv"
	"testing"
)

// algorithms are the measured candidates (docs/ring.md). "rendezvous" is Ring.
var algorithms = []struct {
	name  string
	build func([]Member) picker
}{
	{"rendezvous", func(ms []Member) picker { return mustNew(ms) }},
	{"ketama-160", func(ms []Member) picker { return newKetama(ms, 160) }},
	{"ketama-1024", func(ms []Member) picker { return newKetama(ms, 1024) }},
}

var sizes = []int{7, 64, 256}

// weightedMembers gives every fourth member weight 2, a fleet mixing two
// instance sizes.
func weightedMembers(n int) []Member {
	ms := equalMembers(vllmIDs(n))
	for i := range ms {
		if i%4 == 0 {
			ms[i].Weight = 2
		}
	}
	return ms
}

var sink int

func BenchmarkPrimary(b *testing.B) {
	keys := testKeys()
	for _, alg := range algorithms {
		for _, n := range sizes {
			for _, w := range []struct {
				name string
				ms   []Member
			}{{"equal", equalMembers(vllmIDs(n))}, {"weighted", weightedMembers(n)}} {
				p := alg.build(w.ms)
				b.Run(alg.name+"/N="+strconv.Itoa(n)+"/"+w.name, func(b *testing.B) {
					b.ReportAllocs()
					i := 0
					for b.Loop() {
						sink += p.Primary(keys[i%len(keys)])
						i++
					}
				})
			}
		}
	}
}

func BenchmarkCandidates3(b *testing.B) {
	keys := testKeys()
	for _, alg := range algorithms {
		for _, n := range sizes {
			p := alg.build(equalMembers(vllmIDs(n)))
			b.Run(alg.name+"/N="+strconv.Itoa(n), func(b *testing.B) {
				b.ReportAllocs()
				buf := make([]int, 0, 3)
				i := 0
				for b.Loop() {
					buf = p.Candidates(keys[i%len(keys)], 3, buf[:0])
					i++
				}
				sink += len(buf)
			})
		}
	}
}

func BenchmarkNew(b *testing.B) {
	for _, alg := range algorithms {
		for _, n := range []int{64, 256} {
			ms := equalMembers(uuidIDs(n))
			b.Run(alg.name+"/N="+strconv.Itoa(n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					sink += alg.build(ms).Len()
				}
			})
		}
	}
}

// BenchmarkQuality reports the distribution figures of each algorithm as
// custom metrics over the fixed key set; its ns/op means nothing. Run it with
// -benchtime=1x. Metrics:
//   - max/mean: largest member's share over the mean (equal weights)
//   - add-moved/ideal: keys moved by adding one member over 1/(N+1)
//   - add-collateral, rm-collateral: keys moved that did not have to
//   - rm-order-bad: keys whose first 3 candidates changed beyond the deletion
//   - w2/w1: share of a weight-2 member over the mean weight-1 share
func BenchmarkQuality(b *testing.B) {
	keys := testKeys()
	for _, alg := range algorithms {
		for _, n := range sizes {
			for _, idset := range []struct {
				name string
				ids  []string
			}{{"vllm", vllmIDs(n + 1)}, {"uuid", uuidIDs(n + 1)}} {
				b.Run(alg.name+"/N="+strconv.Itoa(n)+"/"+idset.name, func(b *testing.B) {
					for b.Loop() {
					}
					ids := idset.ids
					small := alg.build(equalMembers(ids[:n]))
					big := alg.build(equalMembers(ids))
					removed := ids[n/2]
					less := alg.build(equalMembers(without(ids[:n], removed)))
					moved, addColl := movement(small, big, keys, ids[n], "")
					_, rmColl := movement(small, less, keys, "", removed)
					ms := equalMembers(ids[:n])
					ms[0].Weight = 2
					sh := shares(alg.build(ms), keys)
					w1 := float64(len(keys)-sh[ms[0].ID]) / float64(n-1)

					b.ReportMetric(maxOverMean(small, keys), "max/mean")
					b.ReportMetric(float64(moved)/(float64(len(keys))/float64(n+1)), "add-moved/ideal")
					b.ReportMetric(float64(addColl), "add-collateral")
					b.ReportMetric(float64(rmColl), "rm-collateral")
					b.ReportMetric(float64(orderViolations(small, less, keys[:20_000], removed, 3)), "rm-order-bad")
					b.ReportMetric(float64(sh[ms[0].ID])/w1, "w2/w1")
				})
			}
		}
	}
}
