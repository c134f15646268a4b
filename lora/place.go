package lora

import (
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/prefixrouter/prefixrouter/engine"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/ring"
)

// runtimeLoading reports whether in's engine loads adapters at run time.
func runtimeLoading(in fleet.Instance) bool {
	p, _ := engine.Lookup(in.Engine)
	return p.Adapters.RuntimeLoading()
}

// Placement is where an endpoint's catalogued adapters should be loaded:
// each adapter's target set. It is a pure function of one endpoint
// snapshot (Place), so every agent and every router replica holding the
// same snapshot computes the same sets.
type Placement struct {
	sets     map[string][]string // adapter → instance ids, in rendezvous order
	assigned map[string][]string // instance id → adapters, sorted
}

// Place computes the target sets of ep's catalogue. An adapter's set is the
// first Target() instances of its rendezvous order among the non-draining
// instances that still have a free adapter slot. The order is the ring's
// (package ring) spill order of the key xxhash(adapter name) over the
// non-draining instances with their weights, so an instance of weight w
// comes early in about w times as many adapters' orders as one of weight 1,
// as it owns w times the keys.
//
//   - Slots: an instance's MaxAdapters (0: unlimited), minus the adapters it
//     reports that are not in the catalogue (loaded by hand or --adapters:
//     they occupy slots the placement cannot use).
//   - First every adapter's MinReplicas are placed, adapters in name order;
//     then the growth beyond MinReplicas of the adapters that grew, in name
//     order, so that growth never displaces another adapter's minimum set.
//   - When slots run out, a set stays smaller than its target; it never
//     lands on a full instance.
//
// Instances whose engine loads adapters only at start (llama-server) take
// no catalogued adapter: nothing could load it there.
//
// Rendezvous (highest random weight) hashing keeps sets stable: an instance
// joining or leaving changes only the sets it enters or leaves, and
// growing k by one adds exactly the next instance of the order.
func Place(ep *fleet.Endpoint) *Placement {
	p := &Placement{sets: map[string][]string{}, assigned: map[string][]string{}}
	if ep == nil || len(ep.Adapters) == 0 {
		return p
	}
	catalogued := make(map[string]bool, len(ep.Adapters))
	for _, a := range ep.Adapters {
		catalogued[a.Name] = true
	}
	type slot struct {
		id   string
		free int // -1: unlimited
	}
	var members []ring.Member
	byID := map[string]*slot{}
	for _, in := range ep.Instances {
		if in.Draining || !runtimeLoading(in) {
			continue
		}
		s := &slot{id: in.ID, free: -1}
		if in.MaxAdapters > 0 {
			s.free = in.MaxAdapters
			for _, a := range in.Adapters {
				if !catalogued[a] {
					s.free--
				}
			}
			s.free = max(s.free, 0)
		}
		members = append(members, ring.Member{ID: in.ID, Weight: in.EffectiveWeight()})
		byID[in.ID] = s
	}
	r, err := ring.New(members)
	if err != nil {
		// A weight beyond ring.MaxWeight: records are validated
		// (fleet.MaxWeight), so only a snapshot built by hand gets here.
		// Placing by equal weights beats placing nothing.
		for i := range members {
			members[i].Weight = 1
		}
		r, _ = ring.New(members)
	}
	slots := make([]*slot, r.Len()) // by ring member index
	for i, m := range r.Members() {
		slots[i] = byID[m.ID]
	}
	var buf []int
	place := func(a fleet.Adapter, n int) {
		key := xxhash.Sum64String(a.Name)
		set := p.sets[a.Name]
		// The first candidates nearly always have room; the whole order
		// only when they do not.
		order := r.Candidates(key, min(r.Len(), n+placeLookahead), buf[:0])
		for j := 0; j < len(order) && n > 0; j++ {
			s := slots[order[j]]
			if s.free != 0 && !slices.Contains(set, s.id) {
				if s.free > 0 {
					s.free--
				}
				set = append(set, s.id)
				p.assigned[s.id] = append(p.assigned[s.id], a.Name)
				n--
			}
			if j == len(order)-1 && n > 0 && len(order) < r.Len() {
				order = r.Candidates(key, r.Len(), order[:0])
			}
		}
		buf = order
		p.sets[a.Name] = set
	}
	for _, a := range ep.Adapters { // sorted by name (fleet.NewSnapshot)
		place(a, a.Min())
	}
	for _, a := range ep.Adapters {
		if extra := a.Target() - a.Min(); extra > 0 {
			place(a, extra)
		}
	}
	for id := range p.assigned {
		slices.Sort(p.assigned[id])
	}
	return p
}

