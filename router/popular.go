package router

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/hotkey"
	"github.com/prefixrouter/prefixrouter/lora"
)

// Keys that follow the prompt's tree (issue 21). A request of an endpoint
// with adaptive keys (PREFIX_AWARE without FixedLengthKeys) has a key at
// each depth of the ladder (key.go). It routes on the shallowest depth
// whose prefix is not hot in the agreed popularity the snapshot carries
// (fleet.Endpoint.Popular, merged from every replica's publication):
//
//   - a prefix nobody published routes as a fixed key does: its ring
//     primary, spilling along its ring order;
//   - a popular prefix that is not hot goes to the instance the placement
//     gave it (below), its ring primary unless that would carry more than
//     placeCap fair shares;
//   - a hot prefix (k > 1) has k candidates; the request is placed among
//     them by its next, deeper key: rendezvous over the k weighted against
//     the instances that served more than their share lately (childOrder),
//     so that an agent session, whose deeper prefix is its own task and
//     history, stays on one instance turn after turn and new sessions go
//     where there is room, or the deeper prefix's own placement when it is
//     popular too (which keeps it where it was sent, fleet.PopularKey.At);
//     a hot prefix whose k trails its traffic places its children over its
//     parent's instances too (spreadOf);
//   - a prefix hot at the deepest depth (identical prompts up to
//     PrefixLength) is replicated by load over its k, as hot-key
//     replication does.
//
// The placement is computed once per snapshot from the merged view, in one
// order, by every replica alike (same snapshot, same decision): the popular
// prefixes, the longest-published first, then the largest, each take the
// first instances of their order (ring order for the shallowest depth,
// rendezvous order of the parent's candidates below it) whose expected
// load stays within placeCap fair shares, or the least loaded when none has
// room. A prefix keeps its instance while that instance has room, so caches
// stay warm; the long tail (prefixes nobody published) hashes as before.

// placeCap bounds an instance's expected load in the placement, in fair
// shares of the endpoint's traffic: what issue 21 calls a bounded multiple.
// 1.25 leaves each instance a quarter of a fair share of headroom for the
// long tail's hashing, which the placement cannot move.
const placeCap = 1.25

// popView is an endpoint's agreed popularity with its placement, built once
// per view; immutable.
type popView struct {
	nodes map[uint64]*popNode
}

// popNode is one popular prefix of the view.
type popNode struct {
	key    uint64
	level  int      // the depth's index in the ladder
	parent *popNode // the prefix one depth shallower; nil at the shallowest
	set    *lora.Set
	share  float64
	since  int64 // when first published popular (at least the parent's): the placement's order
	// k is the number of instances it needs; > 1 makes it hot.
	k int
	// routable: requests can route on it (its parent is hot, or it has
	// none). Others are never reached: a request stops at their parent.
	routable bool
	// cands are its instances (set indexes): a hot prefix's k candidates
	// in its order, a warm prefix's one instance; ivs a hot prefix's
	// candidates' views (nil where one cannot be picked).
	cands []int
	ivs   []*instanceView
	// spread are the instances a hot prefix's children are placed over:
	// its candidates, or its parent's spread while it carries more than
	// spreadShare of its parent's traffic with fewer candidates (spreadOf).
	// w weighs them for its children nobody published (childOrder),
	// aligned with spread; nil when the view has no served loads (all
	// alike).
	spread []int
	w      []float64
	// at is the instance a child of a hot prefix was sent to when first
	// published (fleet.PopularKey.At): its placement keeps it there.
	at string
}

func (nd *popNode) hot() bool { return nd.k > 1 }

