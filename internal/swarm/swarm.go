// Package swarm measures membership at fleet scale: one embedded etcd, N
// simulated instances registered through membership.RegisterInstance (many
// per process, sharing etcd clients), R router replicas' membership
// watchers in process, and churn (joins, graceful leaves, crashes). It
// reports how long the replicas take to agree on the fleet, how fast a
// change reaches all of them, what etcd serves per second, what a replica
// holds in memory and what a snapshot and a pick cost at N (issue 22; the
// figures are in docs/operations.md, "Fleet size limits").
//
// Only membership runs: no model server answers and no request is routed,
// so the figures are those of the control plane alone.
package swarm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/probe"
)

// endpoint is the one endpoint every instance registers under.
const endpoint = "swarm"

// run is one run's parts; Run owns it and stops everything it started.
type run struct {
	o      Options
	etcd   *membership.Embedded // nil with Options.Etcd
	eps    []string             // etcd's client URLs
	opts   membership.Options
	shared []*clientv3.Client // the initial instances' clients

	tmp    string                                      // etcd's data directory when Run made it
	regs   map[string]*membership.InstanceRegistration // live instances by id
	own    map[string]*clientv3.Client                 // joined instances' own clients
	joined []string                                    // live joined instances, crash candidates
	builds *membership.Metrics                         // every watcher's, for the build histogram

	watchers []*membership.Watcher
	wclients []*clientv3.Client
	track    *tracker
	rng      *rand.Rand
}

// Run runs the swarm and returns its report. Every registration, watcher,
// client and the etcd member are stopped before it returns.
func Run(ctx context.Context, o Options) (*Report, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	rep := &Report{Options: o, LoadBefore: loadAverage()}
	r := &run{o: o, regs: map[string]*membership.InstanceRegistration{}, own: map[string]*clientv3.Client{},
		rng: rand.New(rand.NewPCG(o.Seed, 0x5a))}
	defer r.stop()
	if err := r.startEtcd(); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	r.builds = membership.NewMetrics(reg)
	r.opts = membership.Options{TTL: o.TTL, Logger: o.Logger}

	heap0 := heapInUse()
	if err := r.register(ctx, rep); err != nil {
		return rep, err
	}
	heap1 := heapInUse()
	rep.HeapPerInstance = float64(heap1-heap0) / float64(o.Instances)

	if err := r.startReplicas(ctx, rep); err != nil {
		return rep, err
	}
	rep.HeapPerReplica = float64(heapInUse()-heap1) / float64(o.Replicas)
	rep.BuildAtList = histogramOf(reg)

	if err := r.quiet(ctx, rep); err != nil {
		return rep, err
	}
	before := histogramOf(reg)
	if err := r.churn(ctx, rep); err != nil {
		return rep, err
	}
	rep.BuildPerChange = histogramOf(reg).minus(before)
	rep.Pick = measurePick(r.watchers[0].Snapshot().Endpoint(endpoint))
	rep.LoadAfter = loadAverage()
	return rep, nil
}

func (r *run) startEtcd() error {
	if r.o.Etcd != "" {
		r.eps = []string{r.o.Etcd}
		return nil
	}
	dir := r.o.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "swarm-etcd-")
		if err != nil {
			return fmt.Errorf("swarm: %w", err)
		}
		dir, r.tmp = d, d
	}
	var eo []membership.EmbeddedOption
	if r.o.FastTicks {
		eo = append(eo, membership.WithFastTicks())
	}
	e, err := membership.StartEmbedded(dir, "http://127.0.0.1:0", eo...)
	if err != nil {
		return err
	}
	r.etcd, r.eps = e, e.Endpoints()
	return nil
}

func (r *run) client() (*clientv3.Client, error) {
	return membership.NewClient(membership.ClientOptions{Endpoints: r.eps})
}

// counters reads etcd's counters: scraped from an external member, or
// from this process's default registry where the embedded member
// registers them.
func (r *run) counters(ctx context.Context) etcdCounters {
	if r.o.Etcd == "" {
		mfs, err := prometheus.DefaultGatherer.Gather()
		if err != nil {
			return etcdCounters{}
		}
		return countersOf(mfs)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := probe.Scrape(ctx, http.DefaultClient, strings.TrimRight(r.o.Etcd, "/")+"/metrics")
	if err != nil {
		return etcdCounters{}
	}
	mfs := make([]*dto.MetricFamily, 0, len(m))
	for _, mf := range m {
		mfs = append(mfs, mf)
	}
	return countersOf(mfs)
}

// register registers the initial instances, PerClient to a client,
// Registrations at a time.
func (r *run) register(ctx context.Context, rep *Report) error {
	n := r.o.Instances
	for i := 0; i < n; i += r.o.PerClient {
		c, err := r.client()
		if err != nil {
			return err
		}
		r.shared = append(r.shared, c)
	}
	start := time.Now()
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	next := make(chan int)
	for range min(r.o.Registrations, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				id := fmt.Sprintf("sim-%05d", i)
				reg, err := membership.RegisterInstance(ctx, r.shared[i/r.o.PerClient], endpoint, instance(id, i), r.opts)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					r.regs[id] = reg
				}
				mu.Unlock()
			}
		}()
	}
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(next)
	wg.Wait()
	rep.RegisterTime = time.Since(start)
	fmt.Fprintf(r.o.Progress, "registered %d instances on %d clients in %v\n", len(r.regs), len(r.shared), rep.RegisterTime.Round(time.Millisecond))
	if len(errs) > 0 {
		return fmt.Errorf("swarm: %d of %d registrations failed, first: %w", len(errs), n, errs[0])
	}
	return ctx.Err()
}

