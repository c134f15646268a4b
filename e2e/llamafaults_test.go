package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/sony/gobreaker/v2"

	"github.com/prefixrouter/prefixrouter/agent"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/llamacpp"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/overload"
	"github.com/prefixrouter/prefixrouter/probe"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// This file is a real engine failing behind the router: llama.cpp's
// llama-server (3 instances, registered in etcd by the real agent, as
// `prefixrouter register` runs it) killed, hung and restarted under a
// bounded load of mixed streamed and non-streamed chat requests, half of
// them through OpenAI's Go SDK; then hostile clients against it. Every
// request's outcome is counted. docs/engines.md ("Failures of a real
// engine") quotes its figures.

// The fault settings of the replica: what an operator of a llama.cpp
// fleet would set, shortened so that the test runs in seconds. The
// first-byte and idle timeouts leave room for a healthy engine's queue on
// a busy 2-core machine (`make test` runs packages in parallel): at 2 s,
// streams on healthy instances timed out there.
const (
	lfHealthInterval = 250 * time.Millisecond
	lfHealthTimeout  = time.Second
	lfFirstByte      = 4 * time.Second
	lfIdle           = 4 * time.Second
	lfOpenTimeout    = 2 * time.Second
	lfFailures       = 3
)

// llamaFleet is 3 llama-servers behind two router replicas over etcd.
type llamaFleet struct {
	t       *testing.T
	ctx     context.Context
	servers []*llamacpp.Server
	byID    map[string]*llamacpp.Server
	c       *cluster
	// reps[0] runs health checks (as `serve` does by default); reps[1]
	// has them off, so that its breakers alone take failed instances
	// out: the load alternates between them.
	reps []*replica.Replica
	hc   *http.Client
}

// startLlamaFleet starts the servers, an embedded etcd, two replicas with
// the fault settings above (the second without health checks) and an
// agent per server, and waits until the replicas route to all three.
func startLlamaFleet(t *testing.T) *llamaFleet {
	ctx := testsupport.Context(t, 4*time.Minute)
	lf := &llamaFleet{t: t, ctx: ctx, byID: map[string]*llamacpp.Server{}}
	f := startLlamaServers(t, ctx, llamacpp.Options{Instances: 3, Slots: 4, Context: 4096})
	lf.servers = f.Servers()
	for _, s := range lf.servers {
		lf.byID[s.ID] = s
	}
	lf.c = newCluster(t, 2*time.Second, func(o *localfleet.Options) {
		o.Routing = fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware,
			// A threshold the load never reaches: a hung engine's held
			// plain requests would otherwise fill it, and spill the
			// streams that time out on it (and open its breaker).
			PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: fleet.MinPrefixLength, ConcurrencyThreshold: 32}}
		o.Replica.Router = router.Options{
			HealthCheckInterval: lfHealthInterval, HealthCheckTimeout: lfHealthTimeout,
			FirstByteTimeout: lfFirstByte, UpstreamIdleTimeout: lfIdle,
			Breaker: overload.BreakerOptions{ConsecutiveFailures: lfFailures, OpenTimeout: lfOpenTimeout},
		}
	})
	lf.c.startReplicas(1)
	noHealth, err := lf.c.f.AddReplicaWith(ctx, func(o *replica.Options) { o.Router.HealthCheckInterval = 0 })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := lf.c.f.StopReplica(sctx, noHealth); err != nil {
			t.Errorf("close replica %s: %v", noHealth.Addr(), err)
		}
	})
	lf.c.replicas = append(lf.c.replicas, noHealth)
	lf.reps = lf.c.replicas
	for _, s := range lf.servers {
		lf.startAgent(s)
	}
	ids := slices.Sorted(maps.Keys(lf.byID))
	testsupport.Eventually(t, 20*time.Second, "the replicas route to the three llama-servers", func() bool { return lf.c.hasInstances(ids...) })
	tr := &http.Transport{MaxIdleConnsPerHost: 64, Proxy: nil}
	t.Cleanup(tr.CloseIdleConnections)
	lf.hc = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	return lf
}

// startAgent runs the agent beside s, with its own etcd client, as
// `prefixrouter register --endpoint chat --id ID --addr URL` does; it
// stops (draining) when the test ends, before etcd does.
func (lf *llamaFleet) startAgent(s *llamacpp.Server) {
	cli, err := membership.NewClient(membership.ClientOptions{Endpoints: lf.c.f.Etcd().Endpoints()})
	if err != nil {
		lf.t.Fatal(err)
	}
	actx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(actx, agent.Options{
			Client: cli, Options: membership.Options{TTL: 2 * time.Second, Logger: quiet},
			Endpoint: ep, Instance: fleet.Instance{ID: s.ID, Addr: s.URL},
			HealthInterval: 20 * time.Millisecond, DrainTimeout: 2 * time.Second, DrainGrace: 10 * time.Millisecond,
		})
	}()
	lf.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			lf.t.Errorf("agent of %s: %v", s.ID, err)
		}
		_ = cli.Close()
	})
}

