package e2e

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/overload"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// Load shape of TestConcurrencyOptions: clients × (T loops each) send
// perLoop requests of one hot prefix, each held hold by the instance.
const (
	optReplicas  = 3
	optInstances = 4
	optClients   = 3
	optPerLoop   = 6
	optHold      = 150 * time.Millisecond
	optPoll      = 25 * time.Millisecond
)

// hotBody is the one prompt every request of the hot prefix carries.
var hotBody = []byte("the hot system prompt that every request of this tenant shares, then the question")

// optResult is one row of the table.
type optResult struct {
	option, pattern           string
	threshold                 int
	requests, failed          int64
	peak                      int64 // peak concurrency at the primary
	primaryServed             int64
	affinity, spill, fallback int64
}

// TestConcurrencyOptions measures how far the replicas' combined load on
// a hot prefix's primary exceeds ConcurrencyThreshold T with 3 replicas:
//
//	(a) no coordination: each replica admits T (static fleets, Replicas = 1)
//	(b) per-replica share ceil(T/R) (--threshold-share replicas; etcd counts the replicas)
//	(c) the instances' reported load against T (--threshold-share none, LoadPollInterval)
//
// The default share, by traffic, is measured by TestThresholdAtManyReplicas.
//
// The default run asserts the acceptance for (b) at T = 8; with
// PREFIXROUTER_E2E_SWEEP=1 it runs every option for T in {2, 8, 32}, with
// the load spread over all replicas ("even") or sent through one ("skewed",
// as uneven DNS can do), and prints the table of docs/concurrency.md.
func TestConcurrencyOptions(t *testing.T) {
	sweep := os.Getenv("PREFIXROUTER_E2E_SWEEP") != ""
	var bs []*backend
	for i := 0; i < optInstances; i++ {
		b := newBackend(t, fmt.Sprintf("i%d", i))
		b.hold.Store(int64(optHold))
		bs = append(bs, b)
	}
	clients := make([]*http.Client, optClients)
	for i := range clients {
		tr := &http.Transport{MaxIdleConnsPerHost: 256}
		t.Cleanup(tr.CloseIdleConnections)
		clients[i] = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	}

	thresholds, options, patterns := []int{8}, []string{"b"}, []string{"even"}
	if sweep {
		thresholds, options, patterns = []int{2, 8, 32}, []string{"a", "b", "c"}, []string{"even", "skewed"}
	}
	clusters := map[string]*cluster{}
	var rows []optResult
	for _, opt := range options {
		for _, T := range thresholds {
			reps := optionReplicas(t, opt, T, bs, clusters)
			for _, pattern := range patterns {
				res := runHotPrefix(t, reps, clients, bs, T, pattern == "skewed")
				res.option, res.pattern = opt, pattern
				rows = append(rows, res)
				if res.failed != 0 {
					t.Errorf("option %s T=%d %s: %d of %d requests failed", opt, T, pattern, res.failed, res.requests)
				}
				bound := int64(optReplicas * overload.ReplicaShare(T, optReplicas))
				if opt == "b" && res.peak > bound {
					t.Errorf("option b T=%d %s: peak %d at the primary exceeds R·ceil(T/R) = %d", T, pattern, res.peak, bound)
				}
				if opt == "b" && T == 8 && float64(res.peak) > 1.25*float64(T)+1 {
					t.Errorf("option b T=8 %s: peak %d at the primary exceeds 1.25·T+1 = %.0f", pattern, res.peak, 1.25*float64(T)+1)
				}
			}
			if opt == "a" {
				closeReplicas(t, reps)
			}
		}
	}
	t.Log("\n" + optTable(rows))
}

