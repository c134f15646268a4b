package fleet

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestRoutingConfigValidate(t *testing.T) {
	pa := func(pl, ct int) *PrefixAwareConfig {
		return &PrefixAwareConfig{PrefixLength: pl, ConcurrencyThreshold: ct}
	}
	tests := []struct {
		name    string
		cfg     RoutingConfig
		wantErr string
	}{
		{"zero value means defaults", RoutingConfig{}, ""},
		{"each strategy", RoutingConfig{RoutingStrategy: LeastOutstanding}, ""},
		{"random", RoutingConfig{RoutingStrategy: Random}, ""},
		{"bounds low", RoutingConfig{RoutingStrategy: PrefixAware, PrefixAwareRoutingConfig: pa(1024, 1)}, ""},
		{"bounds high", RoutingConfig{RoutingStrategy: PrefixAware, PrefixAwareRoutingConfig: pa(65536, 1024)}, ""},
		{"unknown strategy", RoutingConfig{RoutingStrategy: "ROUND_ROBIN"}, "RoutingStrategy"},
		{"lowercase strategy", RoutingConfig{RoutingStrategy: "prefix_aware"}, "RoutingStrategy"},
		{"prefix too short", RoutingConfig{PrefixAwareRoutingConfig: pa(1023, 0)}, "PrefixLength 1023"},
		{"prefix too long", RoutingConfig{PrefixAwareRoutingConfig: pa(65537, 0)}, "PrefixLength 65537"},
		{"negative prefix", RoutingConfig{PrefixAwareRoutingConfig: pa(-1, 0)}, "PrefixLength -1"},
		{"threshold too high", RoutingConfig{PrefixAwareRoutingConfig: pa(0, 1025)}, "ConcurrencyThreshold 1025"},
		{"negative threshold", RoutingConfig{PrefixAwareRoutingConfig: pa(0, -3)}, "ConcurrencyThreshold -3"},
		{"first-byte timeout", RoutingConfig{FirstByteTimeoutInMilliseconds: 50}, ""},
		{"first-byte timeout at the bound", RoutingConfig{FirstByteTimeoutInMilliseconds: MaxFirstByteTimeoutMillis}, ""},
		{"first-byte timeout beyond the bound", RoutingConfig{FirstByteTimeoutInMilliseconds: MaxFirstByteTimeoutMillis + 1}, "FirstByteTimeoutInMilliseconds 3600001"},
		{"negative first-byte timeout", RoutingConfig{FirstByteTimeoutInMilliseconds: -1}, "FirstByteTimeoutInMilliseconds -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want an ErrInvalidConfig mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func TestRoutingConfigWithDefaults(t *testing.T) {
	got := RoutingConfig{}.WithDefaults()
	if got.RoutingStrategy != PrefixAware || got.PrefixLength() != DefaultPrefixLength || got.ConcurrencyThreshold() != DefaultConcurrencyThreshold {
		t.Fatalf("zero config normalizes to %+v", got)
	}
	c := RoutingConfig{RoutingStrategy: Random, PrefixAwareRoutingConfig: &PrefixAwareConfig{ConcurrencyThreshold: 7}}
	n := c.WithDefaults()
	if n.RoutingStrategy != Random || n.PrefixLength() != DefaultPrefixLength || n.ConcurrencyThreshold() != 7 {
		t.Fatalf("partial config normalizes to %+v", n.PrefixAwareRoutingConfig)
	}
	if c.PrefixAwareRoutingConfig.PrefixLength != 0 {
		t.Fatal("WithDefaults modified its receiver's nested config")
	}
	if d := (RoutingConfig{FirstByteTimeoutInMilliseconds: 50}).WithDefaults().FirstByteTimeout(); d != 50*time.Millisecond {
		t.Fatalf("first-byte timeout normalizes to %v, want 50ms", d)
	}
	if d := n.FirstByteTimeout(); d != 0 {
		t.Fatalf("unset first-byte timeout normalizes to %v, want 0 (the replica's)", d)
	}
}

func labels(n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m["k"+strconv.Itoa(i)] = "v"
	}
	return m
}

func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "lora-" + strconv.Itoa(i)
	}
	return out
}

