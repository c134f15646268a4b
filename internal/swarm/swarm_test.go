package swarm

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/membership"
)

// A small swarm end to end, with an embedded etcd (counters from this
// process's registry) and with one the harness is pointed at (counters
// scraped from its /metrics): every event reaches every replica, every
// agreement check passes, and the figures are filled in.
func TestSwarmSmall(t *testing.T) {
	t.Run("embedded", func(t *testing.T) { swarmSmall(t, Options{Dir: t.TempDir(), FastTicks: true}) })
	t.Run("external", func(t *testing.T) {
		e, err := membership.StartEmbedded(t.TempDir(), "http://127.0.0.1:0", membership.WithFastTicks())
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		swarmSmall(t, Options{Etcd: e.ClientURL()})
	})
}

func swarmSmall(t *testing.T, o Options) {
	var progress strings.Builder
	o.Instances, o.Replicas, o.PerClient, o.TTL = 30, 3, 8, time.Second
	o.Joins, o.Leaves, o.Crashes, o.Rate, o.Quiet, o.Wait = 2, 2, 1, 20, time.Second, 5*time.Second
	o.Progress, o.Timeout = &progress, time.Minute
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	if rep.Missed != 0 || rep.Checks != 5 || rep.Agreed != 5 {
		t.Fatalf("missed %d, agreed %d of %d checks, want 0 and 5 of 5\n%s", rep.Missed, rep.Agreed, rep.Checks, progress.String())
	}
	for kind, n := range map[string]int{Join: 2, Leave: 2, Crash: 1} {
		if p := rep.Propagation(kind); p.Samples != 3*n || p.Max <= 0 {
			t.Errorf("%s: %d samples (max %v), want %d", kind, p.Samples, p.Max, 3*n)
		}
	}
	// Only the graceful leaves revoke their lease; the crash's expires.
	if revokes := math.Round(rep.Churn.Revokes * rep.ChurnTime.Seconds()); revokes != 2 {
		t.Errorf("%v leases revoked during the churn, want the 2 graceful leaves'", revokes)
	}
	if rep.Pick.Instances != 30+2-2-1 || rep.Pick.Candidates4 <= 0 {
		t.Errorf("pick measured on %d instances (%v), want 29", rep.Pick.Instances, rep.Pick.Candidates4)
	}
	if rep.FirstAgreed <= 0 || rep.Quiet.KeepAlives <= 0 || rep.Churn.Txns <= 0 || rep.BuildPerChange.Count == 0 {
		t.Errorf("figures missing: first agreed %v, keepalives/s %v, txns/s %v, builds %d", rep.FirstAgreed, rep.Quiet.KeepAlives, rep.Churn.Txns, rep.BuildPerChange.Count)
	}
	var out strings.Builder
	rep.Write(&out)
	if !strings.Contains(out.String(), "| join | 2 | 6 |") {
		t.Errorf("report:\n%s", out.String())
	}
}

func TestOptionsRefused(t *testing.T) {
	for _, o := range []Options{
		{Instances: -1},
		{Joins: 1, Crashes: 2},
		{Instances: 5, Leaves: 5},
		{TTL: 500 * time.Millisecond},
		{Joins: -1},
	} {
		if _, err := Run(context.Background(), o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}
