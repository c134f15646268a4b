package replica

import (
	"reflect"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/router"
)

// TestOverrides is the rule of docs/operations.md's "Settings etcd
// overrides": a setting is reported when the operator gave it (named, or
// different from the built-in default) and the endpoint's config differs.
func TestOverrides(t *testing.T) {
	hot := fleet.RoutingConfig{PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{HotKeyReplication: true}}
	for _, tc := range []struct {
		name     string
		opts     Options
		endpoint fleet.RoutingConfig
		want     []fleet.Override
	}{
		{"nothing given", Options{}, fleet.RoutingConfig{RoutingStrategy: fleet.Random}, nil},
		{"given and kept", Options{Routing: hot}, hot, nil},
		{"given by value, replaced", Options{Routing: hot}, fleet.RoutingConfig{},
			[]fleet.Override{{Flag: "hot-key-replication", Given: "true", Stored: "false"}}},
		{"given by name at its default, replaced", Options{RoutingFlags: []string{"strategy"}}, fleet.RoutingConfig{RoutingStrategy: fleet.Random},
			[]fleet.Override{{Flag: "strategy", Given: "PREFIX_AWARE", Stored: "RANDOM"}}},
		{"named but the same", Options{RoutingFlags: []string{"strategy", "tenant-cache-salt"}}, fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware}, nil},
		{"first-byte timeout: the config's zero keeps the replica's", Options{Router: router.Options{FirstByteTimeout: time.Minute}}, fleet.RoutingConfig{}, nil},
		{"first-byte timeout replaced", Options{Router: router.Options{FirstByteTimeout: time.Minute}}, fleet.RoutingConfig{FirstByteTimeoutInMilliseconds: 1500},
			[]fleet.Override{{Flag: "upstream-first-byte-timeout", Given: "1m0s", Stored: "1.5s"}}},
		{"tenant salt and prefix length", Options{Routing: fleet.RoutingConfig{TenantCacheSalt: true, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: 2048}}},
			fleet.RoutingConfig{PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: 2048}},
			[]fleet.Override{{Flag: "tenant-cache-salt", Given: "true", Stored: "false"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := tc.endpoint.Resolve()
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.opts.overrides(res); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("overrides %+v, want %+v", got, tc.want)
			}
		})
	}
}