// status is replica r's view of instance id.
func (lf *llamaFleet) status(r int, id string) overload.Status {
	st, ok := lf.reps[r].Router().Status(ep, id)
	if !ok {
		lf.t.Fatalf("no status for %s", id)
	}
	return st
}

// out reports whether replica r holds id out of rotation, and why.
func (lf *llamaFleet) out(r int, id string) (bool, string) {
	st := lf.status(r, id)
	var why []string
	if !st.Healthy {
		why = append(why, "health check")
	}
	if st.Breaker == gobreaker.StateOpen {
		why = append(why, "breaker")
	}
	return len(why) > 0, strings.Join(why, "+")
}

// counter sums replica r's counter name over the series whose labels
// include want.
func (lf *llamaFleet) counter(r int, name string, want map[string]string) float64 {
	return testsupport.Sum(lf.t, lf.reps[r].Registry(), name, want)
}

// processing is llama-server's own count of the requests it works on.
func (lf *llamaFleet) processing(s *llamacpp.Server) float64 {
	m, err := probe.Scrape(lf.ctx, lf.hc, s.URL+"/metrics")
	if err != nil {
		lf.t.Fatalf("%s /metrics: %v", s.ID, err)
	}
	n, err := m.Sum("llamacpp:requests_processing")
	if err != nil {
		lf.t.Fatalf("%s /metrics: %v", s.ID, err)
	}
	return n
}

// lfOutcome is one request of the load and how it ended.
type lfOutcome struct {
	rep         int // the replica it went through
	doc         int
	stream, sdk bool
	start, end  time.Time
	instance    string // X-Prefixrouter-Instance; "" when no answer came
	decision    string
	status      int // 0: no answer
	chunks      int // streamed data events before the end
	done        bool
	prompt      int    // usage.prompt_tokens (raw requests)
	evaluated   int    // timings.prompt_n (raw requests): the prompt tokens not served by the cache
	finish      string // the last finish_reason (raw requests)
	err         error
}

func (o lfOutcome) ok() bool {
	return o.err == nil && o.status == http.StatusOK && (!o.stream || o.done)
}

func (o lfOutcome) String() string {
	kind := "plain"
	if o.stream {
		kind = "stream"
	}
	if o.sdk {
		kind += "/sdk"
	}
	return fmt.Sprintf("doc %d %s via replica %d %s+%v on %q: status %d, %d chunks, done %v, err %v", o.doc, kind, o.rep,
		o.start.Format("15:04:05.000"), o.end.Sub(o.start).Round(time.Millisecond), o.instance, o.status, o.chunks, o.done, o.err)
}

// Answer lengths: streams last long enough to be cut mid-way.
const (
	lfStreamTokens = 48
	lfPlainTokens  = 8
	// lfHeldTokens: the plain request in flight when the engine dies.
	lfHeldTokens = 400
)

// chatRaw sends one chat request through replica o.rep as a plain HTTP
// client (chatLlama).
func (lf *llamaFleet) chatRaw(ctx context.Context, o lfOutcome, system, user string, maxTokens int) lfOutcome {
	return chatLlama(ctx, lf.hc, lf.reps[o.rep].URL(), o, system, user, maxTokens)
}

