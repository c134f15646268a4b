package ring

import (
	"math"
	"slices"
	"strconv"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// The ring before issue 22 (rendezvous at every size) against the ring as
// built now (rendezvous up to RendezvousLimit seeds, multi-probe beyond), at
// the fleet sizes of issue 22: docs/ring.md, "Large sets".
var scaleAlgorithms = []struct {
	name string
	opts []Option
}{
	{"rendezvous", []Option{withLimit(math.MaxInt)}},
	{"ring", nil},
}

var scaleSizes = []int{64, 1024, 16384}

// pickSizes add RendezvousLimit, the dearest rendezvous lookup left, and
// twice it, the cheapest multi-probe one.
var pickSizes = []int{64, RendezvousLimit, 2 * RendezvousLimit, 1024, 16384}

// scaleMembers are n uuid-like ids sorted by id, as lora passes them (a
// snapshot lists its instances sorted).
func scaleMembers(n int) []Member { return mustNew(equalMembers(uuidIDs(n))).Members() }

// BenchmarkScalePick also reports the process's CPU time per op
// (cpu-ns/op): on the shared 2-core machine the wall time per op grows with
// the other processes' load, the CPU time much less.
func BenchmarkScalePick(b *testing.B) {
	keys := testKeys()
	for _, n := range pickSizes {
		ms := scaleMembers(n)
		for _, alg := range scaleAlgorithms {
			r := mustNew(ms, alg.opts...)
			for _, c := range []int{1, 4, 16} {
				b.Run(alg.name+"/N="+strconv.Itoa(n)+"/candidates="+strconv.Itoa(c), func(b *testing.B) {
					b.ReportAllocs()
					buf := make([]int, 0, c)
					i := 0
					cpu := processCPU()
					for b.Loop() {
						buf = r.Candidates(keys[i%len(keys)], c, buf[:0])
						i++
					}
					b.ReportMetric(float64(processCPU()-cpu)/float64(i), "cpu-ns/op")
					sink += len(buf)
				})
			}
		}
	}
}

// BenchmarkScaleNew is the build per snapshot change: lora builds a set's
// ring from scratch on the first request after every change.
func BenchmarkScaleNew(b *testing.B) {
	for _, n := range scaleSizes {
		ms := scaleMembers(n)
		for _, alg := range scaleAlgorithms {
			b.Run(alg.name+"/N="+strconv.Itoa(n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					sink += mustNew(ms, alg.opts...).Len()
				}
			})
		}
	}
}

