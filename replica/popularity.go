package replica

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/router"
)

// DefaultPopularityInterval is how often a replica publishes its popular
// prefixes (--popularity-interval, issue 21): fast enough that a prefix
// turning hot is spread within seconds, slow enough that 100 replicas
// write at most 20 small records a second per endpoint (each only when its
// view moved, see fleet.Popularity.Moved).
const DefaultPopularityInterval = 5 * time.Second

// popularityWriteTimeout bounds one publication's etcd write.
const popularityWriteTimeout = 2 * time.Second

// popularityPublisher publishes the router's popular prefixes every
// interval: with etcd, each endpoint's under this replica's key, bound to
// its registration's lease (the watcher merges every replica's into the
// snapshots); with a static fleet, straight into the router's snapshot
// (one replica: its view is the agreed one). One goroutine; Close stops it.
type popularityPublisher struct {
	rt       *router.Router
	interval time.Duration
	log      *slog.Logger

	// With etcd: where and under which lease.
	cli    *clientv3.Client
	layout membership.Layout
	id     string
	lease  func() clientv3.LeaseID
	// With a static fleet: its prober, which publishes the snapshots.
	static *staticProber

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// start launches the publisher's goroutine.
func (p *popularityPublisher) start() {
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.wg.Go(func() { p.run(ctx) })
}

func (p *popularityPublisher) run(ctx context.Context) {
	tick := time.NewTicker(p.interval)
	defer tick.Stop()
	written := map[string]written{} // by endpoint: the last record written
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			p.publish(ctx, now, written)
		}
	}
}

// written is the last record an endpoint's publication wrote, and under
// which lease.
type written struct {
	pop   fleet.Popularity
	lease clientv3.LeaseID
}

// publish publishes every endpoint's view once.
func (p *popularityPublisher) publish(ctx context.Context, now time.Time, last map[string]written) {
	snap := p.rt.Snapshot()
	if snap == nil {
		return
	}
	names := make([]string, 0, len(snap.Endpoints))
	for name := range snap.Endpoints {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		pop, ok := p.rt.Popularity(name, now)
		if !ok {
			if _, had := last[name]; had && p.static == nil {
				// The endpoint stopped counting (its keys changed): its
				// view must not weigh in the others' merge any longer.
				p.withdraw(ctx, name)
				delete(last, name)
			}
			continue
		}
		if p.static != nil {
			if name == p.static.ep.Name && pop.Moved(last[name].pop) {
				p.static.setPopular(fleet.MergePopularity([]fleet.Popularity{pop}), fleet.MergeServed([]fleet.Popularity{pop}))
				last[name] = written{pop: pop}
			}
			continue
		}
		lease := p.lease()
		if lease == 0 {
			continue // not registered (yet, or any more)
		}
		if prev, ok := last[name]; ok && prev.lease == lease && !pop.Moved(prev.pop) {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, popularityWriteTimeout)
		err := membership.PutPopularity(wctx, p.cli, p.layout, name, p.id, lease, pop)
		cancel()
		if err != nil {
			p.log.Warn("replica: popularity not published; the next interval tries again", "endpoint", name, "err", err)
			delete(last, name)
			continue
		}
		last[name] = written{pop: pop, lease: lease}
	}
}

// withdraw deletes this replica's record for endpoint (best effort: its
// lease removes it when the replica stops anyway).
func (p *popularityPublisher) withdraw(ctx context.Context, endpoint string) {
	wctx, cancel := context.WithTimeout(ctx, popularityWriteTimeout)
	defer cancel()
	if _, err := p.cli.Delete(wctx, p.layout.PopularityKey(endpoint, p.id)); err != nil {
		p.log.Warn("replica: popularity record not withdrawn", "endpoint", endpoint, "err", err)
	}
}

// Close stops the publisher and waits for it.
func (p *popularityPublisher) Close() {
	p.cancel()
	p.wg.Wait()
}
