package membership

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

// TestPopularityMerged: two replicas publish their popular prefixes under
// their own leases; the watcher's snapshot carries them merged
// (rate-weighted shares, the larger k). An invalid record is ignored and
// counted; a replica whose lease is revoked takes its view with it.
func TestPopularityMerged(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	ctx := testsupport.Context(t, 20*time.Second)
	m := NewMetrics(nil)
	w := startWatcher(t, cli, m, nil)
	l := Layout{}
	if _, err := cli.Put(ctx, l.InstanceKey("ep", "a"), `{"addr":"http://127.0.0.1:9"}`); err != nil {
		t.Fatal(err)
	}
	lease := func() clientv3.LeaseID {
		g, err := cli.Grant(ctx, 30)
		if err != nil {
			t.Fatal(err)
		}
		return g.ID
	}
	la, lb := lease(), lease()
	if err := PutPopularity(ctx, cli, l, "ep", "router-a", la, fleet.Popularity{Rate: 3, Keys: []fleet.PopularKey{{Key: 42, Share: 0.4, K: 3}}}); err != nil {
		t.Fatal(err)
	}
	if err := PutPopularity(ctx, cli, l, "ep", "router-b", lb, fleet.Popularity{Rate: 1, Keys: []fleet.PopularKey{{Key: 42, Share: 0.8, K: 5}, {Key: 7, Share: 0.2, K: 1}}}); err != nil {
		t.Fatal(err)
	}
	popular := func() []fleet.PopularKey {
		if ep := w.Snapshot().Endpoint("ep"); ep != nil {
			return ep.Popular
		}
		return nil
	}
	testsupport.Eventually(t, 5*time.Second, "both replicas' views merged", func() bool { return len(popular()) == 2 })
	got := popular()
	if got[0].Key != 7 || got[1].Key != 42 || got[1].K != 5 || got[1].Share < 0.499 || got[1].Share > 0.501 {
		t.Fatalf("merged %+v, want key 7 then key 42 with share 0.5 (3:1 weights) and k 5", got)
	}
	if _, err := cli.Put(ctx, l.PopularityKey("ep", "router-c"), `{"rate":1,"keys":[{"key":"1","share":7}]}`); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 5*time.Second, "invalid record counted", func() bool {
		return counterValue(t, m.invalid.WithLabelValues("popularity")) == 1
	})
	if len(popular()) != 2 {
		t.Fatalf("an invalid record changed the view: %+v", popular())
	}
	if _, err := cli.Revoke(ctx, lb); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 5*time.Second, "router-b's view gone with its lease", func() bool {
		p := popular()
		return len(p) == 1 && p[0].Key == 42 && p[0].Share == 0.4
	})
}
