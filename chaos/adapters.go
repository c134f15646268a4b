package chaos

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/membership"
)

// The adapter scenarios (issue 11).
const (
	AdapterJoin   = "adapter-join"
	AdapterUnload = "adapter-unload"
	// AdapterHot saturates one adapter's instances (the agents' sense, not a
	// popular key's; issue 18 renamed the agents' "hot"). The id stays: the
	// recorded runs in docs/chaos.md name it.
	AdapterHot   = "adapter-hot"
	AdapterCrash = "adapter-holder-crash"
)

// chaosAdapters are catalogued (min 1, max 3 replicas) before the first
// adapter scenario.
var chaosAdapters = []string{"chaos-a0", "chaos-a1", "chaos-a2", "chaos-a3"}

// Placement settings of the chaos fleet's agents: quick, so that a busy
// adapter grows within a load window or two. The cooldown is long: the
// scenarios' own resizes are written directly, and a set a scenario has
// just grown must not shrink back (an adapter the sparse load never
// catches in flight looks cold) while a later scenario measures it. A
// scenario that grows the same adapter twice waits out the cooldown,
// within convergeTimeout.
const (
	agentLoadPoll         = 100 * time.Millisecond
	agentSaturationWindow = 500 * time.Millisecond
	agentScaleCooling     = 30 * time.Second
)

// AdapterMovement compares the probes' primaries of one adapter before and
// after its sticky set changed.
type AdapterMovement struct {
	Adapter   string   `json:"adapter"`
	SetBefore []string `json:"set_before"`
	SetAfter  []string `json:"set_after"`
	// Keys of the adapter, and how many changed primary.
	Keys          int     `json:"keys"`
	Moved         int     `json:"moved"`
	MovedFraction float64 `json:"moved_fraction"`
	// Bound is what the scenario promises MovedFraction stays within.
	Bound float64 `json:"bound"`
	// OtherKeys are the probes of the other adapters (those the event did
	// not concern); OtherMoved how many of them changed primary.
	OtherKeys  int `json:"other_keys"`
	OtherMoved int `json:"other_moved"`
	// AgreementAfter over every adapter's probes.
	AgreementAfter float64 `json:"agreement_after"`
}

// ensureAdapters catalogues chaosAdapters once and waits until every
// replica sees each loaded on its placement set.
func (s *suite) ensureAdapters(ctx context.Context) error {
	if s.adapterProbes != nil {
		return nil
	}
	for _, name := range chaosAdapters {
		if err := membership.PutAdapter(ctx, s.f.Client(), membership.Layout{}, s.f.Endpoint(), fleet.Adapter{Name: name, Source: "/adapters/" + name, MinReplicas: 1, MaxReplicas: 3}); err != nil {
			return err
		}
	}
	if err := s.settled(ctx, chaosAdapters...); err != nil {
		return err
	}
	s.adapterProbes = map[string][][]byte{}
	per := max(s.cfg.Keys/2, 100)
	for i, name := range chaosAdapters {
		s.adapterProbes[name] = newModelProbes(name, per, s.cfg.Seed+int64(i)+1)
	}
	return nil
}

// loaded returns the instances that report adapter, sorted.
func loaded(ep *fleet.Endpoint, adapter string) []string {
	var out []string
	for _, in := range ep.Instances {
		if !in.Draining && in.HasAdapter(adapter) {
			out = append(out, in.ID)
		}
	}
	return out
}

// settledFor is the WaitFor condition: every adapter is loaded exactly on
// its placement set (and, if want > 0, that set has want members).
func settledFor(endpoint string, want int, adapters ...string) func(*fleet.Snapshot) bool {
	return func(sn *fleet.Snapshot) bool {
		ep := sn.Endpoint(endpoint)
		if ep == nil {
			return false
		}
		p := lora.Place(ep)
		for _, a := range adapters {
			set := slices.Sorted(slices.Values(p.Set(a)))
			if len(set) == 0 || !slices.Equal(set, loaded(ep, a)) || (want > 0 && len(set) != want) {
				return false
			}
		}
		return true
	}
}

