package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/bench"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/sim"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// The hot-prefix load of TestThresholdAtManyReplicas (issue 22 part 4):
// open-loop Poisson arrivals of OpenAI completions whose prompts start
// with one of thrPrefixes system prompts, drawn by a Zipf law (the hottest
// carries about a third of the traffic), each followed by its own
// question; a skewed DNS share sends thrSkew of the requests through one
// replica and spreads the rest over the others. The instances are
// simulated vLLM servers (internal/sim, real time) with a KV cache that
// holds a few prefixes beside the running requests, so a request sent away
// from its prefix's instance misses and evicts.
const (
	thrThreshold      = 8 // × the scale (PREFIXROUTER_E2E_THRESHOLD_SCALE), as are max tokens and the KV cache
	thrInstances      = 6
	thrPrefixes       = 24
	thrZipf           = 1.1
	thrPrefixTokens   = 512
	thrQuestionTokens = 48
	thrMaxTokens      = 16 // about 0.38 s a request at scale 1
	thrKVTokens       = 8192
	thrSkew           = 0.75
	thrRate           = 60 // requests per second offered
	thrPoll           = 100 * time.Millisecond
	thrSample         = 2 * time.Millisecond
	thrSeed           = 22
	thrMaxOutstanding = 1024
	// thrCompareRequests is the sample the 2-point comparison with R = 1
	// needs: a standard error of 40/√1600 = 1 point a run.
	thrCompareRequests = 1600
)

// thrOption is one way of sharing the threshold.
type thrOption struct {
	name  string
	share router.Share
	poll  time.Duration
}

var (
	thrReplicasShare = thrOption{"replicas", router.ShareReplicas, 0}
	thrPollOnly      = thrOption{"poll", router.ShareNone, thrPoll}
	thrTraffic       = thrOption{"traffic", router.ShareTraffic, 0}
	thrTrafficPoll   = thrOption{"traffic+poll", router.ShareTraffic, thrPoll}
	thrOptions       = []thrOption{thrReplicasShare, thrPollOnly, thrTraffic, thrTrafficPoll}
)

// thrResult is one row of the table.
type thrResult struct {
	replicas                   int
	option                     string
	requests, failed, dropped  int64
	affinity, spill, fallback  int64
	promptTokens, cachedTokens int64
	hottest                    string  // the instance with the most requests in flight on average
	p50, p99, max, mean        float64 // its samples
	anyP99                     float64 // the highest p99 of any instance
	writes                     int64   // router record puts in the window
	window                     time.Duration
	busyShare, lightShare      int // the share replica 0 and replica 1 applied at the end
}

func (r thrResult) primaryShare() float64 {
	return float64(r.affinity) / float64(max(r.requests-r.failed, 1))
}

func (r thrResult) hitRate() float64 {
	return float64(r.cachedTokens) / float64(max(r.promptTokens, 1))
}

