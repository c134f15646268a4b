package membership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// DefaultTTL is the lease TTL of instance and router records: a crashed
// instance disappears from the routers at most this long (plus the watch
// delay) after its last keepalive.
const DefaultTTL = 5 * time.Second

// maxOpTimeout bounds one etcd call of a registration, so that an
// unreachable etcd never blocks the owner goroutine for long.
const maxOpTimeout = 5 * time.Second

// ErrClosed is returned by the methods of a closed registration, and of one
// whose etcd client was closed (errClientClosed wraps it).
var ErrClosed = errors.New("membership: registration closed")

// ErrTaken is returned when the key is held under another lease: another
// agent (or replica) runs with the same id. Registration is a
// compare-and-swap on the key's own lease, so one holder can never
// overwrite another's record (issue 12).
var ErrTaken = errors.New("membership: key held by another registration")

// errClientClosed: nothing can be written any more and the lease expires by
// itself. It matches both ErrClosed and context.Canceled (what the closed
// client's calls fail with).
var errClientClosed = fmt.Errorf("%w (etcd client closed: %w)", ErrClosed, context.Canceled)

// Options are the settings shared by registrations and the watcher. The zero
// value is usable: DefaultPrefix, DefaultTTL, slog.Default(), no metrics.
type Options struct {
	// Layout names the keys (--etcd-prefix).
	Layout Layout
	// TTL of the lease of a registration; zero means DefaultTTL. etcd
	// rounds it up to whole seconds and to its own minimum (1.5 election
	// timeouts, 2 s with etcd's defaults).
	TTL time.Duration
	// Logger receives one line per lost lease, skipped record and relist.
	Logger *slog.Logger
	// Metrics may be nil.
	Metrics *Metrics
}

func (o Options) ttl() time.Duration {
	if o.TTL <= 0 {
		return DefaultTTL
	}
	return o.TTL
}

func (o Options) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.Default()
	}
	return o.Logger
}

