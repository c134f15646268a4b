package router

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// TestReadiness checks the one readiness rule and what /readyz answers for
// it over real HTTP: ready iff a snapshot is loaded and has an instance that
// is not draining; the snapshot's age only adds the stale note.
func TestReadiness(t *testing.T) {
	up := fleet.Instance{ID: "a", Addr: "http://127.0.0.1:1"}
	down := fleet.Instance{ID: "b", Addr: "http://127.0.0.1:2", Draining: true}
	snap := func(rev int64, insts ...fleet.Instance) *fleet.Snapshot {
		return fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Instances: insts}}, rev, 2, time.Now())
	}
	for _, tc := range []struct {
		name       string
		static     bool
		staleAfter time.Duration
		age        time.Duration
		snap       *fleet.Snapshot
		drain      bool
		ready      bool
		body       string
	}{
		{name: "no snapshot", age: time.Second,
			body: "not ready: router: no fleet snapshot loaded\n"},
		{name: "fresh", age: 1500 * time.Millisecond, snap: snap(7, up, down), ready: true,
			body: "ok revision=7 instances=2 draining=1 replicas=2 snapshot_age=1.5s fresh\n"},
		{name: "stale stays ready", age: 31 * time.Second, snap: snap(7, up), ready: true,
			body: "ok revision=7 instances=1 replicas=2 snapshot_age=31s stale (etcd unreachable? routing on the last good snapshot)\n"},
		{name: "stale after a set bound", staleAfter: 2 * time.Second, age: 3 * time.Second, snap: snap(7, up), ready: true,
			body: "ok revision=7 instances=1 replicas=2 snapshot_age=3s stale (etcd unreachable? routing on the last good snapshot)\n"},
		{name: "all draining", age: time.Second, snap: snap(8, down),
			body: "not ready: router: the fleet has no instance that is not draining; revision=8 instances=1 draining=1 replicas=2 snapshot_age=1s fresh\n"},
		{name: "empty fleet", age: time.Second, snap: snap(9),
			body: "not ready: router: the fleet has no instance that is not draining; revision=9 instances=0 replicas=2 snapshot_age=1s fresh\n"},
		{name: "shutting down", age: time.Second, snap: snap(7, up), drain: true,
			body: "not ready: router: shutting down; revision=7 instances=1 replicas=2 snapshot_age=1s fresh\n"},
		{name: "static", static: true, snap: snap(0, up, down), ready: true,
			body: "ok static fleet instances=2 draining=1\n"},
		{name: "static all draining", static: true, snap: snap(0, down),
			body: "not ready: router: the fleet has no instance that is not draining; static fleet instances=1 draining=1\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{DefaultEndpoint: "ep", StaleAfter: tc.staleAfter}
			if !tc.static {
				o.SnapshotAge = func() time.Duration { return tc.age }
			}
			r, err := New(o)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if tc.snap != nil {
				r.Update(tc.snap)
			}
			if tc.drain {
				r.Drain()
				if !r.Readiness().ShuttingDown {
					t.Fatal("Readiness().ShuttingDown after Drain is false")
				}
			}
			if err := r.Ready(); (err == nil) != tc.ready {
				t.Fatalf("Ready() = %v, want ready %v", err, tc.ready)
			}
			if rd := r.Readiness(); rd.Static != tc.static || rd.Loaded != (tc.snap != nil) {
				t.Fatalf("Readiness() = %+v", rd)
			}
			srv := httptest.NewServer(r)
			defer srv.Close()
			resp, err := srv.Client().Get(srv.URL + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			want := http.StatusServiceUnavailable
			if tc.ready {
				want = http.StatusOK
			}
			if resp.StatusCode != want || string(b) != tc.body {
				t.Fatalf("/readyz = %d %q, want %d %q", resp.StatusCode, b, want, tc.body)
			}
		})
	}
}