// placeLookahead is how many candidates beyond the wanted number Place ranks
// before it ranks the whole order: full instances and the set's own members
// are skipped.
const placeLookahead = 8

// Set returns the target set of a catalogued adapter (instance ids, in its
// rendezvous order; possibly shorter than its target when slots ran out),
// or nil for a name not in the catalogue. Callers must not modify it.
func (p *Placement) Set(adapter string) []string { return p.sets[adapter] }

// Assigned returns the adapters instance id should hold, sorted. Callers
// must not modify it.
func (p *Placement) Assigned(id string) []string { return p.assigned[id] }

// Equal reports whether two placements have the same sets.
func (p *Placement) Equal(q *Placement) bool {
	if len(p.sets) != len(q.sets) {
		return false
	}
	for a, s := range p.sets {
		if !slices.Equal(s, q.sets[a]) {
			return false
		}
	}
	return true
}

// ScaleOptions are the hysteresis of Decide. Zero values mean the defaults.
type ScaleOptions struct {
	// Cooldown is the least time between two changes of one adapter's
	// target; zero means DefaultScaleCooldown. It gives a new member the
	// time to load and to take its share of the traffic before the set is
	// judged again.
	Cooldown time.Duration
}

// DefaultScaleCooldown is ScaleOptions.Cooldown's default.
const DefaultScaleCooldown = 10 * time.Second

// Scale is one decided change of an adapter's target set size.
type Scale struct {
	Adapter  string
	From, To int
	// Revision is the placement state's revision the decision was made
	// from: the compare of the compare-and-swap that writes it.
	Revision int64
}

// Decide returns the target changes that ep's state calls for at now. It is
// a pure function of the snapshot (and now, for the cooldown), so every
// agent deciding from the same etcd revision decides the same; the writes
// are compare-and-swaps on the placement revision, so one of them wins and
// the others become no-ops. The rules, each with its hysteresis:
//
//   - Grow by one (up to MaxReplicas) when every member of the adapter's
//     current set has it loaded, is Saturated and lists it in
//     BusyAdapters. Saturated is set by each member's agent only after its
//     load stayed at or above the endpoint's concurrency threshold for a
//     whole window, and cleared only after it stayed below half of it as
//     long; BusyAdapters names the adapters in use in most of its samples
//     meanwhile, so that a quiet adapter sharing a saturated instance with
//     a busy one does not grow.
//   - Shrink to MinReplicas when the adapter is cold: no instance lists it
//     in ActiveAdapters (no request within the agents' active window) and
//     no member lists it busy.
//   - No change within Cooldown of the last one.
func Decide(ep *fleet.Endpoint, p *Placement, now time.Time, o ScaleOptions) []Scale {
	if ep == nil {
		return nil
	}
	cool := o.Cooldown
	if cool <= 0 {
		cool = DefaultScaleCooldown
	}
	byID := make(map[string]*fleet.Instance, len(ep.Instances))
	active := map[string]bool{}
	for i := range ep.Instances {
		in := &ep.Instances[i]
		byID[in.ID] = in
		for _, a := range in.ActiveAdapters {
			active[a] = true
		}
	}
	var out []Scale
	for _, a := range ep.Adapters {
		k := a.Target()
		if !a.ScaledAt.IsZero() && now.Sub(a.ScaledAt) < cool {
			continue
		}
		set := p.Set(a.Name)
		allSaturated, anySaturated := len(set) > 0, false
		for _, id := range set {
			in := byID[id]
			busy := in != nil && in.Saturated && in.HasAdapter(a.Name) && slices.Contains(in.BusyAdapters, a.Name)
			allSaturated = allSaturated && busy
			anySaturated = anySaturated || busy
		}
		switch {
		case allSaturated && k < a.Max() && len(set) == k:
			out = append(out, Scale{Adapter: a.Name, From: k, To: k + 1, Revision: a.PlacementRevision})
		case k > a.Min() && !active[a.Name] && !anySaturated:
			out = append(out, Scale{Adapter: a.Name, From: k, To: a.Min(), Revision: a.PlacementRevision})
		}
	}
	return out
}
