package chaos

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/overload"
	"github.com/prefixrouter/prefixrouter/probe"
)

// convergeTimeout bounds every wait for the replicas to converge: far above
// a TTL plus the watch delay, so that hitting it means a bug.
const convergeTimeout = 60 * time.Second

// Result is one cycle of one scenario.
type Result struct {
	Scenario string `json:"scenario"`
	Cycle    int    `json:"cycle"`
	// Event says what happened ("added sim-7").
	Event string `json:"event"`
	// InstancesBefore and InstancesAfter the event.
	InstancesBefore int `json:"instances_before"`
	InstancesAfter  int `json:"instances_after"`
	// Convergence is the time from the event (the agent action: the call
	// that starts an instance and its agent, or stops it, or the crash)
	// until every replica's snapshot shows it; for a crash it is the detection time (≈ TTL). Removed is, for a
	// graceful stop, the time until the key is gone (Convergence is the
	// time until every replica sees it draining and routes around it).
	Convergence time.Duration    `json:"convergence_ns"`
	Removed     time.Duration    `json:"removed_ns,omitempty"`
	Movement    *Movement        `json:"movement,omitempty"`
	Load        *Load            `json:"load,omitempty"`
	Outage      *Outage          `json:"outage,omitempty"`
	Breaker     *Breaker         `json:"breaker,omitempty"`
	Hang        *Hang            `json:"hang,omitempty"`
	Adapter     *AdapterMovement `json:"adapter,omitempty"`
	// Checks are the properties the scenario promises.
	Checks []Check `json:"checks"`
	// Err is set when the scenario could not complete.
	Err string `json:"error,omitempty"`
}

// Check is one promised property and whether it held.
type Check struct {
	Name   string `json:"name"`
	Pass   bool   `json:"pass"`
	Detail string `json:"detail"`
}

// Passed reports whether every check passed and the scenario completed.
func (r *Result) Passed() bool {
	if r.Err != "" {
		return false
	}
	for _, c := range r.Checks {
		if !c.Pass {
			return false
		}
	}
	return true
}

func (r *Result) check(name string, pass bool, format string, args ...any) {
	r.Checks = append(r.Checks, Check{Name: name, Pass: pass, Detail: fmt.Sprintf(format, args...)})
}

// Outage describes the etcd-outage scenario.
type Outage struct {
	Window time.Duration `json:"window_ns"`
	// MinInstances and MaxInstances seen on any replica while etcd was
	// down; SnapshotsChanged counts replicas whose instance set changed
	// meanwhile (static stability promises 0).
	MinInstances     int `json:"min_instances"`
	MaxInstances     int `json:"max_instances"`
	SnapshotsChanged int `json:"snapshots_changed"`
	// RecoveryMinInstances is the fewest instances any replica listed
	// between the restart and convergence (a dip means a lease lapsed).
	RecoveryMinInstances int `json:"recovery_min_instances"`
	// Restart is how long etcd took to start again; Recovered the time from
	// the restart to every replica listing the instance added after it.
	Restart   time.Duration `json:"restart_ns"`
	Recovered time.Duration `json:"recovered_ns"`
}

// Breaker describes the failing-instance scenario.
type Breaker struct {
	Instance string `json:"instance"`
	// ConsecutiveFailures that open a breaker; OpenTimeout before a probe.
	ConsecutiveFailures uint32        `json:"consecutive_failures"`
	OpenTimeout         time.Duration `json:"open_timeout_ns"`
	// Opened is the time from the fault to every replica's breaker being
	// open (0 and OpenedAll false if some replica's never opened).
	Opened    time.Duration `json:"opened_ns"`
	OpenedAll bool          `json:"opened_all"`
	// ErrorsBeforeOpen: 5xx from the faulty instance that reached clients
	// before the breaker of the replica they went through opened (the
	// router passes upstream 5xx through). ErrorsAfterOpen: the same
	// after it opened (half-open probes that failed).
	ErrorsBeforeOpen int `json:"errors_before_open"`
	ErrorsAfterOpen  int `json:"errors_after_open"`
	// Closed is the time from clearing the fault to every replica's
	// breaker being closed again (open timeout + a successful probe).
	Closed    time.Duration `json:"closed_ns"`
	ClosedAll bool          `json:"closed_all"`
}

