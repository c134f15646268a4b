package membership

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// DefaultProgressInterval is how often the watcher asks etcd to confirm
// that its watch is current when no event arrives. Each confirmation
// refreshes the time of the last sync, so SnapshotAge stays below about this interval while
// etcd is healthy and grows while it is not.
const DefaultProgressInterval = 2 * time.Second

// stallProgresses is how many progress intervals without any answer on the
// watch (event or progress notification) make the watcher reopen it on a
// new stream, from the revision it had reached. etcd's client keeps a watch
// on the member it opened on; a member that stops answering while its
// connection stays open (a hung host, dropped packets) holds it there
// until gRPC keepalive gives up on the connection (13 s, membership.NewClient).
// A new stream goes to the next member of the client's rotation.
const stallProgresses = 3

// watchOpenTimeout bounds the wait for a member to confirm a new watch; it
// doubles, up to three progress intervals, while watches go unconfirmed.
const watchOpenTimeout = time.Second

// watchStalled is watch's reason to reopen the watch without a list.
const watchStalled = "stalled"

// listTimeout bounds one page of a list of the prefix.
const listTimeout = 5 * time.Second

// listPage is how many keys one request of a list reads. A fleet of 10,000
// instances is about 2.5 MB of records: read whole by 100 replicas starting
// at once, no list finished within listTimeout on a loaded 2-core machine,
// every replica retried, and the lease keepalives waited behind them (issue
// 22, docs/operations.md "Fleet size limits"). Pages of 1,000 keys (about
// 250 KB) each finish quickly, and the list keeps what it has read.
const listPage = 1000

// WatcherOptions configure a Watcher. The zero value is usable.
type WatcherOptions struct {
	Options
	// ProgressInterval; zero means DefaultProgressInterval.
	ProgressInterval time.Duration
	// Clock dates BuiltAt and every sync (so SnapshotAge) and paces the
	// progress requests; nil means the real clock. Tests pass a
	// clockwork.FakeClock to age a snapshot without waiting. Retries of a
	// failed list wait on the real clock: they pace network calls.
	Clock clockwork.Clock
	// VanishGrace guards against the fleet vanishing when agents lose etcd
	// (their leases expire although the model servers are fine): when more
	// than half of an endpoint's instances disappear within one TTL, the
	// disappeared ones stay in the snapshots for VanishGrace, and
	// prefixrouter_membership_vanish_guard_held_instances says so. Instances that
	// were draining when they left are never held (they left on purpose),
	// and at least two must vanish. Zero (the default) means off: a
	// crashed fleet then leaves the snapshot after one TTL, as before.
	VanishGrace time.Duration
	// Upstreams are the addresses instance records may point at
	// (--allowed-upstreams); records outside are ignored, logged and
	// counted (kind="upstream"). The zero value allows
	// fleet.DefaultUpstreams: loopback and private ranges.
	Upstreams fleet.Upstreams
	// DefaultConfig is the routing config of an endpoint whose config key is
	// not set (serve's --strategy, --prefix-length, --concurrency-threshold).
	// The zero value means fleet.DefaultRoutingConfig(). It must be valid.
	DefaultConfig fleet.RoutingConfig
	// OnSessionKeys, if set, is given the endpoints' session keys (by
	// endpoint; a key that does not parse is left out and counted,
	// kind="session-key") with every snapshot but those that change router
	// records alone, on the watcher's goroutine: it must not block. The
	// keys are never part of a snapshot.
	OnSessionKeys func(map[string][]byte)

	// page is the keys per list request; zero means listPage (tests set it).
	page int64
}

