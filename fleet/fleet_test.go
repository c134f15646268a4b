package fleet

import (
	"errors"
	"reflect"
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
	got, err := RoutingConfig{}.Resolve()
	if err != nil || got.Strategy != PrefixAware || got.PrefixLength != DefaultAdaptivePrefixLength || got.FixedLengthKeys || got.ConcurrencyThreshold != DefaultConcurrencyThreshold {
		t.Fatalf("zero config resolves to %+v, %v", got, err)
	}
	c := RoutingConfig{RoutingStrategy: Random, PrefixAwareRoutingConfig: &PrefixAwareConfig{ConcurrencyThreshold: 7}}
	n, err := c.Resolve()
	if err != nil || n.Strategy != Random || n.PrefixLength != DefaultPrefixLength || n.ConcurrencyThreshold != 7 {
		t.Fatalf("partial config resolves to %+v, %v", n, err)
	}
	// SageMaker's exact keys keep SageMaker's default length.
	f, err := RoutingConfig{PrefixAwareRoutingConfig: &PrefixAwareConfig{FixedLengthKeys: true}}.Resolve()
	if err != nil || !f.FixedLengthKeys || f.PrefixLength != DefaultPrefixLength {
		t.Fatalf("fixed-length config resolves to %+v, %v", f, err)
	}
	if c.WithDefaults(); c.PrefixAwareRoutingConfig.PrefixLength != 0 {
		t.Fatal("WithDefaults modified its receiver's nested config")
	}
	if d, _ := (RoutingConfig{FirstByteTimeoutInMilliseconds: 50}).Resolve(); d.FirstByteTimeout != 50*time.Millisecond {
		t.Fatalf("first-byte timeout resolves to %v, want 50ms", d.FirstByteTimeout)
	}
	if n.FirstByteTimeout != 0 {
		t.Fatalf("unset first-byte timeout resolves to %v, want 0 (the replica's)", n.FirstByteTimeout)
	}
	if _, err := (RoutingConfig{RoutingStrategy: "ROUND_ROBIN"}).Resolve(); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Resolve of an invalid config = %v, want ErrInvalidConfig", err)
	}
}

// setEveryField sets every exported field reachable from v (through
// pointers and slices of structs) to a non-zero value inside the valid
// ranges where the test knows them, and returns the paths it set.
func setEveryField(t *testing.T, v reflect.Value, path string) []string {
	t.Helper()
	var paths []string
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		return setEveryField(t, v.Elem(), path)
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			f := v.Type().Field(i)
			if f.IsExported() {
				paths = append(paths, setEveryField(t, v.Field(i), path+"."+f.Name)...)
			}
		}
		return paths
	case reflect.Slice:
		// A slice's element is one unit: its fields are valid only
		// together (a variant needs a name and a weight).
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		setEveryField(t, v.Index(0), path+"[0]")
	case reflect.String:
		if v.Type() == reflect.TypeOf(Strategy("")) {
			v.SetString(string(LeastOutstanding)) // not the default
		} else {
			v.SetString("v")
		}
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(1024) // in range of every int setting, never a default
	case reflect.Float64:
		v.SetFloat(3)
	default:
		t.Fatalf("%s: kind %v: teach setEveryField about it", path, v.Kind())
	}
	return append(paths, path)
}

// TestResolveCarriesEveryField fails when a field of RoutingConfig (or of
// its nested config) is added without reaching WithDefaults' result and
// the resolved config the data plane reads: each field set alone must
// change both.
func TestResolveCarriesEveryField(t *testing.T) {
	var all RoutingConfig
	paths := setEveryField(t, reflect.ValueOf(&all).Elem(), "RoutingConfig")
	if len(paths) < 7 {
		t.Fatalf("found %d fields, want every field of RoutingConfig: %v", len(paths), paths)
	}
	base, err := RoutingConfig{}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	baseDef := RoutingConfig{}.WithDefaults()
	for _, p := range paths {
		// Set only p: copy all's value at p into a zero config.
		one := RoutingConfig{}
		copyPath(reflect.ValueOf(&one).Elem(), reflect.ValueOf(all), strings.Split(p, ".")[1:])
		if one.PrefixAwareRoutingConfig == nil && strings.Contains(p, "PrefixAwareRoutingConfig") {
			t.Fatalf("%s: copyPath did not set it", p)
		}
		if reflect.DeepEqual(one.WithDefaults(), baseDef) {
			t.Errorf("%s: WithDefaults drops it", p)
		}
		got, err := one.Resolve()
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if reflect.DeepEqual(got, base) {
			t.Errorf("%s: Resolve does not carry it into Resolved", p)
		}
	}
}

