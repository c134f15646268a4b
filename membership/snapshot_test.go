package membership

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	dto "github.com/prometheus/client_model/go"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

// BenchmarkSnapshotRebuild is the watcher's work per membership change at
// fleet size N (one endpoint): apply one event (an instance record
// replaced) and build and publish the new snapshot. issue 22; figures in
// docs/operations.md.
func BenchmarkSnapshotRebuild(b *testing.B) {
	for _, n := range []int{100, 1000, 10_000} {
		b.Run("N="+strconv.Itoa(n), func(b *testing.B) {
			w := unstartedWatcher(nil)
			st := newState()
			recs := make([][]byte, n)
			for i := range n {
				id := "vllm-" + strconv.Itoa(i)
				recs[i] = instanceRecord(id, i)
				w.applyPut(st, st, w.layout.InstanceKey("ep", id), recs[i], int64(i+1))
			}
			w.emit(st)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				id := "vllm-" + strconv.Itoa(i%n)
				w.applyPut(st, st, w.layout.InstanceKey("ep", id), recs[i%n], int64(n+i+1))
				w.emit(st)
				i++
			}
		})
	}
}

// unstartedWatcher is a Watcher whose state a test drives by hand (applyPut,
// applyDelete, emit) without etcd.
func unstartedWatcher(m *Metrics) *Watcher {
	return &Watcher{layout: Layout{}, log: quiet, metrics: m, clock: clockwork.NewRealClock(), defCfg: fleet.DefaultRoutingConfig(),
		vanished: map[string]map[string]vanishedInstance{}, guardUntil: map[string]time.Time{}, synced: make(chan struct{})}
}

// instanceRecord is a realistic instance record: two adapters, a label.
func instanceRecord(id string, i int) []byte {
	return []byte(`{"id":"` + id + `","addr":"http://10.0.` + strconv.Itoa(i/250%250) + `.` + strconv.Itoa(i%250) +
		`:8000","adapters":["lora-a","lora-b"],"weight":1,"labels":{"zone":"a"},"draining":false,"registeredAt":"2026-01-01T00:00:00Z"}`)
}

// The snapshot of every change lists exactly the live records, sorted, after
// any mix of puts, replacements, invalid records and deletes applied in
// batches (one watch response), and a published snapshot never changes
// afterwards: the incremental merge shares records with the state.
func TestSnapshotMergesChanges(t *testing.T) {
	m := NewMetrics(nil)
	w := unstartedWatcher(m)
	st := newState()
	truth := map[string]int64{} // id → revision
	rng := rand.New(rand.NewPCG(7, 9))
	type published struct {
		s   *fleet.Snapshot
		ids []string
	}
	var history []published
	ids := func(s *fleet.Snapshot) []string {
		var out []string
		if ep := s.Endpoint("ep"); ep != nil {
			for _, in := range ep.Instances {
				out = append(out, in.ID+"@"+strconv.FormatInt(in.Revision, 10))
			}
		}
		return out
	}
	rev := int64(0)
	for round := range 300 {
		for range 1 + rng.IntN(5) {
			rev++
			id := "i-" + strconv.Itoa(rng.IntN(40))
			key := w.layout.InstanceKey("ep", id)
			switch op := rng.IntN(10); {
			case op < 5:
				w.applyPut(st, st, key, instanceRecord(id, int(rev)), rev)
				truth[id] = rev
			case op < 6:
				w.applyPut(st, st, key, []byte(`{"id":`), rev) // invalid: the record leaves
				delete(truth, id)
			default:
				applyDelete(st, w.layout, key)
				delete(truth, id)
			}
		}
		if round == 150 { // a relist: the next snapshot is built from scratch
			next := newState()
			for id, r := range truth {
				w.applyPut(next, st, w.layout.InstanceKey("ep", id), instanceRecord(id, int(r)), r)
			}
			st = next
		}
		w.emit(st)
		var want []string
		for id, r := range truth {
			want = append(want, id+"@"+strconv.FormatInt(r, 10))
		}
		slices.SortFunc(want, func(a, b string) int { return strings.Compare(strings.Split(a, "@")[0], strings.Split(b, "@")[0]) })
		s := w.Snapshot()
		if got := ids(s); !slices.Equal(got, want) {
			t.Fatalf("round %d: snapshot lists %v, want %v", round, got, want)
		}
		history = append(history, published{s, ids(s)})
	}
	for i, h := range history {
		if got := ids(h.s); !slices.Equal(got, h.ids) {
			t.Fatalf("snapshot %d changed after it was published: %v, was %v", i, got, h.ids)
		}
	}
	var d dto.Metric
	if err := m.build.Write(&d); err != nil || d.GetHistogram().GetSampleCount() != 300 {
		t.Fatalf("build histogram counted %d snapshots (err %v), want 300", d.GetHistogram().GetSampleCount(), err)
	}
}

// A list reads the prefix in pages at one revision: all ten records of a
// fleet listed three at a time, at the revision the watch then continues
// from (a put after the list arrives through the watch, not lost between
// the two).
func TestListPages(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	ctx := testsupport.Context(t, 20*time.Second)
	l := Layout{}
	for i := range 10 {
		id := "i-" + strconv.Itoa(i)
		if _, err := cli.Put(ctx, l.InstanceKey("ep", id), string(instanceRecord(id, i))); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := cli.Get(ctx, "x") // the store's revision after the ten puts
	if err != nil {
		t.Fatal(err)
	}
	w := startWatcherWith(t, cli, WatcherOptions{Options: Options{Logger: quiet}, page: 3}, nil)
	s := w.Snapshot()
	if n := len(s.Endpoint("ep").Instances); n != 10 || s.Revision != resp.Header.Revision {
		t.Fatalf("listed %d instances at revision %d, want 10 at %d", n, s.Revision, resp.Header.Revision)
	}
	if _, err := cli.Put(ctx, l.InstanceKey("ep", "late"), string(instanceRecord("late", 10))); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 5*time.Second, "the put after the list", has(w, "ep", "late"))
}

// Each retry waits between half and all of its step, and the steps double
// from min to max.
func TestRetryBackoffJitter(t *testing.T) {
	b := retryBackoff{min: 100 * time.Millisecond, max: 800 * time.Millisecond}
	for _, step := range []time.Duration{100, 200, 400, 800, 800} {
		step *= time.Millisecond
		if d := b.next(); d < step/2 || d > step {
			t.Fatalf("wait %v outside [%v, %v]", d, step/2, step)
		}
	}
	seen := map[time.Duration]bool{}
	for range 20 {
		seen[b.next()] = true
	}
	if len(seen) < 10 {
		t.Fatalf("20 waits at the same step took %d values: no jitter", len(seen))
	}
	b.reset()
	if d := b.next(); d > 100*time.Millisecond {
		t.Fatalf("after reset: %v", d)
	}
}