// Registration holds one key under a lease: it grants the lease, puts the
// value, keeps the lease alive (always draining the keepalive channel) and,
// when the lease is lost (expired during an outage or revoked by someone
// else), grants a new one and puts the latest value again. One goroutine
// owns the lease and performs every write, so writes are applied in order.
//
// Put never hands its value to the owner directly: it stores it in a
// latest-value slot and wakes the owner through a 1-buffered channel. The
// owner, whenever it is free (it may spend seconds granting a lease while
// etcd is down), writes whatever the slot holds then, so a caller that gives
// up waiting never loses its value and bursts of updates coalesce into one
// write of the latest.
type Registration struct {
	cli     *clientv3.Client
	key     string
	ttl     int64 // seconds requested
	log     *slog.Logger
	metrics *Metrics

	leaseID atomic.Int64 // current lease, 0 while none; written by the owner

	stateMu sync.Mutex // guards value, seq, waiters and stopped
	value   []byte     // the latest value asked for
	seq     uint64     // how many Puts set value; the owner writes by seq
	waiters []*putWaiter
	stopped error         // why no more values are accepted (Close, closed client); nil while running
	notify  chan struct{} // 1-buffered: value changed since the owner last looked

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the owner (run)
	// watchWG is the delete watch's goroutine: Close revokes before it
	// waits for it, since a watch on a shared client's stream may take
	// hundreds of milliseconds to end (issue 22: a graceful leave of one
	// of 100 registrations on a busy client waited for it).
	watchWG sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

// putWaiter is a Put waiting for the first write attempt that carries its
// value (or a later one).
type putWaiter struct {
	seq   uint64
	reply chan error // 1-buffered; receives exactly once
}

// RouterInfo is a router replica's record under routers/<replica-id>.
type RouterInfo struct {
	Addr    string `json:"addr"`
	Version string `json:"version"`
	// Rate is the replica's request rate in requests per second, as it
	// last published it (replica.Options.RateInterval); nil for a replica
	// that publishes none (older versions), whose peers then share the
	// threshold by the count of replicas.
	Rate *float64 `json:"rate,omitempty"`
}

// MaxRouterRate bounds a published rate: more requests per second than any
// replica serves means a broken record.
const MaxRouterRate = 1e9

// ParseRouterInfo decodes and validates a router record.
func ParseRouterInfo(data []byte) (RouterInfo, error) {
	var ri RouterInfo
	if err := json.Unmarshal(data, &ri); err != nil {
		return RouterInfo{}, fmt.Errorf("membership: decode router record: %w", err)
	}
	if ri.Rate != nil && !(*ri.Rate >= 0 && *ri.Rate <= MaxRouterRate) {
		return RouterInfo{}, fmt.Errorf("membership: router record's rate %v is not in 0..%g requests/s", *ri.Rate, float64(MaxRouterRate))
	}
	return ri, nil
}

// RegisterRouter registers a router replica under routers/<replicaID> with
// a lease. Every watcher counts these keys into fleet.Snapshot.Replicas.
func RegisterRouter(ctx context.Context, cli *clientv3.Client, replicaID string, info RouterInfo, opts Options) (*Registration, error) {
	if err := fleet.ValidateName("router replica id", replicaID); err != nil {
		return nil, err
	}
	data, err := json.Marshal(info)
	if err != nil {
		return nil, fmt.Errorf("membership: encode router record: %w", err)
	}
	return Register(ctx, cli, opts.Layout.RouterKey(replicaID), data, opts)
}

// Register puts value under key with a lease of opts.TTL and keeps it there
// until Close. It returns once the first write succeeded; later failures
// are retried in the background, and a key deleted by someone else is
// written again at once.
//
// Every write is a compare-and-swap: it succeeds only if the key is absent
// or held under this registration's own lease. A key held under another
// lease is waited for up to one TTL and a second (a crashed holder's lease
// expires by then); if it is still held, Register fails with ErrTaken.
func Register(ctx context.Context, cli *clientv3.Client, key string, value []byte, opts Options) (*Registration, error) {
	ttl := int64(math.Ceil(opts.ttl().Seconds()))
	if ttl < 1 {
		ttl = 1
	}
	rctx, cancel := context.WithCancel(context.Background())
	r := &Registration{
		cli: cli, key: key, ttl: ttl,
		log:     opts.logger().With("key", key),
		metrics: opts.Metrics,
		value:   value,
		notify:  make(chan struct{}, 1),
		ctx:     rctx, cancel: cancel,
	}
	lease, err := r.grant(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	rev, err := r.put(ctx, lease.id, value)
	for wait := time.Now().Add(time.Duration(ttl)*time.Second + time.Second); errors.Is(err, ErrTaken) && time.Now().Before(wait); {
		select {
		case <-ctx.Done():
		case <-time.After(takenRetry):
			rev, err = r.put(ctx, lease.id, value)
			continue
		}
		break
	}
	if err != nil {
		lease.stop()
		rc, c := context.WithTimeout(context.Background(), r.opTimeout())
		_, _ = cli.Revoke(rc, lease.id)
		c()
		cancel()
		return nil, err
	}
	r.wg.Add(1)
	go r.run(lease, rev)
	return r, nil
}

// reopenRetry is how soon a registration whose reopened keepalive stream
// is not answered either opens another: the first answer on a healthy
// stream comes within etcd's client's send period (500 ms) plus a round trip.
const reopenRetry = time.Second

// takenRetry paces Register's wait for a key held under another lease.
const takenRetry = 200 * time.Millisecond

// Key returns the registered key.
func (r *Registration) Key() string { return r.key }

// LeaseID returns the current lease, or 0 while the registration has none
// (between losing a lease and granting the next).
func (r *Registration) LeaseID() clientv3.LeaseID { return clientv3.LeaseID(r.leaseID.Load()) }

// Put replaces the value under the current lease. It returns the result of
// the first write attempt that carries value, or ctx's error if that takes
// longer (etcd unreachable); in both cases the owner keeps writing the
// latest value in the background until it succeeds, so the record
// converges once etcd answers again. It fails at once with ErrClosed after
// Close or once the etcd client is closed.
func (r *Registration) Put(ctx context.Context, value []byte) error {
	w, err := r.set(value)
	if err != nil {
		return err
	}
	return r.wait(ctx, w)
}

// set stores value as the latest and wakes the owner; it never blocks on
// the owner. Callers that must order their values (InstanceRegistration)
// call it under their own lock.
func (r *Registration) set(value []byte) (*putWaiter, error) {
	if r.cli.Ctx().Err() != nil {
		return nil, errClientClosed
	}
	r.stateMu.Lock()
	if r.stopped != nil {
		err := r.stopped
		r.stateMu.Unlock()
		return nil, err
	}
	r.value = value
	r.seq++
	w := &putWaiter{seq: r.seq, reply: make(chan error, 1)}
	r.waiters = append(r.waiters, w)
	r.stateMu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default: // already pending: the owner reads the slot, not the signal
	}
	return w, nil
}

func (r *Registration) wait(ctx context.Context, w *putWaiter) error {
	select {
	case err := <-w.reply:
		return err
	case <-r.cli.Ctx().Done():
		// The owner may be inside an etcd call; do not wait for it.
		r.forget(w)
		return errClientClosed
	case <-ctx.Done():
		r.forget(w)
		return fmt.Errorf("membership: %s not written yet, retrying in the background: %w", r.key, ctx.Err())
	}
}

// forget drops w from the waiters (its caller left); the value stays.
func (r *Registration) forget(w *putWaiter) {
	r.stateMu.Lock()
	defer r.stateMu.Unlock()
	if i := slices.Index(r.waiters, w); i >= 0 {
		r.waiters = slices.Delete(r.waiters, i, i+1)
	}
}

// answer replies err to every waiter whose value is at most seq (the
// attempt wrote their value or a later one).
func (r *Registration) answer(seq uint64, err error) {
	r.stateMu.Lock()
	defer r.stateMu.Unlock()
	r.waiters = slices.DeleteFunc(r.waiters, func(w *putWaiter) bool {
		if w.seq > seq {
			return false
		}
		w.reply <- err
		return true
	})
}

// stop refuses further values with err (the first reason wins) and answers
// every waiter with it.
func (r *Registration) stop(err error) {
	r.stateMu.Lock()
	defer r.stateMu.Unlock()
	if r.stopped == nil {
		r.stopped = err
	}
	for _, w := range r.waiters {
		w.reply <- r.stopped
	}
	r.waiters = nil
}

// latest returns the value to write and its seq.
func (r *Registration) latest() ([]byte, uint64) {
	r.stateMu.Lock()
	defer r.stateMu.Unlock()
	return r.value, r.seq
}

// Close stops the keepalive and revokes the lease, which deletes the key at
// once (a graceful stop; a crash lets the lease expire instead). It is safe
// to call more than once and returns the first call's result. If the etcd
// client was closed first it returns at once: the record then expires with
// its lease.
func (r *Registration) Close(ctx context.Context) error {
	r.closeOnce.Do(func() {
		r.stop(ErrClosed)
		r.cancel()
		// Every etcd call of the owner runs under r.ctx, so it returns
		// promptly now; once it has, nothing writes the key any more.
		r.wg.Wait()
		defer r.watchWG.Wait()
		if id := r.LeaseID(); id != 0 && r.cli.Ctx().Err() != nil {
			// Revoking on a closed client only spins in its retries.
			r.closeErr = fmt.Errorf("membership: etcd client closed before the registration; %s expires with its lease", r.key)
		} else if id != 0 {
			if _, err := r.cli.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
				r.closeErr = fmt.Errorf("membership: revoke lease of %s: %w", r.key, err)
			}
			r.leaseID.Store(0)
		}
	})
	return r.closeErr
}