// TestThresholdAtManyReplicas measures the in-flight count at the hottest
// instance (sampled every thrSample: p50, p99, max) and PREFIX_AWARE's
// primary share and KV hit rate under the hot-prefix load with a skewed
// DNS share, for R replicas and each way of sharing the threshold T.
//
// The default run is R = 32 with the default share (traffic, no load
// poll) at T = 32 over an 8 s window, and asserts the bound: in
// flight at the hottest instance (the most loaded on average) p99 ≤
// 1.25·T + 1. The other half of the acceptance, the KV hit rate within 2
// points of R = 1's (the primary share is logged beside it), needs an
// R = 1 run first and a larger sample than a fast test sends (a share near
// 80 % from n requests has a standard error of 40/√n points: 1.8 at the
// 480 requests of 8 s), so it is asserted only when both runs answered at
// least thrCompareRequests (PREFIXROUTER_E2E_THRESHOLD_RUNS=1:traffic,32:traffic
// PREFIXROUTER_E2E_THRESHOLD_WINDOW=30s). PREFIXROUTER_E2E_THRESHOLD_SWEEP=1
// runs R in {1, 2, 8, 32} for every option and prints the table of
// docs/concurrency.md; PREFIXROUTER_E2E_THRESHOLD_RUNS picks runs by hand
// ("R:option" or "R:option@poll-interval").
func TestThresholdAtManyReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("32 replicas under load")
	}
	// A measurement in real time of 32 replicas and 6 simulated instances
	// at 60 requests/s: its bound has room for the light replicas' bursts
	// on a machine that keeps the schedule, not for the CPU starvation of a
	// loaded one (on 2 cores beside the rest of make test, requests took
	// several times longer and the schedule was dropped). It runs alone, in
	// make test-threshold (docs/concurrency.md); the shares' logic is
	// tested in make test (router, membership, replica).
	if !thrRequested() {
		t.Skip("a real-time measurement: make test-threshold (PREFIXROUTER_E2E_THRESHOLD=1) runs it alone")
	}
	sweep := os.Getenv("PREFIXROUTER_E2E_THRESHOLD_SWEEP") != ""
	// The warm-up is not counted: the caches fill, and every replica
	// measures and writes its rate; a light replica (0.5 requests/s here
	// at R = 32) writes once it counted enough requests to tell its rate
	// from 0 (router.RateReport), some 8 s.
	warm, measure := 15*time.Second, 8*time.Second
	if w := os.Getenv("PREFIXROUTER_E2E_THRESHOLD_WINDOW"); w != "" {
		d, err := time.ParseDuration(w)
		if err != nil || d <= 0 || d > 10*time.Minute {
			t.Fatalf("PREFIXROUTER_E2E_THRESHOLD_WINDOW %q: want a duration up to 10m", w)
		}
		measure = d
	}
	type run struct {
		replicas int
		opt      thrOption
	}
	runs := []run{{32, thrTraffic}}
	if sweep {
		runs = []run{{1, thrTraffic}}
		for _, r := range []int{2, 8, 32} {
			for _, o := range thrOptions {
				runs = append(runs, run{r, o})
			}
		}
	}
	if spec := os.Getenv("PREFIXROUTER_E2E_THRESHOLD_RUNS"); spec != "" {
		// Runs by hand, e.g. "1:traffic,32:traffic+poll"; the first is
		// the baseline the acceptance compares with.
		runs = nil
		for _, f := range strings.Split(spec, ",") {
			rs, name, _ := strings.Cut(f, ":")
			name, poll, _ := strings.Cut(name, "@") // a poll interval other than thrPoll
			r, err := strconv.Atoi(rs)
			i := slices.IndexFunc(thrOptions, func(o thrOption) bool { return o.name == name })
			if err != nil || r < 1 || i < 0 {
				t.Fatalf("PREFIXROUTER_E2E_THRESHOLD_RUNS: %q is not R:option[@poll] (options %v)", f, thrOptions)
			}
			o := thrOptions[i]
			if d, err := time.ParseDuration(poll); poll != "" && (err != nil || d <= 0 || o.poll == 0) {
				t.Fatalf("PREFIXROUTER_E2E_THRESHOLD_RUNS: %q: a poll interval needs an option that polls", f)
			} else if poll != "" {
				o.poll, o.name = d, o.name+"@"+poll
			}
			runs = append(runs, run{r, o})
		}
	}
	// T = 32 by default: the light replicas' bursts (their Poisson tail,
	// √ of their demand) fit in the acceptance's room (T/4 + 1); at T = 8
	// (PREFIXROUTER_E2E_THRESHOLD_SCALE=1) they fill it (docs/concurrency.md).
	scale := 4
	if v := os.Getenv("PREFIXROUTER_E2E_THRESHOLD_SCALE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 8 {
			t.Fatalf("PREFIXROUTER_E2E_THRESHOLD_SCALE %q: want 1 to 8", v)
		}
		scale = n
	}
	h := newThrHarness(t, scale)
	var rows []thrResult
	for _, x := range runs {
		res := h.run(x.replicas, x.opt, warm, measure)
		t.Logf("R=%d %s: %s", x.replicas, x.opt.name, res.line())
		rows = append(rows, res)
		if res.failed != 0 || res.dropped != 0 {
			t.Errorf("R=%d %s: %d of %d requests failed, %d dropped", x.replicas, x.opt.name, res.failed, res.requests, res.dropped)
		}
	}
	t.Log("\n" + thrTable(rows))
	base := rows[0]
	bound := 1.25*float64(h.threshold) + 1
	for _, r := range rows {
		if r.replicas != 32 || r.option != thrTraffic.name {
			continue
		}
		if r.p99 > bound {
			t.Errorf("R=32 %s: in flight at the hottest instance p99 %.0f, want ≤ 1.25·T+1 = %.0f", r.option, r.p99, bound)
		}
		if base.replicas != 1 {
			continue // no R = 1 run to compare with
		}
		if min(base.requests, r.requests) < thrCompareRequests {
			t.Logf("R=32 %s: primary share %.1f %% (R=1: %.1f %%), hit rate %.1f %% (R=1: %.1f %%); not compared: fewer than %d requests a run",
				r.option, 100*r.primaryShare(), 100*base.primaryShare(), 100*r.hitRate(), 100*base.hitRate(), thrCompareRequests)
			continue
		}
		// The criterion is the hit rate; the primary share (the
		// requests served by their key's primary) is stated beside it.
		t.Logf("R=32 %s: primary share %.1f %% (R=1: %.1f %%)", r.option, 100*r.primaryShare(), 100*base.primaryShare())
		if d := 100 * (base.hitRate() - r.hitRate()); d > 2 {
			t.Errorf("R=32 %s: hit rate %.1f %%, %.1f points below R=1's %.1f %%", r.option, 100*r.hitRate(), d, 100*base.hitRate())
		}
	}
}

