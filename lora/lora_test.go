package lora

import (
	"errors"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/ring"
)

func inst(id string, adapters []string, model string, draining bool) fleet.Instance {
	in := fleet.Instance{ID: id, Addr: "http://127.0.0.1:1/" + id, Adapters: adapters, Draining: draining}
	if model != "" {
		in.Labels = map[string]string{"model": model}
	}
	return in
}

func endpoint(insts ...fleet.Instance) *fleet.Endpoint {
	return fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Instances: insts}}, 1, 1, time.Unix(0, 0)).Endpoint("ep")
}

func setIDs(s *Set) []string {
	var ids []string
	for i := 0; i < s.Len(); i++ {
		ids = append(ids, s.Instance(i).ID)
	}
	return ids
}

func TestSet(t *testing.T) {
	// Fleet without base-model labels: any name not an adapter is the base model.
	unlabeled := endpoint(
		inst("vllm-0", []string{"sql", "chat"}, "", false),
		inst("vllm-1", []string{"sql"}, "", false),
		inst("vllm-2", nil, "", false),
		inst("vllm-3", []string{"sql", "legal"}, "", true), // draining
	)
	// Fleet with labels: two base models.
	labeled := endpoint(
		inst("a-0", []string{"sql"}, "llama-3-8b", false),
		inst("a-1", nil, "llama-3-8b", false),
		inst("b-0", []string{"sql"}, "qwen-7b", false),
		inst("b-1", []string{"both"}, "both", false), // adapter and model share a name
		inst("c-0", nil, "mistral-7b", true),         // draining
	)
	allDraining := endpoint(inst("x", []string{"sql"}, "", true))

	tests := []struct {
		name    string
		ep      *fleet.Endpoint
		model   string
		want    []string
		wantErr error
	}{
		{"no model: base set without draining", unlabeled, "", []string{"vllm-0", "vllm-1", "vllm-2"}, nil},
		{"adapter: its sticky set without draining", unlabeled, "sql", []string{"vllm-0", "vllm-1"}, nil},
		{"adapter on one instance", unlabeled, "chat", []string{"vllm-0"}, nil},
		{"unlabeled fleet: other name is the base model", unlabeled, "meta-llama/Llama-3-8B", []string{"vllm-0", "vllm-1", "vllm-2"}, nil},
		{"adapter only on draining instances", unlabeled, "legal", nil, fleet.ErrNoInstance},
		{"labeled: base model name", labeled, "llama-3-8b", []string{"a-0", "a-1"}, nil},
		{"labeled: other base model", labeled, "qwen-7b", []string{"b-0"}, nil},
		{"labeled: adapter across base models", labeled, "sql", []string{"a-0", "b-0"}, nil},
		{"labeled: name both adapter and model", labeled, "both", []string{"b-1"}, nil},
		{"labeled: no model is every instance", labeled, "", []string{"a-0", "a-1", "b-0", "b-1"}, nil},
		{"labeled: unknown name", labeled, "gpt-4", nil, ErrUnknownModel},
		{"labeled: model only on draining instances", labeled, "mistral-7b", nil, fleet.ErrNoInstance},
		{"all draining: no model", allDraining, "", nil, fleet.ErrNoInstance},
		{"all draining: adapter", allDraining, "sql", nil, fleet.ErrNoInstance},
		{"all draining: other", allDraining, "zzz", nil, fleet.ErrNoInstance},
		{"nil endpoint", nil, "", nil, fleet.ErrNoInstance},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.ep).Set(tt.model)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || s != nil {
					t.Fatalf("Set(%q) = %v, %v; want error %v", tt.model, s, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Set(%q): %v", tt.model, err)
			}
			if got := setIDs(s); !slices.Equal(got, tt.want) {
				t.Fatalf("Set(%q) = %v, want %v", tt.model, got, tt.want)
			}
			// Ring members and set instances line up, and instances point
			// into the endpoint's slice.
			for i, m := range s.Ring().Members() {
				in := s.Instance(i)
				if in.ID != m.ID || m.Weight != in.EffectiveWeight() {
					t.Fatalf("member %d = %+v, instance %s weight %d", i, m, in.ID, in.EffectiveWeight())
				}
				if &tt.ep.Instances[slices.IndexFunc(tt.ep.Instances, func(x fleet.Instance) bool { return x.ID == in.ID })] != in {
					t.Fatalf("Instance(%d) is a copy, not a pointer into the endpoint", i)
				}
			}
		})
	}
}

func TestUnknownModelErrorNamesModel(t *testing.T) {
	_, err := New(endpoint(inst("a", nil, "llama", false))).Set("gpt-4")
	if !errors.Is(err, ErrUnknownModel) || !strings.Contains(err.Error(), `"gpt-4"`) {
		t.Fatalf("err = %v", err)
	}
}

func TestModels(t *testing.T) {
	tests := []struct {
		name string
		ep   *fleet.Endpoint
		want []string
	}{
		{"unlabeled", endpoint(inst("0", []string{"sql", "chat"}, "", false), inst("1", []string{"sql"}, "", false)), []string{"chat", "sql"}},
		{"labeled", endpoint(inst("0", []string{"sql"}, "llama", false), inst("1", nil, "qwen", false), inst("2", []string{"old"}, "gone", true)), []string{"llama", "qwen", "sql"}},
		{"empty", endpoint(), nil},
		{"listed", listed(endpoint(inst("0", []string{"sql"}, "", false), inst("1", nil, "", false), inst("2", nil, "", true)),
			[]string{"tiny", "sql"}, []string{"tiny"}, []string{"gone"}), []string{"sql", "tiny"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := New(tt.ep).Models(); !slices.Equal(got, tt.want) {
				t.Fatalf("Models() = %v, want %v", got, tt.want)
			}
		})
	}
}

