package membership

import (
	"context"
	"encoding/json"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// Agreed popularity (issue 21): every router replica publishes the
// prefixes it sees as popular on an endpoint under
// <prefix>/endpoints/<endpoint>/popularity/<replica-id>, bound to its own
// lease (a replica that stops takes its view with it), and every watcher
// merges them into the endpoint's snapshot (fleet.MergePopularity, in
// replica id order), so that replicas route on one view.

// PopularityKey returns the key a router replica publishes an endpoint's
// popularity under.
func (l Layout) PopularityKey(endpoint, replicaID string) string {
	return l.EndpointsPrefix() + endpoint + "/popularity/" + replicaID
}

// PutPopularity writes p as replicaID's view of endpoint, bound to lease.
func PutPopularity(ctx context.Context, cli *clientv3.Client, l Layout, endpoint, replicaID string, lease clientv3.LeaseID, p fleet.Popularity) error {
	if err := p.Validate(); err != nil {
		return err
	}
	data, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("membership: encode popularity: %w", err)
	}
	key := l.PopularityKey(endpoint, replicaID)
	if _, err := cli.Put(ctx, key, string(data), clientv3.WithLease(lease)); err != nil {
		return fmt.Errorf("membership: put %s: %w", key, err)
	}
	return nil
}

// ParsePopularity decodes and validates a published popularity record.
func ParsePopularity(value []byte) (fleet.Popularity, error) {
	var p fleet.Popularity
	if err := json.Unmarshal(value, &p); err != nil {
		return fleet.Popularity{}, fmt.Errorf("%w: decode: %w", fleet.ErrInvalidPopularity, err)
	}
	if err := p.Validate(); err != nil {
		return fleet.Popularity{}, err
	}
	return p, nil
}