// copyPath copies the field at path (field names) from src to dst,
// allocating pointers on the way.
func copyPath(dst, src reflect.Value, path []string) {
	for dst.Kind() == reflect.Pointer {
		if dst.IsNil() {
			dst.Set(reflect.New(dst.Type().Elem()))
		}
		dst, src = dst.Elem(), src.Elem()
	}
	if len(path) == 0 {
		dst.Set(src)
		return
	}
	copyPath(dst.FieldByName(path[0]), src.FieldByName(path[0]), path[1:])
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
		{"id too long", Instance{ID: strings.Repeat("x", MaxNameLength+1), Addr: ok.Addr}, false},
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
		{"busy adapters over", Instance{ID: "a", Addr: ok.Addr, BusyAdapters: names(MaxAdapterNames + 1)}, false},
		{"active adapters over", Instance{ID: "a", Addr: ok.Addr, ActiveAdapters: names(MaxAdapterNames + 1)}, false},
		{"adapter name too long", Instance{ID: "a", Addr: ok.Addr, Adapters: []string{strings.Repeat("a", MaxAdapterNameLength+1)}}, false},
		{"engine", Instance{ID: "a", Addr: ok.Addr, Engine: "llamacpp"}, true},
		{"unknown engine", Instance{ID: "a", Addr: ok.Addr, Engine: "tgi-next"}, true},
		{"engine uppercase", Instance{ID: "a", Addr: ok.Addr, Engine: "vLLM"}, false},
		{"engine too long", Instance{ID: "a", Addr: ok.Addr, Engine: strings.Repeat("v", 33)}, false},
		{"adapter index", Instance{ID: "a", Addr: ok.Addr, Adapters: []string{"x", "y"}, AdapterIndex: map[string]int{"x": 0, "y": 1}}, true},
		{"adapter index not an adapter", Instance{ID: "a", Addr: ok.Addr, Adapters: []string{"x"}, AdapterIndex: map[string]int{"z": 0}}, false},
		{"adapter index negative", Instance{ID: "a", Addr: ok.Addr, Adapters: []string{"x"}, AdapterIndex: map[string]int{"x": -1}}, false},
		{"adapter index too large", Instance{ID: "a", Addr: ok.Addr, Adapters: []string{"x"}, AdapterIndex: map[string]int{"x": MaxAdapterIndex}}, false},
		{"llamacpp adapter without index", Instance{ID: "a", Addr: ok.Addr, Engine: "llamacpp", Adapters: []string{"x", "y"}, AdapterIndex: map[string]int{"x": 0}}, false},
		{"llamacpp adapters indexed", Instance{ID: "a", Addr: ok.Addr, Engine: "llamacpp", Adapters: []string{"x", "y"}, AdapterIndex: map[string]int{"x": 1, "y": 0}}, true},
		{"adapter index repeated", Instance{ID: "a", Addr: ok.Addr, Adapters: []string{"x", "y"}, AdapterIndex: map[string]int{"x": 0, "y": 0}}, false},
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

// NewSnapshotOwning keeps the caller's sorted slice as it is (the watcher's
// list of thousands, issue 22); NewSnapshot copies and sorts, without
// touching the caller's.
func TestNewSnapshotOwning(t *testing.T) {
	sorted := []Instance{{ID: "a", Addr: "x"}, {ID: "b", Addr: "x"}}
	s := NewSnapshotOwning([]Endpoint{{Name: "ep", Instances: sorted}}, 1, 1, time.Unix(1, 0))
	if got := s.Endpoint("ep").Instances; &got[0] != &sorted[0] {
		t.Fatal("a sorted slice was copied")
	}
	if got := NewSnapshot([]Endpoint{{Name: "ep", Instances: sorted}}, 1, 1, time.Unix(1, 0)).Endpoint("ep").Instances; &got[0] == &sorted[0] {
		t.Fatal("NewSnapshot kept the caller's slice")
	}
	unsorted := []Instance{{ID: "b", Addr: "x"}, {ID: "a", Addr: "x"}}
	got := NewSnapshot([]Endpoint{{Name: "ep", Instances: unsorted}}, 1, 1, time.Unix(1, 0)).Endpoint("ep").Instances
	if got[0].ID != "a" || unsorted[0].ID != "b" {
		t.Fatalf("unsorted: snapshot %v, caller's %v; want a copy sorted, the caller's untouched", got, unsorted)
	}
}