// activeLease is a granted lease whose keepalive runs until stop.
type activeLease struct {
	id   clientv3.LeaseID
	ka   <-chan *clientv3.LeaseKeepAliveResponse
	stop context.CancelFunc
}

func (r *Registration) opTimeout() time.Duration {
	return min(max(time.Duration(r.ttl)*time.Second, time.Second), maxOpTimeout)
}

// grant grants a lease and starts its keepalive. Only the owner (or
// Register before the owner starts) calls it.
func (r *Registration) grant(ctx context.Context) (activeLease, error) {
	gctx, cancel := context.WithTimeout(ctx, r.opTimeout())
	resp, err := r.cli.Grant(gctx, r.ttl)
	cancel()
	if err != nil {
		return activeLease{}, fmt.Errorf("membership: grant lease for %s: %w", r.key, err)
	}
	kctx, stop := context.WithCancel(r.ctx)
	ka, err := r.cli.KeepAlive(kctx, resp.ID)
	if err != nil {
		stop()
		return activeLease{}, fmt.Errorf("membership: keepalive lease for %s: %w", r.key, err)
	}
	r.leaseID.Store(int64(resp.ID))
	return activeLease{id: resp.ID, ka: ka, stop: stop}, nil
}

// reopenKeepAlive starts a keepalive of lease id through a lessor of its
// own, whose stream the client's balancer opens anew (on the next member in
// its rotation); ok is false if it cannot start. Only the owner calls it.
func (r *Registration) reopenKeepAlive(id clientv3.LeaseID) (l activeLease, ok bool) {
	lessor := clientv3.NewLease(r.cli)
	kctx, cancel := context.WithCancel(r.ctx)
	ka, err := lessor.KeepAlive(kctx, id)
	if err != nil {
		cancel()
		_ = lessor.Close()
		return activeLease{}, false
	}
	r.metrics.reopenStream(streamKeepalive)
	return activeLease{id: id, ka: ka, stop: func() {
		cancel()
		_ = lessor.Close() // ends its stream, wherever it is stuck
	}}, true
}