// instance is a simulated instance's record. Its address is never dialed.
func instance(id string, i int) fleet.Instance {
	return fleet.Instance{ID: id, Addr: fmt.Sprintf("http://127.%d.%d.%d:8000", i>>16&255, i>>8&255, i&255),
		Adapters: []string{"lora-a"}, Labels: map[string]string{"zone": fmt.Sprintf("z%d", i%3)}}
}

// startReplicas starts the watchers (all at once, or StartWave at a time)
// and waits until every one has published a snapshot listing every
// instance.
func (r *run) startReplicas(ctx context.Context, rep *Report) error {
	want := r.liveIDs()
	r.track = newTracker(r.o.Replicas)
	ev := r.track.begin("start", func(ep *fleet.Endpoint) bool { return ep != nil && len(ep.Instances) == len(want) })
	wave := r.o.StartWave
	if wave == 0 {
		wave = r.o.Replicas
	}
	for first := 0; first < r.o.Replicas; first += wave {
		n := min(wave, r.o.Replicas-first)
		for i := first; i < first+n; i++ {
			c, err := r.client()
			if err != nil {
				return err
			}
			r.wclients = append(r.wclients, c)
			w := membership.StartWatcher(c, membership.WatcherOptions{Options: membership.Options{
				TTL: r.o.TTL, Logger: r.opts.Logger, Metrics: r.builds,
			}}, r.track.observer(i))
			r.watchers = append(r.watchers, w)
		}
		// Every replica lists every record at once: allow 10 ms of this
		// machine's time per replica and thousand instances beyond the wait.
		if err := r.track.waitLeft(ctx, ev, r.o.Replicas-first-n, r.o.Wait+time.Duration(n*r.o.Instances)*10*time.Microsecond); err != nil {
			return err
		}
	}
	if ts := r.track.times(ev); len(ts) > 0 {
		rep.FirstAgreed = ts[len(ts)-1]
	}
	agreed, _ := r.agreement(want)
	if agreed != r.o.Replicas {
		return fmt.Errorf("swarm: %d of %d replicas agree on the first full snapshot", agreed, r.o.Replicas)
	}
	fmt.Fprintf(r.o.Progress, "%d replicas agree on %d instances %v after they started (%d at a time)\n", r.o.Replicas, len(want), rep.FirstAgreed.Round(time.Millisecond), wave)
	return nil
}

// quiet measures the steady load: nothing changes for Quiet.
func (r *run) quiet(ctx context.Context, rep *Report) error {
	a, cpu0, t0 := r.counters(ctx), processCPU(), time.Now()
	select {
	case <-time.After(r.o.Quiet):
	case <-ctx.Done():
		return ctx.Err()
	}
	z := r.counters(ctx)
	rep.Quiet = z.rates(a, time.Since(t0))
	rep.EtcdMemory = z.rss
	rep.QuietCPU = (processCPU() - cpu0).Seconds() / time.Since(t0).Seconds()
	fmt.Fprintf(r.o.Progress, "quiet %v: %.0f keepalives/s, process CPU %.2f cores\n", r.o.Quiet, rep.Quiet.KeepAlives, rep.QuietCPU)
	return nil
}