// newPopView builds the view of an endpoint's merged popularity: the tree
// of prefixes and its placement over the sets of table.
func newPopView(ev *endpointView, keys []fleet.PopularKey, served map[string]float64) *popView {
	table := ev.table
	p := &popView{nodes: make(map[uint64]*popNode, len(keys))}
	if len(keys) == 0 {
		return p
	}
	parentKey := make(map[*popNode]uint64, len(keys))
	var order []*popNode
	for _, pk := range keys {
		set, err := table.Set(pk.Model)
		if err != nil || set.Len() == 0 || !(pk.Share > 0) {
			continue
		}
		nd := &popNode{key: pk.Key, level: pk.Level, set: set, share: pk.Share, since: pk.Since, at: pk.At, k: min(max(pk.K, 1), set.Len(), maxHotCandidates)}
		p.nodes[pk.Key] = nd
		parentKey[nd] = pk.Parent
		order = append(order, nd)
	}
	// Link each prefix to its parent, shallowest first, and decide which
	// are routable: the shallowest, and those whose parent is routable and
	// hot (a request stops at a parent that is not hot). A routable
	// prefix's age is at most its parent's, so that parents come first in
	// the placement's order.
	slices.SortFunc(order, func(a, b *popNode) int {
		if c := cmp.Compare(a.level, b.level); c != 0 {
			return c
		}
		return cmp.Compare(a.key, b.key)
	})
	residual := make(map[*popNode]float64, len(order))
	roots := 0.0
	for _, nd := range order {
		if nd.level == 0 {
			nd.routable = true
			roots += nd.share
			residual[nd] = nd.share
			continue
		}
		q := p.nodes[parentKey[nd]]
		if q == nil || !q.routable || !q.hot() || q.set != nd.set || q.level != nd.level-1 {
			continue
		}
		nd.parent, nd.routable = q, true
		nd.since = max(nd.since, q.since)
		// A hot prefix carries what its routable children do not: they
		// are placed themselves.
		residual[nd] = nd.share
		residual[q] -= nd.share
	}
	// The placement's order: older first (a prefix keeps its instance
	// while it has room; newcomers fill what is left), parents before
	// their children (neither comes before its parent), then keys. Not
	// by share: shares move with every estimate, and an order that moved
	// with them moved prefixes whose instances were near the cap (on the
	// llamacpp-tiny preset, 15 documents changed instance in 1,000
	// requests ordered by share, 8 ordered by age).
	slices.SortStableFunc(order, func(a, b *popNode) int {
		return cmp.Compare(a.since, b.since)
	})
	pl := placer{load: map[*fleet.Instance]float64{}}
	n := 1
	if base, err := table.Set(""); err == nil {
		n = base.Len()
		// The long tail hashes over every instance: its expected load
		// is even.
		cold := max(0, 1-roots) / float64(n)
		for i := 0; i < base.Len(); i++ {
			pl.load[base.Instance(i)] = cold
		}
	}
	pl.cap = placeCap / float64(n)
	for _, nd := range order {
		if !nd.routable {
			continue
		}
		pl.place(nd, max(0, residual[nd]))
	}
	for _, nd := range order {
		if nd.routable && nd.hot() {
			nd.ivs = make([]*instanceView, len(nd.cands))
			for j, i := range nd.cands {
				nd.ivs[j] = ev.instance(nd.set, i)
			}
			nd.w = childWeights(nd.set, nd.spread, served)
		}
	}
	return p
}

// placer assigns popular prefixes to instances within the cap.
type placer struct {
	load map[*fleet.Instance]float64 // expected share of the traffic
	cap  float64
}

// place gives nd its instances: the first of its order with room for its
// traffic (a hot prefix's k, each taking share / k), the least loaded for
// those that find none; then charges what routes on nd itself.
func (pl *placer) place(nd *popNode, own float64) {
	var buf [maxHotCandidates]int
	ord := pl.nodeOrder(nd, buf[:0])
	want := 1
	if nd.hot() {
		want = min(nd.k, len(ord))
	}
	per := nd.share / float64(want)
	taken := make([]bool, len(ord))
	cands := make([]int, 0, want)
	for j, i := range ord {
		if len(cands) == want {
			break
		}
		if pl.load[nd.set.Instance(i)]+per <= pl.cap {
			cands = append(cands, i)
			taken[j] = true
		}
	}
	for len(cands) < want {
		best := -1
		for j, i := range ord {
			if !taken[j] && (best < 0 || pl.load[nd.set.Instance(i)] < pl.load[nd.set.Instance(ord[best])]) {
				best = j
			}
		}
		taken[best] = true
		cands = append(cands, ord[best])
	}
	// Keep the order's order among the chosen.
	cands = cands[:0]
	for j, i := range ord {
		if taken[j] {
			cands = append(cands, i)
		}
	}
	nd.cands = cands
	nd.spread = spreadOf(nd)
	for _, i := range cands {
		pl.load[nd.set.Instance(i)] += own / float64(len(cands))
	}
}

