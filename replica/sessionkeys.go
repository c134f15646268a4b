package replica

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/membership"
)

// sessionKeyring holds the endpoints' session keys from etcd (issue 19),
// for a replica without --session-key-file: the watcher hands over the keys
// it reads, and the replica creates the key of an endpoint that has none
// (the first replica to do so wins; every other one reads its key). The
// router reads it on the request path: two atomic loads, no lock.
type sessionKeyring struct {
	cli    *clientv3.Client
	layout membership.Layout
	log    *slog.Logger

	watched atomic.Pointer[map[string][]byte] // from the watcher: authoritative
	created atomic.Pointer[map[string][]byte] // from EnsureSessionKey, until the watch brings them
	mu      sync.Mutex                        // serializes writers of created (Start, run, the watcher)

	kick   chan *fleet.Snapshot // latest snapshot to check for endpoints without a key
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startSessionKeyring starts the goroutine that creates missing keys.
func startSessionKeyring(cli *clientv3.Client, l membership.Layout, log *slog.Logger) *sessionKeyring {
	k := &sessionKeyring{cli: cli, layout: l, log: log, kick: make(chan *fleet.Snapshot, 1)}
	k.ctx, k.cancel = context.WithCancel(context.Background())
	empty := map[string][]byte{}
	k.watched.Store(&empty)
	k.created.Store(&empty)
	k.wg.Go(k.run)
	return k
}

// key is the router's Options.SessionKeys.
func (k *sessionKeyring) key(endpoint string) []byte {
	if b := (*k.watched.Load())[endpoint]; b != nil {
		return b
	}
	return (*k.created.Load())[endpoint]
}

// setWatched is the watcher's OnSessionKeys. A key the watch brought
// replaces the one EnsureSessionKey returned for good: if it is deleted or
// made invalid later, the router falls back to its own key, not to an old
// one.
func (k *sessionKeyring) setWatched(keys map[string][]byte) {
	k.watched.Store(&keys)
	k.mu.Lock()
	defer k.mu.Unlock()
	created := *k.created.Load()
	if len(created) == 0 {
		return
	}
	m := maps.Clone(created)
	for ep := range keys {
		delete(m, ep)
	}
	k.created.Store(&m)
}

// check asks the goroutine to create the keys that s's endpoints lack. It
// never blocks (the watcher calls it); a newer snapshot replaces one not
// yet looked at.
func (k *sessionKeyring) check(s *fleet.Snapshot) {
	for {
		select {
		case k.kick <- s:
			return
		default:
		}
		select {
		case <-k.kick:
		default:
		}
	}
}

// ensure creates (or reads) the keys s's endpoints lack, each tried once
// per tried map (its caller's): a replica without write access warns once
// per endpoint, not once per snapshot.
func (k *sessionKeyring) ensure(ctx context.Context, s *fleet.Snapshot, tried map[string]bool) {
	for ep := range s.Endpoints {
		if k.key(ep) != nil || tried[ep] {
			continue
		}
		tried[ep] = true
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		key, err := membership.EnsureSessionKey(cctx, k.cli, k.layout, ep)
		cancel()
		if err != nil {
			k.log.Warn("replica: no session key for the endpoint in etcd, and none could be created; its session ids are sealed with this replica's own key, which other replicas refuse (give the router role write access to the key, or use --session-key-file)",
				"endpoint", ep, "key", k.layout.SessionKeyKey(ep), "err", err)
			continue
		}
		k.mu.Lock()
		m := maps.Clone(*k.created.Load())
		m[ep] = key
		k.created.Store(&m)
		k.mu.Unlock()
	}
}

func (k *sessionKeyring) run() {
	tried := map[string]bool{} // owned by this goroutine
	for {
		select {
		case <-k.ctx.Done():
			return
		case s := <-k.kick:
			k.ensure(k.ctx, s, tried)
		}
	}
}

// Close stops the goroutine and waits for it.
func (k *sessionKeyring) Close() {
	k.cancel()
	k.wg.Wait()
}