// chatLlama sends one chat request (streamed when o.stream) to base and
// reads its answer into o, without failing the test: o says how it ended.
// A streamed answer must be an event stream that ends with [DONE].
func chatLlama(ctx context.Context, hc *http.Client, base string, o lfOutcome, system, user string, maxTokens int) lfOutcome {
	body, _ := json.Marshal(map[string]any{
		"model": "tiny", "max_tokens": maxTokens, "stream": o.stream,
		"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		o.err = err
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		o.err = err
		return o
	}
	defer resp.Body.Close()
	o.status, o.instance, o.decision = resp.StatusCode, resp.Header.Get(router.HeaderInstance), resp.Header.Get(router.HeaderDecision)
	var obj struct {
		Choices []struct {
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
		Timings *struct {
			PromptN int `json:"prompt_n"`
		} `json:"timings"`
	}
	take := func(b []byte) {
		obj.Usage, obj.Timings, obj.Choices = nil, nil, nil
		if err := json.Unmarshal(b, &obj); err != nil {
			o.err = fmt.Errorf("answer %q: %w", b, err)
			return
		}
		for _, c := range obj.Choices {
			if c.FinishReason != nil {
				o.finish = *c.FinishReason
			}
		}
		if obj.Usage != nil {
			o.prompt = obj.Usage.PromptTokens
		}
		if obj.Timings != nil {
			o.evaluated = obj.Timings.PromptN
		}
	}
	if !o.stream || resp.StatusCode != http.StatusOK {
		b, err := io.ReadAll(resp.Body)
		o.err = err
		if resp.StatusCode == http.StatusOK {
			take(b)
		} else if o.err == nil {
			o.err = fmt.Errorf("status %d: %.200s", resp.StatusCode, b)
		}
		return o
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		o.err = fmt.Errorf("streamed answer of type %q", ct)
		return o
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() && o.err == nil {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		switch {
		case !ok:
		case line == "[DONE]":
			o.done = true
		default:
			o.chunks++
			take([]byte(line))
		}
	}
	if o.err == nil {
		o.err = sc.Err()
	}
	if o.err == nil && !o.done {
		o.err = fmt.Errorf("stream ended without [DONE] and without an error, after %d chunks", o.chunks)
	}
	return o
}

// chatSDK sends one chat request through OpenAI's Go SDK.
func (lf *llamaFleet) chatSDK(ctx context.Context, o lfOutcome, system, user string, maxTokens int) lfOutcome {
	oa := newOpenAI(lf.reps[o.rep].URL(), lf.hc)
	params := openai.ChatCompletionNewParams{Model: "tiny", MaxTokens: openai.Int(int64(maxTokens)),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage(user)}}
	var raw *http.Response
	answered := func() {
		if raw != nil {
			o.status, o.instance, o.decision = raw.StatusCode, raw.Header.Get(router.HeaderInstance), raw.Header.Get(router.HeaderDecision)
		}
	}
	var apiErr *openai.Error
	if !o.stream {
		_, o.err = oa.Chat.Completions.New(ctx, params, option.WithResponseInto(&raw))
		answered()
		if errors.As(o.err, &apiErr) {
			o.status = apiErr.StatusCode
		}
		return o
	}
	st := oa.Chat.Completions.NewStreaming(ctx, params, option.WithResponseInto(&raw))
	finished := false
	for st.Next() {
		o.chunks++
		for _, c := range st.Current().Choices {
			finished = finished || c.FinishReason != ""
		}
	}
	o.err = st.Err()
	_ = st.Close()
	answered()
	if errors.As(o.err, &apiErr) {
		o.status = apiErr.StatusCode
	}
	// The SDK ends a stream at [DONE] without an error, and at an end
	// without it too: a stream without a finish reason and without an
	// error is a truncation the client was not told of.
	o.done = o.err == nil && finished
	if o.err == nil && !finished {
		o.err = fmt.Errorf("stream ended without a finish reason and without an error, after %d chunks", o.chunks)
	}
	return o
}

// lfLoad is the bounded load: workers send requests (count and time
// bounded) until stopped, and keep every outcome.
type lfLoad struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex // guards outcomes
	all    []lfOutcome
}

// startLoad runs workers goroutines over docs, each sending at most
// perWorker requests within maxTime: streamed and plain in turn, every
// third through the SDK.
func (lf *llamaFleet) startLoad(workers, perWorker int, maxTime time.Duration, docs []string) *lfLoad {
	ctx, cancel := context.WithTimeout(lf.ctx, maxTime)
	l := &lfLoad{cancel: cancel}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; i < perWorker && ctx.Err() == nil; i++ {
				o := lfOutcome{rep: (i / 2) % 2, doc: (w*5 + i) % len(docs), stream: (w+i)%2 == 0, sdk: i%3 == 0, start: time.Now()}
				n := lfPlainTokens
				if o.stream {
					n = lfStreamTokens
				}
				// The client's own deadline; a request cut by the loop's
				// end is the test's doing, not the router's.
				rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
				user := fmt.Sprintf("Question %d of worker %d?", i, w)
				if o.sdk {
					o = lf.chatSDK(rctx, o, docs[o.doc], user, n)
				} else {
					o = lf.chatRaw(rctx, o, docs[o.doc], user, n)
				}
				rcancel()
				o.end = time.Now()
				l.mu.Lock()
				l.all = append(l.all, o)
				l.mu.Unlock()
			}
		}()
	}
	return l
}