// Hang describes the hung-instance scenario.
type Hang struct {
	Instance string `json:"instance"`
	// Interval and Timeout of the health checks; UnhealthyThreshold
	// consecutive failed probes mark an instance down.
	Interval           time.Duration `json:"interval_ns"`
	Timeout            time.Duration `json:"timeout_ns"`
	UnhealthyThreshold int           `json:"unhealthy_threshold"`
	// Detected is the time from the freeze to every replica marking it down
	// (DetectedAll false if some replica never did).
	Detected    time.Duration `json:"detected_ns"`
	DetectedAll bool          `json:"detected_all"`
	// Stuck: requests routed to it between the freeze and detection, which
	// waited until it was unfrozen; StuckLongest the longest of them.
	Stuck        int           `json:"stuck"`
	StuckLongest time.Duration `json:"stuck_longest_ns"`
	// AfterDetection: requests sent between detection and the unfreeze;
	// RoutedToIt those of them that went to it anyway (promised 0).
	AfterDetection int `json:"after_detection"`
	RoutedToIt     int `json:"routed_to_it"`
	// Recovered is the time from the unfreeze to every replica marking it
	// up again.
	Recovered    time.Duration `json:"recovered_ns"`
	RecoveredAll bool          `json:"recovered_all"`
}

type suite struct {
	cfg    Options
	f      *localfleet.Fleet
	probes [][]byte
	rng    *rand.Rand
	// adapterProbes are each chaos adapter's probe bodies; nil until the
	// first adapter scenario catalogued the adapters.
	adapterProbes map[string][][]byte
}

func (s *suite) run(ctx context.Context, name string) *Result {
	res := &Result{Scenario: name, InstancesBefore: len(s.f.IDs())}
	var err error
	for _, sc := range scenarios {
		if sc.name == name {
			err = sc.run(s, ctx, res)
		}
	}
	res.InstancesAfter = len(s.f.IDs())
	if err != nil {
		res.Err = err.Error()
	}
	return res
}

// measure returns every replica's primary of every probe.
func (s *suite) measure() (owners, error) {
	return primaries(s.f.Replicas(), s.f.Endpoint(), s.probes)
}

// converge waits until every replica lists exactly ids.
func (s *suite) converge(ctx context.Context, ids []string) error {
	ctx, cancel := context.WithTimeout(ctx, convergeTimeout)
	defer cancel()
	return s.f.WaitFor(ctx, s.f.HasInstances(ids...))
}

// withLoad runs the background load for a window, then event, then (after
// event returned, the fleet converged) another window, and summarizes it.
func (s *suite) withLoad(ctx context.Context, crash func() *inFlightAt, event func() error) (*Load, error) {
	l := startLoad(s.f.RouterURLs(), s.cfg.LoadRate, s.cfg.Seed)
	err := sleep(ctx, s.cfg.LoadWindow)
	if err == nil {
		err = event()
	}
	if err == nil {
		err = sleep(ctx, s.cfg.LoadWindow)
	}
	recs, skipped := l.stop()
	var c *inFlightAt
	if crash != nil {
		c = crash()
	}
	return summarize(recs, skipped, l.stopped.Sub(l.started), c), err
}

// sleep waits for d; a window of the scenario, not a wait for a condition.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// movementChecks adds the movement properties every membership change
// promises.
func movementChecks(res *Result, m *Movement) {
	res.Movement = m
	res.check("zero collateral moves", m.Collateral == 0, "%d of %d keys moved between two unchanged instances", m.Collateral, m.Keys)
	res.check("replicas agree", m.AgreementAfter == 1, "%.4f%% of keys have the same primary on every replica after convergence", 100*m.AgreementAfter)
	dev := (m.MovedFraction - m.Nominal) / m.Sigma
	if m.Added {
		res.check("moved ≈ 1/(N+1)", dev >= -4 && dev <= 4, "moved %.4f vs 1/(N+1) = %.4f: %+.1fσ (σ = %.4f for %d keys)", m.MovedFraction, m.Nominal, dev, m.Sigma, m.Keys)
	} else {
		res.check("moved = removed instance's share", m.MovedFraction == m.Ideal, "moved %.4f, its share %.4f", m.MovedFraction, m.Ideal)
		res.check("share ≈ 1/N", dev >= -4 && dev <= 4, "share %.4f vs 1/N = %.4f: %+.1fσ (σ = %.4f for %d keys)", m.Ideal, m.Nominal, dev, m.Sigma, m.Keys)
	}
}

func noFailures(res *Result, l *Load) {
	res.Load = l
	res.check("no failed request", l.Failed == 0 && l.Sent > 0, "%d of %d requests failed %v", l.Failed, l.Sent, l.ByKind)
}

