package membership_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/membership/etcdtest"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// stored reads the instance record from etcd through cli; ok is false when
// the key is absent or etcd does not answer.
func stored(cli *clientv3.Client, key string) (fleet.Instance, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, key)
	if err != nil || len(resp.Kvs) == 0 {
		return fleet.Instance{}, false
	}
	var in fleet.Instance
	if json.Unmarshal(resp.Kvs[0].Value, &in) != nil {
		return fleet.Instance{}, false
	}
	return in, true
}

// TestUpdateDuringOutageNotLost: updates whose callers gave up while etcd
// was down (the owner busy granting a new lease) are not lost: once etcd is
// back the latest of them is written, and none of them blocked its caller
// beyond its context.
func TestUpdateDuringOutageNotLost(t *testing.T) {
	for _, tc := range []struct {
		name     string
		updates  [][]string // SetAdapters calls made during the outage, in order
		wantLast []string
	}{
		{"one update", [][]string{{"lora-late"}}, []string{"lora-late"}},
		{"latest of several wins", [][]string{{"a"}, {"a", "b"}, {"c"}}, []string{"c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := etcdtest.Start(t)
			cli := etcdtest.Client(t, e)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			reg, err := membership.RegisterInstance(ctx, cli, "ep", fleet.Instance{ID: "i-1", Addr: "http://127.0.0.1:9", Adapters: []string{"old"}}, membership.Options{TTL: time.Second, Logger: discard})
			if err != nil {
				t.Fatal(err)
			}
			defer reg.Close(ctx)

			e.Close()
			// The keepalive got no answer for a TTL: the owner now
			// tries to grant a new lease, each attempt blocking.
			testsupport.Eventually(t, 10*time.Second, "lease lost", func() bool { return reg.LeaseID() == 0 })
			const callTimeout = 200 * time.Millisecond
			for _, adapters := range tc.updates {
				uctx, ucancel := context.WithTimeout(ctx, callTimeout)
				began := time.Now()
				err := reg.SetAdapters(uctx, adapters)
				took := time.Since(began)
				ucancel()
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("SetAdapters(%v) during the outage = %v, want a deadline error", adapters, err)
				}
				// Bounded by the caller's context, not by the owner's
				// etcd call (up to a TTL).
				if took > callTimeout+500*time.Millisecond {
					t.Fatalf("SetAdapters(%v) took %v with a %v context", adapters, took, callTimeout)
				}
			}
			if got := reg.Instance().Adapters; !slices.Equal(got, tc.wantLast) {
				t.Fatalf("Instance().Adapters = %v, want %v", got, tc.wantLast)
			}

			e2 := etcdtest.Restart(t, e)
			other := etcdtest.Client(t, e2)
			took := testsupport.Eventually(t, 15*time.Second, "latest record written after the outage", func() bool {
				in, ok := stored(other, reg.Key())
				return ok && slices.Equal(in.Adapters, tc.wantLast)
			})
			t.Logf("written %v after etcd restarted", took)
			// A later update is acknowledged normally again.
			if err := reg.SetDraining(ctx, true); err != nil {
				t.Fatal(err)
			}
			if in, _ := stored(other, reg.Key()); !in.Draining || !slices.Equal(in.Adapters, tc.wantLast) {
				t.Fatalf("record after SetDraining = %+v", in)
			}
		})
	}
}