// streamUntil sends streamed requests for docs[pick...] through replica
// r from n goroutines, at most max in all, until done holds, and adds
// their outcomes to the load's.
func (lf *llamaFleet) streamUntil(l *lfLoad, r int, pick []int, docs []string, n, max int, done func() bool) *sync.WaitGroup {
	var wg sync.WaitGroup
	var sent atomic.Int64
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !done() && sent.Add(1) <= int64(max); i++ {
				o := lfOutcome{rep: r, doc: pick[(w+i)%len(pick)], stream: true, start: time.Now()}
				rctx, cancel := context.WithTimeout(lf.ctx, 20*time.Second)
				o = lf.chatRaw(rctx, o, docs[o.doc], fmt.Sprintf("Stream %d of %d?", i, w), lfStreamTokens)
				cancel()
				o.end = time.Now()
				l.mu.Lock()
				l.all = append(l.all, o)
				l.mu.Unlock()
			}
		}()
	}
	return &wg
}

// outcomes returns a copy of the outcomes so far.
func (l *lfLoad) outcomes() []lfOutcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.all)
}

// stop ends the load and waits for its workers.
func (l *lfLoad) stop() []lfOutcome {
	l.cancel()
	l.wg.Wait()
	return l.outcomes()
}

// served counts the successful outcomes on id that started after since.
func served(all []lfOutcome, id string, since time.Time) int {
	n := 0
	for _, o := range all {
		if o.ok() && o.instance == id && o.start.After(since) {
			n++
		}
	}
	return n
}

// lfReplicas names the two replicas in logs.
var lfReplicas = [2]string{"health checks", "breaker only"}

// outOfRotation waits until every replica holds id out of rotation and
// returns, per replica, how long after since it did and by what.
func (lf *llamaFleet) outOfRotation(id string, since time.Time, within time.Duration) (after [2]time.Duration, by [2]string) {
	lf.t.Helper()
	defer func() {
		if lf.t.Failed() {
			for r := range lf.reps {
				lf.t.Logf("replica %d: %+v", r, lf.status(r, id))
			}
		}
	}()
	testsupport.Eventually(lf.t, within, id+" out of rotation on both replicas", func() bool {
		all := true
		for r := range lf.reps {
			if after[r] != 0 {
				continue
			}
			if out, why := lf.out(r, id); out {
				after[r], by[r] = time.Since(since), why
			} else {
				all = false
			}
		}
		return all
	})
	return after, by
}

// backInRotation waits until every replica routes to id again and
// returns, per replica, how long after since it did.
func (lf *llamaFleet) backInRotation(id string, since time.Time, within time.Duration) (after [2]time.Duration) {
	lf.t.Helper()
	testsupport.Eventually(lf.t, within, id+" back in rotation on both replicas", func() bool {
		all := true
		for r := range lf.reps {
			if after[r] != 0 {
				continue
			}
			if out, _ := lf.out(r, id); !out && lf.status(r, id).Breaker == gobreaker.StateClosed {
				after[r] = time.Since(since)
			} else {
				all = false
			}
		}
		return all
	})
	return after
}

// servesKeysAgain waits until every replica has had a request for one of
// id's own documents answered by id (affinity) that started after since,
// and returns the first such outcome per replica.
func (lf *llamaFleet) servesKeysAgain(load *lfLoad, id string, owner map[int]string, since time.Time) (first [2]lfOutcome) {
	lf.t.Helper()
	testsupport.Eventually(lf.t, 30*time.Second, id+" serves its keys again through both replicas", func() bool {
		var seen [2]bool
		for _, o := range load.outcomes() {
			if !seen[o.rep] && o.ok() && o.instance == id && owner[o.doc] == id && o.decision == router.DecisionAffinity && o.start.After(since) {
				seen[o.rep], first[o.rep] = true, o
			}
		}
		return seen[0] && seen[1]
	})
	return first
}