func (s *suite) scaleUp(ctx context.Context, res *Result) error {
	ids := s.f.IDs()
	before, err := s.measure()
	if err != nil {
		return err
	}
	var added string
	l, err := s.withLoad(ctx, nil, func() error {
		// From the agent action: AddInstance starts the server and its
		// agent, and returns once the agent's key is in etcd.
		t0 := time.Now()
		in, err := s.f.AddInstance(ctx)
		if err != nil {
			return err
		}
		added = in.ID
		if err := s.converge(ctx, append(slices.Clone(ids), in.ID)); err != nil {
			return err
		}
		res.Convergence = time.Since(t0)
		return nil
	})
	if err != nil {
		return err
	}
	res.Event = "added " + added
	after, err := s.measure()
	if err != nil {
		return err
	}
	movementChecks(res, compare(before, after, added, true, len(ids), len(ids)+1))
	noFailures(res, l)
	return nil
}

func (s *suite) scaleDown(ctx context.Context, res *Result) error {
	victim, rest, err := s.victim("scale-down")
	if err != nil {
		return err
	}
	res.Event = "stopped " + victim + " gracefully"
	before, err := s.measure()
	if err != nil {
		return err
	}
	l, err := s.withLoad(ctx, nil, func() error {
		in := s.f.Instance(victim)
		t0 := time.Now()
		stopped := make(chan struct{})
		go func() { defer close(stopped); s.f.StopInstance(in) }()
		// Routing moves once every replica sees the instance draining.
		cctx, cancel := context.WithTimeout(ctx, convergeTimeout)
		err := s.f.WaitFor(cctx, func(sn *fleet.Snapshot) bool { return routedAround(sn, s.f.Endpoint(), victim) })
		cancel()
		if err == nil {
			res.Convergence = time.Since(t0)
			if err = s.converge(ctx, rest); err == nil {
				res.Removed = time.Since(t0)
			}
		}
		<-stopped // bounded by the fleet's drain timeout
		return err
	})
	if err != nil {
		return err
	}
	after, err := s.measure()
	if err != nil {
		return err
	}
	movementChecks(res, compare(before, after, victim, false, len(rest)+1, len(rest)))
	noFailures(res, l)
	return nil
}

// routedAround: the endpoint lists id as draining, or not at all.
func routedAround(sn *fleet.Snapshot, endpoint, id string) bool {
	ep := sn.Endpoint(endpoint)
	if ep == nil {
		return false
	}
	for _, in := range ep.Instances {
		if in.ID == id {
			return in.Draining
		}
	}
	return true
}

func (s *suite) crash(ctx context.Context, res *Result) error {
	victim, rest, err := s.victim("crash")
	if err != nil {
		return err
	}
	res.Event = "crashed " + victim
	before, err := s.measure()
	if err != nil {
		return err
	}
	var window inFlightAt
	var stillRouted bool
	l, err := s.withLoad(ctx, func() *inFlightAt { return &window }, func() error {
		in := s.f.Instance(victim)
		window.from, window.instance = time.Now(), victim
		s.f.CrashInstance(in)
		window.to = time.Now()
		// Keys stay on the dead instance until its lease expires: routers
		// learn of a crash only through etcd.
		stillRouted = allList(s.f, victim)
		if err := s.converge(ctx, rest); err != nil {
			return err
		}
		res.Convergence = time.Since(window.from)
		return nil
	})
	if err != nil {
		return err
	}
	after, err := s.measure()
	if err != nil {
		return err
	}
	movementChecks(res, compare(before, after, victim, false, len(rest)+1, len(rest)))
	res.Load = l
	ttl := s.cfg.TTL
	res.check("listed until its lease expires", stillRouted, "every replica still listed %s right after the crash", victim)
	res.check("detection ≈ TTL", res.Convergence >= ttl/2 && res.Convergence <= 2*ttl+time.Second,
		"removed from every replica %v after the crash (TTL %v)", res.Convergence.Round(time.Millisecond), ttl)
	res.check("no failure but in-flight ones", l.FailedOther == 0 && l.Sent > 0,
		"%d of %d requests failed: %d in flight on %s at the crash, %d other %v", l.Failed, l.Sent, l.FailedInFlight, victim, l.FailedOther, l.ByKind)
	return nil
}