// thrRequested reports whether the environment asks for the threshold
// measurement: PREFIXROUTER_E2E_THRESHOLD=1, or any of its settings.
func thrRequested() bool {
	for _, v := range []string{"", "_SWEEP", "_RUNS", "_WINDOW", "_SCALE"} {
		if os.Getenv("PREFIXROUTER_E2E_THRESHOLD"+v) != "" {
			return true
		}
	}
	return false
}

// thrInstance is a simulated instance behind a handler that counts its
// inference requests in flight.
type thrInstance struct {
	id       string
	sim      *sim.Server
	srv      *httptest.Server
	inFlight atomic.Int64
}

func (in *thrInstance) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		in.inFlight.Add(1)
		defer in.inFlight.Add(-1)
	}
	in.sim.ServeHTTP(w, r)
}

// thrHarness is one etcd with the simulated instances registered; each run
// starts its replicas and stops them at its end.
type thrHarness struct {
	t *testing.T
	f *localfleet.Fleet
	// scale multiplies T, the tokens out (so a request's duration and the
	// instances' demand) and the KV cache: the light replicas' bursts grow
	// as the square root of the demand, the acceptance's room as T.
	scale, threshold int
	insts            []*thrInstance
	client           *http.Client
	prefix           []string  // the system prompts
	weights          []float64 // their Zipf weights, cumulated
}

func newThrHarness(t *testing.T, scale int) *thrHarness {
	t.Helper()
	// Fixed-length keys, SageMaker's PREFIX_AWARE: the threshold alone
	// spreads a hot prefix. With adaptive keys (issue 21's default) a hot
	// prefix is replicated by load, and under this load the hottest
	// instance stays below T: the threshold would not be what holds it.
	cfg := fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{
		PrefixLength: fleet.MinPrefixLength, ConcurrencyThreshold: thrThreshold * scale, FixedLengthKeys: true}}
	f, err := localfleet.Start(testsupport.Context(t, 20*time.Second), localfleet.Options{
		Endpoint: ep, TTL: membership.DefaultTTL, FastEtcd: true, Logger: quiet, Routing: cfg})
	if err != nil {
		t.Fatalf("start the fleet: %v", err)
	}
	t.Cleanup(f.Close)
	h := &thrHarness{t: t, f: f, scale: scale, threshold: thrThreshold * scale}
	for i := range thrInstances {
		in := &thrInstance{id: fmt.Sprintf("sim-%d", i)}
		in.sim, err = sim.New(sim.Options{ID: in.id, KVCapacityTokens: thrKVTokens * scale})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(in.sim.Close)
		in.srv = httptest.NewServer(in)
		t.Cleanup(in.srv.Close)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		x, err := f.Register(ctx, fleet.Instance{ID: in.id, Addr: in.srv.URL, Engine: "vllm"}, 0)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = x.Registration().Close(ctx)
		})
		h.insts = append(h.insts, in)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 256, Proxy: nil}
	t.Cleanup(tr.CloseIdleConnections)
	h.client = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	total := 0.0
	for p := range thrPrefixes {
		h.prefix = append(h.prefix, bench.Text(thrSeed, "system", thrPrefixTokens, p))
		total += 1 / math.Pow(float64(p+1), thrZipf)
		h.weights = append(h.weights, total)
	}
	return h
}

// arrival is one request of the schedule.
type arrival struct {
	at       time.Duration
	prefix   int
	replica  int
	question int
}

