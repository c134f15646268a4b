package membership

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

func TestLayoutParseKey(t *testing.T) {
	for _, tc := range []struct {
		prefix, key string
		kind        keyKind
		ep, id      string
	}{
		{"", "/prefixrouter/v1/endpoints/ep/instances/i-1", kindInstance, "ep", "i-1"},
		{"/prefixrouter/v1/", "/prefixrouter/v1/endpoints/ep/config", kindConfig, "ep", ""},
		{"/custom", "/custom/routers/r1", kindRouter, "", "r1"},
		{"", "/prefixrouter/v1/routers/r1/extra", kindOther, "", ""},
		{"", "/prefixrouter/v1/endpoints/ep/instances/", kindOther, "", ""},
		{"", "/prefixrouter/v1/endpoints/ep/other", kindOther, "", ""},
		{"", "/prefixrouter/v1/endpoints//config", kindOther, "", ""},
		{"", "/prefixrouter/v1/endpoints/ep/instances/a/b", kindOther, "", ""},
		{"", "/prefixrouter/v1/endpoints/ep/adapters/a", kindAdapter, "ep", "a"},
		{"", "/prefixrouter/v1/endpoints/ep/placement/a", kindPlacement, "ep", "a"},
		{"", "/prefixrouter/v1/endpoints/ep/stale/i1", kindStale, "ep", "i1"},
		{"", "/prefixrouter/v1/endpoints/ep/adapters/", kindOther, "", ""},
		{"/custom", "/prefixrouter/v1/routers/r1", kindOther, "", ""},
	} {
		kind, ep, id := Layout{Prefix: tc.prefix}.parseKey(tc.key)
		if kind != tc.kind || ep != tc.ep || id != tc.id {
			t.Errorf("parseKey(%q, %q) = %v %q %q, want %v %q %q", tc.prefix, tc.key, kind, ep, id, tc.kind, tc.ep, tc.id)
		}
	}
	l := Layout{Prefix: "/x/"}
	if got := l.InstanceKey("ep", "i"); got != "/x/endpoints/ep/instances/i" {
		t.Errorf("InstanceKey = %q", got)
	}
	if got := l.RouterKey("r"); got != "/x/routers/r" {
		t.Errorf("RouterKey = %q", got)
	}
	if got := l.ConfigKey("ep"); got != "/x/endpoints/ep/config" {
		t.Errorf("ConfigKey = %q", got)
	}
}

func TestParseRoutingConfig(t *testing.T) {
	for _, tc := range []struct {
		raw   string
		valid bool
		want  fleet.Strategy
	}{
		{`{"RoutingStrategy":"PREFIX_AWARE","PrefixAwareRoutingConfig":{"PrefixLength":4096,"ConcurrencyThreshold":10}}`, true, fleet.PrefixAware},
		{`{"RoutingStrategy":"RANDOM"}`, true, fleet.Random},
		{`{"RoutingStrategy":"LEAST_OUTSTANDING_REQUESTS"}`, true, fleet.LeastOutstanding},
		{`{"RoutingStrategy":"PREFIX_AWARE","TenantCacheSalt":true}`, true, fleet.PrefixAware},
		{`{"RoutingStrategy":"RANDOM","ProductionVariants":[{"VariantName":"a","InitialVariantWeight":1},{"VariantName":"b","InitialVariantWeight":0}]}`, true, fleet.Random},
		{`{"RoutingStrategy":"RANDOM","ProductionVariants":[{"VariantName":"a","InitialVariantWeight":1},{"VariantName":"a","InitialVariantWeight":1}]}`, false, ""},
		{`{"RoutingStrategy":"RANDOM","ProductionVariants":[{"VariantName":"a","InitialVariantWeight":-1}]}`, false, ""},
		{`{"RoutingStrategy":"RANDOM","ProductionVariants":[{"VariantName":"a","InitialVariantWeight":0}]}`, false, ""},
		{`{}`, false, ""}, // RoutingStrategy is required, as in SageMaker
		{`{"RoutingStrategy":""}`, false, ""},
		{`{"PrefixAwareRoutingConfig":{"PrefixLength":4096}}`, false, ""},
		{`{"RoutingStrategy":"PREFIX_AWARE","PrefixAwareRoutingConfig":{"PrefixLength":0}}`, false, ""}, // never silently the default
		{`{"RoutingStrategy":"PREFIX_AWARE","PrefixAwareRoutingConfig":{"ConcurrencyThreshold":0}}`, false, ""},
		{`{"RoutingStrategy":"PREFIX_AWARE","PrefixAwareRoutingConfig":{"PrefixLength":65537}}`, false, ""},
		{`{"RoutingStrategy":"PREFIX_AWARE","PrefixAwareRoutingConfig":{"ConcurrencyThreshold":-1}}`, false, ""},
		{`{"RoutingStrategy":"PREFIX_AWARE","PrefixAwareRoutingConfig":{"PrefixLength":1024,"ConcurrencyThreshold":1024}}`, true, fleet.PrefixAware},
		{`{"RoutingStrategy":"PREFIX_AWARE","PrefixAwareRoutingConfig":{}}`, true, fleet.PrefixAware},
		{`{"RoutingStrategy":"ROUND_ROBIN"}`, false, ""},
		{`{"RoutingStrategy":"PREFIX_AWARE","PrefixAwareRoutingConfig":{"PrefixLength":100}}`, false, ""},
		{`{"RoutingStrategy":"PREFIX_AWARE","PrefixAwareRoutingConfig":{"ConcurrencyThreshold":2000}}`, false, ""},
		{`{"RoutingStrategy":"RANDOM","FirstByteTimeoutInMilliseconds":50}`, true, fleet.Random},
		{`{"RoutingStrategy":"RANDOM","FirstByteTimeoutInMilliseconds":3600000}`, true, fleet.Random},
		{`{"RoutingStrategy":"RANDOM","FirstByteTimeoutInMilliseconds":0}`, false, ""}, // left out means the replica's
		{`{"RoutingStrategy":"RANDOM","FirstByteTimeoutInMilliseconds":-1}`, false, ""},
		{`{"RoutingStrategy":"RANDOM","FirstByteTimeoutInMilliseconds":3600001}`, false, ""},
		{`{"RoutingStrategy":"RANDOM","FirstByteTimeoutInMilliseconds":0.5}`, false, ""},
		{`{"RoutingStrategy":"RANDOM","FirstByteTimeoutInMilliseconds":"50ms"}`, false, ""},
		{`{"RoutingStrategy":"RANDOM","Typo":1}`, false, ""},
		{`{"RoutingStrategy":"RANDOM"} {}`, false, ""},
		{`not json`, false, ""},
		{``, false, ""},
	} {
		c, err := ParseRoutingConfig([]byte(tc.raw))
		if tc.valid {
			if err != nil || c.RoutingStrategy != tc.want {
				t.Errorf("%s: %+v, %v", tc.raw, c, err)
			}
		} else if !errors.Is(err, fleet.ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", tc.raw, err)
		}
	}
}