// BenchmarkScaleMovement reports, over scaleJoins joins of a new member and
// scaleJoins leaves of an existing one, the keys moved as a multiple of the
// ideal 1/(N+1) (join) or 1/N (leave): the mean and the largest, the keys
// moved between members that stayed (collateral), and the balance of the
// N-member ring (largest and smallest share over the mean). Run it with
// -benchtime=1x; its ns/op means nothing. The key set holds 250 keys per
// member, so a join moves about 250 keys and the mean over 8 joins has a
// sampling error near 2 %; rendezvous at 16,384 members (20 µs a lookup)
// gets 60 keys per member and 2 joins (about 6 % per join).
func BenchmarkScaleMovement(b *testing.B) {
	for _, n := range scaleSizes {
		all := equalMembers(uuidIDs(n + scaleJoins))
		for _, alg := range scaleAlgorithms {
			joins, perMember := scaleJoins, 250
			if alg.name == "rendezvous" && n > 4096 {
				joins, perMember = 2, 60
			}
			b.Run(alg.name+"/N="+strconv.Itoa(n), func(b *testing.B) {
				for b.Loop() {
				}
				keys := scaleKeys(perMember * (n + 1))
				base := mustNew(all[:n], alg.opts...)
				before := owners(base, keys)
				var joinSum, joinMax, leaveSum, leaveMax float64
				collateral := 0
				for j := range joins {
					added := all[n+j].ID
					after := owners(mustNew(append(all[:n:n], all[n+j]), alg.opts...), keys)
					moved, coll := diff(before, after, added, "")
					f := float64(moved) / (float64(len(keys)) / float64(n+1))
					joinSum, joinMax, collateral = joinSum+f, max(joinMax, f), collateral+coll

					// Leave: members spread over the id order.
					gone := all[(j*n)/joins+1].ID
					var rest []Member
					for _, m := range all[:n] {
						if m.ID != gone {
							rest = append(rest, m)
						}
					}
					after = owners(mustNew(rest, alg.opts...), keys)
					moved, coll = diff(before, after, "", gone)
					f = float64(moved) / (float64(len(keys)) / float64(n))
					leaveSum, leaveMax, collateral = leaveSum+f, max(leaveMax, f), collateral+coll
				}
				counts := map[string]int{}
				for _, id := range before {
					counts[id]++
				}
				mx, mn := 0, len(keys)
				for _, m := range all[:n] {
					mx, mn = max(mx, counts[m.ID]), min(mn, counts[m.ID])
				}
				mean := float64(len(keys)) / float64(n)
				b.ReportMetric(joinSum/float64(joins), "join-moved/ideal")
				b.ReportMetric(joinMax, "join-max/ideal")
				b.ReportMetric(leaveSum/float64(joins), "leave-moved/ideal")
				b.ReportMetric(leaveMax, "leave-max/ideal")
				b.ReportMetric(float64(collateral), "collateral")
				b.ReportMetric(float64(mx)/mean, "max/mean")
				b.ReportMetric(float64(mn)/mean, "min/mean")
				b.ReportMetric(float64(len(keys)), "keys")
				b.ReportMetric(float64(joins), "joins")
			})
		}
	}
}

// scaleJoins is how many joins (and leaves) BenchmarkScaleMovement averages.
const scaleJoins = 8

// scaleKeys returns n keys: xxhash of "key-<i>".
func scaleKeys(n int) []uint64 {
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = xxhash.Sum64String("key-" + strconv.Itoa(i))
	}
	return keys
}

// owners is the owner id of every key.
func owners(r *Ring, keys []uint64) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = r.members[r.Primary(k)].ID
	}
	return out
}

// diff counts the keys whose owner changed and, of those, the ones that
// moved neither to added nor away from removed.
func diff(before, after []string, added, removed string) (moved, collateral int) {
	for i := range before {
		if before[i] != after[i] {
			moved++
			if after[i] != added && before[i] != removed {
				collateral++
			}
		}
	}
	return moved, collateral
}

// BenchmarkScaleBalance reports how the keys' shares spread over the members
// of a multi-probe ring: 4,096 keys per member, so that the sampling error
// (1/√4096 = 1.6 %) can be taken out of the measured standard deviation.
// Metrics: spread (the standard deviation of a share over the mean, less
// the sampling), the largest and smallest share and the 1st percentile over
// the mean. Run it with -benchtime=1x.
func BenchmarkScaleBalance(b *testing.B) {
	for _, n := range []int{600, 1024, 4096} {
		b.Run("N="+strconv.Itoa(n), func(b *testing.B) {
			for b.Loop() {
			}
			r := mustNew(equalMembers(uuidIDs(n)), withLimit(0))
			keys := scaleKeys(4096 * n)
			counts := make([]int, n)
			for _, k := range keys {
				counts[r.Primary(k)]++
			}
			slices.Sort(counts)
			mean := float64(len(keys)) / float64(n)
			var ss float64
			for _, c := range counts {
				ss += (float64(c) - mean) * (float64(c) - mean)
			}
			sd := math.Sqrt(ss/float64(n)) / mean
			sampling := 1 / math.Sqrt(mean)
			b.ReportMetric(math.Sqrt(max(0, sd*sd-sampling*sampling)), "spread")
			b.ReportMetric(float64(counts[n-1])/mean, "max/mean")
			b.ReportMetric(float64(counts[0])/mean, "min/mean")
			b.ReportMetric(float64(counts[n/100])/mean, "p1/mean")
		})
	}
}
