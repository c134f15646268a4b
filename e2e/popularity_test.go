package e2e

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/replica"
)

// docBody is an invoke body: document d (8,000 bytes, longer than the
// ladder's first depth) then question q.
func docBody(d, q int) []byte {
	doc := strings.Repeat(fmt.Sprintf("document %03d says this. ", d), 8000/25)
	return fmt.Appendf(nil, `{"inputs":%q}`, doc+fmt.Sprintf(" question %d?", q))
}

// TestPopularityAgreement is issue 21's agreement line through etcd: two
// replicas, each publishing its popular prefixes every 200 ms under its own
// lease, fed one stream alternately (each sees half of it, as DNS would
// spread it): Zipf(1.5) over 200 documents of 8,000 bytes, the top one 40 %
// of the requests. Once both route on the merged view, each request one
// replica serves is explained by the other (its no-load choice from its own
// snapshot): they agree on ≥ 99.9 % of requests while the view keeps being
// republished, and the top document is spread over several instances (it
// is hot) while every request of a cold document goes to one.
func TestPopularityAgreement(t *testing.T) {
	if testing.Short() {
		t.Skip("3,000 requests through two replicas")
	}
	c := newCluster(t, 0, func(o *localfleet.Options) { o.Replica = replica.Options{PopularityInterval: 200 * time.Millisecond} })
	c.startReplicas(2)
	fleetOf(t, c, 7)
	rng := rand.New(rand.NewPCG(21, 21))
	cdf := make([]float64, 200)
	sum := 0.0
	for d := range cdf {
		sum += math.Pow(float64(d+1), -1.5)
		cdf[d] = sum
	}
	next := func() int {
		d, _ := slices.BinarySearch(cdf, rng.Float64()*sum)
		return min(d, len(cdf)-1)
	}
	send := func(i int) (d int, served, other string) {
		d = next()
		body := docBody(d, i)
		r, o := c.replicas[i%2], c.replicas[(i+1)%2]
		a := c.invoke(r, body, "")
		if !a.ok() {
			t.Fatalf("request %d: %v", i, a)
		}
		return d, a.instance, choose(t, o.Router(), body, "")
	}
	for i := range 1000 {
		send(i)
	}
	hot := func(r *replica.Replica) bool {
		for _, k := range r.Router().Snapshot().Endpoint(ep).Popular {
			if k.K > 1 {
				return true
			}
		}
		return false
	}
	testsupport.Eventually(t, 10*time.Second, "both replicas route on a view with a hot prefix", func() bool {
		return hot(c.replicas[0]) && hot(c.replicas[1])
	})
	const measured = 2000
	agree := 0
	top := map[string]bool{}
	cold := map[int]map[string]bool{}
	start := time.Now()
	for i := range measured {
		d, served, other := send(1000 + i)
		if served == other {
			agree++
		}
		if d == 0 {
			top[served] = true
		} else if d >= 50 {
			if cold[d] == nil {
				cold[d] = map[string]bool{}
			}
			cold[d][served] = true
		}
	}
	elapsed := time.Since(start)
	ratio := float64(agree) / measured
	spread := 0
	for _, on := range cold {
		if len(on) > 1 {
			spread++
		}
	}
	t.Logf("agreement %.2f %% of %d requests over %v (about %.0f publications); top document on %d instances; %d of %d cold documents on more than one",
		100*ratio, measured, elapsed.Round(time.Millisecond), elapsed.Seconds()/0.2, len(top), spread, len(cold))
	if ratio < 0.999 {
		t.Errorf("replicas agree on %.2f %% of requests, want ≥ 99.9 %%", 100*ratio)
	}
	if len(top) < 3 {
		t.Errorf("the top document (40 %%) went to %d instances: it is not spread", len(top))
	}
	if spread > 0 {
		t.Errorf("%d cold documents went to more than one instance", spread)
	}
}