func TestClientConfig(t *testing.T) {
	dir := t.TempDir()
	pki := testsupport.NewPKI(t)
	cert, key := pki.ClientCert, pki.ClientKey
	notPEM := filepath.Join(dir, "notpem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	ep := []string{"https://127.0.0.1:2379"}
	for _, tc := range []struct {
		name    string
		cfg     ClientOptions
		wantErr string // substring; empty means success
		tls     bool
	}{
		{"plain", ClientOptions{Endpoints: []string{"http://127.0.0.1:2379", "127.0.0.1:22379"}}, "", false},
		{"no endpoints", ClientOptions{}, "no etcd endpoints", false},
		{"bad scheme", ClientOptions{Endpoints: []string{"ftp://x:1"}}, "scheme", false},
		{"empty endpoint", ClientOptions{Endpoints: []string{" "}}, "empty etcd endpoint", false},
		{"cert without key", ClientOptions{Endpoints: ep, Cert: cert}, "--etcd-cert and --etcd-key", false},
		{"user without password", ClientOptions{Endpoints: ep, Username: "u"}, "--etcd-username and --etcd-password", false},
		{"missing CA file", ClientOptions{Endpoints: ep, CACert: filepath.Join(dir, "nope")}, "read etcd CA certificate", false},
		{"CA not PEM", ClientOptions{Endpoints: ep, CACert: notPEM}, "holds no PEM certificate", false},
		{"bad key pair", ClientOptions{Endpoints: ep, Cert: cert, Key: notPEM}, "load etcd client certificate", false},
		{"https only", ClientOptions{Endpoints: ep}, "", true},
		{"mutual TLS", ClientOptions{Endpoints: ep, CACert: pki.CACert, Cert: cert, Key: key}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.cfg.TLS() != tc.tls && tc.wantErr == "" {
				t.Errorf("TLS() = %v", tc.cfg.TLS())
			}
			cli, err := NewClient(tc.cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to mention %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			cli.Close()
		})
	}
	tc, err := ClientOptions{Endpoints: ep, CACert: pki.CACert, Cert: cert, Key: key}.tlsConfig()
	if err != nil || tc.RootCAs == nil || len(tc.Certificates) != 1 {
		t.Fatalf("tlsConfig = %+v, %v", tc, err)
	}
}

// TestParseInstanceEngine: a record without "engine" (older agents) stays
// valid with the engine unknown; a known or newer engine name is kept; a
// malformed one, or an adapter index that names no adapter, rejects the
// record (issue 20).
func TestParseInstanceEngine(t *testing.T) {
	for _, tc := range []struct {
		raw    string
		ok     bool
		engine string
		index  map[string]int
	}{
		{`{"id":"a","addr":"http://127.0.0.1:8000","adapters":["x"],"draining":false,"registeredAt":"2025-01-01T00:00:00Z"}`, true, "", nil},
		{`{"id":"a","addr":"http://127.0.0.1:8000","engine":"llamacpp","adapters":["chat","sql"],"adapterIndex":{"sql":0,"chat":1}}`, true, "llamacpp", map[string]int{"sql": 0, "chat": 1}},
		{`{"id":"a","addr":"http://127.0.0.1:8000","engine":"tgi-next"}`, true, "tgi-next", nil},
		{`{"id":"a","addr":"http://127.0.0.1:8000","engine":"vLLM"}`, false, "", nil},
		{`{"id":"a","addr":"http://127.0.0.1:8000","engine":7}`, false, "", nil},
		{`{"id":"a","addr":"http://127.0.0.1:8000","engine":"llamacpp","adapterIndex":{"sql":0}}`, false, "", nil},
		{`{"id":"a","addr":"http://127.0.0.1:8000","engine":"llamacpp","adapters":["sql"],"adapterIndex":{"sql":-1}}`, false, "", nil},
	} {
		in, err := parseInstance("a", []byte(tc.raw))
		if (err == nil) != tc.ok {
			t.Errorf("%s: err = %v, want ok %v", tc.raw, err, tc.ok)
			continue
		}
		if err == nil && (in.Engine != tc.engine || len(in.AdapterIndex) != len(tc.index)) {
			t.Errorf("%s: engine %q index %v, want %q %v", tc.raw, in.Engine, in.AdapterIndex, tc.engine, tc.index)
		}
		for k, v := range tc.index {
			if in.AdapterIndex[k] != v {
				t.Errorf("%s: index[%s] = %d, want %d", tc.raw, k, in.AdapterIndex[k], v)
			}
		}
	}
}