func allList(f *localfleet.Fleet, id string) bool {
	for _, r := range f.Replicas() {
		ep := r.Router().Snapshot().Endpoint(f.Endpoint())
		if ep == nil || !slices.ContainsFunc(ep.Instances, func(in fleet.Instance) bool { return in.ID == id }) {
			return false
		}
	}
	return true
}

// sampler records the instance count every replica lists, every 5 ms.
type sampler struct {
	f      *localfleet.Fleet
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex // guards the fields below
	min, max int
	sets     []string // each replica's first instance set, joined
	changed  map[int]bool
}

func startSampler(f *localfleet.Fleet) *sampler {
	ctx, cancel := context.WithCancel(context.Background())
	sm := &sampler{f: f, cancel: cancel, min: -1, changed: map[int]bool{}}
	sm.sample()
	sm.wg.Add(1)
	go func() {
		defer sm.wg.Done()
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				sm.sample()
			}
		}
	}()
	return sm
}

func (sm *sampler) sample() {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	for i, r := range sm.f.Replicas() {
		ep := r.Router().Snapshot().Endpoint(sm.f.Endpoint())
		n, set := 0, ""
		if ep != nil {
			n = len(ep.Instances)
			for _, in := range ep.Instances {
				set += in.ID + ","
			}
		}
		if sm.min < 0 || n < sm.min {
			sm.min = n
		}
		sm.max = max(sm.max, n)
		if i >= len(sm.sets) {
			sm.sets = append(sm.sets, set)
		} else if sm.sets[i] != set {
			sm.changed[i] = true
		}
	}
}

// stop stops sampling and returns the extremes and how many replicas'
// instance sets changed.
func (sm *sampler) stop() (lo, hi, changed int) {
	sm.cancel()
	sm.wg.Wait()
	sm.sample()
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.min, sm.max, len(sm.changed)
}

func (s *suite) etcdOutage(ctx context.Context, res *Result) error {
	ids := s.f.IDs()
	before, err := s.measure()
	if err != nil {
		return err
	}
	out := &Outage{Window: s.cfg.OutageWindow}
	res.Outage = out
	var added string
	l, err := s.withLoad(ctx, nil, func() error {
		sm := startSampler(s.f)
		if err := s.f.StopEtcd(); err != nil {
			sm.stop()
			return err
		}
		werr := sleep(ctx, s.cfg.OutageWindow)
		out.MinInstances, out.MaxInstances, out.SnapshotsChanged = sm.stop()
		t0 := time.Now()
		if err := s.f.RestartEtcd(); err != nil {
			return err
		}
		out.Restart = time.Since(t0)
		if werr != nil {
			return werr
		}
		rec := startSampler(s.f)
		actx, cancel := context.WithTimeout(ctx, convergeTimeout)
		tAdded := time.Now()
		in, err := s.f.AddInstance(actx)
		cancel()
		if err != nil {
			rec.stop()
			return err
		}
		added = in.ID
		err = s.converge(ctx, append(slices.Clone(ids), in.ID))
		out.Recovered = time.Since(t0)
		res.Convergence = time.Since(tAdded)
		out.RecoveryMinInstances, _, _ = rec.stop()
		return err
	})
	if err != nil {
		return err
	}
	res.Event = fmt.Sprintf("etcd down %v, restarted, added %s", s.cfg.OutageWindow, added)
	n := len(ids)
	res.check("snapshots kept during the outage", out.MinInstances == n && out.MaxInstances == n && out.SnapshotsChanged == 0,
		"every replica listed %d–%d instances (want %d), %d replicas' sets changed", out.MinInstances, out.MaxInstances, n, out.SnapshotsChanged)
	res.check("no instance lost on recovery", out.RecoveryMinInstances >= n,
		"fewest instances on any replica between restart and convergence: %d (want ≥ %d)", out.RecoveryMinInstances, n)
	after, err := s.measure()
	if err != nil {
		return err
	}
	movementChecks(res, compare(before, after, added, true, n, n+1))
	noFailures(res, l)
	return nil
}