func (s *suite) settled(ctx context.Context, adapters ...string) error {
	ctx, cancel := context.WithTimeout(ctx, convergeTimeout)
	defer cancel()
	return s.f.WaitFor(ctx, settledFor(s.f.Endpoint(), 0, adapters...))
}

func (s *suite) adapterSnapshot() *fleet.Endpoint {
	return s.f.Replicas()[0].Router().Snapshot().Endpoint(s.f.Endpoint())
}

// measureAdapters returns each adapter's probe primaries on every replica.
func (s *suite) measureAdapters() (map[string]owners, error) {
	out := map[string]owners{}
	for name, probes := range s.adapterProbes {
		o, err := primaries(s.f.Replicas(), s.f.Endpoint(), probes)
		if err != nil {
			return nil, err
		}
		out[name] = o
	}
	return out, nil
}

// adapterMovement compares two measurements for adapter.
func adapterMovement(adapter string, before, after map[string]owners) *AdapterMovement {
	m := &AdapterMovement{Adapter: adapter, AgreementAfter: 1}
	agree, total := 0, 0
	for name, b := range before {
		a := after[name]
		for i := range b[0] {
			moved := b[0][i] != a[0][i]
			if name == adapter {
				m.Keys++
				if moved {
					m.Moved++
				}
			} else {
				m.OtherKeys++
				if moved {
					m.OtherMoved++
				}
			}
		}
		agree += int(a.agreement() * float64(len(a[0])))
		total += len(a[0])
	}
	m.MovedFraction = float64(m.Moved) / float64(max(m.Keys, 1))
	m.AgreementAfter = float64(agree) / float64(max(total, 1))
	return m
}

// resize writes adapter's target k as an agent's decision would
// (compare-and-swap on the placement revision), dated now.
func (s *suite) resize(ctx context.Context, adapter string, k int) error {
	return s.place(ctx, adapter, k, time.Now())
}

// place writes adapter's target k, dated at (the agents' cooldown runs
// from it; zero: never scaled).
func (s *suite) place(ctx context.Context, adapter string, k int, at time.Time) error {
	a, _ := s.adapterSnapshot().Adapter(adapter)
	ok, err := membership.SetPlacement(ctx, s.f.Client(), membership.Layout{}, s.f.Endpoint(), adapter, a.PlacementRevision, membership.Placement{Replicas: k, ScaledAt: at})
	if err == nil && !ok {
		err = fmt.Errorf("chaos: placement of %s changed under the scenario", adapter)
	}
	return err
}

// startAt puts adapter's set at k members before a scenario measures, and
// waits until every replica routes on it. A set at one member is reset
// (ScaledAt zero): nothing can shrink it, and the agents may grow it at
// once (adapter-hot needs that). A larger one is dated now, so that the
// agents' cooldown keeps a cold adapter from shrinking under the
// scenario. Scenarios that run again (--long) start from the same state
// each time.
func (s *suite) startAt(ctx context.Context, adapter string, k int) error {
	if err := s.ensureAdapters(ctx); err != nil {
		return err
	}
	// Every adapter settled first: an earlier scenario's crash or restart
	// may have moved a set, and its new member may still be loading.
	if err := s.settled(ctx, chaosAdapters...); err != nil {
		return fmt.Errorf("chaos: adapters did not settle: %w", err)
	}
	ep := s.adapterSnapshot()
	a, _ := ep.Adapter(adapter)
	if len(lora.Place(ep).Set(adapter)) == k && a.Target() == k {
		return nil
	}
	at := time.Now()
	if k <= 1 {
		at = time.Time{}
	}
	if err := s.place(ctx, adapter, k, at); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, convergeTimeout)
	defer cancel()
	if err := s.f.WaitFor(wctx, settledFor(s.f.Endpoint(), k, adapter)); err != nil {
		return fmt.Errorf("chaos: %s did not settle on %d instance(s): %w", adapter, k, err)
	}
	return nil
}

