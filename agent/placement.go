package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/probe"
)

// Defaults of the placement settings in Options.
const (
	DefaultLoadPollInterval = time.Second
	DefaultSaturationWindow = 5 * time.Second
	DefaultActiveWindow     = 30 * time.Second
)

// placer is the agent's adapter placement: it follows the fleet snapshot,
// loads what lora.Place assigns to its instance and unloads the rest,
// publishes the instance's load state (Saturated, BusyAdapters,
// ActiveAdapters) and writes the
// growth and shrink decisions of lora.Decide. One goroutine (run) owns
// every field but the snapshot signal.
type placer struct {
	a      *agent
	reg    *membership.InstanceRegistration
	static []string
	clock  clockwork.Clock

	watcher *membership.Watcher
	snapCh  chan struct{} // capacity 1: a new snapshot is waiting
	stale   chan struct{} // capacity 1: a router found the record stale

	// Owned by run.
	aboveSince, belowSince time.Time
	saturated              bool
	share                  map[string]float64 // adapter → moving average of its presence in the samples
	busyAdapters           []string
	lastSeen               map[string]time.Time // adapter → last scrape that showed it in use
	failed                 map[string]time.Time // adapter → last failed load (back off)

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startPlacer starts the watcher, the stale-mark watch and the loop.
func (a *agent) startPlacer(reg *membership.InstanceRegistration, static []string) *placer {
	ctx, cancel := context.WithCancel(context.Background())
	p := &placer{
		a: a, reg: reg, static: static, clock: a.cfg.Clock,
		snapCh: make(chan struct{}, 1), stale: make(chan struct{}, 1),
		lastSeen: map[string]time.Time{}, failed: map[string]time.Time{}, share: map[string]float64{},
		cancel: cancel,
	}
	p.watcher = membership.StartWatcher(a.cfg.Client, membership.WatcherOptions{Options: a.cfg.Options}, func(*fleet.Snapshot) {
		select {
		case p.snapCh <- struct{}{}:
		default:
		}
	})
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		p.watchStale(ctx)
	}()
	go func() {
		defer p.wg.Done()
		p.run(ctx)
	}()
	return p
}

// Close stops the loop and the watches and waits for them.
func (p *placer) Close() {
	p.cancel()
	p.wg.Wait()
	p.watcher.Close()
}

// watchStale turns a router's stale mark on this instance into an
// immediate re-poll, and deletes the mark.
func (p *placer) watchStale(ctx context.Context) {
	key := p.a.cfg.Options.Layout.StaleKey(p.a.cfg.Endpoint, p.a.cfg.Instance.ID)
	for ctx.Err() == nil {
		wch := p.a.cfg.Client.Watch(clientv3.WithRequireLeader(ctx), key)
		for resp := range wch {
			for _, ev := range resp.Events {
				if ev.Type != mvccpb.PUT {
					continue
				}
				select {
				case p.stale <- struct{}{}:
				default:
				}
			}
		}
		select { // the watch ended (etcd lost its leader): watch again
		case <-ctx.Done():
		case <-p.clock.After(time.Second):
		}
	}
}

func (p *placer) run(ctx context.Context) {
	tick := p.clock.NewTicker(p.a.cfg.LoadPollInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.snapCh:
			p.reconcile(ctx)
		case <-p.stale:
			p.a.log.Info("agent: a router found the adapter list stale; polling the server now")
			p.refresh(ctx)
			dctx, cancel := context.WithTimeout(ctx, EtcdCallTimeout)
			_, _ = p.a.cfg.Client.Delete(dctx, p.a.cfg.Options.Layout.StaleKey(p.a.cfg.Endpoint, p.a.cfg.Instance.ID))
			cancel()
			p.reconcile(ctx)
		case <-tick.Chan():
			p.observe(ctx)
			p.scale(ctx)
			p.reconcile(ctx) // retries loads that failed
		}
	}
}

// endpoint returns the agent's endpoint in the latest snapshot, or nil.
func (p *placer) endpoint() *fleet.Endpoint {
	return p.watcher.Snapshot().Endpoint(p.a.cfg.Endpoint)
}