// Watcher lists the layout's prefix at a revision, watches from the next
// one and publishes a full, immutable *fleet.Snapshot after every list and
// every watch response that changed something. One goroutine owns the
// state; the callback runs on it, so it must not block (the router's
// Update is one atomic store).
//
// Static stability: while etcd is unreachable nothing is published, so the
// last snapshot stays in force; SnapshotAge tells how old it
// is. When etcd answers again the watch resumes (or, if the history it
// needs was compacted, the watcher lists again) and the snapshot converges.
type Watcher struct {
	cli      *clientv3.Client
	layout   Layout
	log      *slog.Logger
	metrics  *Metrics
	publish  func(*fleet.Snapshot)
	onKeys   func(map[string][]byte)
	progress time.Duration
	clock    clockwork.Clock
	defCfg   fleet.RoutingConfig
	allowed  fleet.Upstreams
	grace    time.Duration // 0: the vanish guard is off
	window   time.Duration // one TTL
	page     int64         // keys per list request

	// Owned by the run goroutine: how many watches it opened (each gets
	// its own stream), instances whose keys were deleted while
	// serving, and until when each endpoint's vanish guard holds them.
	watches    int
	openWait   time.Duration // how long the next watch may take to be confirmed; 0: watchOpenTimeout
	vanished   map[string]map[string]vanishedInstance
	guardUntil map[string]time.Time

	snap     atomic.Pointer[fleet.Snapshot]
	lastSync atomic.Int64 // unix nanoseconds; 0 = never
	synced   chan struct{}
	syncOnce sync.Once

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// StartWatcher starts watching and returns at once; the first snapshot is
// published when the first list succeeds (see Synced). onSnapshot may be
// nil; Snapshot always returns the latest.
func StartWatcher(cli *clientv3.Client, opts WatcherOptions, onSnapshot func(*fleet.Snapshot)) *Watcher {
	ctx, cancel := context.WithCancel(context.Background())
	w := &Watcher{
		cli:      cli,
		layout:   opts.Layout,
		log:      opts.logger(),
		metrics:  opts.Metrics,
		publish:  onSnapshot,
		onKeys:   opts.OnSessionKeys,
		progress: opts.ProgressInterval,
		clock:    opts.Clock,
		defCfg:   opts.DefaultConfig.WithDefaults(),
		allowed:  opts.Upstreams,
		grace:    opts.VanishGrace,
		window:   opts.ttl(),
		page:     opts.page,

		vanished:   map[string]map[string]vanishedInstance{},
		guardUntil: map[string]time.Time{},
		synced:     make(chan struct{}),
		ctx:        ctx,
		cancel:     cancel,
	}
	if w.progress <= 0 {
		w.progress = DefaultProgressInterval
	}
	if w.page <= 0 {
		w.page = listPage
	}

	if w.clock == nil {
		w.clock = clockwork.NewRealClock()
	}
	w.wg.Add(1)
	go w.run()
	return w
}

// Snapshot returns the latest published snapshot, or nil before the first.
func (w *Watcher) Snapshot() *fleet.Snapshot { return w.snap.Load() }

// Synced is closed once the first snapshot has been published.
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

// SnapshotAge returns the time since the watcher last heard from etcd (a
// list, a watch event or a progress notification), or -1 before the first sync.
// A /readyz handler may compare it with a bound.
func (w *Watcher) SnapshotAge() time.Duration {
	ns := w.lastSync.Load()
	if ns == 0 {
		return -1
	}
	return w.clock.Now().Sub(time.Unix(0, ns))
}

// Close stops the watcher and waits for its goroutine. The last snapshot
// stays readable.
func (w *Watcher) Close() error {
	w.cancel()
	w.wg.Wait()
	return nil
}

func (w *Watcher) markSynced() {
	t := w.clock.Now()
	w.lastSync.Store(t.UnixNano())
	w.metrics.synced(t)
}

// state is the owner goroutine's view of the prefix.
type state struct {
	instances map[string]map[string]fleet.Instance   // endpoint → id → record
	configs   map[string]fleet.RoutingConfig         // endpoint → last valid config
	routers   map[string]float64                     // replica id → published rate, -1 for none
	adapters  map[string]map[string]fleet.Adapter    // endpoint → name → catalogue record
	placement map[string]map[string]Placement        // endpoint → name → placement state
	popular   map[string]map[string]fleet.Popularity // endpoint → replica id → its publication
	keys      map[string][]byte                      // endpoint → session key
	rev       int64

	// sorted is each endpoint's instance list as last published, sorted by
	// id and never modified; changed holds the ids put or deleted since.
	// The next snapshot merges the two (O(N) copying, no sort), so that a
	// change in a fleet of 10,000 costs a copy rather than a sort and a
	// clone of every record (issue 22). An endpoint missing from sorted is
	// built from instances and sorted (after a list).
	sorted  map[string][]fleet.Instance
	changed map[string]map[string]struct{}
}

func newState() *state {
	return &state{
		instances: map[string]map[string]fleet.Instance{},
		configs:   map[string]fleet.RoutingConfig{},
		routers:   map[string]float64{},
		adapters:  map[string]map[string]fleet.Adapter{},
		placement: map[string]map[string]Placement{},
		popular:   map[string]map[string]fleet.Popularity{},
		keys:      map[string][]byte{},
		sorted:    map[string][]fleet.Instance{},
		changed:   map[string]map[string]struct{}{},
	}
}

// instanceChanged notes that ep's record id was put or deleted.
func (st *state) instanceChanged(ep, id string) {
	putIn(st.changed, ep, id, struct{}{})
}

// sortedInstances returns ep's instances sorted by id: the last published
// list with the changed ids merged in, or a full sort after a list. The
// records are shared with the state, whose records are replaced, never
// modified, and with the snapshots, which are immutable. Owner goroutine
// only.
func (st *state) sortedInstances(ep string) []fleet.Instance {
	m := st.instances[ep]
	old, built := st.sorted[ep]
	changed := st.changed[ep]
	if built && len(changed) == 0 {
		return old
	}
	out := make([]fleet.Instance, 0, len(m))
	if !built {
		for _, in := range m {
			out = append(out, in)
		}
		slices.SortFunc(out, func(a, b fleet.Instance) int { return strings.Compare(a.ID, b.ID) })
	} else {
		ids := make([]string, 0, len(changed))
		for id := range changed {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		i := 0
		for _, id := range ids {
			// The records before id are unchanged: one copy for the run.
			j := i + sort.Search(len(old)-i, func(k int) bool { return old[i+k].ID >= id })
			out = append(out, old[i:j]...)
			i = j
			if i < len(old) && old[i].ID == id {
				i++ // replaced or deleted: the state has the current record
			}
			if in, ok := m[id]; ok {
				out = append(out, in)
			}
		}
		out = append(out, old[i:]...)
	}
	st.sorted[ep] = out
	delete(st.changed, ep)
	return out
}

func (w *Watcher) run() {
	defer w.wg.Done()
	st := newState()
	reason := relistStart
	bo := retryBackoff{min: 100 * time.Millisecond, max: 2 * time.Second}
	for {
		if w.ctx.Err() != nil {
			return
		}
		next, err := w.list(st, reason)
		if err != nil {
			w.log.Warn("membership: list failed; keeping the last snapshot", "err", err, "reason", reason)
			select {
			case <-w.ctx.Done():
				return
			case <-time.After(bo.next()):
			}
			continue
		}
		bo.reset()
		st = next
		w.emit(st)
		reason = w.watch(st)
		for n := 0; reason == watchStalled; n++ {
			if n == 0 { // once: while etcd is down every reopen stalls too
				w.log.Warn("membership: no answer on the watch for three progress intervals, or no member confirmed it in time; reopening it on a new stream", "revision", st.rev)
			}
			w.metrics.reopenStream(streamWatch)
			reason = w.watch(st)
		}
		if reason == "" {
			return
		}
		w.log.Info("membership: watch ended, listing again", "reason", reason, "revision", st.rev)
	}
}

// list reads the whole prefix and builds a new state. Configs that do not
// validate keep the endpoint's config from prev. It reads in pages of
// w.page keys, every page at the first page's revision, so the state is
// the prefix at one revision however long the list takes (a compaction of
// that revision meanwhile fails the list, which is then retried).
func (w *Watcher) list(prev *state, reason string) (*state, error) {
	w.metrics.relist(reason)
	st := newState()
	key, end := w.layout.Root(), clientv3.GetPrefixRangeEnd(w.layout.Root())
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(w.page)}
		if st.rev != 0 {
			opts = append(opts, clientv3.WithRev(st.rev))
		}
		ctx, cancel := context.WithTimeout(w.ctx, listTimeout)
		resp, err := w.cli.Get(ctx, key, opts...)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("membership: list %s: %w", w.layout.Root(), err)
		}
		if st.rev == 0 {
			st.rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			w.applyPut(st, prev, string(kv.Key), kv.Value, kv.ModRevision)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00" // the next key after the last
	}
	w.markSynced()
	return st, nil
}

