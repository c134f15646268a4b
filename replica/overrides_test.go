package replica_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/admin/adminpb"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// TestStoredConfigOverridesAreReported: a replica started with
// --hot-key-replication, --prefix-length 8192, an explicit --strategy
// PREFIX_AWARE and --upstream-first-byte-timeout 30s. Each stored config
// written with `config set` replaces the whole default; GetFleet (admin
// fleet) and the log say which of those settings it replaces, on every
// change, and say when it replaces none any more.
func TestStoredConfigOverridesAreReported(t *testing.T) {
	ctx := testsupport.Context(t, 30*time.Second)
	var logs testsupport.LogBuffer
	f, err := localfleet.Start(ctx, localfleet.Options{
		Endpoint: "chat", FastEtcd: true,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Replica: replica.Options{
			Routing: fleet.RoutingConfig{PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: 8192, HotKeyReplication: true}},
			// --strategy given with its default value: still the
			// operator's, still reported.
			RoutingFlags: []string{"strategy", "hot-key-replication", "prefix-length", "upstream-first-byte-timeout"},
			Router:       router.Options{FirstByteTimeout: 30 * time.Second},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	srv := httptest.NewServer(localfleet.Stub("i-0"))
	t.Cleanup(srv.Close)
	if _, err := f.Register(ctx, fleet.Instance{ID: "i-0", Addr: srv.URL}, 0); err != nil {
		t.Fatal(err)
	}
	put := func(rc fleet.RoutingConfig) {
		t.Helper()
		if err := membership.PutConfig(ctx, f.Client(), membership.Layout{}, "chat", rc); err != nil {
			t.Fatal(err)
		}
	}
	// A stored config before the replica starts: reported at start.
	put(fleet.RoutingConfig{RoutingStrategy: fleet.Random})
	rep, err := f.AddReplica(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.StopReplica(context.Background(), rep) })
	if err := f.WaitFor(ctx, f.HasInstances("i-0")); err != nil {
		t.Fatal(err)
	}
	ac, _ := adminClient(t, rep)
	overridden := func() []string {
		resp, err := ac.GetFleet(ctx, &adminpb.GetFleetRequest{Endpoint: "chat"})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, o := range resp.GetEndpoints()[0].GetOverridden() {
			out = append(out, o.GetFlag()+"="+o.GetGiven()+"->"+o.GetStored())
		}
		return out
	}
	for _, step := range []struct {
		name   string
		stored fleet.RoutingConfig
		want   []string
		log    string
	}{
		{"at start, config set --strategy RANDOM", fleet.RoutingConfig{RoutingStrategy: fleet.Random},
			[]string{"strategy=PREFIX_AWARE->RANDOM", "prefix-length=8192->4096", "hot-key-replication=true->false"},
			"--strategy=PREFIX_AWARE (stored: RANDOM), --prefix-length=8192 (stored: 4096), --hot-key-replication=true (stored: false)"},
		{"the replica's settings and a first-byte timeout", fleet.RoutingConfig{
			RoutingStrategy:                fleet.PrefixAware,
			PrefixAwareRoutingConfig:       &fleet.PrefixAwareConfig{PrefixLength: 8192, HotKeyReplication: true},
			FirstByteTimeoutInMilliseconds: 5000,
		}, []string{"upstream-first-byte-timeout=30s->5s"}, "--upstream-first-byte-timeout=30s (stored: 5s)"},
		{"the replica's settings", fleet.RoutingConfig{
			RoutingStrategy:          fleet.PrefixAware,
			PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: 8192, HotKeyReplication: true},
		}, nil, "no longer replaces settings given to this replica"},
	} {
		put(step.stored) // the first is written already: a no-op
		testsupport.Eventually(t, 10*time.Second, step.name+": GetFleet reports "+strings.Join(step.want, ", "), func() bool {
			return slices.Equal(overridden(), step.want)
		})
		testsupport.Eventually(t, 5*time.Second, step.name+": logged "+step.log, func() bool {
			return strings.Contains(logs.String(), step.log)
		})
	}
	if n := strings.Count(logs.String(), "('config set') replaces settings"); n != 2 {
		t.Fatalf("%d warnings, want one per change that overrides something (2):\n%s", n, logs.String())
	}
}