// reconcile loads the adapters Place assigns to this instance and unloads
// the others but the static ones (--adapters): with placement on, the
// agent owns the server's adapter set, so that an adapter removed from the
// catalogue leaves the fleet. The server's slots (MaxAdapters) are an LRU
// cache, as vLLM's are: a catalogued adapter no longer assigned here (its
// set shrank or moved) stays loaded, a spare copy routers keep using, while
// it is in use and a slot is free; when an assigned adapter needs the slot,
// the least recently used spare is evicted first (see spares).
func (p *placer) reconcile(ctx context.Context) {
	ep := p.endpoint()
	if ep == nil {
		return
	}
	id := p.a.cfg.Instance.ID
	self := p.reg.Instance()
	if self.Draining {
		return // a draining instance is in no set; keep serving what it has
	}
	want := lora.Place(ep).Assigned(id)
	have := self.Adapters
	now := p.clock.Now()
	var load []string
	for _, name := range want {
		if slices.Contains(have, name) {
			continue
		}
		if t, ok := p.failed[name]; ok && now.Sub(t) < p.a.cfg.LoadPollInterval {
			continue
		}
		load = append(load, name)
	}
	keep, unload := p.spares(ep, self, want, len(load), now)
	changed := false
	for _, name := range unload {
		if err := p.post(ctx, p.a.cfg.UnloadPath, name, ""); err != nil {
			p.a.log.Warn("agent: unload failed", "adapter", name, "err", err)
		} else if slices.Contains(keep.evicted, name) {
			p.a.log.Info("agent: evicted the least recently used spare adapter to free a slot", "adapter", name, "last_used", p.lastSeen[name], "spares_kept", keep.kept)
		} else {
			p.a.log.Info("agent: unloaded", "adapter", name)
		}
		changed = true
	}
	for _, name := range load {
		a, _ := ep.Adapter(name)
		if err := p.post(ctx, p.a.cfg.LoadPath, name, a.Source); err != nil {
			p.failed[name] = now
			p.a.log.Warn("agent: load failed", "adapter", name, "source", a.Source, "err", err)
		} else {
			delete(p.failed, name)
			p.a.log.Info("agent: loaded", "adapter", name, "source", a.Source)
		}
		changed = true
	}
	if changed {
		p.refresh(ctx)
	}
}

// spareSet is what spares decided: the spare copies kept (most recently
// used first) and those evicted to free a slot.
type spareSet struct {
	kept, evicted []string
}

// spares decides which loaded adapters outside want and the static ones
// stay: it returns them, with those evicted, and the adapters to unload.
// A spare is a catalogued adapter seen in use on this server within
// ActiveWindow (recency: the agent's scrapes of vLLM's
// vllm:lora_requests_info, p.lastSeen). It is kept only while the slots
// (the record's MaxAdapters; 0, unlimited, keeps none: there is nothing to
// evict for and a cache needs a bound) hold it beside the assigned
// adapters, the static ones and the loads pending: when they do not, the
// least recently used spares go first. An adapter left out of the
// catalogue, or cold, is unloaded at once, so that a set that shrank
// because its adapter went cold (lora.Decide) loses its copies.
func (p *placer) spares(ep *fleet.Endpoint, self fleet.Instance, want []string, pending int, now time.Time) (spareSet, []string) {
	var out spareSet
	var unload []string
	used := 0
	for _, name := range self.Adapters {
		_, catalogued := ep.Adapter(name)
		t, seen := p.lastSeen[name]
		switch {
		case slices.Contains(want, name) || slices.Contains(p.static, name):
			used++
		case catalogued && self.MaxAdapters > 0 && seen && now.Sub(t) <= p.a.cfg.ActiveWindow:
			out.kept = append(out.kept, name)
		default:
			unload = append(unload, name)
		}
	}
	// Most recently used first; the name breaks ties, so the choice is
	// reproducible.
	slices.SortFunc(out.kept, func(x, y string) int {
		if c := p.lastSeen[y].Compare(p.lastSeen[x]); c != 0 {
			return c
		}
		return strings.Compare(x, y)
	})
	for len(out.kept) > 0 && used+pending+len(out.kept) > self.MaxAdapters {
		lru := out.kept[len(out.kept)-1]
		out.kept = out.kept[:len(out.kept)-1]
		out.evicted = append(out.evicted, lru)
		unload = append(unload, lru)
	}
	return out, unload
}

// refresh reads the server's model list and writes the adapters it
// reports (with the static ones) into the registration.
func (p *placer) refresh(ctx context.Context) {
	l, err := p.a.list(ctx)
	if err != nil {
		p.a.log.Warn("agent: model list not read", "err", err)
		return
	}
	p.a.writeModels(ctx, p.reg, p.static, l)
}

// post sends the engine's load (source set) or unload request for name,
// {"lora_name","lora_path"} or {"lora_name"} (vLLM and SGLang take the
// same bodies). An adapter already loaded, or already gone, is success.
func (p *placer) post(ctx context.Context, path, name, source string) error {
	body := map[string]string{"lora_name": name}
	if source != "" {
		body["lora_path"] = source
	}
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.a.url(path), bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.a.cfg.HTTPClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch {
	case resp.StatusCode/100 == 2:
		return nil
	case source != "" && resp.StatusCode == http.StatusBadRequest && alreadyLoaded(string(msg)):
		return nil
	case source == "" && resp.StatusCode == http.StatusNotFound:
		return nil
	}
	return fmt.Errorf("agent: POST %s: %s: %s", path, resp.Status, bytes.TrimSpace(msg))
}

// alreadyLoaded recognizes the answer to loading an adapter that is
// loaded: vLLM's "...has already been loaded", SGLang's "...is skipped as
// it is already loaded...".
func alreadyLoaded(msg string) bool {
	return strings.Contains(msg, "already been loaded") || strings.Contains(msg, "already loaded")
}