// watch follows the prefix from st.rev+1, applying events to st, until the
// watch must be restarted (it returns the reason: watchStalled to reopen it
// from st.rev+1, any other to list again) or the watcher closes (it
// returns "").
func (w *Watcher) watch(st *state) string {
	// WithRequireLeader: a member cut off from its quorum cancels the watch
	// instead of silently serving stale history; the relist then goes to a
	// member that has a leader.
	//
	// etcd's client shares one stream among the watches whose contexts
	// carry the same metadata: a number of its own gives each watch a
	// stream of its own, so that a reopened watch never joins the stalled
	// stream it leaves.
	w.watches++
	md := clientv3.WithRequireLeader(w.ctx)
	md = metadata.AppendToOutgoingContext(md, "prefixrouter-watch", strconv.Itoa(w.watches))
	ctx, cancel := context.WithCancel(md)
	defer cancel()
	// Watch returns once the member has confirmed the watch, which waits
	// as long as a silent member holds the connection the stream went to
	// (the client's balancer still counts it ready): give up on it soon
	// (a member confirms within milliseconds) and try the next.
	stall := stallProgresses * w.progress
	wait := min(stall, cmp.Or(w.openWait, watchOpenTimeout))
	opening := w.clock.AfterFunc(wait, cancel)
	wch := w.cli.Watch(ctx, w.layout.Root(), clientv3.WithPrefix(), clientv3.WithRev(st.rev+1), clientv3.WithProgressNotify())
	if !opening.Stop() && w.ctx.Err() == nil {
		// The next stream may wait twice as long: an etcd too busy to
		// confirm a watch within a second (many replicas starting at
		// once) must still get one opened, not a reopen every second.
		w.openWait = min(2*wait, stall)
		return watchStalled
	}
	w.openWait = 0
	tick := w.clock.NewTicker(w.progress)
	defer tick.Stop()
	heard := w.clock.Now()
	for {
		select {
		case <-w.ctx.Done():
			return ""
		case <-tick.Chan():
			if w.clock.Since(heard) >= stall {
				return watchStalled
			}
			// Same metadata as the watch, so the request goes on its
			// stream; bounded, since a stream still opening blocks it.
			// Errors mean the stream is down; the age then grows.
			pctx, pcancel := context.WithTimeout(ctx, w.progress)
			_ = w.cli.RequestProgress(pctx)
			pcancel()
			if w.pruneVanished() {
				w.emit(st)
			}
		case resp, ok := <-wch:
			if !ok {
				if w.ctx.Err() != nil {
					return ""
				}
				return relistWatchClosed
			}
			if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
				return relistCompacted
			}
			if err := resp.Err(); err != nil {
				w.log.Warn("membership: watch error", "err", err)
				return relistWatchError
			}
			if resp.Canceled {
				return relistWatchClosed
			}
			if resp.Header.Revision < st.rev {
				// etcd went back in time (restored or replaced with
				// an empty cluster): our history is meaningless.
				return relistRevisionRegressed
			}
			w.markSynced()
			heard = w.clock.Now()
			if len(resp.Events) == 0 {
				continue // progress notification
			}
			routersOnly := true
			for _, ev := range resp.Events {
				key := string(ev.Kv.Key)
				if kind, _, _ := w.layout.parseKey(key); kind != kindRouter {
					routersOnly = false
				}
				switch ev.Type {
				case mvccpb.PUT:
					w.applyPut(st, st, key, ev.Kv.Value, ev.Kv.ModRevision)
				case mvccpb.DELETE:
					w.noteVanished(st, key)
					applyDelete(st, w.layout, key)
				}
			}
			st.rev = resp.Header.Revision
			if routersOnly {
				w.emitReplicas(st)
			} else {
				w.emit(st)
			}
		}
	}
}