// nodeOrder is the order in which nd prefers instances: its ring order in
// its set at the shallowest depth (the first maxHotCandidates); below it,
// the rendezvous order of its key over its parent's candidates, which is
// where its requests went before it was published (treeChoice), so that
// publishing it moves nothing while its first choice has room.
func (pl *placer) nodeOrder(nd *popNode, buf []int) []int {
	if nd.parent == nil {
		return nd.set.Ring().Candidates(nd.key, min(nd.set.Len(), maxHotCandidates), buf)
	}
	buf = rendezvous(nd.parent.spread, nd.key, buf)
	for j, i := range buf {
		if nd.at != "" && nd.set.Instance(i).ID == nd.at {
			copy(buf[1:j+1], buf[:j])
			buf[0] = i
			break
		}
	}
	return buf
}

// rendezvous returns cands ordered by spreadScore of key, highest first:
// rendezvous hashing over the candidates.
func rendezvous(cands []int, key uint64, buf []int) []int {
	buf = append(buf[:0], cands...)
	// Insertion sort: at most maxHotCandidates elements.
	for a := 1; a < len(buf); a++ {
		for b := a; b > 0 && spreadScore(key, buf[b]) > spreadScore(key, buf[b-1]); b-- {
			buf[b], buf[b-1] = buf[b-1], buf[b]
		}
	}
	return buf
}

// Weights of a hot prefix's candidates for its new children (issue 21's
// balance line). A session under a shared tool prompt is an eighth of the
// traffic on agentic, and is placed by its own key before it is popular
// enough to be published; by the key alone, which instance gets two of
// the open sessions is the hash's luck (22-26 % of the requests on one of
// 7 instances where 21.5 % is the line). The agreed served loads (each
// replica's recent requests per instance, merged: fleet.Endpoint.Served)
// show where that luck fell, so the rendezvous is weighted against the
// instances above their share: weight (childFloor / l)^childSharpness for
// an instance serving l times the mean of the candidates, 1 at or below
// childFloor times the mean. Instances at or below it weigh alike, so their
// drift moves no session; a weight changes only where an instance is
// loaded, and a session that moves there moves once (docs/balance.md
// measured the constants).
const (
	childFloor     = 1.15
	childSharpness = 5
)

// spreadShare is the share of its hot parent's traffic above which a hot
// prefix places its children over its parent's instances when it has
// fewer (issue 21): a prefix that newly takes most of an older hot
// prefix's traffic (a second tool prompt after the first 8,000 characters
// both share) is measured against the mass the older traffic left, so its
// k trails its traffic for hundreds of requests, and its sessions would
// crowd on its few candidates meanwhile; a session (an eighth of the
// traffic on agentic) stays below it. Its children then pay its prefix's
// prefill once on each further instance.
const spreadShare = 0.25

// spreadOf returns the instances hot prefix nd's children are placed
// over (popNode.spread); nd's parents are placed before it.
func spreadOf(nd *popNode) []int {
	if !nd.hot() {
		return nil
	}
	q := nd.parent
	if q == nil || !q.hot() || len(q.spread) <= len(nd.cands) || nd.share < spreadShare*q.share {
		return nd.cands
	}
	out := slices.Clone(nd.cands)
	for _, i := range q.spread {
		if !slices.Contains(out, i) {
			out = append(out, i)
		}
	}
	return out
}

// childWeights returns the weights of instances cands of set (see above),
// nil when served says nothing of them.
func childWeights(set *lora.Set, cands []int, served map[string]float64) []float64 {
	if len(served) == 0 {
		return nil
	}
	mean := 0.0
	for _, i := range cands {
		mean += served[set.Instance(i).ID]
	}
	mean /= float64(len(cands))
	if !(mean > 0) {
		return nil
	}
	w := make([]float64, len(cands))
	for j, i := range cands {
		l := served[set.Instance(i).ID] / mean
		w[j] = math.Pow(childFloor/max(l, childFloor), childSharpness)
	}
	return w
}

