// Package lora maps a requested model (a LoRA adapter, a base model or nothing) to its sticky instance set and that set's ring.
//
// A Table is built from one fleet.Endpoint of one snapshot and is immutable;
// build a new one with every new snapshot and publish it with the snapshot.
// The rings inside are built lazily, once per model, the first time a
// request asks for that model, and then cached for the table's life. The read
// path takes no lock: the model → entry map is complete after New and each
// entry builds its Set under a sync.Once.
//
// Which instances serve a model:
//
//   - Draining instances are in no set: routers stop sending them new
//     requests. The others are ring members by ID with their EffectiveWeight.
//   - "" (no model named) → every non-draining instance: the base set.
//   - A name that non-draining instances report in Adapters → those
//     instances: the adapter's sticky set, so requests for an adapter go only
//     where it is loaded, and its prefixes warm a stable subset of the fleet.
//   - A name equal to an instance's Labels["model"] (the base model the
//     instance declares) → the instances declaring it. A name that is both
//     an adapter and a declared base model gets the union of both.
//   - Any other name: when no instance declares Labels["model"], the router
//     cannot know the base model's name, so the name is taken as the base
//     model → the base set. When some instance declares it, the name is
//     unknown → ErrUnknownModel.
//   - A name in the endpoint's adapter catalogue that no non-draining
//     instance reports yet → ErrNotLoaded: the agents are loading it (see
//     Place), and the router waits for it, bounded, instead of sending it
//     anywhere else.
//   - A name that only draining instances report or declare is known but has
//     nowhere to go right now → fleet.ErrNoInstance (retry later), rather than
//     being sent to instances that lack the adapter.
//   - An endpoint without a non-draining instance → fleet.ErrNoInstance for every
//     model.
//
// Walkthrough:
//
//	t := lora.New(snap.Endpoint("chat"))   // cheap: no ring built yet
//	set, err := t.Set(req.Model)            // first call per model builds its ring
//	switch {
//	case errors.Is(err, lora.ErrUnknownModel): // 404
//	case errors.Is(err, fleet.ErrNoInstance):   // 503 + Retry-After
//	}
//	for _, i := range set.Ring().Candidates(key, 3, buf[:0]) {
//		inst := set.Instance(i)          // admit the first with room
//		_ = inst
//	}
//
// Two replicas holding the same snapshot build identical sets and rings, so
// they route the same key to the same instance without talking to each other.
//
// Placement (which instances should load a catalogued adapter) is a second
// pure function of the same snapshot:
//
//	p := lora.Place(ep)                   // adapter → target set, by rendezvous order and free slots
//	p.Assigned("i-3")                     // what the agent of i-3 loads; it unloads the rest
//	for _, s := range lora.Decide(ep, p, now, lora.ScaleOptions{}) {
//		// grow or shrink s.Adapter: compare-and-swap on s.Revision
//	}
//
// The agents load and unload; the Table above then follows what instances
// report loaded. docs/adapters.md tells how the agents agree.
package lora
