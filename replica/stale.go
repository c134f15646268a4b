package replica

import (
	"context"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/membership"
)

// staleMarkTTL is the lease of a stale mark: an agent that never consumes
// it (it crashed) leaves no key behind for longer.
const staleMarkTTL = 10 * time.Second

// staleMarker writes the router's stale reports (router.Options.OnStale)
// to etcd off the request path: report never blocks, a bounded queue
// drops reports beyond it, and a report repeated within a second is
// written once.
type staleMarker struct {
	cli    *clientv3.Client
	layout membership.Layout
	log    *slog.Logger
	ch     chan [3]string // endpoint, instance, adapter
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startStaleMarker(cli *clientv3.Client, layout membership.Layout, log *slog.Logger) *staleMarker {
	ctx, cancel := context.WithCancel(context.Background())
	m := &staleMarker{cli: cli, layout: layout, log: log, ch: make(chan [3]string, 64), cancel: cancel}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.run(ctx)
	}()
	return m
}

func (m *staleMarker) report(endpoint, instance, adapter string) {
	select {
	case m.ch <- [3]string{endpoint, instance, adapter}:
	default: // the agent re-polls on its own schedule anyway
	}
}

func (m *staleMarker) run(ctx context.Context) {
	last := map[[3]string]time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case k := <-m.ch:
			if t, ok := last[k]; ok && time.Since(t) < time.Second {
				continue
			}
			last[k] = time.Now()
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			if err := membership.MarkStale(wctx, m.cli, m.layout, k[0], k[1], k[2], staleMarkTTL); err != nil {
				m.log.Warn("replica: stale mark not written", "endpoint", k[0], "instance", k[1], "adapter", k[2], "err", err)
			}
			cancel()
			if len(last) > 1024 {
				clear(last)
			}
		}
	}
}

func (m *staleMarker) Close() {
	m.cancel()
	m.wg.Wait()
}
