package membership

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// ParseRoutingConfig decodes SageMaker's RoutingConfig JSON strictly and
// validates it as SageMaker does: RoutingStrategy is required, and a
// PrefixLength, ConcurrencyThreshold or FirstByteTimeoutInMilliseconds
// that is given must be in its range
// (an explicit 0 is refused, never replaced by the default). Unknown fields
// and trailing data are errors, since they are most likely typos. Every
// error wraps fleet.ErrInvalidConfig. The result is not normalized: members
// left out still mean the defaults.
func ParseRoutingConfig(data []byte) (fleet.RoutingConfig, error) {
	var c fleet.RoutingConfig
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return fleet.RoutingConfig{}, fmt.Errorf("%w: %v", fleet.ErrInvalidConfig, err)
	}
	if dec.More() {
		return fleet.RoutingConfig{}, fmt.Errorf("%w: trailing data after the JSON object", fleet.ErrInvalidConfig)
	}
	// given tells a member left out from one given as 0, which c cannot.
	var given struct {
		FirstByteTimeoutInMilliseconds *int
		PrefixAwareRoutingConfig       *struct {
			PrefixLength, ConcurrencyThreshold *int
		}
	}
	_ = json.Unmarshal(data, &given) // decoded above already
	if c.RoutingStrategy == "" {
		return fleet.RoutingConfig{}, fmt.Errorf("%w: RoutingStrategy is required (RANDOM, LEAST_OUTSTANDING_REQUESTS or PREFIX_AWARE)", fleet.ErrInvalidConfig)
	}
	if ms := given.FirstByteTimeoutInMilliseconds; ms != nil && *ms == 0 {
		return fleet.RoutingConfig{}, fmt.Errorf("%w: FirstByteTimeoutInMilliseconds 0 is outside 1..%d (leave it out for the replica's --upstream-first-byte-timeout)", fleet.ErrInvalidConfig, fleet.MaxFirstByteTimeoutMillis)
	}
	if p := given.PrefixAwareRoutingConfig; p != nil {
		if p.PrefixLength != nil && *p.PrefixLength == 0 {
			return fleet.RoutingConfig{}, fmt.Errorf("%w: PrefixLength 0 is outside %d..%d", fleet.ErrInvalidConfig, fleet.MinPrefixLength, fleet.MaxPrefixLength)
		}
		if p.ConcurrencyThreshold != nil && *p.ConcurrencyThreshold == 0 {
			return fleet.RoutingConfig{}, fmt.Errorf("%w: ConcurrencyThreshold 0 is outside %d..%d", fleet.ErrInvalidConfig, fleet.MinConcurrencyThreshold, fleet.MaxConcurrencyThreshold)
		}
	}
	if err := c.Validate(); err != nil {
		return fleet.RoutingConfig{}, err
	}
	return c, nil
}

// PutConfig validates c and writes it, normalized, as the endpoint's routing
// config. An invalid c is not written and the error wraps
// fleet.ErrInvalidConfig (the CLI exits 2 on it). Every router watching the
// layout applies the change on its next snapshot.
func PutConfig(ctx context.Context, cli *clientv3.Client, l Layout, endpoint string, c fleet.RoutingConfig) error {
	if err := fleet.ValidateName("endpoint name", endpoint); err != nil {
		return err
	}
	if err := c.Validate(); err != nil {
		return err
	}
	data, err := json.Marshal(c.WithDefaults())
	if err != nil {
		return fmt.Errorf("membership: encode routing config: %w", err)
	}
	key := l.ConfigKey(endpoint)
	if _, err := cli.Put(ctx, key, string(data)); err != nil {
		return fmt.Errorf("membership: put %s: %w", key, err)
	}
	return nil
}

// GetConfig reads the endpoint's routing config, normalized. When the key
// does not exist it returns fleet.DefaultRoutingConfig() and set == false.
// A stored value that does not parse or validate is returned as an error
// wrapping fleet.ErrInvalidConfig (routers ignore such a value and keep
// the previous one).
func GetConfig(ctx context.Context, cli *clientv3.Client, l Layout, endpoint string) (c fleet.RoutingConfig, set bool, err error) {
	if err := fleet.ValidateName("endpoint name", endpoint); err != nil {
		return fleet.RoutingConfig{}, false, err
	}
	key := l.ConfigKey(endpoint)
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return fleet.RoutingConfig{}, false, fmt.Errorf("membership: get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return fleet.DefaultRoutingConfig(), false, nil
	}
	c, err = ParseRoutingConfig(resp.Kvs[0].Value)
	if err != nil {
		return fleet.RoutingConfig{}, true, fmt.Errorf("membership: stored value of %s: %w", key, err)
	}
	return c.WithDefaults(), true, nil
}