// childOrder returns the order in which a deeper prefix nobody published,
// key, prefers hot prefix h's instances (spread): weighted rendezvous (the least
// -ln(u)/w, u the key's uniform score of the instance), plain rendezvous
// when h has no weights. A weight that does not change moves no key.
func (h *popNode) childOrder(key uint64, buf []int) []int {
	if h.w == nil {
		return rendezvous(h.spread, key, buf)
	}
	var sc [maxHotCandidates]float64
	buf = buf[:0]
	for j, i := range h.spread {
		u := (float64(spreadScore(key, i)>>11) + 0.5) / (1 << 53)
		s := -math.Log(u) / h.w[j]
		// Insertion by score: at most maxHotCandidates elements.
		b := len(buf)
		buf = append(buf, i)
		for ; b > 0 && s < sc[b-1]; b-- {
			buf[b], sc[b] = buf[b-1], sc[b-1]
		}
		buf[b], sc[b] = i, s
	}
	return buf
}

// levelKey returns the routing key of the request's prefix at ladder depth
// i (i < rt.digests.n), computing the keys up to it once.
func (rt *route) levelKey(i int) uint64 {
	for rt.nkeys <= i {
		rt.keys[rt.nkeys] = routingKey(rt.tenant, rt.model, rt.digests.d[rt.nkeys])
		rt.nkeys++
	}
	return rt.keys[i]
}

// treeChoice walks the request's depths in the agreed view (see the top of
// this file) and returns its choice: the key whose ring order the request
// spills along, and the instances it prefers before that order.
func (p *popView) treeChoice(rt *route) hotChoice {
	var h *popNode // the deepest hot prefix so far
	for lvl := 0; lvl < rt.digests.n; lvl++ {
		key := rt.levelKey(lvl)
		nd := p.nodes[key]
		if nd == nil || !nd.routable || nd.parent != h || nd.set != rt.set {
			if h == nil {
				return hotChoice{key: key}
			}
			// A prefix below a hot one that nobody published: weighted
			// rendezvous over the hot prefix's candidates by its key.
			c := hotChoice{key: h.key, level: lvl}
			c.nlead = len(h.childOrder(key, c.lead[:0]))
			return c
		}
		if !nd.hot() {
			c := hotChoice{key: nd.key, level: lvl}
			c.lead[0], c.nlead = nd.cands[0], 1
			if h != nil {
				// Its parent's other candidates next, in its order.
				var buf [maxHotCandidates]int
				for _, i := range rendezvous(h.spread, key, buf[:0]) {
					if i != nd.cands[0] {
						c.lead[c.nlead] = i
						c.nlead++
					}
				}
			}
			return c
		}
		h = nd
	}
	// Hot at every depth: the same prompt up to PrefixLength. Its k
	// share it by load.
	c := hotChoice{key: h.key, level: rt.digests.n - 1, k: len(h.cands), byLoad: true, ivs: h.ivs}
	c.nlead = copy(c.lead[:], h.cands)
	return c
}

// count counts the request's prefixes in the endpoint's sketch: the
// shallowest, and each deeper one while the one above it is popular.
func (rt *route) count() {
	s := rt.ev.hot
	e := s.Begin()
	var parent uint64
	for lvl := 0; lvl < rt.digests.n; lvl++ {
		key := rt.levelKey(lvl)
		if popular, _ := s.Count(e, key, parent, lvl, rt.model, rt.set.Len()); !popular {
			return
		}
		parent = key
	}
}