func (s *suite) failingInstance(ctx context.Context, res *Result) error {
	victim, _, err := s.victim("failing-instance")
	if err != nil {
		return err
	}
	res.Event = "fault on " + victim
	b := &Breaker{Instance: victim, ConsecutiveFailures: overload.DefaultConsecutiveFailures, OpenTimeout: cmp.Or(s.cfg.BreakerOpenTimeout, overload.DefaultOpenTimeout)}
	res.Breaker = b
	reps := s.f.Replicas()
	openedAt := make([]time.Time, len(reps)) // per replica
	var t0 time.Time
	l := startLoad(s.f.RouterURLs(), s.cfg.LoadRate, s.cfg.Seed)
	err = func() error {
		if err := sleep(ctx, s.cfg.LoadWindow); err != nil {
			return err
		}
		in := s.f.Instance(victim)
		t0 = time.Now()
		in.SetFault(localfleet.FaultError)
		// Wait (bounded) for every replica's breaker to open.
		deadline := t0.Add(convergeTimeout)
		for time.Now().Before(deadline) {
			all := true
			for i, r := range reps {
				if !openedAt[i].IsZero() {
					continue
				}
				if st, ok := r.Router().Status(s.f.Endpoint(), victim); ok && st.Breaker == gobreaker.StateOpen {
					openedAt[i] = time.Now()
				} else {
					all = false
				}
			}
			if all {
				b.OpenedAll = true
				b.Opened = time.Since(t0)
				break
			}
			if err := sleep(ctx, 2*time.Millisecond); err != nil {
				return err
			}
		}
		// Let the traffic run around the open breaker for a window.
		if err := sleep(ctx, s.cfg.LoadWindow); err != nil {
			return err
		}
		tc := time.Now()
		in.SetFault(localfleet.FaultNone)
		deadline = tc.Add(convergeTimeout)
		for time.Now().Before(deadline) {
			all := true
			for _, r := range reps {
				if st, ok := r.Router().Status(s.f.Endpoint(), victim); !ok || st.Breaker != gobreaker.StateClosed {
					all = false
				}
			}
			if all {
				b.ClosedAll = true
				b.Closed = time.Since(tc)
				break
			}
			if err := sleep(ctx, 2*time.Millisecond); err != nil {
				return err
			}
		}
		return sleep(ctx, s.cfg.LoadWindow)
	}()
	recs, skipped := l.stop()
	if err != nil {
		return err
	}
	ld := summarize(recs, skipped, l.stopped.Sub(l.started), nil)
	res.Load = ld
	other := 0
	for _, r := range recs {
		if r.kind == "" {
			continue
		}
		if r.instance != victim || r.status != 500 {
			other++
			continue
		}
		if o := openedAt[r.replica]; o.IsZero() || r.end.Before(o) {
			b.ErrorsBeforeOpen++
		} else {
			b.ErrorsAfterOpen++
		}
	}
	res.check("breaker opens on every replica", b.OpenedAll, "opened on every replica %v after the fault", b.Opened.Round(time.Millisecond))
	res.check("breaker closes after the fault clears", b.ClosedAll, "closed on every replica %v after the fault cleared (open timeout %v)", b.Closed.Round(time.Millisecond), b.OpenTimeout)
	res.check("no failure but the faulty instance's 500s", other == 0, "%d failures other than a 500 from %s", other, victim)
	return nil
}

func (s *suite) rollingRestart(ctx context.Context, res *Result) error {
	ids := s.f.IDs()
	slices.Sort(ids)
	var longest time.Duration
	l, err := s.withLoad(ctx, nil, func() error {
		cur := slices.Clone(ids)
		for _, id := range ids {
			t0 := time.Now()
			s.f.StopInstance(s.f.Instance(id))
			cur = slices.DeleteFunc(cur, func(x string) bool { return x == id })
			in, err := s.f.AddInstance(ctx)
			if err != nil {
				return err
			}
			cur = append(cur, in.ID)
			if err := s.converge(ctx, cur); err != nil {
				return err
			}
			longest = max(longest, time.Since(t0))
		}
		return nil
	})
	if err != nil {
		return err
	}
	res.Event = fmt.Sprintf("replaced all %d instances one by one", len(ids))
	res.Convergence = longest
	after, err := s.measure()
	if err != nil {
		return err
	}
	agree := after.agreement()
	res.check("replicas agree", agree == 1, "%.4f%% of keys have the same primary on every replica", 100*agree)
	noFailures(res, l)
	return nil
}

