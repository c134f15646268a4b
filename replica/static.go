package replica

import (
	"context"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/prefixrouter/prefixrouter/engine"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/probe"
)

// StaticProbeInterval is how often a static fleet's instances are asked
// what they are (staticProber).
const StaticProbeInterval = 30 * time.Second

// staticProber keeps a static fleet's records in step with what its
// instances say of themselves, as the agent does for an etcd fleet
// (issue 20): the engine (engine.Detect over /v1/models' owned_by and the
// Server header), the models /v1/models lists (fleet.Instance.Listed, so
// that token metrics name them instead of "unlisted"), and for an engine
// that selects adapters by position (llama-server) each adapter's
// position, read from its /lora-adapters. It republishes the snapshot when
// any of that changes. An instance that does not answer keeps what it
// had.
type staticProber struct {
	base   []fleet.Instance // as --static-instances declared them
	ep     fleet.Endpoint   // name and config of the snapshot
	update func(*fleet.Snapshot)
	client *http.Client
	log    *slog.Logger

	mu      sync.Mutex                // guards found, popular and served
	found   map[string]fleet.Instance // instance id → its record as last published
	popular []fleet.PopularKey        // the replica's popular prefixes (issue 21)
	served  map[string]float64        // and its instances' served shares
	p       *probe.Prober
}

// startStaticProber probes every instance of ep at once and then every
// interval of clock.
func startStaticProber(ep fleet.Endpoint, tr http.RoundTripper, clock clockwork.Clock, log *slog.Logger, update func(*fleet.Snapshot)) (*staticProber, error) {
	s := &staticProber{
		base: ep.Instances, ep: ep, update: update,
		client: probe.NewClient(tr), log: log, found: map[string]fleet.Instance{},
	}
	for _, in := range ep.Instances {
		s.found[in.ID] = in
	}
	var err error
	s.p, err = probe.Start(probe.Options{Interval: StaticProbeInterval, Timeout: 5 * time.Second, Clock: clock},
		func() []fleet.Instance { return s.base }, s.probe, s.observe)
	return s, err
}

// Close stops the probes and waits for them.
func (s *staticProber) Close() { _ = s.p.Close() }

// probe asks one instance what it is and returns its record updated.
func (s *staticProber) probe(ctx context.Context, in fleet.Instance) (fleet.Instance, error) {
	base := strings.TrimRight(in.Addr, "/")
	m, err := probe.FetchModels(ctx, s.client, base+"/v1/models")
	if err != nil {
		return in, err
	}
	p, _ := engine.Detect(engine.Evidence{OwnedBy: m.OwnedBy, Server: m.Server})
	in.Engine = p.Name
	in.Listed = nil
	if m.Base != "" {
		in.Listed = append(in.Listed, m.Base)
	}
	in.Listed = append(in.Listed, m.Adapters...)
	if p.Adapters.List != engine.ListIndexed {
		return in, nil
	}
	listed, err := probe.FetchIndexedAdapters(ctx, s.client, base+p.Adapters.ListPath)
	if err != nil {
		return in, err
	}
	in.AdapterIndex = map[string]int{}
	for _, x := range listed {
		name := engine.AdapterName(x.Path)
		if _, dup := in.AdapterIndex[name]; dup || (fleet.Adapter{Name: name, Source: x.Path}).Validate() != nil {
			continue // not a name a request could use
		}
		in.AdapterIndex[name] = x.ID
	}
	// Route the adapters it loaded at start to it; a declared one it did
	// not load cannot be selected there.
	adapters := slices.Clone(in.Adapters)
	for name := range in.AdapterIndex {
		adapters = append(adapters, name)
	}
	slices.Sort(adapters)
	in.Adapters = slices.DeleteFunc(slices.Compact(adapters), func(a string) bool {
		_, ok := in.AdapterIndex[a]
		return !ok
	})
	if dropped := slices.DeleteFunc(slices.Clone(s.declared(in.ID)), func(a string) bool { return slices.Contains(in.Adapters, a) }); len(dropped) > 0 {
		s.log.Warn("replica: declared adapters that llama-server did not load at start are not routed to it", "instance", in.ID, "adapters", dropped, "loaded", in.Adapters)
	}
	in.Listed = append(in.Listed, in.Adapters...)
	if len(in.AdapterIndex) == 0 {
		in.AdapterIndex = nil
	}
	return in, nil
}

// declared returns the adapters --static-instances gave the instance.
func (s *staticProber) declared(id string) []string {
	for _, in := range s.base {
		if in.ID == id {
			return in.Adapters
		}
	}
	return nil
}

// observe publishes a new snapshot when the instance's record changed.
func (s *staticProber) observe(in fleet.Instance, next fleet.Instance, err error) {
	if err != nil {
		s.log.Debug("replica: static instance not probed", "instance", in.ID, "err", err)
		return
	}
	if err := next.Validate(); err != nil {
		s.log.Warn("replica: static instance's answers ignored", "instance", in.ID, "err", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.found[in.ID]
	if cur.Engine == next.Engine && slices.Equal(cur.Listed, next.Listed) && slices.Equal(cur.Adapters, next.Adapters) && maps.Equal(cur.AdapterIndex, next.AdapterIndex) {
		return
	}
	s.found[in.ID] = next
	s.log.Info("replica: static instance probed", "instance", in.ID, "engine", next.Engine, "models", next.Listed)
	s.publishLocked()
}

// setPopular publishes the replica's popular prefixes with the records.
func (s *staticProber) setPopular(keys []fleet.PopularKey, served map[string]float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.popular, s.served = keys, served
	s.publishLocked()
}

// publishLocked publishes a snapshot of the records and popular prefixes.
func (s *staticProber) publishLocked() {
	ep := s.ep
	ep.Instances = make([]fleet.Instance, 0, len(s.base))
	for _, b := range s.base {
		ep.Instances = append(ep.Instances, s.found[b.ID])
	}
	ep.Popular, ep.Served = s.popular, s.served
	s.update(fleet.NewSnapshot([]fleet.Endpoint{ep}, 0, 1, time.Now()))
}