// churn runs the joins, leaves and crashes one after the other.
func (r *run) churn(ctx context.Context, rep *Report) error {
	plan := r.plan()
	if r.o.ChurnProfile != nil {
		if err := pprof.StartCPUProfile(r.o.ChurnProfile); err != nil {
			return fmt.Errorf("swarm: churn profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	a, t0, cpu0 := r.counters(ctx), time.Now(), processCPU()
	gap := time.Duration(0)
	if r.o.Rate > 0 {
		gap = time.Duration(float64(time.Second) / r.o.Rate)
	}
	for k, kind := range plan {
		started := time.Now()
		ev, err := r.event(ctx, kind)
		if err != nil {
			return err
		}
		wait := r.o.Wait
		if kind == Crash {
			wait += r.o.TTL
		}
		if err := r.track.wait(ctx, ev, wait); err != nil {
			rep.Missed++
			fmt.Fprintf(r.o.Progress, "event %d (%s %s): %v\n", k, kind, ev.id, err)
		}
		rep.add(kind, Event{ID: ev.id, Call: ev.call, Delays: r.track.times(ev)})
		agreed, ok := r.agreement(r.liveIDs())
		rep.Checks++
		if ok && agreed == r.o.Replicas {
			rep.Agreed++
		}
		if d := gap - time.Since(started); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	rep.ChurnTime, rep.ChurnCPU = time.Since(t0), processCPU()-cpu0
	rep.Churn = r.counters(ctx).rates(a, rep.ChurnTime)
	fmt.Fprintf(r.o.Progress, "churn: %d events in %v, %d of %d agreement checks passed\n", len(plan), rep.ChurnTime.Round(time.Millisecond), rep.Agreed, rep.Checks)
	return nil
}

// Event kinds.
const (
	Join  = "join"
	Leave = "leave"
	Crash = "crash"
)

// plan interleaves the events: join, leave, then a crash of a joined
// instance, while each kind lasts.
func (r *run) plan() []string {
	var out []string
	j, l, c := r.o.Joins, r.o.Leaves, r.o.Crashes
	for j+l+c > 0 {
		if j > 0 {
			out = append(out, Join)
			j--
		}
		if l > 0 {
			out = append(out, Leave)
			l--
		}
		if c > 0 && r.o.Joins-j > r.o.Crashes-c {
			out = append(out, Crash)
			c--
		}
	}
	return out
}

// event starts one churn event and returns its tracker.
func (r *run) event(ctx context.Context, kind string) (*event, error) {
	switch kind {
	case Join:
		id := fmt.Sprintf("join-%05d", len(r.own))
		c, err := r.client()
		if err != nil {
			return nil, err
		}
		r.own[id] = c
		ev := r.track.begin(id, present(id))
		reg, err := membership.RegisterInstance(ctx, c, endpoint, instance(id, r.o.Instances+len(r.own)), r.opts)
		ev.call = time.Since(ev.start)
		if err != nil {
			return nil, err
		}
		r.regs[id], r.joined = reg, append(r.joined, id)
		return ev, nil
	case Leave:
		ids := r.liveIDs()
		var id string
		for id == "" || !strings.HasPrefix(id, "sim-") {
			id = ids[r.rng.IntN(len(ids))]
		}
		ev := r.track.begin(id, absent(id))
		cctx, cancel := context.WithTimeout(ctx, r.o.Wait)
		defer cancel()
		err := r.regs[id].Close(cctx)
		ev.call = time.Since(ev.start)
		delete(r.regs, id)
		return ev, err
	default: // Crash: the client goes away, the lease expires
		id := r.joined[0]
		r.joined = r.joined[1:]
		ev := r.track.begin(id, absent(id))
		err := r.own[id].Close()
		delete(r.own, id)
		_ = r.regs[id].Close(ctx) // returns at once: the client is closed
		delete(r.regs, id)
		return ev, err
	}
}

// liveIDs returns the ids registered now, sorted.
func (r *run) liveIDs() []string {
	ids := make([]string, 0, len(r.regs))
	for id := range r.regs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// agreement counts the replicas whose current snapshot lists exactly want
// (and reports whether they all list the same records, revisions included).
func (r *run) agreement(want []string) (agreed int, same bool) {
	same = true
	var first []fleet.Instance
	for i, w := range r.watchers {
		ep := w.Snapshot().Endpoint(endpoint)
		var insts []fleet.Instance
		if ep != nil {
			insts = ep.Instances
		}
		if slices.EqualFunc(insts, want, func(in fleet.Instance, id string) bool { return in.ID == id }) {
			agreed++
		}
		if i == 0 {
			first = insts
		} else if !slices.EqualFunc(insts, first, func(a, b fleet.Instance) bool { return a.ID == b.ID && a.Revision == b.Revision }) {
			same = false
		}
	}
	return agreed, same
}

// stop closes everything in reverse order of start. Registrations are not
// revoked one by one (10,000 revokes take longer than the run's point):
// their clients close and etcd stops.
func (r *run) stop() {
	for _, w := range r.watchers {
		_ = w.Close()
	}
	for _, c := range r.wclients {
		_ = c.Close()
	}
	for _, c := range r.own {
		_ = c.Close()
	}
	for _, c := range r.shared {
		_ = c.Close()
	}
	for _, reg := range r.regs {
		_ = reg.Close(context.Background()) // returns at once: its client is closed
	}
	if r.etcd != nil {
		_ = r.etcd.Close()
	}
	if r.tmp != "" {
		_ = os.RemoveAll(r.tmp)
	}
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