// applyPut records one key's value in st. prev supplies the last valid
// config of an endpoint whose new config is invalid.
func (w *Watcher) applyPut(st, prev *state, key string, value []byte, modRev int64) {
	kind, ep, id := w.layout.parseKey(key)
	if ep != "" && fleet.ValidateName("endpoint name", ep) != nil {
		// Endpoint names become metric labels and URL path segments on
		// every replica: an invalid-UTF-8 name made metric creation
		// panic and /metrics answer 500 (issue 12).
		w.metrics.invalidRecord(invalidEndpoint)
		w.log.Warn("membership: ignoring a record under an invalid endpoint name", "key", strconv.Quote(key))
		return
	}
	switch kind {
	case kindAdapter:
		a, err := ParseAdapter(id, value)
		putValid(w, st.adapters, invalidAdapter, key, ep, id, a, err)
	case kindPlacement:
		p, err := parsePlacement(value)
		p.revision = modRev
		putValid(w, st.placement, invalidPlacement, key, ep, id, p, err)
	case kindPopularity:
		p, err := ParsePopularity(value)
		putValid(w, st.popular, invalidPopularity, key, ep, id, p, err)
	case kindRouter:
		// A record that does not parse still counts as a replica (its
		// lease says it runs), with no rate.
		rate := -1.0
		if ri, err := ParseRouterInfo(value); err != nil {
			w.metrics.invalidRecord(invalidRouter)
			w.log.Warn("membership: router record without a usable rate", "key", key, "err", err)
		} else if ri.Rate != nil {
			rate = *ri.Rate
		}
		st.routers[id] = rate
	case kindSessionKey:
		k, err := ParseSessionKey(value)
		if err != nil {
			w.metrics.invalidRecord("session-key")
			w.log.Warn("membership: ignoring an invalid session key", "key", key, "err", err)
			delete(st.keys, ep)
			return
		}
		st.keys[ep] = k
	case kindConfig:
		c, err := ParseRoutingConfig(value)
		if err != nil {
			w.metrics.invalidRecord(invalidConfig)
			if old, ok := prev.configs[ep]; ok {
				st.configs[ep] = old
				w.log.Warn("membership: ignoring invalid routing config; keeping the previous one", "key", key, "err", err)
			} else {
				w.log.Warn("membership: ignoring invalid routing config; using the default", "key", key, "err", err)
			}
			return
		}
		st.configs[ep] = c.WithDefaults()
	case kindInstance:
		in, err := parseInstance(id, value)
		kind := invalidInstance
		if err == nil {
			if err = w.allowed.Check(in.Addr); err != nil {
				kind = invalidUpstream
			}
		}
		st.instanceChanged(ep, id)
		if err != nil {
			w.metrics.invalidRecord(kind)
			w.log.Warn("membership: ignoring invalid instance record", "key", key, "err", err)
			if m := st.instances[ep]; m != nil {
				delete(m, id)
			}
			return
		}
		m := st.instances[ep]
		if m == nil {
			m = map[string]fleet.Instance{}
			st.instances[ep] = m
		}
		in.Revision = modRev
		m[id] = in
		delete(w.vanished[ep], id) // back: no longer held
	}
}

