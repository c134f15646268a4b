package e2e

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/agent"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/sim"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/membership"
)

// placementLog records, for every etcd revision either replica's snapshot
// reached, the placement each replica computed from it, and the sequence
// of every adapter's target on replica 0.
type placementLog struct {
	mu      sync.Mutex
	byRev   [2]map[int64]string
	targets map[string][]int
}

func fingerprint(p *lora.Placement, ep *fleet.Endpoint) string {
	var b strings.Builder
	for _, a := range ep.Adapters {
		fmt.Fprintf(&b, "%s=%v;", a.Name, p.Set(a.Name))
	}
	return b.String()
}

// sample polls both replicas' snapshots until ctx ends.
func (l *placementLog) sample(ctx context.Context, f *localfleet.Fleet) {
	reps := f.Replicas()
	for ctx.Err() == nil {
		for i, rep := range reps[:2] {
			s := rep.Router().Snapshot()
			ep := s.Endpoint(f.Endpoint())
			if ep == nil {
				continue
			}
			l.mu.Lock()
			if _, seen := l.byRev[i][s.Revision]; !seen {
				l.byRev[i][s.Revision] = fingerprint(lora.Place(ep), ep)
				if i == 0 {
					for _, a := range ep.Adapters {
						seq := l.targets[a.Name]
						if n := len(seq); n == 0 || seq[n-1] != a.Target() {
							l.targets[a.Name] = append(seq, a.Target())
						}
					}
				}
			}
			l.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Millisecond):
		}
	}
}

// startPlacing starts a fleet for the adapter tests: fast etcd with 5 s
// leases, simulators in real time that answer 8 tokens, agents that place
// adapters; o gives the rest. The fleet closes when the test ends.
func startPlacing(t *testing.T, ctx context.Context, o localfleet.Options) *localfleet.Fleet {
	t.Helper()
	o.Endpoint, o.FastEtcd, o.Logger, o.TTL = ep, true, quiet, 5*time.Second
	o.Sim.TimeScale, o.Sim.DefaultMaxTokens = 1, 8
	o.Agent.PlaceAdapters = true
	f, err := localfleet.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// TestAdaptersPlaceThemselves is issue 11's acceptance: 6 simulated vLLM
// servers with 4 adapter slots each, 12 catalogued adapters, Zipf-popular
// traffic through 2 replicas.
func TestAdaptersPlaceThemselves(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute of traffic")
	}
	ctx := testsupport.Context(t, 3*time.Minute)
	f := startPlacing(t, ctx, localfleet.Options{
		Instances: 6, Replicas: 2,
		Sim:     sim.Options{MaxLoras: 4, AdapterLoadTime: 500 * time.Millisecond},
		Routing: fleet.RoutingConfig{PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{ConcurrencyThreshold: 2}},
		Agent:   agent.Options{LoadPollInterval: 50 * time.Millisecond, SaturationWindow: time.Second, ActiveWindow: 10 * time.Second, ScaleCooldown: time.Second},
	})
	log := &placementLog{byRev: [2]map[int64]string{{}, {}}, targets: map[string][]int{}}
	sctx, stopSampling := context.WithCancel(ctx)
	var swg sync.WaitGroup
	swg.Add(1)
	go func() { defer swg.Done(); log.sample(sctx, f) }()

	var names []string
	for i := range 12 {
		name := fmt.Sprintf("lora-%02d", i)
		names = append(names, name)
		if err := membership.PutAdapter(ctx, f.Client(), membership.Layout{}, ep, fleet.Adapter{Name: name, Source: "/adapters/" + name, MinReplicas: 1, MaxReplicas: 3}); err != nil {
			t.Fatal(err)
		}
	}

	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	routers := f.RouterURLs()
	var sent, failed, notFound atomic.Int64
	send := func(model, prompt string) {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":8,"messages":[{"role":"user","content":%q}]}`, model, prompt)
		resp, err := client.Post(routers[int(sent.Add(1))%len(routers)]+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			failed.Add(1)
			t.Errorf("%s: %v", model, err)
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound {
			notFound.Add(1)
		}
		if resp.StatusCode != http.StatusOK {
			failed.Add(1)
			if failed.Load() < 5 {
				t.Errorf("%s: %d %s", model, resp.StatusCode, b)
			}
		}
	}
	// Zipf-popular adapters (s = 1.2 over 12): lora-00 takes about a
	// third of the traffic. 8 clients send as fast as they are answered,
	// from the moment the catalogue is written: the first requests of
	// every adapter wait for its load.
	traffic := func(n int, seed uint64) {
		rng := rand.New(rand.NewPCG(seed, 1))
		z := rand.NewZipf(rng, 1.2, 1, 11)
		var mu sync.Mutex
		next := func() (string, string) {
			mu.Lock()
			defer mu.Unlock()
			a := names[z.Uint64()]
			return a, fmt.Sprintf("system prompt of %s. question %d", a, rng.IntN(50))
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for sent.Load() < int64(n) {
					send(next())
				}
			}()
		}
		wg.Wait()
	}
	traffic(1000, 1)
	t.Logf("phase 1: %d requests, %d failed", sent.Load(), failed.Load())

	// Sustained overload made lora-00's set grow; once traffic stops it
	// is cold and shrinks back to 1.
	testsupport.Eventually(t, 60*time.Second, "every set back to its minimum once traffic stopped", func() bool {
		ep := f.Replicas()[0].Router().Snapshot().Endpoint(ep)
		for _, a := range ep.Adapters {
			if a.Target() != a.Min() {
				return false
			}
		}
		return true
	})

	// An adapter unloaded behind the router's back: no client sees a 404.
	holder := lora.Place(f.Replicas()[0].Router().Snapshot().Endpoint(ep)).Set("lora-01")[0]
	in := f.Instance(holder)
	in.Sim.SetAdapters(slices.DeleteFunc(in.Sim.Adapters(), func(a string) bool { return a == "lora-01" }))
	before := sent.Load()
	for i := range 20 {
		send("lora-01", fmt.Sprintf("after the unload %d", i))
	}
	t.Logf("stale set: %d requests after the unload", sent.Load()-before)

	stopSampling()
	swg.Wait()
	if failed.Load() != 0 || notFound.Load() != 0 {
		t.Fatalf("%d of %d requests failed, %d with 404", failed.Load(), sent.Load(), notFound.Load())
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	common := 0
	for rev, fp := range log.byRev[0] {
		if other, ok := log.byRev[1][rev]; ok {
			common++
			if other != fp {
				t.Errorf("revision %d: the replicas place differently:\n%s\n%s", rev, fp, other)
			}
		}
	}
	t.Logf("placements compared at %d revisions both replicas reached", common)
	if common < 10 {
		t.Errorf("only %d common revisions sampled", common)
	}
	grew := false
	for name, seq := range log.targets {
		// No flapping: a target rises step by step (growth) and then
		// falls once to the minimum; never up again after a fall.
		fell := false
		for i := 1; i < len(seq); i++ {
			switch {
			case seq[i] > seq[i-1] && fell:
				t.Errorf("%s: target %v rose again after shrinking (flapping)", name, seq)
			case seq[i] > seq[i-1] && seq[i] != seq[i-1]+1:
				t.Errorf("%s: target %v grew by more than one", name, seq)
			case seq[i] < seq[i-1]:
				fell = true
			}
		}
		if slices.Max(seq) > 1 {
			grew = true
		}
		t.Logf("%s: targets %v", name, seq)
	}
	if !grew {
		t.Error("no set grew under sustained overload")
	}
}