// resume restarts the keepalive of lease id if etcd still holds it (alive);
// a lease that expired or was revoked is not alive. Only the owner calls it.
func (r *Registration) resume(id clientv3.LeaseID) (l activeLease, alive bool, err error) {
	ctx, cancel := context.WithTimeout(r.ctx, r.opTimeout())
	resp, err := r.cli.TimeToLive(ctx, id)
	cancel()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && resp.TTL <= 0) {
		return activeLease{}, false, nil
	}
	if err != nil {
		return activeLease{}, false, fmt.Errorf("membership: look up lease %x of %s: %w", int64(id), r.key, err)
	}
	kctx, stop := context.WithCancel(r.ctx)
	ka, err := r.cli.KeepAlive(kctx, id)
	if err != nil {
		stop()
		return activeLease{}, false, fmt.Errorf("membership: keepalive lease for %s: %w", r.key, err)
	}
	r.leaseID.Store(int64(id))
	r.log.Info("membership: lease resumed", "lease", fmt.Sprintf("%x", id), "ttl_s", resp.TTL)
	return activeLease{id: id, ka: ka, stop: stop}, true, nil
}

// put writes value under lease id if the key is absent or already held
// under id, and returns the revision of the write; otherwise it fails with
// ErrTaken. One round trip: the "absent" branch is a transaction nested in
// the else branch of the "ours" comparison.
func (r *Registration) put(ctx context.Context, id clientv3.LeaseID, value []byte) (int64, error) {
	pctx, cancel := context.WithTimeout(ctx, r.opTimeout())
	defer cancel()
	put := clientv3.OpPut(r.key, string(value), clientv3.WithLease(id))
	resp, err := r.cli.Txn(pctx).
		If(clientv3.Compare(clientv3.LeaseValue(r.key), "=", id)).
		Then(put).
		Else(clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(r.key), "=", 0)},
			[]clientv3.Op{put},
			[]clientv3.Op{clientv3.OpGet(r.key, clientv3.WithKeysOnly())},
		)).Commit()
	if err != nil {
		return 0, fmt.Errorf("membership: put %s: %w", r.key, err)
	}
	if resp.Succeeded {
		return resp.Header.Revision, nil
	}
	inner := resp.Responses[0].GetResponseTxn()
	if inner.GetSucceeded() {
		return resp.Header.Revision, nil
	}
	holder := int64(0)
	if rr := inner.GetResponses(); len(rr) > 0 && len(rr[0].GetResponseRange().GetKvs()) > 0 {
		holder = rr[0].GetResponseRange().GetKvs()[0].Lease
	}
	return 0, fmt.Errorf("%w: %s is held under lease %x, not ours (%x): is another agent or replica running with the same id?", ErrTaken, r.key, holder, int64(id))
}

