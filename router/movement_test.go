package router

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

// keysMoved returns the count and sum of the endpoint's keys-moved histogram.
func keysMoved(t *testing.T, reg *prometheus.Registry, endpoint string) (uint64, float64) {
	t.Helper()
	for _, m := range testsupport.Series(t, reg, "prefixrouter_keys_moved_ratio", map[string]string{"endpoint": endpoint}) {
		return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
	}
	return 0, 0
}

func instances(n int) []fleet.Instance {
	out := make([]fleet.Instance, n)
	for i := range out {
		out[i] = fleet.Instance{ID: fmt.Sprintf("vllm-%d", i), Addr: fmt.Sprintf("http://10.0.0.%d:8000", i+1)}
	}
	return out
}

// TestKeysMovedPerMembershipChange: one instance joining N moves about
// 1/(N+1) of the keys, one leaving or draining out of N+1 moves its share
// back, and a snapshot that changes no member records nothing.
func TestKeysMovedPerMembershipChange(t *testing.T) {
	// The estimate is a proportion over keySample keys (σ ≤ 0.6 points at
	// these sizes) of a ring whose shares are the ideal multinomial ones
	// (docs/ring.md); 3 points is more than 5σ.
	const tol = 0.03
	for _, n := range []int{3, 7, 16} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			r, err := New(Options{DefaultEndpoint: "ep", Registry: reg})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			update := func(insts []fleet.Instance, cfg fleet.RoutingConfig) {
				r.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Config: cfg, Instances: insts}}, 0, 1, time.Now()))
			}
			last := func(wantCount uint64) float64 {
				t.Helper()
				count, sum := keysMoved(t, reg, "ep")
				if count != wantCount {
					t.Fatalf("%d observations, want %d", count, wantCount)
				}
				return sum
			}
			want := 1 / float64(n+1)

			update(instances(n), fleet.RoutingConfig{})
			last(0) // the first snapshot moves nothing

			update(instances(n+1), fleet.RoutingConfig{})
			joined := last(1)
			if math.Abs(joined-want) > tol {
				t.Errorf("join %d→%d moved %.4f of the keys, want %.4f±%.2f", n, n+1, joined, want, tol)
			}

			cfg := fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: 100, ConcurrencyThreshold: 3}}
			update(instances(n+1), cfg)
			if got := last(1) - joined; got != 0 {
				t.Errorf("a config change moved %.4f", got)
			}

			// Draining the instance that joined moves back exactly the keys
			// it took: the same sample, the same ring as before the join.
			insts := instances(n + 1)
			insts[n].Draining = true
			update(insts, cfg)
			if drained := last(2) - joined; math.Abs(drained-joined) > 1e-12 {
				t.Errorf("draining the joiner moved %.4f, the join moved %.4f", drained, joined)
			}

			// Another instance leaves: its share of N moves.
			update(instances(n + 1)[1:n], cfg)
			left := last(3) - 2*joined
			t.Logf("join %d→%d moved %.4f (ideal %.4f); leave %d→%d moved %.4f (ideal %.4f)", n, n+1, joined, want, n, n-1, left, 1/float64(n))
			if w := 1 / float64(n); math.Abs(left-w) > tol {
				t.Errorf("leave %d→%d moved %.4f, want %.4f±%.2f", n, n-1, left, w, tol)
			}
		})
	}
}

// TestKeysMovedSkipsEmptySides: an endpoint that loses every instance and
// gets them back reports nothing (every key loses or finds an owner; that is
// not movement between instances), and endpoints are measured separately.
func TestKeysMovedSkipsEmptySides(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, err := New(Options{DefaultEndpoint: "a", Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	snap := func(a, b []fleet.Instance) {
		r.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: "a", Instances: a}, {Name: "b", Instances: b}}, 0, 1, time.Now()))
	}
	snap(instances(4), instances(4))
	snap(nil, instances(5))
	snap(instances(4), instances(5))
	if c, _ := keysMoved(t, reg, "a"); c != 0 {
		t.Errorf("endpoint a: %d observations across an empty snapshot, want 0", c)
	}
	if c, _ := keysMoved(t, reg, "b"); c != 1 {
		t.Errorf("endpoint b: %d observations, want 1", c)
	}
}

// TestSampleKeysSpread: the sample covers the key space evenly (so the
// moved fraction estimates the share of all keys): each of 16 equal ranges
// of the 64-bit space holds 256±4σ of the 4096 keys.
func TestSampleKeysSpread(t *testing.T) {
	var buckets [16]int
	seen := map[uint64]bool{}
	for i := range keySample {
		k := sampleKey(i)
		seen[k] = true
		buckets[k>>60]++
	}
	if len(seen) != keySample {
		t.Fatalf("%d distinct sample keys, want %d", len(seen), keySample)
	}
	sigma := math.Sqrt(keySample * (1.0 / 16) * (15.0 / 16))
	for i, c := range buckets {
		if math.Abs(float64(c)-keySample/16) > 4*sigma {
			t.Errorf("range %d holds %d keys, want %d±%.0f", i, c, keySample/16, 4*sigma)
		}
	}
}