// adapterEvent runs the common frame of the adapter scenarios: measure,
// load over every adapter across event, measure again. event returns the
// adapter whose set changed.
func (s *suite) adapterEvent(ctx context.Context, res *Result, models []string, event func() (string, error)) (*AdapterMovement, error) {
	if err := s.ensureAdapters(ctx); err != nil {
		return nil, err
	}
	if models == nil {
		models = chaosAdapters
	}
	before, err := s.measureAdapters()
	if err != nil {
		return nil, err
	}
	beforeEp := s.adapterSnapshot()
	var changed string
	l, err := s.withLoadModels(ctx, models, func() error {
		start := time.Now()
		var err error
		changed, err = event()
		res.Convergence = time.Since(start)
		return err
	})
	if err != nil {
		return nil, err
	}
	after, err := s.measureAdapters()
	if err != nil {
		return nil, err
	}
	m := adapterMovement(changed, before, after)
	m.SetBefore, m.SetAfter = loaded(beforeEp, changed), loaded(s.adapterSnapshot(), changed)
	res.Adapter = m
	res.Load = l
	return m, nil
}

// withLoadModels is withLoad over the given models.
func (s *suite) withLoadModels(ctx context.Context, models []string, event func() error) (*Load, error) {
	l := startLoadModels(s.f.RouterURLs(), s.cfg.LoadRate, s.cfg.Seed, models)
	err := sleep(ctx, s.cfg.LoadWindow)
	if err == nil {
		err = event()
	}
	if err == nil {
		err = sleep(ctx, s.cfg.LoadWindow)
	}
	recs, skipped := l.stop()
	return summarize(recs, skipped, l.stopped.Sub(l.started), nil), err
}

func joinChecks(res *Result, m *AdapterMovement) {
	k := len(m.SetBefore)
	m.Bound = 1.05 / float64(k+1)
	res.check("set grew by one", len(m.SetAfter) == k+1, "%v → %v", m.SetBefore, m.SetAfter)
	res.check("moved ≤ 1.05/(|set|+1)", m.MovedFraction <= m.Bound, "%d of %d keys of %s moved (%.4f; bound %.4f)", m.Moved, m.Keys, m.Adapter, m.MovedFraction, m.Bound)
	res.check("other adapters unmoved", m.OtherMoved == 0, "%d of %d keys of other adapters moved", m.OtherMoved, m.OtherKeys)
	res.check("replicas agree", m.AgreementAfter == 1, "%.4f%% of keys have the same primary on every replica", 100*m.AgreementAfter)
}

func (s *suite) adapterJoin(ctx context.Context, res *Result) error {
	a := chaosAdapters[0]
	if err := s.startAt(ctx, a, 1); err != nil {
		return err
	}
	m, err := s.adapterEvent(ctx, res, nil, func() (string, error) {
		ep := s.adapterSnapshot()
		k := len(loaded(ep, a))
		res.Event = fmt.Sprintf("%s loaded on one more instance (k %d→%d)", a, k, k+1)
		if err := s.resize(ctx, a, k+1); err != nil {
			return a, err
		}
		wctx, cancel := context.WithTimeout(ctx, convergeTimeout)
		defer cancel()
		return a, s.f.WaitFor(wctx, settledFor(s.f.Endpoint(), k+1, a))
	})
	if err != nil {
		return err
	}
	joinChecks(res, m)
	noFailures(res, res.Load)
	return nil
}