// TestConcurrentUpdatesLastWins: concurrent updates are written in the
// order they changed the record, so etcd ends with what Instance reports.
func TestConcurrentUpdatesLastWins(t *testing.T) {
	e := etcdtest.Start(t)
	cli := etcdtest.Client(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg, err := membership.RegisterInstance(ctx, cli, "ep", fleet.Instance{ID: "i-1", Addr: "http://127.0.0.1:9"}, membership.Options{TTL: 2 * time.Second, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 8*10)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				errs <- reg.SetAdapters(ctx, []string{fmt.Sprintf("g%d-%d", g, i)})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	want := reg.Instance().Adapters
	if in, ok := stored(cli, reg.Key()); !ok || !slices.Equal(in.Adapters, want) {
		t.Fatalf("stored adapters %v, Instance() reports %v", in.Adapters, want)
	}
}

// TestClosedClientFailsFast: once the registration's client is closed (a
// crashed agent), updates fail at once with ErrClosed instead of waiting
// for their context, and Close returns promptly, whether the owner held a
// lease or was granting one during an outage.
func TestClosedClientFailsFast(t *testing.T) {
	for _, tc := range []struct {
		name     string
		etcdDown bool
	}{
		{"lease held", false},
		{"owner granting during an outage", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := etcdtest.Start(t)
			cli, err := membership.NewClient(membership.ClientOptions{Endpoints: e.Endpoints()})
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			reg, err := membership.RegisterInstance(ctx, cli, "ep", fleet.Instance{ID: "i-1", Addr: "http://127.0.0.1:9"}, membership.Options{TTL: time.Second, Logger: discard})
			if err != nil {
				t.Fatal(err)
			}
			if tc.etcdDown {
				e.Close()
				testsupport.Eventually(t, 10*time.Second, "lease lost", func() bool { return reg.LeaseID() == 0 })
			}
			cli.Close()

			const bound = time.Second // the callers allow 10 s
			for _, call := range []struct {
				name string
				fn   func(context.Context) error
			}{
				{"SetDraining", func(ctx context.Context) error { return reg.SetDraining(ctx, true) }},
				{"Update", func(ctx context.Context) error {
					return reg.Update(ctx, func(in *fleet.Instance) { in.Adapters = []string{"x"} })
				}},
			} {
				cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
				began := time.Now()
				err := call.fn(cctx)
				took := time.Since(began)
				ccancel()
				if !errors.Is(err, membership.ErrClosed) {
					t.Errorf("%s after the client closed = %v, want ErrClosed", call.name, err)
				}
				if took > bound {
					t.Errorf("%s after the client closed took %v, want within %v", call.name, took, bound)
				}
			}
			cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
			began := time.Now()
			err = reg.Close(cctx)
			took := time.Since(began)
			ccancel()
			t.Logf("Close: %v", err)
			if took > bound {
				t.Errorf("Close after the client closed took %v, want within %v", took, bound)
			}
			if err := reg.SetDraining(ctx, false); !errors.Is(err, membership.ErrClosed) {
				t.Errorf("SetDraining after Close = %v, want ErrClosed", err)
			}
		})
	}
}

// TestRegistrationIsCompareAndSwap: a second agent with the same id is
// refused with ErrTaken (after waiting out one TTL, which a crashed holder's
// lease would not survive) and the first record is untouched; a key deleted
// by someone else is back within one TTL; once the first holder closes, the
// id is free again.
func TestRegistrationIsCompareAndSwap(t *testing.T) {
	e := etcdtest.Start(t)
	cli := etcdtest.Client(t, e)
	ctx := testsupport.Context(t, 30*time.Second)
	const ttl = time.Second
	opts := membership.Options{Logger: discard, TTL: ttl}
	l := opts.Layout
	first, err := membership.RegisterInstance(ctx, cli, "chat", fleet.Instance{ID: "vllm-0", Addr: "http://127.0.0.1:1"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close(context.Background())

	start := time.Now()
	second, err := membership.RegisterInstance(ctx, etcdtest.Client(t, e), "chat", fleet.Instance{ID: "vllm-0", Addr: "http://127.0.0.1:2"}, opts)
	if !errors.Is(err, membership.ErrTaken) {
		if second != nil {
			second.Close(context.Background())
		}
		t.Fatalf("second registration with the same id = %v, want ErrTaken", err)
	}
	t.Logf("refused after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if in, ok := stored(cli, l.InstanceKey("chat", "vllm-0")); !ok || in.Addr != "http://127.0.0.1:1" {
		t.Fatalf("first record overwritten: %+v %v", in, ok)
	}

	// Deleted behind the holder's back: written again well within one TTL.
	if _, err := cli.Delete(ctx, l.InstanceKey("chat", "vllm-0")); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, ttl, "deleted key re-created", func() bool {
		in, ok := stored(cli, l.InstanceKey("chat", "vllm-0"))
		return ok && in.Addr == "http://127.0.0.1:1"
	})
	resp, err := cli.Get(ctx, l.InstanceKey("chat", "vllm-0"))
	if err != nil || len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) != first.LeaseID() {
		t.Fatalf("re-created key not under the holder's lease: %v %v", resp, err)
	}

	// A key written by hand without a lease is not ours either.
	if _, err := cli.Put(ctx, l.InstanceKey("chat", "manual"), `{"id":"manual","addr":"http://127.0.0.1:3"}`); err != nil {
		t.Fatal(err)
	}
	if _, err := membership.RegisterInstance(ctx, cli, "chat", fleet.Instance{ID: "manual", Addr: "http://127.0.0.1:4"}, opts); !errors.Is(err, membership.ErrTaken) {
		t.Fatalf("registration over a lease-less key = %v, want ErrTaken", err)
	}

	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := membership.RegisterInstance(ctx, cli, "chat", fleet.Instance{ID: "vllm-0", Addr: "http://127.0.0.1:2"}, opts)
	if err != nil {
		t.Fatalf("id not free after the holder closed: %v", err)
	}
	again.Close(context.Background())
}

// TestLeaseResumedAfterOutage: an outage longer than a TTL ends the
// keepalive stream on the client's side, but the restarted etcd still holds
// the lease (a new leader extends every lease by its TTL). The registration
// resumes that lease: the record is never deleted, so no router drops the
// instance. It is the regression test of a bug where the registration
// granted a new lease, could not write the key held under the old one, and
// the record vanished when the old lease expired about a TTL after the
// restart (seen as replicas disagreeing after chaos's etcd-outage).
func TestLeaseResumedAfterOutage(t *testing.T) {
	e := etcdtest.Start(t)
	cli := etcdtest.Client(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The shortest TTL the docs suggest: the client must get through
	// within it after the restart (its reconnect backoff is capped below).
	const ttl = 2 * time.Second
	reg, err := membership.RegisterInstance(ctx, cli, "ep", fleet.Instance{ID: "i-1", Addr: "http://127.0.0.1:9"}, membership.Options{TTL: ttl, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)
	old := reg.LeaseID()
	resp, err := cli.Get(ctx, reg.Key())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("record before the outage: %v, %v", resp, err)
	}
	rev := resp.Header.Revision

	e.Close()
	testsupport.Eventually(t, 10*time.Second, "keepalive ended", func() bool { return reg.LeaseID() == 0 })
	e2 := etcdtest.Restart(t, e)
	other := etcdtest.Client(t, e2)
	testsupport.Eventually(t, 15*time.Second, "lease held again", func() bool { return reg.LeaseID() != 0 })
	if got := reg.LeaseID(); got != old {
		t.Errorf("lease %x after the outage, want the old %x resumed", int64(got), int64(old))
	}
	// Past the old lease's extended expiry (TTL plus an election timeout
	// after the restart): had it been abandoned, it would have taken the
	// record with it by then.
	wctx, wcancel := context.WithTimeout(ctx, 2*ttl)
	defer wcancel()
	for wr := range other.Watch(wctx, reg.Key(), clientv3.WithRev(rev+1), clientv3.WithFilterPut()) {
		if err := wr.Err(); err != nil && wctx.Err() == nil {
			t.Fatalf("watch: %v", err)
		}
		for _, ev := range wr.Events {
			t.Errorf("record deleted at revision %d after the outage", ev.Kv.ModRevision)
		}
	}
	if in, ok := stored(other, reg.Key()); !ok || in.ID != "i-1" {
		t.Fatalf("record after the outage: %+v, %v", in, ok)
	}
	if got := reg.LeaseID(); got != old {
		t.Errorf("lease %x at the end, want %x", int64(got), int64(old))
	}
}

// TestWatcherReopensASilentWatch: each member of a 3-member cluster in turn
// stops answering the watcher's client while its connections stay open
// (etcdtest's Partition). A watcher that hears nothing for three progress
// intervals reopens its watch on a new stream, so a record written through
// the other members reaches it within a second or so; etcd's client alone
// would hold the watch on the silent member until gRPC keepalive gave up on
// the connection (13 s).
func TestWatcherReopensASilentWatch(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	cli := etcdtest.ClusterClient(t, c)
	const progress = 100 * time.Millisecond
	w := membership.StartWatcher(cli, membership.WatcherOptions{Options: membership.Options{Logger: discard}, ProgressInterval: progress}, nil)
	defer w.Close()
	testsupport.Eventually(t, 10*time.Second, "first snapshot", func() bool { return w.Snapshot() != nil })
	ctx := testsupport.Context(t, 30*time.Second)
	for i := range c.Size() {
		c.Partition(i)
		// Written through a member that answers.
		other, err := membership.NewClient(membership.ClientOptions{Endpoints: []string{c.Endpoints()[(i+1)%c.Size()]}})
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("i-%d", i)
		if _, err := other.Put(ctx, membership.Layout{}.InstanceKey("ep", id), fmt.Sprintf(`{"id":%q,"addr":"http://127.0.0.1:9"}`, id)); err != nil {
			t.Fatal(err)
		}
		_ = other.Close()
		took := testsupport.Eventually(t, 10*time.Second, id+" in the watcher's snapshot", func() bool {
			ep := w.Snapshot().Endpoint("ep")
			return ep != nil && len(ep.Instances) == i+1
		})
		t.Logf("member-%d silent: a record written meanwhile reached the watcher in %v", i, took.Round(time.Millisecond))
		if bound := 20 * progress; took > bound {
			t.Errorf("member-%d silent: the record reached the watcher in %v, want within %v", i, took, bound)
		}
		c.Heal(i)
	}
}

// TestWatcherOpensOnASlowCluster: a member that takes longer than the first
// open timeout (1 s) to confirm every watch (an overloaded etcd, a slow
// link) still gets the watch opened, since each unconfirmed open lets the
// next wait twice as long; with a fixed timeout every open was cancelled
// and the watcher never saw another change.
func TestWatcherOpensOnASlowCluster(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	cli := etcdtest.ClusterClient(t, c)
	for i := range c.Size() {
		c.Delay(i, 1500*time.Millisecond)
	}
	w := membership.StartWatcher(cli, membership.WatcherOptions{Options: membership.Options{Logger: discard}, ProgressInterval: time.Second}, nil)
	defer w.Close()
	testsupport.Eventually(t, 20*time.Second, "first snapshot", func() bool { return w.Snapshot() != nil })
	other := etcdtest.ClusterClient(t, c)
	ctx := testsupport.Context(t, 30*time.Second)
	if _, err := other.Put(ctx, membership.Layout{}.InstanceKey("ep", "i-0"), `{"id":"i-0","addr":"http://127.0.0.1:9"}`); err != nil {
		t.Fatal(err)
	}
	took := testsupport.Eventually(t, 20*time.Second, "the record in the watcher's snapshot", func() bool {
		ep := w.Snapshot().Endpoint("ep")
		return ep != nil && len(ep.Instances) == 1
	})
	t.Logf("answers 1.5 s late: a record written after the start reached the watcher in %v", took.Round(time.Millisecond))
	for i := range c.Size() {
		c.Delay(i, 0)
	}
}