func applyDelete(st *state, l Layout, key string) {
	kind, ep, id := l.parseKey(key)
	if ep != "" && fleet.ValidateName("endpoint name", ep) != nil {
		return // never applied
	}
	switch kind {
	case kindRouter:
		delete(st.routers, id)
	case kindSessionKey:
		delete(st.keys, ep)
	case kindConfig:
		delete(st.configs, ep)
	case kindAdapter:
		deleteIn(st.adapters, ep, id)
	case kindPlacement:
		deleteIn(st.placement, ep, id)
	case kindPopularity:
		deleteIn(st.popular, ep, id)
	case kindInstance:
		st.instanceChanged(ep, id)
		if m := st.instances[ep]; m != nil {
			delete(m, id)
			if len(m) == 0 {
				delete(st.instances, ep)
			}
		}
	}
}

// putValid records the parsed value v of one record under the endpoint,
// or, when it did not parse (err), ignores it, logs and counts it, and
// drops the record's previous value.
func putValid[V any](w *Watcher, m map[string]map[string]V, kind, key, ep, id string, v V, err error) {
	if err != nil {
		w.metrics.invalidRecord(kind)
		w.log.Warn("membership: ignoring invalid "+kind+" record", "key", key, "err", err)
		deleteIn(m, ep, id)
		return
	}
	putIn(m, ep, id, v)
}