// schedule draws the open-loop arrivals of a run of length d over r
// replicas from the fixed seed: every run offers the same requests in the
// same order at the same times; only the replica count changes where the
// light share goes.
func (h *thrHarness) schedule(d time.Duration, r int) []arrival {
	rng := rand.New(rand.NewPCG(thrSeed, 4))
	var out []arrival
	total := h.weights[len(h.weights)-1]
	for at, i := time.Duration(0), 0; ; i++ {
		at += time.Duration(rng.ExpFloat64() / thrRate * float64(time.Second))
		if at >= d {
			return out
		}
		u := rng.Float64() * total
		p, _ := slices.BinarySearch(h.weights, u)
		rep := 0
		if s := rng.Float64(); r > 1 && s >= thrSkew {
			rep = 1 + int((s-thrSkew)/(1-thrSkew)*float64(r-1))%(r-1)
		}
		out = append(out, arrival{at: at, prefix: min(p, thrPrefixes-1), replica: rep, question: i})
	}
}

// run starts r replicas sharing the threshold by opt, sends the load for
// warm (not counted: the replicas measure and publish their rates, the
// caches fill) then measure, and stops the replicas.
func (h *thrHarness) run(r int, opt thrOption, warm, measure time.Duration) thrResult {
	t := h.t
	t.Helper()
	for _, in := range h.insts {
		if _, err := in.sim.ResetPrefixCache(); err != nil {
			t.Fatal(err)
		}
	}
	reps := h.startReplicas(r, opt)
	defer func() {
		for _, rep := range reps {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := h.f.StopReplica(ctx, rep); err != nil {
				t.Errorf("stop replica: %v", err)
			}
			cancel()
		}
	}()

	res := thrResult{replicas: r, option: opt.name, window: measure}
	sched := h.schedule(warm+measure, r)
	ctx, cancel := context.WithTimeout(context.Background(), warm+measure+time.Minute)
	defer cancel()
	var counting atomic.Bool
	var requests, failed, dropped, prompt, cached atomic.Int64
	var dec decisions
	var outstanding atomic.Int64
	var wg sync.WaitGroup
	send := func(a arrival) {
		defer wg.Done()
		defer outstanding.Add(-1)
		count := counting.Load()
		body, _ := json.Marshal(map[string]any{
			"model": sim.DefaultBaseModel, "max_tokens": thrMaxTokens * h.scale,
			"prompt": h.prefix[a.prefix] + " " + bench.Text(thrSeed, "question", thrQuestionTokens, a.question),
		})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, reps[a.replica].URL()+"/v1/completions", bytes.NewReader(body))
		if err != nil {
			t.Error(err)
			return
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := h.client.Do(req)
		ok := err == nil && resp.StatusCode == http.StatusOK
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if !count {
			return
		}
		requests.Add(1)
		if !ok {
			failed.Add(1)
			return
		}
		dec.count(resp.Header.Get(router.HeaderDecision))
		pt, _ := strconv.ParseInt(resp.Header.Get("X-Prompt-Tokens"), 10, 64)
		ct, _ := strconv.ParseInt(resp.Header.Get("X-Cached-Tokens"), 10, 64)
		prompt.Add(pt)
		cached.Add(ct)
	}

	samples := make([][]int64, len(h.insts))
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	var writes atomic.Int64
	start := time.Now()
	for _, a := range sched {
		if a.at >= warm && !counting.Load() {
			counting.Store(true)
			go h.sample(samples, stopSampling, sampled)
			go h.countWrites(ctx, stopSampling, &writes)
		}
		// Arrival times are the workload (open loop), not a wait.
		if d := time.Until(start.Add(a.at)); d > 0 {
			tm := time.NewTimer(d)
			select {
			case <-tm.C:
			case <-ctx.Done():
				tm.Stop()
			}
		}
		if ctx.Err() != nil {
			break
		}
		if outstanding.Load() >= thrMaxOutstanding {
			if counting.Load() {
				dropped.Add(1)
			}
			continue
		}
		outstanding.Add(1)
		wg.Add(1)
		go send(a)
	}
	// The window ends with the last arrival; what is in flight then is
	// counted when it ends, but no longer sampled.
	close(stopSampling)
	<-sampled
	res.busyShare, res.lightShare = thresholdShare(t, reps[0]), thresholdShare(t, reps[min(1, len(reps)-1)])
	wg.Wait()

	res.requests, res.failed, res.dropped = requests.Load(), failed.Load(), dropped.Load()
	res.affinity, res.spill, res.fallback = dec.affinity.Load(), dec.spill.Load(), dec.fallback.Load()
	res.promptTokens, res.cachedTokens = prompt.Load(), cached.Load()
	res.writes = writes.Load()
	for i, s := range samples {
		p50, p99, mx, mean := percentiles(s)
		if res.hottest == "" || mean > res.mean {
			res.hottest, res.p50, res.p99, res.max, res.mean = h.insts[i].id, p50, p99, mx, mean
		}
		res.anyP99 = max(res.anyP99, p99)
	}
	return res
}