// run owns the lease: it drains the keepalive channel, writes the latest
// value whenever it changed or the lease was re-granted, and re-grants the
// lease when it is lost.
func (r *Registration) run(lease activeLease, rev int64) {
	defer r.wg.Done()
	// Deletions of the key by anyone but us (etcdctl del, a cleanup
	// script) are written back at once, not left until the lease is lost.
	deleted := make(chan struct{}, 1)
	r.watchWG.Add(1)
	go r.watchDeletes(rev, deleted)
	k := newKeepalives(r, lease)
	defer k.stop()
	var written uint64        // seq of the value last written under the current lease
	dirty := false            // the current lease holds no value yet (granted, put failed)
	var lost clientv3.LeaseID // a lease whose keepalive stream ended, until resumed or found gone
	bo := retryBackoff{min: 100 * time.Millisecond, max: min(time.Duration(r.ttl)*time.Second/2, 2*time.Second)}
	var retry <-chan time.Time
	for {
		if r.cli.Ctx().Err() != nil {
			// The client was closed under us: nothing can be written any
			// more, and the lease expires by itself.
			r.stop(errClientClosed)
			return
		}
		if r.ctx.Err() != nil {
			r.stop(ErrClosed)
			return
		}
		value, seq := r.latest()
		if (k.lease.id == 0 || dirty || seq != written) && retry == nil {
			err := r.step(&k.lease, &lost, value, &dirty)
			if err != nil && (r.cli.Ctx().Err() != nil || r.ctx.Err() != nil) {
				continue // the checks above answer the waiters
			}
			if err != nil {
				r.log.Warn("membership: registration not written, retrying", "err", err)
				retry = time.After(bo.next())
			} else {
				written = seq
				bo.reset()
			}
			r.answer(seq, err)
		}
		k.follow()
		ended := false
		select {
		case <-r.ctx.Done():
		case <-r.cli.Ctx().Done():
		case <-r.notify:
			retry = nil
		case <-k.stalled.C:
			ended = k.silence()
		case _, ok := <-k.lease.ka:
			ended = !ok
			if ok {
				k.heard()
			}
		case _, ok := <-k.hedge.ka:
			if ok {
				k.heard()
			} else {
				k.dropHedge()
			}
		case <-deleted:
			if k.lease.id != 0 {
				r.log.Warn("membership: registration deleted by someone else; writing it again")
				dirty = true
				retry = nil
			}
		case <-retry:
			retry = nil
		}
		if ended {
			lost = k.end()
			retry = nil
		}
	}
}

// keepalives are a registration's lease keepalive streams, owned by its
// run goroutine: the current one and the hedge, the one the last reopen
// replaced, kept running in case its stream answers again (a slow member
// rather than a silent one), with the watch over their silence.
//
// etcd's client sends a keepalive TTL/3 after the last answer, on its next
// 500 ms tick. Silence well past that (half a TTL, and at least TTL/3 plus
// a second) means the stream's member has stopped answering while its
// connection stays open (a hung host, dropped packets): etcd's client keeps
// the stream there until gRPC keepalive gives up on the connection (13 s),
// and the lease would expire meanwhile. A whole TTL of silence counts as the
// keepalive ending, as etcd's client would say it had, had the stream not
// been reopened.
type keepalives struct {
	r            *Registration
	lease, hedge activeLease
	ttl, quiet   time.Duration
	stalled      *time.Timer
	watched      clientv3.LeaseID // the lease stalled watches
	answered     time.Time        // when it was last answered (or held from)
	reopened     int              // keepalives reopened since the last answer
}

func newKeepalives(r *Registration, lease activeLease) *keepalives {
	ttl := time.Duration(r.ttl) * time.Second
	quiet := max(ttl/2, ttl/3+time.Second)
	return &keepalives{r: r, lease: lease, ttl: ttl, quiet: quiet, stalled: time.NewTimer(quiet)}
}

// follow restarts the silence watch when the lease changed (step granted
// or resumed one), and drops a hedge of a lease no longer held.
func (k *keepalives) follow() {
	if k.lease.id != k.watched {
		k.watched, k.answered, k.reopened = k.lease.id, time.Now(), 0
		k.stalled.Reset(k.quiet)
	}
	if k.hedge.id != k.lease.id {
		k.dropHedge()
	}
}