func putIn[V any](m map[string]map[string]V, ep, name string, v V) {
	inner := m[ep]
	if inner == nil {
		inner = map[string]V{}
		m[ep] = inner
	}
	inner[name] = v
}

func deleteIn[V any](m map[string]map[string]V, ep, name string) {
	if inner := m[ep]; inner != nil {
		delete(inner, name)
		if len(inner) == 0 {
			delete(m, ep)
		}
	}
}

func parseInstance(id string, value []byte) (fleet.Instance, error) {
	var in fleet.Instance
	if err := json.Unmarshal(value, &in); err != nil {
		return fleet.Instance{}, fmt.Errorf("decode: %w", err)
	}
	if in.ID == "" {
		in.ID = id
	}
	if in.ID != id {
		return fleet.Instance{}, fmt.Errorf("record id %q differs from the key's %q", in.ID, id)
	}
	if err := in.Validate(); err != nil {
		return fleet.Instance{}, err
	}
	return in, nil
}

// emit builds a snapshot of st and publishes it. An endpoint exists when it
// has instances, a config or an adapter catalogue.
func (w *Watcher) emit(st *state) {
	start := time.Now() // real time: the clock may be a test's fake
	names := map[string]struct{}{}
	for ep, m := range st.instances {
		if len(m) > 0 {
			names[ep] = struct{}{}
		}
	}
	for ep := range w.guardUntil {
		names[ep] = struct{}{}
	}
	for ep := range st.configs {
		names[ep] = struct{}{}
	}
	for ep := range st.adapters {
		names[ep] = struct{}{}
	}
	eps := make([]fleet.Endpoint, 0, len(names))
	for ep := range names {
		cfg, ok := st.configs[ep]
		if !ok {
			cfg = w.defCfg
		}
		insts := st.sortedInstances(ep)
		held := w.held(st, ep)
		if len(held) > 0 {
			// Rare (the vanish guard holds): a sorted copy with them in.
			insts = append(slices.Clone(insts), held...)
			slices.SortFunc(insts, func(a, b fleet.Instance) int { return strings.Compare(a.ID, b.ID) })
		}
		w.metrics.vanishHeld(ep, len(held))
		ads := make([]fleet.Adapter, 0, len(st.adapters[ep]))
		for name, a := range st.adapters[ep] {
			st.placement[ep][name].apply(&a)
			ads = append(ads, a)
		}
		popular, served := mergePopular(st.popular[ep])
		eps = append(eps, fleet.Endpoint{Name: ep, Config: cfg, Instances: insts, Adapters: ads, Popular: popular, Served: served})
	}
	sort.Slice(eps, func(i, j int) bool { return eps[i].Name < eps[j].Name })
	// The instance lists are st.sorted's (or the guard's sorted copies),
	// never modified: the snapshot keeps them.
	s := fleet.NewSnapshotOwning(eps, st.rev, len(st.routers), w.clock.Now())
	s.ReplicaRates = maps.Clone(st.routers)
	if w.onKeys != nil {
		w.onKeys(maps.Clone(st.keys))
	}
	w.store(s, start)
}

