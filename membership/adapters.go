package membership

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// ErrAdapterNotFound is fleet.ErrAdapterNotFound, which DeleteAdapter
// wraps for a name not in the catalogue.
var ErrAdapterNotFound = fleet.ErrAdapterNotFound

// ParseAdapter decodes an adapter's catalogue JSON strictly (unknown
// fields are typos) and validates it with name. Errors wrap
// fleet.ErrInvalidAdapter.
func ParseAdapter(name string, data []byte) (fleet.Adapter, error) {
	var a fleet.Adapter
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return fleet.Adapter{}, fmt.Errorf("%w %q: %v", fleet.ErrInvalidAdapter, name, err)
	}
	if dec.More() {
		return fleet.Adapter{}, fmt.Errorf("%w %q: trailing data after the JSON object", fleet.ErrInvalidAdapter, name)
	}
	a.Name = name
	if err := a.Validate(); err != nil {
		return fleet.Adapter{}, err
	}
	return a, nil
}

// PutAdapter validates a and writes it into the endpoint's catalogue
// (adding or replacing it). Invalid input is not written; the error wraps
// fleet.ErrInvalid (the CLI exits 2).
func PutAdapter(ctx context.Context, cli *clientv3.Client, l Layout, endpoint string, a fleet.Adapter) error {
	if err := fleet.ValidateName("endpoint name", endpoint); err != nil {
		return fmt.Errorf("%w: %w", fleet.ErrInvalid, err)
	}
	if err := a.Validate(); err != nil {
		return err
	}
	data, err := json.Marshal(a)
	if err != nil {
		return fmt.Errorf("membership: encode adapter: %w", err)
	}
	key := l.AdapterKey(endpoint, a.Name)
	if _, err := cli.Put(ctx, key, string(data)); err != nil {
		return fmt.Errorf("membership: put %s: %w", key, err)
	}
	return nil
}

// DeleteAdapter removes an adapter from the catalogue, with its placement
// state, in one transaction. Agents then unload it.
func DeleteAdapter(ctx context.Context, cli *clientv3.Client, l Layout, endpoint, name string) error {
	if err := fleet.ValidateName("endpoint name", endpoint); err != nil {
		return fmt.Errorf("%w: %w", fleet.ErrInvalid, err)
	}
	if err := (fleet.Adapter{Name: name, Source: "-"}).Validate(); err != nil {
		return err
	}
	key := l.AdapterKey(endpoint, name)
	resp, err := cli.Txn(ctx).Then(clientv3.OpDelete(key), clientv3.OpDelete(l.PlacementKey(endpoint, name))).Commit()
	if err != nil {
		return fmt.Errorf("membership: delete %s: %w", key, err)
	}
	if resp.Responses[0].GetResponseDeleteRange().Deleted == 0 {
		return fmt.Errorf("%w: %q", ErrAdapterNotFound, name)
	}
	return nil
}

// ListAdapters returns the endpoint's catalogue with its placement state,
// sorted by name. Records that do not validate are skipped, as routers
// skip them.
func ListAdapters(ctx context.Context, cli *clientv3.Client, l Layout, endpoint string) ([]fleet.Adapter, error) {
	if err := fleet.ValidateName("endpoint name", endpoint); err != nil {
		return nil, fmt.Errorf("%w: %w", fleet.ErrInvalid, err)
	}
	prefix := l.EndpointsPrefix() + endpoint + "/"
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("membership: list %s: %w", prefix, err)
	}
	byName := map[string]fleet.Adapter{}
	places := map[string]Placement{}
	for _, kv := range resp.Kvs {
		switch kind, _, name := l.parseKey(string(kv.Key)); kind {
		case kindAdapter:
			if a, err := ParseAdapter(name, kv.Value); err == nil {
				byName[name] = a
			}
		case kindPlacement:
			if p, err := parsePlacement(kv.Value); err == nil {
				p.revision = kv.ModRevision
				places[name] = p
			}
		}
	}
	out := make([]fleet.Adapter, 0, len(byName))
	for name, a := range byName {
		places[name].apply(&a)
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Placement is an adapter's placement state: the size of its target set,
// as the agents last agreed (see lora.Decide and docs/adapters.md).
type Placement struct {
	Replicas int       `json:"replicas"`
	ScaledAt time.Time `json:"scaledAt"`
	// revision is the key's mod revision when read.
	revision int64
}

func parsePlacement(data []byte) (Placement, error) {
	var p Placement
	if err := json.Unmarshal(data, &p); err != nil {
		return Placement{}, fmt.Errorf("membership: decode placement: %w", err)
	}
	if p.Replicas < 0 || p.Replicas > fleet.MaxAdapterReplicas {
		return Placement{}, fmt.Errorf("membership: placement replicas %d outside 0..%d", p.Replicas, fleet.MaxAdapterReplicas)
	}
	return p, nil
}

func (p Placement) apply(a *fleet.Adapter) {
	a.Replicas, a.ScaledAt, a.PlacementRevision = p.Replicas, p.ScaledAt, p.revision
}

// SetPlacement writes an adapter's set size if the placement key is still
// at modRevision (0: absent), the revision the caller decided from. It
// returns false, without error, when another writer changed it first:
// every agent decides from the same etcd state, so the winner wrote what
// the loser would have, and the loser sees it on its next snapshot.
func SetPlacement(ctx context.Context, cli *clientv3.Client, l Layout, endpoint, name string, modRevision int64, p Placement) (bool, error) {
	data, err := json.Marshal(p)
	if err != nil {
		return false, fmt.Errorf("membership: encode placement: %w", err)
	}
	key := l.PlacementKey(endpoint, name)
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", modRevision)).
		Then(clientv3.OpPut(key, string(data))).
		Commit()
	if err != nil {
		return false, fmt.Errorf("membership: put %s: %w", key, err)
	}
	return resp.Succeeded, nil
}

// StaleMark is what a router writes under StaleKey when the instance
// answered "adapter not found" for an adapter its record lists.
type StaleMark struct {
	Adapter string    `json:"adapter"`
	At      time.Time `json:"at"`
}

// MarkStale writes a StaleMark for the instance under a lease of ttl, so
// that marks nobody consumed disappear by themselves. The instance's agent
// watches its key and re-polls its server at once.
func MarkStale(ctx context.Context, cli *clientv3.Client, l Layout, endpoint, id, adapter string, ttl time.Duration) error {
	lease, err := cli.Grant(ctx, max(int64(ttl/time.Second), 1))
	if err != nil {
		return fmt.Errorf("membership: grant stale mark lease: %w", err)
	}
	data, _ := json.Marshal(StaleMark{Adapter: adapter, At: time.Now()})
	key := l.StaleKey(endpoint, id)
	if _, err := cli.Put(ctx, key, string(data), clientv3.WithLease(lease.ID)); err != nil {
		return fmt.Errorf("membership: put %s: %w", key, err)
	}
	return nil
}
