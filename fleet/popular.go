package fleet

import (
	"fmt"
	"math"
	"sort"
)

// Agreed popularity (issue 21). Each router replica publishes the prefixes
// it sees as popular on an endpoint, under its own lease; the snapshot
// carries them merged, so that every replica routes on the same view and
// the same snapshot still gives the same decision.

// PopularKey is one popular prefix of an endpoint.
type PopularKey struct {
	// Key is the prefix's routing key (hash of tenant, model and the
	// prompt's first units at its depth); Parent the key of the prefix one
	// depth shallower, 0 at the shallowest; Level the depth's index.
	Key    uint64 `json:"key,string"`
	Parent uint64 `json:"parent,string,omitempty"`
	Level  int    `json:"level,omitempty"`
	// Model names the sticky set that serves it ("" for the base set).
	Model string `json:"model,omitempty"`
	// Share is its share of the endpoint's requests; K the number of
	// instances it needs (1: one is enough).
	Share float64 `json:"share"`
	K     int     `json:"k,omitempty"`
	// Since is when it was first published popular (unix seconds): the
	// placement serves older prefixes first, so that a prefix keeps its
	// instance while that instance has room and newcomers fill the rest.
	Since int64 `json:"since,omitempty"`
	// At is, for a prefix one depth below a hot one, the instance its
	// requests were sent to when it was first published (an instance id):
	// the placement keeps it there while that instance has room, so that a
	// session stays where its history is cached. Empty elsewhere.
	At string `json:"at,omitempty"`
}

// Popularity is what one replica publishes for one endpoint.
type Popularity struct {
	// Rate is the requests per second the replica counted on the endpoint
	// over its last interval: the weight of its shares in the merge.
	Rate float64      `json:"rate"`
	Keys []PopularKey `json:"keys"`
	// Served is each instance's share of the replica's recent requests
	// (by instance id; decayed over a few intervals): merged, it tells
	// the placement of a hot prefix's new children where the load is.
	Served map[string]float64 `json:"served,omitempty"`
}

// Bounds of a replica's publication: what one record may hold.
const (
	// MaxPopularKeys bounds the prefixes one replica publishes per endpoint.
	MaxPopularKeys = 256
	// MaxPopularLevel bounds a prefix's depth index in the ladder.
	MaxPopularLevel = 15
	// MaxPopularK bounds a published replication factor.
	MaxPopularK = 255
	// MaxServedInstances bounds the instances of Popularity.Served.
	MaxServedInstances = 4096
)

// ErrInvalidPopularity is wrapped by Popularity.Validate's errors; it wraps
// ErrInvalid.
var ErrInvalidPopularity = fmt.Errorf("fleet: %w popularity", ErrInvalid)

// Validate checks the ranges a merge relies on: a record from a replica of
// another version, or a damaged one, must not skew every replica's view.
func (p Popularity) Validate() error {
	if !(p.Rate >= 0 && p.Rate < math.Inf(1)) {
		return fmt.Errorf("%w: rate %v", ErrInvalidPopularity, p.Rate)
	}
	if len(p.Keys) > MaxPopularKeys {
		return fmt.Errorf("%w: %d keys, at most %d", ErrInvalidPopularity, len(p.Keys), MaxPopularKeys)
	}
	if len(p.Served) > MaxServedInstances {
		return fmt.Errorf("%w: %d served instances, at most %d", ErrInvalidPopularity, len(p.Served), MaxServedInstances)
	}
	for id, v := range p.Served {
		if len(id) > MaxNameLength || !(v >= 0 && v <= 1) {
			return fmt.Errorf("%w: served share %v of instance %.*q", ErrInvalidPopularity, v, MaxNameLength, id)
		}
	}
	for _, k := range p.Keys {
		switch {
		case !(k.Share >= 0 && k.Share <= 1):
			return fmt.Errorf("%w: key %d: share %v outside [0, 1]", ErrInvalidPopularity, k.Key, k.Share)
		case k.K < 0 || k.K > MaxPopularK:
			return fmt.Errorf("%w: key %d: k %d outside 0..%d", ErrInvalidPopularity, k.Key, k.K, MaxPopularK)
		case k.Level < 0 || k.Level > MaxPopularLevel:
			return fmt.Errorf("%w: key %d: level %d outside 0..%d", ErrInvalidPopularity, k.Key, k.Level, MaxPopularLevel)
		case len(k.Model) > MaxNameLength:
			return fmt.Errorf("%w: key %d: model name longer than %d", ErrInvalidPopularity, k.Key, MaxNameLength)
		case len(k.At) > MaxNameLength:
			return fmt.Errorf("%w: key %d: instance id longer than %d", ErrInvalidPopularity, k.Key, MaxNameLength)
		}
	}
	return nil
}

