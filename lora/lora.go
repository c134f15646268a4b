package lora

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/ring"
)

var (
	// ErrUnknownModel is returned (wrapped with the name) for a model that no
	// instance of the endpoint serves.
	ErrUnknownModel = errors.New("lora: unknown model")
	// ErrModelNotReady is wrapped, with fleet.ErrNoInstance, when a model is
	// known but every instance serving it is draining (or leaving): the
	// model is not ready rather than unknown.
	ErrModelNotReady = errors.New("lora: model not ready")
	// ErrNotLoaded is returned (wrapped with the name) for an adapter of
	// the endpoint's catalogue that no non-draining instance reports loaded
	// yet: the agents are placing it, and a request may wait for it.
	ErrNotLoaded = errors.New("lora: adapter not loaded yet")
)

// Table maps model names to sticky instance sets for one endpoint snapshot.
// It is immutable after New and safe for concurrent use.
type Table struct {
	ep   *fleet.Endpoint
	opts []ring.Option
	// base is the set of every non-draining instance, nil when there is none.
	base *entry
	// named holds adapters and declared base models with a non-draining
	// instance; complete after New, never written afterwards.
	named map[string]*entry
	// parked holds names that only draining instances report or declare.
	parked map[string]bool
	// declared is whether any instance declares Labels["model"].
	declared bool
	models   []string
}

// entry is one model's set, built on first use.
type entry struct {
	insts []*fleet.Instance // members, in endpoint order
	once  sync.Once
	set   *Set
	err   error // the ring's refusal (a weight beyond ring.MaxWeight)
}

// Set is one model's sticky instance set and its ring.
type Set struct {
	ring  *ring.Ring
	insts []*fleet.Instance // indexed by ring member index
}

// New builds the table of one endpoint snapshot. It builds no ring: each is
// built on the first Set call for its model. opts are passed to ring.New.
// ep must not be modified afterwards; a nil ep is an endpoint without
// instances.
func New(ep *fleet.Endpoint, opts ...ring.Option) *Table {
	if ep == nil {
		ep = &fleet.Endpoint{}
	}
	t := &Table{ep: ep, opts: opts, named: map[string]*entry{}, parked: map[string]bool{}}
	var all []*fleet.Instance
	add := func(name string, in *fleet.Instance) {
		e := t.named[name]
		if e == nil {
			e = &entry{}
			t.named[name] = e
		}
		// An instance both declaring and reporting a name joins once.
		if n := len(e.insts); n == 0 || e.insts[n-1] != in {
			e.insts = append(e.insts, in)
		}
	}
	for i := range ep.Instances {
		in := &ep.Instances[i]
		model, hasModel := in.Labels["model"]
		hasModel = hasModel && model != ""
		if hasModel {
			t.declared = true
		}
		if in.Draining {
			if hasModel {
				t.parked[model] = true
			}
			for _, a := range in.Adapters {
				t.parked[a] = true
			}
			continue
		}
		all = append(all, in)
		if hasModel {
			add(model, in)
		}
		for _, a := range in.Adapters {
			if a != "" {
				add(a, in)
			}
		}
	}
	if len(all) > 0 {
		t.base = &entry{insts: all}
	}
	for name := range t.named {
		delete(t.parked, name)
		t.models = append(t.models, name)
	}
	// What instances list of themselves names models too (labels only).
	for _, in := range all {
		for _, name := range in.Listed {
			if name != "" && t.named[name] == nil {
				t.models = append(t.models, name)
			}
		}
	}
	// Catalogued adapters are served on demand: a request loads them.
	for _, a := range ep.Adapters {
		if t.named[a.Name] == nil {
			t.models = append(t.models, a.Name)
		}
	}
	sort.Strings(t.models)
	t.models = slices.Compact(t.models)
	return t
}

// Endpoint returns the endpoint the table was built from.
func (t *Table) Endpoint() *fleet.Endpoint { return t.ep }

// Models returns the sorted names of the base models instances declare and
// the adapters they report, with the catalogued adapters and the models
// instances list of themselves (fleet.Instance.Listed), draining instances
// excluded. Callers must not modify it.
func (t *Table) Models() []string { return t.models }

// Set returns the sticky set serving model, building its ring on first use.
// See the package documentation for how a name is resolved.
func (t *Table) Set(model string) (*Set, error) {
	if t.base == nil {
		return nil, fmt.Errorf("%w: endpoint %q has no instance that is not draining", fleet.ErrNoInstance, t.ep.Name)
	}
	e := t.base
	if model != "" {
		if named := t.named[model]; named != nil {
			e = named
		} else if _, ok := t.ep.Adapter(model); ok {
			return nil, fmt.Errorf("%w: %q", ErrNotLoaded, model)
		} else if t.parked[model] {
			return nil, fmt.Errorf("%w: %w: every instance serving model %q is draining", fleet.ErrNoInstance, ErrModelNotReady, model)
		} else if t.declared {
			return nil, fmt.Errorf("%w: %q", ErrUnknownModel, model)
		}
	}
	e.once.Do(func() { e.set, e.err = newSet(e.insts, t.opts) })
	if e.err != nil {
		return nil, fmt.Errorf("%w: %w", fleet.ErrNoInstance, e.err)
	}
	return e.set, nil
}

// newSet builds a set's ring. Records were validated (fleet.MaxWeight), so
// the ring's refusal only guards snapshots built without validation.
func newSet(insts []*fleet.Instance, opts []ring.Option) (*Set, error) {
	ms := make([]ring.Member, len(insts))
	byID := make(map[string]*fleet.Instance, len(insts))
	for i, in := range insts {
		ms[i] = ring.Member{ID: in.ID, Weight: in.EffectiveWeight()}
		if _, dup := byID[in.ID]; !dup { // the ring keeps the first of duplicates too
			byID[in.ID] = in
		}
	}
	r, err := ring.New(ms, opts...)
	if err != nil {
		return nil, err
	}
	s := &Set{ring: r, insts: make([]*fleet.Instance, r.Len())}
	for i, m := range r.Members() {
		s.insts[i] = byID[m.ID]
	}
	return s, nil
}

// Ring returns the set's ring; its member indexes are the set's instance
// indexes.
func (s *Set) Ring() *ring.Ring { return s.ring }

// Instance returns the instance of ring member i: a pointer into the
// endpoint's Instances, shared and not to be modified.
func (s *Set) Instance(i int) *fleet.Instance { return s.insts[i] }

// Len returns the number of instances in the set.
func (s *Set) Len() int { return len(s.insts) }

// Index returns the member index of in (an instance of the snapshot the
// set was built from), or -1 when in is not a member. It scans the set: for
// the rare request that names its instance (a stateful session).
func (s *Set) Index(in *fleet.Instance) int {
	for i, m := range s.insts {
		if m == in {
			return i
		}
	}
	return -1
}
