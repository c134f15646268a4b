package membership

import (
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

// TestVanishGuard: when more than half of an endpoint's instances vanish
// within one TTL (agents lost etcd), the watcher keeps them in the snapshot
// for the grace period and says so in a metric; afterwards they go. Losses
// spread over more than a TTL, and draining instances, are not held. The
// clock is fake: the test moves it past the grace instead of waiting.
func TestVanishGuard(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	ctx := testsupport.Context(t, 20*time.Second)
	m := NewMetrics(nil)
	clock := testsupport.NewFakeClock()
	const ttl, grace = 2 * time.Second, 10 * time.Second
	w := startWatcherWith(t, cli, WatcherOptions{Options: Options{Logger: quiet, Metrics: m, TTL: ttl}, ProgressInterval: 50 * time.Millisecond, Clock: clock, VanishGrace: grace}, nil)
	l := Layout{}
	put := func(ep, id string, draining bool) {
		t.Helper()
		if _, err := cli.Put(ctx, l.InstanceKey(ep, id), fmt.Sprintf(`{"id":%q,"addr":"http://127.0.0.1:9","draining":%v}`, id, draining)); err != nil {
			t.Fatal(err)
		}
	}
	del := func(ep, id string) {
		t.Helper()
		if _, err := cli.Delete(ctx, l.InstanceKey(ep, id)); err != nil {
			t.Fatal(err)
		}
	}
	count := func(ep string) int {
		if s := w.Snapshot().Endpoint(ep); s != nil {
			return len(s.Instances)
		}
		return 0
	}
	heldGauge := func(ep string) float64 {
		var d dto.Metric
		if err := m.held.WithLabelValues(ep).Write(&d); err != nil {
			t.Fatal(err)
		}
		return d.GetGauge().GetValue()
	}
	for i := range 4 {
		put("mass", fmt.Sprintf("i-%d", i), false)
		put("spread", fmt.Sprintf("i-%d", i), false)
	}
	put("drain", "d-0", true)
	put("drain", "d-1", true)
	put("drain", "d-2", false)
	testsupport.Eventually(t, 5*time.Second, "fleet visible", func() bool { return count("mass") == 4 && count("spread") == 4 && count("drain") == 3 })

	// Three of four vanish at once: held, and the metric says so.
	for i := range 3 {
		del("mass", fmt.Sprintf("i-%d", i))
	}
	// The watcher sets the gauge before it publishes the snapshot: wait
	// for both (reading the gauge first, the old snapshot with 2 showed
	// under load).
	testsupport.Eventually(t, 5*time.Second, "guard holding three, all four in the snapshot", func() bool { return heldGauge("mass") == 3 && count("mass") == 4 })
	// Draining instances left on purpose: gone at once.
	del("drain", "d-0")
	del("drain", "d-1")
	testsupport.Eventually(t, 5*time.Second, "draining instances gone", func() bool { return count("drain") == 1 })
	// One loss per TTL is ordinary churn: never held.
	for i := range 3 {
		del("spread", fmt.Sprintf("i-%d", i))
		testsupport.Eventually(t, 5*time.Second, "spread loss applied", func() bool { return count("spread") == 3-i })
		clock.Advance(ttl + time.Second)
	}
	if heldGauge("spread") != 0 {
		t.Fatal("losses spread over TTLs were held")
	}
	// Past the grace the held instances go (the progress tick prunes).
	clock.Advance(grace)
	testsupport.Eventually(t, 5*time.Second, "held instances released after the grace", func() bool {
		clock.Advance(100 * time.Millisecond)
		return count("mass") == 1 && heldGauge("mass") == 0
	})
}