// heard notes an answer on either stream.
func (k *keepalives) heard() {
	k.answered, k.reopened = time.Now(), 0
	k.stalled.Reset(k.quiet)
}

// silence handles the silence watch firing: a whole TTL without an answer
// ends the keepalive (it returns true); less keeps the lease alive on a
// new stream too.
func (k *keepalives) silence() (ended bool) {
	next := k.quiet
	switch {
	case k.lease.id == 0:
	case time.Since(k.answered) >= k.ttl:
		return true
	default:
		if k.reopened == 0 { // once per silence: etcd may be down for long
			k.r.log.Warn("membership: no lease keepalive answer for half a TTL; keeping the lease alive on a new stream too", "lease", fmt.Sprintf("%x", k.lease.id))
		}
		if l, ok := k.r.reopenKeepAlive(k.lease.id); ok {
			k.reopened++
			k.dropHedge()
			k.hedge, k.lease = k.lease, l
		}
		// The new stream may have gone to the silent member too (the
		// client's balancer still counts it ready): try the next sooner
		// than half a TTL.
		next = min(k.quiet, reopenRetry)
	}
	k.stalled.Reset(next)
	return false
}

// end stops the keepalive of the current lease and returns the lease, for
// the owner to resume if etcd still holds it.
func (k *keepalives) end() clientv3.LeaseID {
	k.r.log.Warn("membership: lease keepalive ended; resuming the lease if etcd still holds it, else granting a new one", "lease", fmt.Sprintf("%x", k.lease.id))
	k.dropHedge()
	k.lease.stop()
	lost := k.lease.id
	k.lease = activeLease{}
	k.r.leaseID.Store(0)
	return lost
}

func (k *keepalives) dropHedge() {
	if k.hedge.stop != nil {
		k.hedge.stop()
	}
	k.hedge = activeLease{}
}

// stop ends both streams and the silence watch.
func (k *keepalives) stop() {
	k.stalled.Stop()
	for _, l := range []activeLease{k.lease, k.hedge} {
		if l.stop != nil {
			l.stop()
		}
	}
}

// watchDeletes signals deleted (1-buffered, never blocking) whenever the key
// is deleted after revision rev. It runs beside the owner because
// clientv3's Watch blocks while etcd is unreachable, and the owner must not.
// When a watch ends (compaction, a cut stream) it signals once, in case a
// deletion fell in the gap, and watches again from the current revision.
func (r *Registration) watchDeletes(rev int64, deleted chan<- struct{}) {
	defer r.watchWG.Done()
	signal := func() {
		select {
		case deleted <- struct{}{}:
		default:
		}
	}
	for r.ctx.Err() == nil && r.cli.Ctx().Err() == nil {
		opts := []clientv3.OpOption{clientv3.WithFilterPut()}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev+1))
		}
		for wr := range r.cli.Watch(r.ctx, r.key, opts...) {
			if wr.Err() != nil {
				break
			}
			if len(wr.Events) > 0 {
				signal()
			}
		}
		rev = 0
		if r.ctx.Err() != nil {
			return
		}
		signal()
		select {
		case <-r.ctx.Done():
		case <-time.After(takenRetry):
		}
	}
}

// step resumes the lost lease if etcd still holds it, else grants a lease
// if there is none, and writes value under it.
func (r *Registration) step(lease *activeLease, lost *clientv3.LeaseID, value []byte, dirty *bool) error {
	if lease.id == 0 && *lost != 0 {
		// The keepalive stream ends when etcd has not answered for a TTL
		// (an outage, a restart), but etcd may still hold the lease: a
		// member that becomes leader extends every lease by its TTL. A new
		// lease could not take the key before the old one expired, and
		// every router would drop the instance until then.
		l, alive, err := r.resume(*lost)
		if err != nil {
			return err
		}
		if alive {
			*lease = l
		}
		*lost = 0
	}
	if lease.id == 0 {
		l, err := r.grant(r.ctx)
		if err != nil {
			return err
		}
		r.metrics.leaseRegranted()
		*lease = l
		*dirty = true
	}
	if _, err := r.put(r.ctx, lease.id, value); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			// Expired while etcd was unreachable, or revoked by someone
			// else: grant a new one next.
			lease.stop()
			*lease = activeLease{}
			r.leaseID.Store(0)
		}
		return err
	}
	*dirty = false
	return nil
}