// MergePopularity merges the replicas' publications into one view, sorted
// by key: a prefix's share is the replicas' shares weighted by their rates
// (a replica that does not list it counts 0), its k the largest any
// replica asks for, its parent, level and model the first publication's
// that lists it, its Since the earliest. ps must come in an order every replica uses (the watcher
// sorts them by replica id), so that the floating-point sums are equal
// everywhere. Replicas with no rate weigh alike when none has one.
func MergePopularity(ps []Popularity) []PopularKey {
	total := 0.0
	for _, p := range ps {
		total += p.Rate
	}
	at := map[uint64]int{}
	var out []PopularKey
	for _, p := range ps {
		w := 1 / float64(len(ps))
		if total > 0 {
			w = p.Rate / total
		}
		for _, k := range p.Keys {
			i, ok := at[k.Key]
			if !ok {
				i = len(out)
				at[k.Key] = i
				m := k
				m.Share = 0
				out = append(out, m)
			}
			if out[i].At == "" {
				out[i].At = k.At
			}
			out[i].Share += w * k.Share
			out[i].K = max(out[i].K, k.K)
			if k.Since > 0 && (out[i].Since == 0 || k.Since < out[i].Since) {
				out[i].Since = k.Since
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// MergeServed merges the replicas' served shares (Popularity.Served) as
// MergePopularity merges prefixes' shares, weighted by the replicas' rates,
// in the order of ps; nil when none has any.
func MergeServed(ps []Popularity) map[string]float64 {
	total := 0.0
	for _, p := range ps {
		total += p.Rate
	}
	var out map[string]float64
	for _, p := range ps {
		w := 1 / float64(len(ps))
		if total > 0 {
			w = p.Rate / total
		}
		// Sorted ids, so that every replica sums in one order.
		ids := make([]string, 0, len(p.Served))
		for id := range p.Served {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			if out == nil {
				out = make(map[string]float64, len(p.Served))
			}
			out[id] += w * p.Served[id]
		}
	}
	return out
}

// Moved reports whether p differs from old, the view a replica last
// published, enough to be published again: a prefix listed or gone, a k
// moved, a share moved by more than a tenth (and half a point), an
// instance's served share likewise, or the rate by more than a quarter. Small drifts of the estimates are worth neither a
// write nor a new snapshot on every replica, nor moving a prefix whose
// placement depends on them.
func (p Popularity) Moved(old Popularity) bool {
	if len(old.Keys) != len(p.Keys) || math.Abs(p.Rate-old.Rate) > 0.25*max(old.Rate, 1) {
		return true
	}
	if len(old.Served) != len(p.Served) {
		return true
	}
	for id, v := range p.Served {
		if o, ok := old.Served[id]; !ok || math.Abs(o-v) > max(0.1*o, 0.005) {
			return true
		}
	}
	prev := make(map[uint64]PopularKey, len(old.Keys))
	for _, k := range old.Keys {
		prev[k.Key] = k
	}
	for _, k := range p.Keys {
		o, ok := prev[k.Key]
		if !ok || o.K != k.K || o.At != k.At || math.Abs(o.Share-k.Share) > max(0.1*o.Share, 0.005) {
			return true
		}
	}
	return false
}