func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// TestLlamaCppFaults: llama-servers killed (SIGKILL), hung (SIGSTOP, then
// SIGCONT) and restarted on the same port behind two replicas (one with
// health checks, one with breakers only), under a bounded load of mixed
// streamed and plain chat requests (raw and through OpenAI's SDK). Only
// the requests the dying or hung engine already held fail, each with an
// error its client sees (a stream cut mid-way, a 502/504 before any byte);
// every other request is answered; the failed instance leaves rotation
// within a few health-check periods or failures, and comes back with its
// keys.
func TestLlamaCppFaults(t *testing.T) {
	lf := startLlamaFleet(t)
	docs := make([]string, 9)
	for i := range docs {
		docs[i] = document(100+i, 150)
	}
	// Where each document's key lives, from a plain request each (both
	// replicas agree: the same snapshot, the same ring).
	owner := map[int]string{}
	byInstance := map[string][]int{}
	for d := range docs {
		for r := range lf.reps {
			o := lf.chatRaw(lf.ctx, lfOutcome{rep: r, doc: d}, docs[d], "Hello?", 1)
			if !o.ok() || o.decision != router.DecisionAffinity || (r == 1 && o.instance != owner[d]) {
				t.Fatalf("warm-up of document %d: %v (decision %q; replica 0 chose %q)", d, o, o.decision, owner[d])
			}
			owner[d] = o.instance
		}
		byInstance[owner[d]] = append(byInstance[owner[d]], d)
	}
	if len(byInstance) != 3 {
		t.Fatalf("documents by instance %v: want keys on all three", byInstance)
	}
	killed, hung := lf.servers[0], lf.servers[1]
	t.Logf("documents by instance: %v; killing %s, hanging %s", byInstance, killed.ID, hung.ID)
	// A document of the killed instance that the load leaves alone: its
	// cache warm before the kill, cold after the restart.
	probe := ""
	for i := 0; probe == "" && i < 30; i++ {
		d := document(500+i, 150)
		if o := lf.chatRaw(lf.ctx, lfOutcome{}, d, "Hello?", 1); o.ok() && o.instance == killed.ID {
			probe = d
		}
	}
	if probe == "" {
		t.Fatalf("no document of %s among 30", killed.ID)
	}
	if o := lf.chatRaw(lf.ctx, lfOutcome{}, probe, "Again?", 1); !o.ok() || o.instance != killed.ID || o.evaluated > o.prompt/4 {
		t.Fatalf("the probe document again before the kill: %v, evaluated %d of %d; want a warm cache on %s", o, o.evaluated, o.prompt, killed.ID)
	}

	load := lf.startLoad(6, 500, 2*time.Minute, docs)
	defer load.stop()
	testsupport.Eventually(t, 20*time.Second, "the load warmed up on every instance", func() bool {
		all := load.outcomes()
		for _, s := range lf.servers {
			if served(all, s.ID, time.Time{}) < 2 {
				return false
			}
		}
		return true
	})

	// SIGKILL, with a stream and a plain request of ours on the instance
	// (and whatever the load has there).
	var dialsBefore, retriesBefore [2]float64
	for r := range lf.reps {
		dialsBefore[r] = lf.counter(r, "prefixrouter_upstream_errors_total", map[string]string{"kind": "dial"})
		retriesBefore[r] = lf.counter(r, "prefixrouter_retries_total", nil)
	}
	cut, held := make(chan lfOutcome, 1), make(chan lfOutcome, 1)
	firstChunk := make(chan struct{})
	go func() {
		o := lfOutcome{doc: byInstance[killed.ID][0], stream: true, start: time.Now()}
		cut <- lf.streamUntilCut(o, docs[o.doc], firstChunk)
	}()
	go func() {
		o := lfOutcome{rep: 1, doc: byInstance[killed.ID][1], start: time.Now()}
		o = lf.chatRaw(lf.ctx, o, docs[o.doc], "Go on for a while.", lfHeldTokens)
		o.end = time.Now()
		held <- o
	}()
	select {
	case <-firstChunk:
	case <-time.After(20 * time.Second):
		t.Fatal("no chunk of the stream to be cut")
	}
	testsupport.Eventually(t, 20*time.Second, "our plain request on the instance", func() bool { return lf.status(1, killed.ID).InFlight > 0 })
	var inFlight [2]int64
	for r := range lf.reps {
		inFlight[r] = lf.status(r, killed.ID).InFlight
	}
	tKill := time.Now()
	if err := killed.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-killed.Exited()
	// Until the process is gone, its sockets are: a request sent in
	// those milliseconds may be reset on a fresh connection (the engine
	// may have read it: not retried).
	tGone := time.Now()
	outAfter, outBy := lf.outOfRotation(killed.ID, tKill, 20*time.Second)
	t.Logf("SIGKILL %s: process gone after %v", killed.ID, ms(tGone.Sub(tKill)))
	for r := range lf.reps {
		t.Logf("SIGKILL %s with %d requests in flight through replica %d (%s): out of rotation after %v, by %s",
			killed.ID, inFlight[r], r, lfReplicas[r], ms(outAfter[r]), outBy[r])
	}
	// Membership plays no part: the agent holds its lease whatever its
	// engine does (it probes the engine only until it registers).
	_, recorded := lookup(lf.reps[0], killed.ID)
	t.Logf("the killed instance's record still in the replicas' snapshot: %v", recorded)
	c, h := <-cut, <-held
	if c.err == nil || c.chunks == 0 || c.end.Sub(tKill) > 5*time.Second {
		t.Errorf("the stream cut by the kill: %v; want an error the client sees after its first chunks, at once", c)
	}
	t.Logf("the stream cut mid-way ended %v after the kill: %v", ms(c.end.Sub(tKill)), c.err)
	if !h.ok() && h.status != http.StatusBadGateway {
		t.Errorf("the plain request the killed engine held: %v; want 502 (it died with it) or an answer from another instance (re-sent)", h)
	}
	t.Logf("the plain request the killed engine held ended %v after the kill: %v", ms(h.end.Sub(tKill)), h)
	// A while without it: the others answer everything.
	tOut := time.Now()
	testsupport.Eventually(t, 20*time.Second, "requests answered by the two others", func() bool {
		all := load.outcomes()
		return served(all, lf.servers[1].ID, tOut) >= 4 && served(all, lf.servers[2].ID, tOut) >= 4
	})
	for r := range lf.reps {
		t.Logf("replica %d after the kill: %v dial errors, %v retries elsewhere", r,
			lf.counter(r, "prefixrouter_upstream_errors_total", map[string]string{"kind": "dial"})-dialsBefore[r],
			lf.counter(r, "prefixrouter_retries_total", nil)-retriesBefore[r])
	}

	// Restart on the same port: back in rotation (health check, or the
	// breaker's half-open probe), with a cold cache, and its keys return.
	tRestart := time.Now()
	if err := killed.Restart(lf.ctx); err != nil {
		t.Fatal(err)
	}
	up := time.Since(tRestart)
	backAfter := lf.backInRotation(killed.ID, tRestart, 20*time.Second)
	first := lf.servesKeysAgain(load, killed.ID, owner, tRestart)
	for r := range lf.reps {
		t.Logf("restart of %s (healthy after %v): in rotation on replica %d (%s) after %v, first answer of its own keys %v after the restart",
			killed.ID, ms(up), r, lfReplicas[r], ms(backAfter[r]), ms(first[r].end.Sub(tRestart)))
	}
	// Its cache is cold: the probe document, back on it, is evaluated
	// whole. (Warm again afterwards only while no other prompt takes its
	// slot: llama-server keeps one prompt per slot, and the load's reuse
	// them.)
	if o := lf.chatRaw(lf.ctx, lfOutcome{}, probe, "After the restart?", 1); !o.ok() || o.instance != killed.ID || o.evaluated < o.prompt/2 {
		t.Fatalf("the probe document after the restart: %v, evaluated %d of %d; want a cold cache on %s", o, o.evaluated, o.prompt, killed.ID)
	} else {
		t.Logf("the probe document after the restart on %s: %d of %d prompt tokens evaluated (cold)", o.instance, o.evaluated, o.prompt)
	}

	// SIGSTOP: a hung engine. Its streams hit the first-byte and idle
	// timeouts, it leaves rotation (health checks; the breaker, once the
	// timeouts add up); after SIGCONT it comes back with its keys (and its
	// cache, which it kept).
	var timeoutsBefore [2]float64
	for r := range lf.reps {
		timeoutsBefore[r] = lf.counter(r, "prefixrouter_upstream_errors_total", map[string]string{"kind": "timeout"})
	}
	tStop := time.Now()
	if err := hung.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Clients streaming the hung instance's documents through the
	// breaker-only replica: the timeouts that open its breaker (the
	// load's own would come slowly: its workers wait on the plain
	// requests the hung engine holds).
	streamers := lf.streamUntil(load, 1, byInstance[hung.ID], docs, 3, 12, func() bool {
		return lf.status(1, hung.ID).Breaker == gobreaker.StateOpen
	})
	outAfter, outBy = lf.outOfRotation(hung.ID, tStop, 20*time.Second)
	streamers.Wait()
	for r := range lf.reps {
		t.Logf("SIGSTOP %s: out of rotation on replica %d (%s) after %v, by %s; %v calls cut by the first-byte or idle timeout",
			hung.ID, r, lfReplicas[r], ms(outAfter[r]), outBy[r],
			lf.counter(r, "prefixrouter_upstream_errors_total", map[string]string{"kind": "timeout"})-timeoutsBefore[r])
	}
	tCont := time.Now()
	if err := hung.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	backAfter = lf.backInRotation(hung.ID, tCont, 20*time.Second)
	first = lf.servesKeysAgain(load, hung.ID, owner, tCont)
	for r := range lf.reps {
		t.Logf("SIGCONT %s: in rotation on replica %d (%s) after %v, first answer of its own keys %v after SIGCONT",
			hung.ID, r, lfReplicas[r], ms(backAfter[r]), ms(first[r].end.Sub(tCont)))
	}

	all := load.stop()
	// Every outcome accounted for: answered, or one of the failures the
	// faults explain, each with an error the client saw.
	var ok, cutByKill, heldByKilled, hungTimeouts, heldThroughHang int
	var unexplained []lfOutcome
	for _, o := range all {
		switch {
		case o.ok():
			ok++
			if o.instance == hung.ID && o.start.Before(tCont) && o.end.After(tCont) && !o.stream {
				heldThroughHang++
			}
		case o.instance == killed.ID && o.start.Before(tGone) && o.end.After(tKill) && o.stream && o.status == http.StatusOK && o.err != nil:
			cutByKill++ // a stream cut mid-way: the client saw an error
		case o.instance == killed.ID && o.start.Before(tGone) && o.end.After(tKill) && o.status == http.StatusBadGateway:
			heldByKilled++ // the engine had the request; it died with it
		case o.instance == hung.ID && o.start.After(tStop.Add(-lfIdle)) && o.start.Before(tCont) && o.stream && o.err != nil &&
			(o.status == http.StatusGatewayTimeout || o.status == http.StatusBadGateway || o.status == http.StatusOK):
			// Cut by the first-byte or idle timeout: before its headers
			// (502), or after them (a truncated stream: the headers of
			// an SSE answer reach the client at once).
			hungTimeouts++
		default:
			unexplained = append(unexplained, o)
		}
	}
	t.Logf("%d requests over %v: %d answered (%d plain ones held by the hung engine until SIGCONT), %d streams cut by the kill, %d plain requests the killed engine held (502), %d streams timed out on the hung engine; %d unexplained",
		len(all), ms(all[len(all)-1].end.Sub(all[0].start)), ok, heldThroughHang, cutByKill, heldByKilled, hungTimeouts, len(unexplained))
	for i, o := range unexplained {
		if i == 10 {
			break
		}
		t.Errorf("unexplained outcome: %v", o)
	}
}