// startReplicas starts r replicas sharing the threshold by opt and waits
// until each sees the others, every instance, the config, and (for the
// traffic share) every replica's rate record.
func (h *thrHarness) startReplicas(r int, opt thrOption) []*replica.Replica {
	t := h.t
	t.Helper()
	var reps []*replica.Replica
	for range r {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		rep, err := h.f.AddReplicaWith(ctx, func(o *replica.Options) {
			o.Router.ThresholdShare = opt.share
			o.Router.LoadPollInterval = opt.poll
		})
		cancel()
		if err != nil {
			t.Fatalf("start replica: %v", err)
		}
		reps = append(reps, rep)
	}
	testsupport.Eventually(t, 30*time.Second, "every replica sees the fleet", func() bool {
		for _, rep := range reps {
			s := rep.Router().Snapshot()
			e := s.Endpoint(ep)
			if s.Replicas != r || len(s.ReplicaRates) != r || e == nil || len(e.Instances) != thrInstances || e.Resolved.ConcurrencyThreshold != h.threshold {
				return false
			}
		}
		return true
	})
	return reps
}

// sample records every instance's in-flight count every thrSample until
// stop is closed; then it closes done.
func (h *thrHarness) sample(out [][]int64, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	tick := time.NewTicker(thrSample)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			for i, in := range h.insts {
				out[i] = append(out[i], in.inFlight.Load())
			}
		}
	}
}

// countWrites counts the puts of router records (rate publications) until
// stop is closed.
func (h *thrHarness) countWrites(ctx context.Context, stop <-chan struct{}, n *atomic.Int64) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := h.f.Client().Watch(wctx, membership.Layout{}.RoutersPrefix(), clientv3.WithPrefix())
	for {
		select {
		case <-stop:
			return
		case resp, ok := <-wch:
			if !ok {
				return
			}
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypePut {
					n.Add(1)
				}
			}
		}
	}
}

// thresholdShare reads the share the replica applies now on ep from its
// metrics (prefixrouter_endpoint_threshold_share).
func thresholdShare(t *testing.T, r *replica.Replica) int {
	t.Helper()
	for _, m := range testsupport.Series(t, r.Registry(), "prefixrouter_endpoint_threshold_share", nil) {
		return int(m.GetGauge().GetValue())
	}
	return -1
}

// percentiles returns the p50, p99, max and mean of samples.
func percentiles(samples []int64) (p50, p99, mx, mean float64) {
	if len(samples) == 0 {
		return 0, 0, 0, 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	at := func(q float64) float64 { return float64(s[min(len(s)-1, int(q*float64(len(s))))]) }
	sum := int64(0)
	for _, v := range s {
		sum += v
	}
	return at(0.50), at(0.99), float64(s[len(s)-1]), float64(sum) / float64(len(s))
}

func (r thrResult) line() string {
	return fmt.Sprintf("requests %d, hottest %s in flight p50/p99/max %.0f/%.0f/%.0f (mean %.1f; any instance's p99 ≤ %.0f), primary share %.1f %%, hit rate %.1f %%, spill %d, fallback %d, shares %d/%d, record writes %.1f/s, failed %d",
		r.requests, r.hottest, r.p50, r.p99, r.max, r.mean, r.anyP99, 100*r.primaryShare(), 100*r.hitRate(), r.spill, r.fallback,
		r.busyShare, r.lightShare, float64(r.writes)/r.window.Seconds(), r.failed)
}

func thrTable(rows []thrResult) string {
	var cells [][]string
	for _, r := range rows {
		cells = append(cells, []string{fmt.Sprint(r.replicas), r.option, fmt.Sprint(r.requests),
			fmt.Sprintf("%.0f / %.0f / %.0f (%.1f)", r.p50, r.p99, r.max, r.mean), fmt.Sprintf("%.0f", r.anyP99),
			fmt.Sprintf("%.1f %%", 100*r.primaryShare()), fmt.Sprintf("%.1f %%", 100*r.hitRate()), fmt.Sprint(r.spill), fmt.Sprint(r.fallback),
			fmt.Sprintf("%d / %d", r.busyShare, r.lightShare), fmt.Sprintf("%.1f", float64(r.writes)/r.window.Seconds()), fmt.Sprint(r.failed)})
	}
	return markdownTable([]string{"R", "share", "requests", "in flight at the hottest p50 / p99 / max (mean)", "any instance's p99",
		"primary share", "KV hit rate", "spill", "fallback", "share busy / light", "record writes/s", "failed"}, cells)
}