// listed sets each instance's Listed models, in order.
func listed(ep *fleet.Endpoint, names ...[]string) *fleet.Endpoint {
	for i := range ep.Instances {
		ep.Instances[i].Listed = names[i]
	}
	return ep
}

// TestListedDoesNotRoute: the models a static fleet's instances list name
// labels but leave routing as declared: a request naming a listed model
// still goes to the whole fleet, not only to the instances listing it.
func TestListedDoesNotRoute(t *testing.T) {
	ep := listed(endpoint(inst("0", nil, "", false), inst("1", nil, "", false)), []string{"tiny"}, nil)
	tbl := New(ep)
	s, err := tbl.Set("tiny")
	if err != nil || len(s.Ring().Members()) != 2 {
		t.Fatalf("Set(tiny) = %v, %v; want the whole fleet", s, err)
	}
	if _, err := tbl.Set("anything"); err != nil {
		t.Fatalf("an undeclared model is refused: %v", err)
	}
}

func TestWeights(t *testing.T) {
	a, b := inst("a", nil, "", false), inst("b", nil, "", false)
	a.Weight = 3
	s, err := New(endpoint(a, b)).Set("")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Ring().Members(); !reflect.DeepEqual(got, []ring.Member{{ID: "a", Weight: 3}, {ID: "b", Weight: 1}}) {
		t.Fatalf("members = %v", got)
	}
}

// bigFleet is 64 instances with realistic ids, adapters spread over them and
// some weights and draining instances.
func bigFleet() []fleet.Instance {
	var insts []fleet.Instance
	for i := 0; i < 64; i++ {
		in := inst("vllm-"+strconv.Itoa(i), []string{"adapter-" + strconv.Itoa(i%5), "adapter-" + strconv.Itoa(i%7+5)}, "", i%13 == 0)
		in.Weight = 1 + i%3
		insts = append(insts, in)
	}
	return insts
}

// Two replicas holding the same snapshot, whatever order their instances
// arrived in, build identical sets and rings.
func TestReplicasAgree(t *testing.T) {
	insts := bigFleet()
	rev := slices.Clone(insts)
	slices.Reverse(rev)
	t1, t2 := New(endpoint(insts...)), New(endpoint(rev...))
	if !slices.Equal(t1.Models(), t2.Models()) {
		t.Fatalf("models differ: %v vs %v", t1.Models(), t2.Models())
	}
	for _, model := range append([]string{""}, t1.Models()...) {
		s1, err1 := t1.Set(model)
		s2, err2 := t2.Set(model)
		if err1 != nil || err2 != nil {
			t.Fatalf("Set(%q): %v, %v", model, err1, err2)
		}
		if !reflect.DeepEqual(s1.Ring(), s2.Ring()) || !slices.Equal(setIDs(s1), setIDs(s2)) {
			t.Fatalf("Set(%q) differs between replicas", model)
		}
		b1, b2 := make([]int, 0, 3), make([]int, 0, 3)
		for i := 0; i < 10_000; i++ {
			key := xxhash.Sum64String("key-" + strconv.Itoa(i))
			c1, c2 := s1.Ring().Candidates(key, 3, b1[:0]), s2.Ring().Candidates(key, 3, b2[:0])
			for j := range c1 {
				if s1.Instance(c1[j]).ID != s2.Instance(c2[j]).ID {
					t.Fatalf("Set(%q) key %d: candidates differ", model, i)
				}
			}
		}
	}
}

// Rings are built lazily, exactly once per model, also when many goroutines
// ask for the same model at once. The injected id hash counts the builds'
// work: each build hashes each member id once (weights are 1 here).
func TestLazyOnce(t *testing.T) {
	insts := bigFleet()
	for i := range insts {
		insts[i].Weight = 0
	}
	var hashed atomic.Int64
	tab := New(endpoint(insts...), ring.WithHash(func(s string) uint64 {
		hashed.Add(1)
		return xxhash.Sum64String(s)
	}))
	if n := hashed.Load(); n != 0 {
		t.Fatalf("New built rings eagerly: %d ids hashed", n)
	}
	models := append([]string{""}, tab.Models()...)
	const goroutines = 32
	start := make(chan struct{})
	got := make([][]*Set, goroutines)
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for round := 0; round < 3; round++ {
				for i := range models {
					m := models[(i+g)%len(models)] // different first models per goroutine
					s, err := tab.Set(m)
					if err != nil {
						t.Error(err)
						return
					}
					if round == 0 {
						got[g] = append(got[g], s)
					}
				}
			}
		}()
	}
	close(start)
	wg.Wait()

	want := int64(0)
	for _, m := range models {
		s, _ := tab.Set(m)
		want += int64(s.Len())
		for g := range got {
			found := false
			for _, x := range got[g] {
				found = found || x == s
			}
			if !found {
				t.Fatalf("goroutine %d saw another *Set for %q", g, m)
			}
		}
	}
	if n := hashed.Load(); n != want {
		t.Fatalf("%d ids hashed, want %d: some ring was built more than once", n, want)
	}
}

func BenchmarkSetCached(b *testing.B) {
	tab := New(endpoint(bigFleet()...))
	for _, model := range []string{"", "adapter-3", "base-model-by-another-name"} {
		if _, err := tab.Set(model); err != nil {
			b.Fatal(err)
		}
		b.Run("model="+model, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s, _ := tab.Set(model)
				sink += s.Len()
			}
		})
	}
}

var sink int
