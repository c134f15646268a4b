package membership

import (
	"errors"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestAdapterCatalogue(t *testing.T) {
	cli, ctx, m, w := watched(t)
	l := Layout{}

	for _, bad := range []fleet.Adapter{
		{Name: "", Source: "s"},
		{Name: "a/b", Source: "s"},
		{Name: "a", Source: ""},
		{Name: "a", Source: "s", MinReplicas: 3, MaxReplicas: 2},
		{Name: "a", Source: "s", MinReplicas: -1},
		{Name: "a", Source: "s", MaxReplicas: fleet.MaxAdapterReplicas + 1},
	} {
		if err := PutAdapter(ctx, cli, l, "ep", bad); !errors.Is(err, fleet.ErrInvalid) {
			t.Errorf("PutAdapter(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
	if ads, err := ListAdapters(ctx, cli, l, "ep"); err != nil || len(ads) != 0 {
		t.Fatalf("nothing invalid may be written: %v %v", ads, err)
	}

	if err := PutAdapter(ctx, cli, l, "ep", fleet.Adapter{Name: "b", Source: "/models/b", MinReplicas: 2, MaxReplicas: 4}); err != nil {
		t.Fatal(err)
	}
	if err := PutAdapter(ctx, cli, l, "ep", fleet.Adapter{Name: "a", Source: "/models/a"}); err != nil {
		t.Fatal(err)
	}
	ok, err := SetPlacement(ctx, cli, l, "ep", "b", 0, Placement{Replicas: 3, ScaledAt: time.Unix(100, 0)})
	if err != nil || !ok {
		t.Fatalf("SetPlacement = %v %v", ok, err)
	}
	// A second writer deciding from the same (absent) state loses.
	if ok, err := SetPlacement(ctx, cli, l, "ep", "b", 0, Placement{Replicas: 4}); err != nil || ok {
		t.Fatalf("SetPlacement from a stale revision = %v %v, want false", ok, err)
	}
	ads, err := ListAdapters(ctx, cli, l, "ep")
	if err != nil || len(ads) != 2 || ads[0].Name != "a" || ads[1].Name != "b" || ads[1].Target() != 3 || ads[0].Target() != 1 || ads[0].Max() != fleet.DefaultMaxReplicas {
		t.Fatalf("ListAdapters = %+v %v", ads, err)
	}
	testsupport.Eventually(t, 2*time.Second, "catalogue in the snapshot", func() bool {
		ep := w.Snapshot().Endpoint("ep")
		if ep == nil || len(ep.Adapters) != 2 {
			return false
		}
		b, _ := ep.Adapter("b")
		return b.Source == "/models/b" && b.Target() == 3 && b.PlacementRevision == ads[1].PlacementRevision && b.PlacementRevision != 0
	})

	// An invalid record written behind our back is ignored and counted.
	before := testsupport.Value(t, m.invalid.WithLabelValues("adapter"))
	if _, err := cli.Put(ctx, l.AdapterKey("ep", "c"), `{"source":"x","minReplicas":5,"maxReplicas":1}`); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 2*time.Second, "invalid record counted", func() bool {
		return testsupport.Value(t, m.invalid.WithLabelValues("adapter")) == before+1
	})
	if _, ok := w.Snapshot().Endpoint("ep").Adapter("c"); ok {
		t.Fatal("invalid adapter in the snapshot")
	}

	if err := DeleteAdapter(ctx, cli, l, "ep", "b"); err != nil {
		t.Fatal(err)
	}
	if err := DeleteAdapter(ctx, cli, l, "ep", "b"); !errors.Is(err, ErrAdapterNotFound) {
		t.Fatalf("second delete = %v", err)
	}
	testsupport.Eventually(t, 2*time.Second, "removed from the snapshot", func() bool {
		_, ok := w.Snapshot().Endpoint("ep").Adapter("b")
		return !ok
	})
	if resp, err := cli.Get(ctx, l.PlacementKey("ep", "b")); err != nil || resp.Count != 0 {
		t.Fatalf("placement state left behind: %v %v", resp.Count, err)
	}
}

// TestPopularityMerged: two replicas publish their popular prefixes under
// their own leases; the watcher's snapshot carries them merged
// (rate-weighted shares, the larger k). An invalid record is ignored and
// counted; a replica whose lease is revoked takes its view with it.
func TestPopularityMerged(t *testing.T) {
	cli, ctx, m, w := watched(t)
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
		return testsupport.Value(t, m.invalid.WithLabelValues("popularity")) == 1
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