func (s *suite) adapterUnload(ctx context.Context, res *Result) error {
	a := chaosAdapters[0]
	// The set holds two members before the measurement starts, so that
	// one can leave.
	if err := s.startAt(ctx, a, 2); err != nil {
		return err
	}
	var removed string
	m, err := s.adapterEvent(ctx, res, nil, func() (string, error) {
		set := lora.Place(s.adapterSnapshot()).Set(a)
		k := len(set)
		if k < 2 {
			return a, fmt.Errorf("chaos: %s is on %d instance(s); unload needs two", a, k)
		}
		removed = set[k-1]
		res.Event = fmt.Sprintf("%s unloaded from %s (k %d→%d)", a, removed, k, k-1)
		if err := s.resize(ctx, a, k-1); err != nil {
			return a, err
		}
		wctx, cancel := context.WithTimeout(ctx, convergeTimeout)
		defer cancel()
		return a, s.f.WaitFor(wctx, settledFor(s.f.Endpoint(), k-1, a))
	})
	if err != nil {
		return err
	}
	// Only the keys of the member that left may move: about 1/|set|.
	m.Bound = 1.05 / float64(len(m.SetBefore))
	res.check("set shrank by one", len(m.SetAfter) == len(m.SetBefore)-1 && !slices.Contains(m.SetAfter, removed), "%v → %v", m.SetBefore, m.SetAfter)
	res.check("moved ≈ the leaving member's share", m.MovedFraction <= m.Bound, "%d of %d keys of %s moved (%.4f; bound 1.05/|set| = %.4f)", m.Moved, m.Keys, a, m.MovedFraction, m.Bound)
	res.check("other adapters unmoved", m.OtherMoved == 0, "%d of %d keys of other adapters moved", m.OtherMoved, m.OtherKeys)
	res.check("replicas agree", m.AgreementAfter == 1, "%.4f%% of keys have the same primary on every replica", 100*m.AgreementAfter)
	noFailures(res, res.Load)
	return nil
}

// hotLoad keeps about n long generations of adapter in flight through the
// replicas until stop is closed.
func hotLoad(urls []string, adapter string, n int, stop <-chan struct{}) (failed int, wait func() int) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	client := &http.Client{Timeout: loadTimeout}
	body := chatBodyModel(adapter, "a hot adapter: write a long answer about load", 400, false)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := client.Post(urls[i%len(urls)]+chatPath, "application/json", bytes.NewReader(body))
				ok := err == nil && resp.StatusCode == http.StatusOK
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if !ok {
					mu.Lock()
					failed++
					mu.Unlock()
				}
			}
		}()
	}
	return 0, func() int { wg.Wait(); client.CloseIdleConnections(); return failed }
}

func (s *suite) adapterHot(ctx context.Context, res *Result) error {
	a := chaosAdapters[1]
	var hotFailed int
	if err := s.startAt(ctx, a, 1); err != nil {
		return err
	}
	// Adapters that share an instance with the busy one get no background
	// load: an adapter in use on a saturated instance is busy too (its members
	// are above the threshold), and would grow as well.
	ep := s.adapterSnapshot()
	var quiet []string
	for _, b := range chaosAdapters {
		shares := false
		for _, id := range loaded(ep, a) {
			shares = shares || slices.Contains(loaded(ep, b), id)
		}
		if b == a || !shares {
			quiet = append(quiet, b)
		}
	}
	m, err := s.adapterEvent(ctx, res, quiet, func() (string, error) {
		k := len(loaded(s.adapterSnapshot(), a))
		res.Event = fmt.Sprintf("%s made hot (%d long generations in flight)", a, 3*fleet.DefaultConcurrencyThreshold)
		stop := make(chan struct{})
		_, wait := hotLoad(s.f.RouterURLs(), a, 3*fleet.DefaultConcurrencyThreshold, stop)
		wctx, cancel := context.WithTimeout(ctx, convergeTimeout)
		defer cancel()
		err := s.f.WaitFor(wctx, func(sn *fleet.Snapshot) bool {
			ad, _ := sn.Endpoint(s.f.Endpoint()).Adapter(a)
			return ad.Target() > k
		})
		close(stop)
		hotFailed = wait()
		if err != nil {
			return a, fmt.Errorf("chaos: %s did not grow under load: %w", a, err)
		}
		return a, s.settled(wctx, a)
	})
	if err != nil {
		return err
	}
	joinChecks(res, m)
	noFailures(res, res.Load)
	res.check("no failed hot request", hotFailed == 0, "%d hot requests failed", hotFailed)
	return nil
}