// Popularity returns what this replica publishes of endpoint's popular
// prefixes (fleet.MaxPopularKeys at most) at now: its request rate since
// the previous call, and each prefix's Since, the time of the first call
// that listed it; ok is false when the endpoint does not count popularity
// (not PREFIX_AWARE with adaptive keys). The replica's publisher calls it
// every interval (replica/popularity.go).
func (r *Router) Popularity(endpoint string, now time.Time) (fleet.Popularity, bool) {
	v := r.view.Load()
	if v == nil {
		return fleet.Popularity{}, false
	}
	ev := v.endpoints[endpoint]
	if ev == nil || ev.pop == nil || ev.hot == nil {
		return fleet.Popularity{}, false
	}
	entries := ev.hot.Popular(fleet.MaxPopularKeys)
	seen := ev.hot.Seen()
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := r.published[endpoint]
	next := &published{at: now, seen: seen, since: make(map[uint64]int64, len(entries))}
	r.published[endpoint] = next
	var out fleet.Popularity
	if prev != nil && now.After(prev.at) && seen >= prev.seen {
		out.Rate = float64(seen-prev.seen) / now.Sub(prev.at).Seconds()
	}
	out.Served = next.countServed(prev, ev)
	for _, e := range entries {
		since := now.Unix()
		if prev != nil && prev.since[e.Key] != 0 {
			since = prev.since[e.Key]
		}
		next.since[e.Key] = since
		out.Keys = append(out.Keys, fleet.PopularKey{Key: e.Key, Parent: e.Parent, Level: e.Level, Model: e.Model, Share: e.Share, K: e.K, Since: since, At: ev.pop.childAt(e)})
	}
	return out, true
}

// childAt returns where the view sends popular prefix e's requests when
// e is one depth below a hot prefix and not hot itself (a session under a
// shared tool prompt): its placement's instance once it is in the view,
// before that the first of its parent's childOrder. Published with e
// (fleet.PopularKey.At), it keeps e there: the placement tries it first,
// though the weights that chose it have moved since. Empty otherwise.
func (p *popView) childAt(e hotkey.Entry) string {
	if e.K > 1 {
		return ""
	}
	if nd := p.nodes[e.Key]; nd != nil && nd.routable && nd.parent != nil && !nd.hot() {
		return nd.set.Instance(nd.cands[0]).ID
	}
	h := p.nodes[e.Parent]
	if h == nil || !h.routable || !h.hot() || h.level != e.Level-1 || h.set.Len() == 0 {
		return ""
	}
	var buf [maxHotCandidates]int
	return h.set.Instance(h.childOrder(e.Key, buf[:0])[0]).ID
}

// published is what an endpoint's last Popularity gave: when, the sketch's
// count then, since when each listed prefix has been listed, and the
// instances' admitted counts then (sent) with their decayed recent counts
// (served).
type published struct {
	at     time.Time
	seen   uint64
	since  map[uint64]int64
	sent   map[string]uint64
	served map[string]float64
}

// servedDecay is what a publication keeps of the served counts before it:
// a half-life of about 10 intervals (48 s at the default 5 s), long enough
// that one session's turns do not swing an instance's weight, short enough
// that a fleet's warm-up (every request on one instance until the first
// publication) is forgotten within a minute. Measured load-free with the
// weights of childWeights (docs/balance.md).
const servedDecay = 0.93

// countServed decays prev's served counts, adds the requests admitted to
// each instance of ev since prev, and returns each instance's share of
// them (nil before any request).
func (p *published) countServed(prev *published, ev *endpointView) map[string]float64 {
	p.sent = make(map[string]uint64, len(ev.instances))
	p.served = make(map[string]float64, len(ev.instances))
	total := 0.0
	for id, iv := range ev.instances {
		n := iv.state.Sent()
		p.sent[id] = n
		d, old := n, 0.0
		if prev != nil {
			if m, ok := prev.sent[id]; ok && m <= n {
				d = n - m
			}
			old = prev.served[id]
		}
		p.served[id] = servedDecay*old + float64(d)
		total += p.served[id]
	}
	if !(total > 0) {
		return nil
	}
	out := make(map[string]float64, len(p.served))
	for id, c := range p.served {
		out[id] = c / total
	}
	return out
}

// order returns the instances c prefers, then those of ring (the ring
// order of c.key) not among them, at most len(ring) in all: the no-load
// spill order Explain reports.
func (c *hotChoice) order(ring []int) []int {
	out := make([]int, 0, max(len(ring), c.nlead))
	out = append(out, c.lead[:c.nlead]...)
	for _, i := range ring {
		if len(out) >= len(ring) {
			break
		}
		if !slices.Contains(out, i) {
			out = append(out, i)
		}
	}
	return out
}