// observe scrapes the server's load and adapter use and publishes
// Saturated, BusyAdapters and ActiveAdapters (and, once, the adapter slots
// vLLM reports) when they change. Saturated has hysteresis: set after the
// load stayed at or above the endpoint's concurrency threshold for
// SaturationWindow, cleared after it stayed below half of it as long.
func (p *placer) observe(ctx context.Context) {
	m, err := probe.Scrape(ctx, p.a.cfg.HTTPClient, p.a.url(p.a.cfg.MetricsPath))
	if err != nil {
		return // unknown load: keep the published state
	}
	now := p.clock.Now()
	threshold := fleet.DefaultConcurrencyThreshold
	if ep := p.endpoint(); ep != nil {
		threshold = ep.Resolved.ConcurrencyThreshold
	}
	if busy, err := p.a.busyIn(m); err == nil {
		p.saturationStep(busy, float64(threshold), now)
	}
	inUse, slots := m.LoRAUse()
	present := map[string]bool{}
	for _, a := range inUse {
		p.lastSeen[a] = now
		present[a] = true
	}
	p.busyAdapters = p.busyAdaptersStep(present)
	var active []string
	for a, t := range p.lastSeen {
		if now.Sub(t) <= p.a.cfg.ActiveWindow {
			active = append(active, a)
		} else {
			delete(p.lastSeen, a)
		}
	}
	slices.Sort(active)
	cur := p.reg.Instance()
	setSlots := cur.MaxAdapters == 0 && slots > 0 && p.a.cfg.Instance.MaxAdapters == 0
	if cur.Saturated == p.saturated && slices.Equal(cur.ActiveAdapters, active) && slices.Equal(cur.BusyAdapters, p.busyAdapters) && !setSlots {
		return
	}
	uctx, cancel := context.WithTimeout(ctx, DefaultRequestTimeout)
	defer cancel()
	saturated, busyAdapters := p.saturated, p.busyAdapters
	err = p.reg.Update(uctx, func(in *fleet.Instance) {
		in.Saturated, in.ActiveAdapters, in.BusyAdapters = saturated, active, busyAdapters
		if setSlots {
			in.MaxAdapters = slots
		}
	})
	if err != nil {
		p.a.log.Warn("agent: load state not yet written", "err", err)
	}
}

// saturationStep advances the saturated flag's hysteresis with one load
// sample.
func (p *placer) saturationStep(busy, threshold float64, now time.Time) {
	if busy >= threshold {
		if p.aboveSince.IsZero() {
			p.aboveSince = now
		}
	} else {
		p.aboveSince = time.Time{}
	}
	if busy < threshold/2 {
		if p.belowSince.IsZero() {
			p.belowSince = now
		}
	} else {
		p.belowSince = time.Time{}
	}
	switch {
	case !p.saturated && !p.aboveSince.IsZero() && now.Sub(p.aboveSince) >= p.a.cfg.SaturationWindow:
		p.saturated = true
	case p.saturated && !p.belowSince.IsZero() && now.Sub(p.belowSince) >= p.a.cfg.SaturationWindow:
		p.saturated = false
	}
}

// busyAdaptersStep updates each adapter's share of the samples in which it
// was in use (a moving average over about SaturationWindow) and returns, while the
// instance is saturated, the adapters that carry the load: in use in at least
// three quarters of the recent samples, staying listed until they fall
// below 40 % (hysteresis). An adapter with a request now and then is in
// use in few samples, however long one request takes.
func (p *placer) busyAdaptersStep(present map[string]bool) []string {
	// Weight of one sample: SaturationWindow spans about 1/alpha samples.
	alpha := min(1, float64(p.a.cfg.LoadPollInterval)/float64(p.a.cfg.SaturationWindow))
	for a := range present {
		if _, ok := p.share[a]; !ok {
			p.share[a] = 0
		}
	}
	var out []string
	for a, v := range p.share {
		x := 0.0
		if present[a] {
			x = 1
		}
		v += alpha * (x - v)
		if v < 0.01 {
			delete(p.share, a)
			continue
		}
		p.share[a] = v
		if p.saturated && (v >= 0.75 || (v >= 0.4 && slices.Contains(p.busyAdapters, a))) {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return out
}

// scale writes the growth and shrink decisions of lora.Decide. Every agent
// makes them from the same snapshot; the compare-and-swap lets exactly one
// write each (see docs/adapters.md).
func (p *placer) scale(ctx context.Context) {
	ep := p.endpoint()
	if ep == nil || len(ep.Adapters) == 0 {
		return
	}
	now := p.clock.Now()
	for _, s := range lora.Decide(ep, lora.Place(ep), now, lora.ScaleOptions{Cooldown: p.a.cfg.ScaleCooldown}) {
		wctx, cancel := context.WithTimeout(ctx, EtcdCallTimeout)
		ok, err := membership.SetPlacement(wctx, p.a.cfg.Client, p.a.cfg.Options.Layout, p.a.cfg.Endpoint, s.Adapter, s.Revision,
			membership.Placement{Replicas: s.To, ScaledAt: now})
		cancel()
		if err != nil {
			p.a.log.Warn("agent: placement change not written", "adapter", s.Adapter, "err", err)
		} else if ok {
			p.a.log.Info("agent: adapter set resized", "adapter", s.Adapter, "from", s.From, "to", s.To)
		}
	}
}
