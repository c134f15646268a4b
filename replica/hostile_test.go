package replica

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/membership/etcdtest"
	"github.com/prefixrouter/prefixrouter/router"
)

// counterValue sums the samples of a counter family whose labels include
// every pair of match.
func counterValue(t *testing.T, reg *prometheus.Registry, name string, match map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for k, v := range match {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

// heapInUse is the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestWeightBombIgnored reproduces issue 12's crash: a record of weight 1e9
// (and one of 2^31, which overflows int32 offsets) beside normal instances.
// Both records must be ignored and counted, the others keep routing, and the
// replica's heap must not grow by the gigabytes the ring would have taken.
func TestWeightBombIgnored(t *testing.T) {
	e := etcdtest.Start(t)
	cli := etcdtest.Client(t, e)
	ctx := testsupport.Context(t, 30*time.Second)
	mopts := membership.Options{Logger: quiet}
	for _, in := range backends(t, 2) {
		reg, err := membership.RegisterInstance(ctx, cli, "chat", in, mopts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { reg.Close(context.Background()) })
	}
	rep, err := Start(ctx, Options{
		ID: "r-1", Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Router: router.Options{DefaultEndpoint: "chat"},
		Client: cli, Membership: mopts, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close(context.Background())
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	invoke := func() int {
		resp, err := hc.Post(rep.URL()+"/invocations", "application/json", strings.NewReader(`{"inputs":"hello"}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	testsupport.Eventually(t, 5*time.Second, "two instances routed", func() bool {
		s := rep.Router().Snapshot().Endpoint("chat")
		return s != nil && len(s.Instances) == 2
	})
	if code := invoke(); code != 200 {
		t.Fatalf("before: status %d", code)
	}
	before := heapInUse()
	l := membership.Layout{}
	for id, w := range map[string]string{"bomb-1e9": "1000000000", "bomb-2p31": "2147483648"} {
		if _, err := cli.Put(ctx, l.InstanceKey("chat", id), `{"id":"`+id+`","addr":"http://127.0.0.1:9","weight":`+w+`}`); err != nil {
			t.Fatal(err)
		}
	}
	testsupport.Eventually(t, 5*time.Second, "both records counted as invalid", func() bool {
		return counterValue(t, rep.Registry(), "prefixrouter_membership_invalid_records_total", map[string]string{"kind": "instance"}) == 2
	})
	for range 50 {
		if code := invoke(); code != 200 {
			t.Fatalf("after the bombs: status %d", code)
		}
	}
	if n := len(rep.Router().Snapshot().Endpoint("chat").Instances); n != 2 {
		t.Fatalf("instances = %d, want the two valid ones", n)
	}
	after := heapInUse()
	if after > before && after-before > 10<<20 {
		t.Fatalf("heap grew by %d bytes, want < 10 MiB", after-before)
	}
	t.Logf("heap before %d, after %d bytes", before, after)
}