func (s *suite) adapterCrash(ctx context.Context, res *Result) error {
	a := chaosAdapters[2]
	if err := s.startAt(ctx, a, 1); err != nil {
		return err
	}
	ep := s.adapterSnapshot()
	set := loaded(ep, a)
	victim := set[0]
	// The other adapters that do not live on the victim must not notice.
	var bystanders []string
	for _, b := range chaosAdapters {
		if b != a && !slices.Contains(loaded(ep, b), victim) {
			bystanders = append(bystanders, b)
		}
	}
	before, err := s.measureAdapters()
	if err != nil {
		return err
	}
	res.Event = fmt.Sprintf("crashed %s, the only instance holding %s", victim, a)
	rest := slices.DeleteFunc(s.f.IDs(), func(id string) bool { return id == victim })
	onA := startLoadModels(s.f.RouterURLs(), s.cfg.LoadRate/2, s.cfg.Seed, []string{a})
	var others *load
	if len(bystanders) > 0 {
		others = startLoadModels(s.f.RouterURLs(), s.cfg.LoadRate/2, s.cfg.Seed+1, bystanders)
	}
	// Requests in flight on the victim at the crash instant may fail (as
	// in the crash scenario): it may have read them, so they are not
	// re-sent.
	var window inFlightAt
	err = sleep(ctx, s.cfg.LoadWindow)
	if err == nil {
		start := time.Now()
		window.from, window.instance = start, victim
		s.f.CrashInstance(s.f.Instance(victim))
		window.to = time.Now()
		if err = s.converge(ctx, rest); err == nil {
			err = s.settled(ctx, a)
		}
		res.Convergence = time.Since(start)
		if err == nil {
			// The other adapters the victim held reload elsewhere too;
			// the measurement below probes every adapter.
			err = s.settled(ctx, chaosAdapters...)
		}
	}
	if err == nil {
		err = sleep(ctx, s.cfg.LoadWindow)
	}
	recs, skipped := onA.stop()
	lA := summarize(recs, skipped, onA.stopped.Sub(onA.started), &window)
	var lO *Load
	if others != nil {
		recs, skipped := others.stop()
		lO = summarize(recs, skipped, others.stopped.Sub(others.started), nil)
	}
	if err != nil {
		return err
	}
	after, err := s.measureAdapters()
	if err != nil {
		return err
	}
	m := adapterMovement(a, before, after)
	// Only the bystanders are "other adapters" here: those that shared
	// the victim lose its keys too.
	m.OtherKeys, m.OtherMoved = 0, 0
	for _, b := range bystanders {
		for i := range before[b][0] {
			m.OtherKeys++
			if before[b][0][i] != after[b][0][i] {
				m.OtherMoved++
			}
		}
	}
	m.SetBefore, m.SetAfter = set, loaded(s.adapterSnapshot(), a)
	m.Bound = 1
	res.Adapter, res.Load = m, lA
	res.check("reloaded elsewhere", len(m.SetAfter) == 1 && m.SetAfter[0] != victim, "%v → %v in %s", m.SetBefore, m.SetAfter, ms(res.Convergence))
	res.check("adapters not on it unmoved", m.OtherMoved == 0, "%d of %d keys of %v moved", m.OtherMoved, m.OtherKeys, bystanders)
	if lO != nil {
		res.check("adapters not on it never fail", lO.Failed == 0 && lO.Sent > 0, "%d of %d requests failed %v", lO.Failed, lO.Sent, lO.ByKind)
	}
	// Requests for the crashed adapter: the routers hold them (within
	// the adapter wait) from the first dial error until the lease expires
	// and the next rendezvous choice has loaded it.
	res.check("its requests fail only in flight at the crash", lA.Sent > 0 && lA.FailedOther == 0,
		"%d of %d requests for %s failed: %d in flight on %s at the crash, %d other %v", lA.Failed, lA.Sent, a, lA.FailedInFlight, victim, lA.FailedOther, lA.ByKind)
	// Back to the fleet size the other scenarios expect.
	if _, err := s.f.AddInstance(ctx); err != nil {
		return err
	}
	return s.converge(ctx, append(rest, s.f.IDs()[len(s.f.IDs())-1]))
}