// retryBackoff doubles from min to max, each wait drawn between half and
// all of the current step: thousands of registrations (or a hundred
// watchers) that failed together must not retry together (issue 22).
type retryBackoff struct {
	min, max, cur time.Duration
}

func (b *retryBackoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	return b.cur/2 + rand.N(b.cur/2+1)
}

func (b *retryBackoff) reset() { b.cur = 0 }

// InstanceRegistration is a model-server instance's record under
// endpoints/<endpoint>/instances/<id>, held by a Registration.
type InstanceRegistration struct {
	*Registration

	mu   sync.Mutex // guards inst
	inst fleet.Instance
}

// RegisterInstance validates in and registers it under the endpoint with a
// lease. RegisteredAt is set to the current time when zero.
func RegisterInstance(ctx context.Context, cli *clientv3.Client, endpoint string, in fleet.Instance, opts Options) (*InstanceRegistration, error) {
	if err := fleet.ValidateName("endpoint name", endpoint); err != nil {
		return nil, err
	}
	if err := in.Validate(); err != nil {
		return nil, err
	}
	if in.RegisteredAt.IsZero() {
		in.RegisteredAt = time.Now().UTC()
	}
	in.Adapters = append([]string(nil), in.Adapters...)
	data, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("membership: encode instance: %w", err)
	}
	reg, err := Register(ctx, cli, opts.Layout.InstanceKey(endpoint, in.ID), data, opts)
	if err != nil {
		return nil, err
	}
	return &InstanceRegistration{Registration: reg, inst: in}, nil
}

// Instance returns a copy of the record as last requested.
func (r *InstanceRegistration) Instance() fleet.Instance {
	r.mu.Lock()
	defer r.mu.Unlock()
	return cloneInstance(r.inst)
}

// Update applies fn to a copy of the record and writes it in place under
// the same lease. The id cannot change. Instance reports the new record at
// once. Like Registration.Put, Update does not lose the record when it
// returns ctx's error or a failed write: the owner keeps writing the latest
// record until etcd accepts it. After Close, or once the etcd client is
// closed, it fails at once with ErrClosed and leaves the record unchanged.
func (r *InstanceRegistration) Update(ctx context.Context, fn func(*fleet.Instance)) error {
	r.mu.Lock()
	next := cloneInstance(r.inst)
	fn(&next)
	if next.ID != r.inst.ID {
		r.mu.Unlock()
		return fmt.Errorf("membership: instance id cannot change (%q → %q)", r.inst.ID, next.ID)
	}
	if err := next.Validate(); err != nil {
		r.mu.Unlock()
		return err
	}
	data, err := json.Marshal(next)
	if err != nil {
		r.mu.Unlock()
		return fmt.Errorf("membership: encode instance: %w", err)
	}
	// set under mu: the slot takes records in the order they changed
	// r.inst, so the last change is the one written.
	w, err := r.set(data)
	if err != nil {
		r.mu.Unlock()
		return err
	}
	r.inst = next
	r.mu.Unlock()
	return r.wait(ctx, w)
}

// SetAdapters replaces the instance's adapter list.
func (r *InstanceRegistration) SetAdapters(ctx context.Context, adapters []string) error {
	return r.Update(ctx, func(in *fleet.Instance) { in.Adapters = append([]string(nil), adapters...) })
}

// SetDraining marks the instance draining (routers send it no new requests)
// or serving again.
func (r *InstanceRegistration) SetDraining(ctx context.Context, draining bool) error {
	return r.Update(ctx, func(in *fleet.Instance) { in.Draining = draining })
}

func cloneInstance(in fleet.Instance) fleet.Instance {
	in.Adapters = append([]string(nil), in.Adapters...)
	in.ActiveAdapters = append([]string(nil), in.ActiveAdapters...)
	in.BusyAdapters = append([]string(nil), in.BusyAdapters...)
	if in.Labels != nil {
		labels := make(map[string]string, len(in.Labels))
		for k, v := range in.Labels {
			labels[k] = v
		}
		in.Labels = labels
	}
	return in
}