// pollUpTo polls cond until it holds or d has passed, and reports how long
// it waited and whether it held: for what may or may not happen.
func pollUpTo(d time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Since(start) > d {
			return time.Since(start), false
		}
		<-tick.C
	}
	return time.Since(start), true
}

// streamUntilCut streams a long answer for doc through the router, closes
// firstChunk at its first chunk and reads until the stream ends.
func (lf *llamaFleet) streamUntilCut(o lfOutcome, doc string, firstChunk chan<- struct{}) lfOutcome {
	body, _ := json.Marshal(map[string]any{
		"model": "tiny", "max_tokens": 4000, "stream": true,
		"messages": []map[string]string{{"role": "system", "content": doc}, {"role": "user", "content": "Go on forever."}},
	})
	ctx, cancel := context.WithTimeout(lf.ctx, time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, lf.reps[o.rep].URL()+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := lf.hc.Do(req)
	if err != nil {
		o.err, o.end = err, time.Now()
		close(firstChunk)
		return o
	}
	defer resp.Body.Close()
	o.status, o.instance = resp.StatusCode, resp.Header.Get(router.HeaderInstance)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			if o.chunks++; o.chunks == 1 {
				close(firstChunk)
			}
		}
		if sc.Text() == "data: [DONE]" {
			o.done = true
		}
	}
	o.err = sc.Err()
	if o.chunks == 0 {
		close(firstChunk)
	}
	o.end = time.Now()
	return o
}