// hungInstance freezes one instance (FaultHang) under load and measures how
// long the replicas' active health checks take to mark it down, that new
// requests avoid it afterwards, and that it is marked up once unfrozen.
func (s *suite) hungInstance(ctx context.Context, res *Result) error {
	victim, _, err := s.victim("hung-instance")
	if err != nil {
		return err
	}
	res.Event = "froze " + victim
	h := &Hang{Instance: victim, Interval: healthCheckInterval, Timeout: healthCheckTimeout, UnhealthyThreshold: probe.DefaultUnhealthyThreshold}
	res.Hang = h
	reps := s.f.Replicas()
	// waitAll polls (bounded) until every replica's view of the victim
	// satisfies ok and returns the time it took from t0.
	waitAll := func(t0 time.Time, ok func(overload.Status) bool) (time.Duration, bool, error) {
		for deadline := t0.Add(convergeTimeout); time.Now().Before(deadline); {
			all := true
			for _, r := range reps {
				if st, found := r.Router().Status(s.f.Endpoint(), victim); !found || !ok(st) {
					all = false
					break
				}
			}
			if all {
				return time.Since(t0), true, nil
			}
			if err := sleep(ctx, 2*time.Millisecond); err != nil {
				return 0, false, err
			}
		}
		return 0, false, nil
	}
	var t0, detectedAt, unfrozeAt time.Time
	in := s.f.Instance(victim)
	l := startLoad(s.f.RouterURLs(), s.cfg.LoadRate, s.cfg.Seed)
	err = func() error {
		if err := sleep(ctx, s.cfg.LoadWindow); err != nil {
			return err
		}
		t0 = time.Now()
		in.SetFault(localfleet.FaultHang)
		d, all, err := waitAll(t0, func(st overload.Status) bool { return !st.Healthy })
		if err != nil {
			return err
		}
		h.Detected, h.DetectedAll, detectedAt = d, all, time.Now()
		// Let the traffic run around the frozen instance for a window.
		if err := sleep(ctx, s.cfg.LoadWindow); err != nil {
			return err
		}
		unfrozeAt = time.Now()
		in.SetFault(localfleet.FaultNone)
		d, all, err = waitAll(unfrozeAt, func(st overload.Status) bool { return st.Healthy })
		if err != nil {
			return err
		}
		h.Recovered, h.RecoveredAll = d, all
		return sleep(ctx, s.cfg.LoadWindow)
	}()
	if err != nil {
		in.SetFault(localfleet.FaultNone)
		l.stop()
		return err
	}
	recs, skipped := l.stop()
	// Failures are acceptable only for requests that were sent to the
	// frozen instance before every replica knew.
	ld := summarize(recs, skipped, l.stopped.Sub(l.started), &inFlightAt{from: t0, to: detectedAt, instance: victim})
	res.Load = ld
	res.Convergence = h.Detected
	for _, r := range recs {
		switch {
		case r.start.Before(t0) || !r.start.Before(unfrozeAt):
		case r.start.Before(detectedAt):
			if r.instance == victim && r.end.After(unfrozeAt) {
				h.Stuck++
				h.StuckLongest = max(h.StuckLongest, r.end.Sub(r.start))
			}
		default:
			h.AfterDetection++
			if r.instance == victim {
				h.RoutedToIt++
			}
		}
	}
	bound := time.Duration(h.UnhealthyThreshold)*(h.Interval+h.Timeout) + time.Second
	res.check("marked down on every replica", h.DetectedAll && h.Detected <= bound,
		"down on every replica %v after the freeze (bound %v: %d × (interval %v + timeout %v) + 1 s)", h.Detected.Round(time.Millisecond), bound, h.UnhealthyThreshold, h.Interval, h.Timeout)
	res.check("new requests avoid it", h.AfterDetection > 0 && h.RoutedToIt == 0,
		"%d of %d requests sent after detection went to %s", h.RoutedToIt, h.AfterDetection, victim)
	res.check("marked up after the unfreeze", h.RecoveredAll, "up on every replica %v after the unfreeze", h.Recovered.Round(time.Millisecond))
	res.check("no failure but requests sent to it before detection", ld.FailedOther == 0 && ld.Sent > 0,
		"%d of %d requests failed (%d sent to %s before detection, %d other) %v; %d waited for the unfreeze (longest %v)",
		ld.Failed, ld.Sent, ld.FailedInFlight, victim, ld.FailedOther, ld.ByKind, h.Stuck, h.StuckLongest.Round(time.Millisecond))
	return nil
}

// victim picks the instance a scenario acts on, and the instances that stay;
// the scenario needs at least two.
func (s *suite) victim(scenario string) (victim string, rest []string, err error) {
	ids := s.f.IDs()
	if len(ids) < 2 {
		return "", nil, fmt.Errorf("chaos: %s needs at least 2 instances, have %d", scenario, len(ids))
	}
	victim = s.pick(ids)
	return victim, slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == victim }), nil
}
