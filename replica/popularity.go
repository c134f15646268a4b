package replica

import (
	"context"
	"log/slog"
	"math"
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
// view changed, see popularityChanged).
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
			continue
		}
		if p.static != nil {
			if name == p.static.ep.Name && popularityChanged(last[name].pop, pop) {
				p.static.setPopular(fleet.MergePopularity([]fleet.Popularity{pop}))
				last[name] = written{pop: pop}
			}
			continue
		}
		lease := p.lease()
		if lease == 0 {
			continue // not registered (yet, or any more)
		}
		if prev, ok := last[name]; ok && prev.lease == lease && !popularityChanged(prev.pop, pop) {
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

// Close stops the publisher and waits for it.
func (p *popularityPublisher) Close() {
	p.cancel()
	p.wg.Wait()
}

// popularityChanged reports whether a new view differs from the last one
// written enough to be written again: a prefix listed or gone, a k moved,
// a share moved by more than a tenth (and half a point), or the rate by
// more than a quarter. Small drifts of the estimates are not worth a write
// and a new snapshot on every replica.
func popularityChanged(old, cur fleet.Popularity) bool {
	if len(old.Keys) != len(cur.Keys) || math.Abs(cur.Rate-old.Rate) > 0.25*max(old.Rate, 1) {
		return true
	}
	prev := make(map[uint64]fleet.PopularKey, len(old.Keys))
	for _, k := range old.Keys {
		prev[k.Key] = k
	}
	for _, k := range cur.Keys {
		o, ok := prev[k.Key]
		if !ok || o.K != k.K || math.Abs(o.Share-k.Share) > max(0.1*o.Share, 0.005) {
			return true
		}
	}
	return false
}