// TestLlamaCppHostileClients: clients that misbehave against a real
// llama-server behind the router. A client that leaves mid-answer
// (streamed or not) has its generation cancelled on the engine: the
// router closes the upstream connection and llama-server, which polls
// it (is_connection_closed, once a second or once a token), stops; its
// requests_processing gauge falls back to 0. Requests llama-server
// refuses, with 400 or with the 500 it answers to a body it cannot parse
// into a task, reach the client as llama-server sent them and never open
// the instance's breaker.
func TestLlamaCppHostileClients(t *testing.T) {
	lf := startLlamaFleet(t)
	doc := document(200, 150)
	o := lf.chatRaw(lf.ctx, lfOutcome{}, doc, "Hello?", 1)
	if !o.ok() {
		t.Fatalf("warm-up: %v", o)
	}
	s := lf.byID[o.instance]
	// The engine's own gauge, polled fast for a stream (llama-server stops
	// at the first token it cannot write); every 1.2 s for a plain answer:
	// each scrape of /metrics is a task whose result wakes every handler
	// waiting on llama-server's result queue, and a plain request's
	// handler checks its connection only after a whole second without any
	// result (server.cpp, recv_with_timeout and HTTP_POLLING_SECONDS), so
	// faster polls would keep it from ever noticing.
	idle := func(what string, every time.Duration) time.Duration {
		start := time.Now()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for lf.processing(s) != 0 || lf.status(0, s.ID).InFlight != 0 {
			if time.Since(start) > 20*time.Second {
				t.Fatalf("not within 20s: %s", what)
			}
			<-tick.C
		}
		return time.Since(start)
	}
	idle("the engine idle before the test", 10*time.Millisecond)

	for _, tc := range []struct {
		stream bool
		base   string // the router, or the engine itself to compare
		poll   time.Duration
	}{{true, lf.reps[0].URL(), 10 * time.Millisecond}, {false, lf.reps[0].URL(), 1200 * time.Millisecond}, {false, s.URL, 1200 * time.Millisecond}} {
		stream := tc.stream
		ctx, cancel := context.WithCancel(lf.ctx)
		body, _ := json.Marshal(map[string]any{
			"model": "tiny", "max_tokens": 4000, "stream": stream,
			"messages": []map[string]string{{"role": "system", "content": doc}, {"role": "user", "content": "Go on forever."}},
		})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tc.base+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		done := make(chan error, 1)
		chunk := make(chan struct{}, 1)
		go func() {
			resp, err := lf.hc.Do(req)
			if err != nil {
				done <- err
				return
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			for {
				line, err := br.ReadString('\n')
				if strings.HasPrefix(line, "data: ") {
					select {
					case chunk <- struct{}{}:
					default:
					}
				}
				if err != nil {
					done <- err
					return
				}
			}
		}()
		if stream {
			select {
			case <-chunk:
			case err := <-done:
				t.Fatalf("stream ended before its first chunk: %v", err)
			}
		} else {
			testsupport.Eventually(t, 15*time.Second, "the engine generating the plain answer", func() bool { return lf.processing(s) > 0 })
		}
		cancel()
		<-done
		via := "the router"
		if tc.base == s.URL {
			via = "directly"
		}
		took := idle(fmt.Sprintf("the engine's requests_processing back to 0 after the client left (stream %v, %s)", stream, via), tc.poll)
		t.Logf("client left mid-answer (stream %v, %s): %s idle within %v (polled every %v)", stream, via, s.ID, ms(took), tc.poll)
	}

	// Refused requests: one client's, repeated (one key), and another
	// client's on many documents (many keys).
	bad := []struct {
		name   string
		extra  map[string]any
		status int
		keys   int
	}{
		// "invalid adapter id": invalid_request_error, 400.
		{"lora id 9", map[string]any{"lora": []map[string]any{{"id": 9, "scale": 1}}}, http.StatusBadRequest, 1},
		{"lora id 9", map[string]any{"lora": []map[string]any{{"id": 9, "scale": 1}}}, http.StatusBadRequest, 8},
		// "Only one completion choice is allowed": an exception, which
		// llama-server answers 500 server_error.
		{"n=2", map[string]any{"n": 2}, http.StatusInternalServerError, 1},
		{"n=2", map[string]any{"n": 2}, http.StatusInternalServerError, 8},
	}
	for _, b := range bad {
		keys := b.keys
		for i := range 8 {
			m := map[string]any{"model": "tiny", "max_tokens": 1,
				"messages": []map[string]string{{"role": "system", "content": document(300+i%keys, 150)}, {"role": "user", "content": "Hi"}}}
			for k, v := range b.extra {
				m[k] = v
			}
			body, _ := json.Marshal(m)
			resp, err := lf.hc.Post(lf.reps[0].URL()+"/v1/chat/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			msg, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != b.status {
				t.Fatalf("%s (%d keys), request %d: %d %s, want llama-server's %d", b.name, keys, i, resp.StatusCode, msg, b.status)
			}
		}
		for _, srv := range lf.servers {
			if st := lf.status(0, srv.ID); st.Breaker != gobreaker.StateClosed || !st.Healthy {
				t.Errorf("%s (%d keys): %s breaker %v, healthy %v after 8 refused requests; want closed", b.name, keys, srv.ID, st.Breaker, st.Healthy)
			}
		}
	}
}
