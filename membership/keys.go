package membership

import "strings"

// DefaultPrefix is the root of the etcd layout (v1) unless --etcd-prefix
// says otherwise.
const DefaultPrefix = "/prefixrouter/v1"

// Layout names the keys of the etcd layout (v1) under one root prefix:
//
//	<prefix>/endpoints/<endpoint>/instances/<instance-id>   lease-bound fleet.Instance JSON
//	<prefix>/endpoints/<endpoint>/config                     fleet.RoutingConfig JSON
//	<prefix>/endpoints/<endpoint>/adapters/<name>            fleet.Adapter JSON: the catalogue
//	<prefix>/endpoints/<endpoint>/placement/<name>           Placement JSON: an adapter's set size
//	<prefix>/endpoints/<endpoint>/stale/<instance-id>        lease-bound StaleMark JSON
//	<prefix>/endpoints/<endpoint>/popularity/<replica-id>    lease-bound fleet.Popularity JSON
//	<prefix>/endpoints/<endpoint>/session-key                the base64 key of the endpoint's session ids (routers only)
//	<prefix>/routers/<replica-id>                            lease-bound RouterInfo JSON
type Layout struct {
	// Prefix is the root; a trailing slash is ignored. Empty (or "/")
	// means DefaultPrefix.
	Prefix string
}

func (l Layout) root() string {
	if p := strings.TrimRight(l.Prefix, "/"); p != "" {
		return p
	}
	return DefaultPrefix
}

// Root returns the prefix that every key of the layout starts with, with a
// trailing slash.
func (l Layout) Root() string { return l.root() + "/" }

// EndpointsPrefix returns the prefix of all endpoints' keys.
func (l Layout) EndpointsPrefix() string { return l.root() + "/endpoints/" }

// InstancesPrefix returns the prefix of one endpoint's instance keys.
func (l Layout) InstancesPrefix(endpoint string) string {
	return l.EndpointsPrefix() + endpoint + "/instances/"
}

// InstanceKey returns the key of one instance record.
func (l Layout) InstanceKey(endpoint, id string) string { return l.InstancesPrefix(endpoint) + id }

// ConfigKey returns the key of an endpoint's routing config.
func (l Layout) ConfigKey(endpoint string) string {
	return l.EndpointsPrefix() + endpoint + "/config"
}

// AdaptersPrefix returns the prefix of one endpoint's adapter catalogue.
func (l Layout) AdaptersPrefix(endpoint string) string {
	return l.EndpointsPrefix() + endpoint + "/adapters/"
}

// AdapterKey returns the catalogue key of one adapter.
func (l Layout) AdapterKey(endpoint, name string) string { return l.AdaptersPrefix(endpoint) + name }

// PlacementKey returns the key of one adapter's placement state.
func (l Layout) PlacementKey(endpoint, name string) string {
	return l.EndpointsPrefix() + endpoint + "/placement/" + name
}

// StaleKey returns the key a router writes when an instance refused an
// adapter it was believed to hold.
func (l Layout) StaleKey(endpoint, id string) string {
	return l.EndpointsPrefix() + endpoint + "/stale/" + id
}

// SessionKeyKey returns the key of an endpoint's session key: the secret
// every router replica of the endpoint seals its session ids with. Only
// router roles may read it (docs/security.md); it is never part of an
// instance record or a snapshot.
func (l Layout) SessionKeyKey(endpoint string) string {
	return l.EndpointsPrefix() + endpoint + "/session-key"
}

// RoutersPrefix returns the prefix of router replica keys.
func (l Layout) RoutersPrefix() string { return l.root() + "/routers/" }

// RouterKey returns the key of one router replica.
func (l Layout) RouterKey(replicaID string) string { return l.RoutersPrefix() + replicaID }

// keyKind classifies a key of the layout.
type keyKind int

const (
	kindOther keyKind = iota
	kindInstance
	kindConfig
	kindRouter
	kindAdapter
	kindPlacement
	kindStale
	kindPopularity
	kindSessionKey
)

// parseKey splits a key into its kind and names. Keys that do not fit the
// layout are kindOther and ignored by the watcher.
func (l Layout) parseKey(key string) (kind keyKind, endpoint, id string) {
	if rest, ok := strings.CutPrefix(key, l.RoutersPrefix()); ok {
		if rest == "" || strings.Contains(rest, "/") {
			return kindOther, "", ""
		}
		return kindRouter, "", rest
	}
	rest, ok := strings.CutPrefix(key, l.EndpointsPrefix())
	if !ok {
		return kindOther, "", ""
	}
	parts := strings.Split(rest, "/")
	switch {
	case len(parts) == 2 && parts[1] == "config" && parts[0] != "":
		return kindConfig, parts[0], ""
	case len(parts) == 2 && parts[1] == "session-key" && parts[0] != "":
		return kindSessionKey, parts[0], ""
	case len(parts) == 3 && parts[1] == "instances" && parts[0] != "" && parts[2] != "":
		return kindInstance, parts[0], parts[2]
	case len(parts) == 3 && parts[1] == "adapters" && parts[0] != "" && parts[2] != "":
		return kindAdapter, parts[0], parts[2]
	case len(parts) == 3 && parts[1] == "placement" && parts[0] != "" && parts[2] != "":
		return kindPlacement, parts[0], parts[2]
	case len(parts) == 3 && parts[1] == "stale" && parts[0] != "" && parts[2] != "":
		return kindStale, parts[0], parts[2]
	case len(parts) == 3 && parts[1] == "popularity" && parts[0] != "" && parts[2] != "":
		return kindPopularity, parts[0], parts[2]
	}
	return kindOther, "", ""
}