func TestInstanceValidate(t *testing.T) {
	ok := Instance{ID: "vllm-0", Addr: "http://127.0.0.1:8000"}
	tests := []struct {
		name string
		in   Instance
		ok   bool
	}{
		{"valid", ok, true},
		{"empty id", Instance{Addr: ok.Addr}, false},
		{"id with slash", Instance{ID: "a/b", Addr: ok.Addr}, false},
		{"id with space", Instance{ID: "a b", Addr: ok.Addr}, false},
		{"id too long", Instance{ID: strings.Repeat("x", MaxIDLength+1), Addr: ok.Addr}, false},
		{"no addr", Instance{ID: "a"}, false},
		{"negative weight", Instance{ID: "a", Addr: ok.Addr, Weight: -1}, false},
		{"max weight", Instance{ID: "a", Addr: ok.Addr, Weight: MaxWeight}, true},
		{"weight above max", Instance{ID: "a", Addr: ok.Addr, Weight: MaxWeight + 1}, false},
		{"weight 1e9", Instance{ID: "a", Addr: ok.Addr, Weight: 1e9}, false},
		{"weight 2^31", Instance{ID: "a", Addr: ok.Addr, Weight: 1 << 31}, false},
		// Issue 19: a record with 50,000 labels was accepted.
		{"max labels", Instance{ID: "a", Addr: ok.Addr, Labels: labels(MaxLabels)}, true},
		{"50,000 labels", Instance{ID: "a", Addr: ok.Addr, Labels: labels(50000)}, false},
		{"one label over", Instance{ID: "a", Addr: ok.Addr, Labels: labels(MaxLabels + 1)}, false},
		{"label value too long", Instance{ID: "a", Addr: ok.Addr, Labels: map[string]string{"k": strings.Repeat("v", MaxLabelValueLength+1)}}, false},
		{"label key too long", Instance{ID: "a", Addr: ok.Addr, Labels: map[string]string{strings.Repeat("k", MaxLabelKeyLength+1): "v"}}, false},
		{"empty label key", Instance{ID: "a", Addr: ok.Addr, Labels: map[string]string{"": "v"}}, false},
		{"max adapters", Instance{ID: "a", Addr: ok.Addr, Adapters: names(MaxAdapterNames)}, true},
		{"adapters over", Instance{ID: "a", Addr: ok.Addr, Adapters: names(MaxAdapterNames + 1)}, false},
		{"hot adapters over", Instance{ID: "a", Addr: ok.Addr, HotAdapters: names(MaxAdapterNames + 1)}, false},
		{"active adapters over", Instance{ID: "a", Addr: ok.Addr, ActiveAdapters: names(MaxAdapterNames + 1)}, false},
		{"adapter name too long", Instance{ID: "a", Addr: ok.Addr, Adapters: []string{strings.Repeat("a", MaxAdapterNameLength+1)}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.in.Validate(); (err == nil) != tt.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tt.ok)
			}
		})
	}
	if (Instance{}).EffectiveWeight() != 1 || (Instance{Weight: 3}).EffectiveWeight() != 3 {
		t.Fatal("EffectiveWeight")
	}
	if !(Instance{Adapters: []string{"a", "b"}}).HasAdapter("b") || (Instance{}).HasAdapter("b") {
		t.Fatal("HasAdapter")
	}
}

func TestNewSnapshotSortsAndCopies(t *testing.T) {
	insts := []Instance{{ID: "c", Addr: "x"}, {ID: "a", Addr: "x"}, {ID: "b", Addr: "x"}}
	s := NewSnapshot([]Endpoint{{Name: "ep", Instances: insts}}, 42, 0, time.Unix(1, 0))
	ep := s.Endpoint("ep")
	if ep == nil || ep.Instances[0].ID != "a" || ep.Instances[2].ID != "c" {
		t.Fatalf("instances not sorted: %+v", ep)
	}
	if insts[0].ID != "c" {
		t.Fatal("NewSnapshot sorted the caller's slice")
	}
	if s.Replicas != 1 || s.Revision != 42 || s.InstanceCount() != 3 {
		t.Fatalf("snapshot fields: %+v", s)
	}
	if ep.Config.RoutingStrategy != PrefixAware {
		t.Fatal("endpoint config not normalized")
	}
	var nilSnap *Snapshot
	if nilSnap.Endpoint("ep") != nil || nilSnap.InstanceCount() != 0 {
		t.Fatal("nil snapshot accessors")
	}
}
