package membership

import (
	"testing"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// FuzzParseRoutingConfig: a config value from etcd never panics the
// watcher, and what parses validates.
func FuzzParseRoutingConfig(f *testing.F) {
	for _, s := range []string{
		`{"RoutingStrategy":"PREFIX_AWARE","PrefixAwareRoutingConfig":{"PrefixLength":4096,"ConcurrencyThreshold":10}}`,
		`{"RoutingStrategy":"RANDOM"}`, `{"RoutingStrategy":"PREFIX_AWARE","PrefixAwareRoutingConfig":{"PrefixLength":0}}`,
		`{"RoutingStrategy":"X"}`, `{}`, `null`, `{"RoutingStrategy":"RANDOM"} {}`, `{"routingstrategy":"RANDOM"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseRoutingConfig(data)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("parsed config %+v does not validate: %v", c, err)
		}
	})
}

// FuzzParseInstance: an instance record from etcd never panics the watcher;
// what parses validates (weight within bounds), carries the key's id, and
// the upstream check never panics on its address.
func FuzzParseInstance(f *testing.F) {
	for _, s := range []string{
		`{"id":"a","addr":"http://127.0.0.1:8000","adapters":["x"],"weight":3}`,
		`{"addr":"http://10.0.0.1"}`, `{"id":"a","addr":"file:///etc/passwd"}`, `{"id":"a","addr":"http://u:p@127.0.0.1"}`,
		`{"id":"a","addr":"http://169.254.169.254/"}`, `{"id":"a","addr":"x","weight":1000000000}`, `{"id":"a","addr":"x","weight":2147483648}`,
		`{"id":"a","addr":"x","weight":-1}`, `{"id":"a\u0000","addr":"x"}`, `[]`,
		`{"id":"a","addr":"x","engine":"llamacpp","adapters":["s"],"adapterIndex":{"s":0}}`, `{"id":"a","addr":"x","adapterIndex":{"s":9}}`,
	} {
		f.Add("a", []byte(s))
	}
	up, err := fleet.ParseUpstreams(nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id string, data []byte) {
		in, err := parseInstance(id, data)
		if err != nil {
			return
		}
		if in.ID != id {
			t.Fatalf("record id %q under key id %q", in.ID, id)
		}
		if err := in.Validate(); err != nil || in.Weight > fleet.MaxWeight {
			t.Fatalf("accepted %+v: %v", in, err)
		}
		_ = up.Check(in.Addr)
	})
}
