package e2e

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// TestConfigSetFlipsStrategy: `config set` (membership.PutConfig) switches
// the strategy of running replicas within 1 s; invalid values written into
// etcd behind the CLI's back are ignored and the previous config stays.
func TestConfigSetFlipsStrategy(t *testing.T) {
	c := newCluster(t, 0)
	c.startReplicas(2)
	fleetOf(t, c, 3)
	body := []byte("the same prompt every time")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	decisions := func(want string) func() bool {
		return func() bool {
			return c.everyReplica(func(r *replica.Replica) bool { return c.invoke(r, body, "").decision == want })
		}
	}
	if !decisions(router.DecisionAffinity)() {
		t.Fatal("default config: want affinity decisions")
	}

	start := time.Now()
	if err := membership.PutConfig(ctx, c.cli, c.opts.Layout, ep, fleet.RoutingConfig{RoutingStrategy: fleet.Random}); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 10*time.Second, "random decisions on every replica", decisions(router.DecisionRandom))
	within(t, "strategy flipped on every replica", time.Since(start), propagation)

	// The CLI path refuses an out-of-range value...
	bad := fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: 100}}
	if err := membership.PutConfig(ctx, c.cli, c.opts.Layout, ep, bad); !errors.Is(err, fleet.ErrInvalidConfig) {
		t.Fatalf("PutConfig(PrefixLength 100) = %v, want ErrInvalidConfig", err)
	}
	// ...and replicas ignore invalid values written directly.
	for _, raw := range []string{
		`{"RoutingStrategy":`,
		`{"RoutingStrategy":"PREFIX_AWARE","PrefixAwareRoutingConfig":{"PrefixLength":100}}`,
		`{"RoutingStrategy":"ROUND_ROBIN"}`,
		`{"RoutingStrategy":"PREFIX_AWARE","Typo":1}`,
	} {
		resp, err := c.cli.Put(ctx, c.opts.Layout.ConfigKey(ep), raw)
		if err != nil {
			t.Fatal(err)
		}
		testsupport.Eventually(t, 10*time.Second, "replicas saw "+raw, func() bool { return c.seenRevision(resp.Header.Revision) })
		for _, r := range c.replicas {
			if got := r.Router().Snapshot().Endpoint(ep).Config.RoutingStrategy; got != fleet.Random {
				t.Errorf("after raw %s: replica %s strategy %s, want the previous RANDOM", raw, r.Addr(), got)
			}
		}
		if !decisions(router.DecisionRandom)() {
			t.Errorf("after raw %s: decisions are no longer random", raw)
		}
	}

	// A valid config after the invalid ones applies again.
	start = time.Now()
	good := fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: 2048, ConcurrencyThreshold: 4}}
	if err := membership.PutConfig(ctx, c.cli, c.opts.Layout, ep, good); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 10*time.Second, "affinity decisions on every replica", decisions(router.DecisionAffinity))
	within(t, "strategy flipped back on every replica", time.Since(start), propagation)
	for _, r := range c.replicas {
		if got := r.Router().Snapshot().Endpoint(ep).Resolved; got.PrefixLength != 2048 || got.ConcurrencyThreshold != 4 {
			t.Errorf("replica %s config %+v, want PrefixLength 2048, ConcurrencyThreshold 4", r.Addr(), got)
		}
	}
}