// optionReplicas returns the option's R replicas, configured for T.
func optionReplicas(t *testing.T, opt string, T int, bs []*backend, clusters map[string]*cluster) []*replica.Replica {
	t.Helper()
	cfg := fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{ConcurrencyThreshold: T}}
	if opt == "a" {
		// Static fleets: no replica knows of the others (Replicas = 1),
		// so each admits T on its own.
		var reps []*replica.Replica
		for i := 0; i < optReplicas; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			r, err := replica.Start(ctx, replica.Options{
				Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Router: router.Options{DefaultEndpoint: ep},
				Static: instances(bs...), Routing: cfg, Logger: quiet,
			})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			reps = append(reps, r)
		}
		return reps
	}
	c := clusters[opt]
	if c == nil {
		c = newCluster(t, 0, func(cfg *localfleet.Options) {
			cfg.Replica.Router.ThresholdShare = router.ShareReplicas
			if opt == "c" {
				// The poll alone, as (c) was measured: every replica
				// compares the polled load with the whole T.
				cfg.Replica.Router.ThresholdShare = router.ShareNone
				cfg.Replica.Router.LoadPollInterval = optPoll
			}
		})
		c.startReplicas(optReplicas)
		for _, b := range bs {
			c.register(b.instance())
		}
		clusters[opt] = c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := membership.PutConfig(ctx, c.cli, c.opts.Layout, ep, cfg); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 10*time.Second, "replicas configured", func() bool {
		return c.everyReplica(func(r *replica.Replica) bool {
			e := r.Router().Snapshot().Endpoint(ep)
			return e != nil && len(e.Instances) == len(bs) && e.Resolved.ConcurrencyThreshold == T && r.Router().Snapshot().Replicas == optReplicas
		})
	})
	if opt == "c" {
		testsupport.Eventually(t, 10*time.Second, "every replica polled every instance", func() bool {
			return c.everyReplica(func(r *replica.Replica) bool {
				for _, b := range bs {
					if st, ok := r.Router().Status(ep, b.id); !ok || st.ExternalLoad < 0 {
						return false
					}
				}
				return true
			})
		})
	}
	return c.replicas
}

func closeReplicas(t *testing.T, reps []*replica.Replica) {
	t.Helper()
	for _, r := range reps {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := r.Close(ctx); err != nil {
			t.Error(err)
		}
		cancel()
	}
}

// runHotPrefix sends the hot prefix from optClients clients with T loops
// each (so up to optClients·T requests in flight, enough for R·T), the
// loops' starts spread over one hold time as arrivals would be. Even load
// cycles over the replicas; skewed load goes through the first one only.
func runHotPrefix(t *testing.T, reps []*replica.Replica, clients []*http.Client, bs []*backend, T int, skewed bool) optResult {
	t.Helper()
	primary := choose(t, reps[0].Router(), hotBody, "")
	var pb *backend
	for _, b := range bs {
		if b.id == primary {
			pb = b
		}
	}
	if pb == nil {
		t.Fatalf("primary %q is not a backend", primary)
	}
	testsupport.Eventually(t, 10*time.Second, "backends idle", func() bool {
		for _, b := range bs {
			if b.inFlight.Load() != 0 {
				return false
			}
		}
		return true
	})
	for _, b := range bs {
		b.reset()
	}
	res := optResult{threshold: T}
	var requests, failed atomic.Int64
	var dec decisions
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	loops := optClients * T
	var wg sync.WaitGroup
	for k, client := range clients {
		for l := 0; l < T; l++ {
			w := k*T + l
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Arrival spread, part of the workload (not a wait).
				stagger := time.NewTimer(optHold * time.Duration(w) / time.Duration(loops))
				select {
				case <-stagger.C:
				case <-ctx.Done():
					return
				}
				for i := 0; i < optPerLoop && ctx.Err() == nil; i++ {
					r := reps[0]
					if !skewed {
						r = reps[(w+i)%len(reps)]
					}
					a := invoke(ctx, client, r.URL(), hotBody, "")
					requests.Add(1)
					if !a.ok() {
						failed.Add(1)
						continue
					}
					dec.count(a.decision)
				}
			}()
		}
	}
	wg.Wait()
	res.requests, res.failed = requests.Load(), failed.Load()
	res.affinity, res.spill, res.fallback = dec.affinity.Load(), dec.spill.Load(), dec.fallback.Load()
	res.peak, res.primaryServed = pb.peak.Load(), pb.served.Load()
	return res
}

func optTable(rows []optResult) string {
	var cells [][]string
	for _, r := range rows {
		cells = append(cells, []string{r.option, fmt.Sprint(r.threshold), r.pattern, fmt.Sprint(r.requests), fmt.Sprint(r.peak),
			fmt.Sprint(optReplicas * overload.ReplicaShare(r.threshold, optReplicas)), fmt.Sprint(optReplicas * r.threshold),
			fmt.Sprintf("%.0f %%", math.Round(100*float64(r.primaryServed)/float64(max(r.requests, 1)))),
			fmt.Sprint(r.spill), fmt.Sprint(r.fallback), fmt.Sprint(r.failed)})
	}
	return markdownTable([]string{"option", "T", "load", "requests", "peak at primary", "R·ceil(T/R)", "R·T", "served by primary", "spill", "fallback", "failed"}, cells)
}