// emitReplicas publishes a snapshot after a change of router records
// alone (a replica came, went or published its rate): the last snapshot's
// endpoints, shared, with st's replicas. It costs O(replicas), not
// O(instances): at 100 replicas publishing rates, a full rebuild per record
// would rebuild every replica's fleet view many times a second.
func (w *Watcher) emitReplicas(st *state) {
	prev := w.snap.Load()
	if prev == nil {
		w.emit(st)
		return
	}
	start := time.Now()
	w.store(prev.WithReplicas(st.rev, maps.Clone(st.routers), w.clock.Now()), start)
}

// store publishes s, built since start.
func (w *Watcher) store(s *fleet.Snapshot, start time.Time) {
	w.snap.Store(s)
	w.syncOnce.Do(func() { close(w.synced) })
	w.metrics.snapshotPublished(time.Since(start))
	if w.publish != nil {
		w.publish(s)
	}
}

// mergePopular merges the replicas' publications for one endpoint in
// replica id order, so that every watcher computes the same view: the
// popular prefixes and the instances' served shares.
func mergePopular(byReplica map[string]fleet.Popularity) ([]fleet.PopularKey, map[string]float64) {
	if len(byReplica) == 0 {
		return nil, nil
	}
	ids := make([]string, 0, len(byReplica))
	for id := range byReplica {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	ps := make([]fleet.Popularity, len(ids))
	for i, id := range ids {
		ps[i] = byReplica[id]
	}
	return fleet.MergePopularity(ps), fleet.MergeServed(ps)
}

// vanishedInstance is an instance whose key was deleted while it served.
type vanishedInstance struct {
	in fleet.Instance
	at time.Time
}

// noteVanished records an instance whose key is being deleted (before
// applyDelete) and turns the endpoint's guard on when more than half of its
// instances vanished within one TTL: the signature of agents losing etcd,
// not of model servers failing one by one. Owner goroutine only.
func (w *Watcher) noteVanished(st *state, key string) {
	kind, ep, id := w.layout.parseKey(key)
	if w.grace <= 0 || kind != kindInstance {
		return
	}
	in, ok := st.instances[ep][id]
	if !ok || in.Draining {
		return
	}
	now := w.clock.Now()
	m := w.vanished[ep]
	if m == nil {
		m = map[string]vanishedInstance{}
		w.vanished[ep] = m
	}
	m[id] = vanishedInstance{in: in, at: now}
	recent := 0
	for _, v := range m {
		if now.Sub(v.at) <= w.window {
			recent++
		}
	}
	live := len(st.instances[ep]) - 1 // this one is leaving
	if recent >= 2 && 2*recent > live+recent && !now.Before(w.guardUntil[ep]) {
		w.guardUntil[ep] = now.Add(w.grace)
		w.log.Warn("membership: more than half of an endpoint's instances vanished within one TTL; routing to them for the grace period (agents may have lost etcd)",
			"endpoint", ep, "vanished", recent, "remaining", live, "grace", w.grace)
	}
}

// held returns the vanished instances the endpoint's guard keeps now.
func (w *Watcher) held(st *state, ep string) []fleet.Instance {
	until, ok := w.guardUntil[ep]
	if !ok || !w.clock.Now().Before(until) {
		return nil
	}
	var out []fleet.Instance
	for id, v := range w.vanished[ep] {
		if _, live := st.instances[ep][id]; !live {
			out = append(out, v.in)
		}
	}
	return out
}

// pruneVanished forgets vanished instances older than a TTL and the grace
// period, and ends expired guards. It reports whether a guard ended, so the
// snapshot must be published without its instances.
func (w *Watcher) pruneVanished() bool {
	now := w.clock.Now()
	ended := false
	for ep, until := range w.guardUntil {
		if !now.Before(until) {
			delete(w.guardUntil, ep)
			w.metrics.vanishHeld(ep, 0)
			ended = true
		}
	}
	keep := max(w.window, w.grace)
	for ep, m := range w.vanished {
		for id, v := range m {
			if now.Sub(v.at) > keep {
				delete(m, id)
			}
		}
		if len(m) == 0 {
			delete(w.vanished, ep)
		}
	}
	return ended
}
