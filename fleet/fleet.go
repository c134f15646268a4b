// Package fleet holds the plain data types that the control plane (membership)
// and the data plane (router) share: instances, routing configuration and the
// immutable snapshot of a whole fleet, with the validation of their ranges.
package fleet

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/prefixrouter/prefixrouter/engine"
)

// Strategy names a routing strategy, spelled as SageMaker spells it.
type Strategy string

// The routing strategies.
const (
	Random           Strategy = "RANDOM"
	LeastOutstanding Strategy = "LEAST_OUTSTANDING_REQUESTS"
	PrefixAware      Strategy = "PREFIX_AWARE"
)

// Valid reports whether s is one of the known strategies.
func (s Strategy) Valid() bool {
	switch s {
	case Random, LeastOutstanding, PrefixAware:
		return true
	}
	return false
}

// Ranges of the prefix-aware settings (SageMaker's documented bounds).
const (
	MinPrefixLength             = 1024
	MaxPrefixLength             = 65536
	MinConcurrencyThreshold     = 1
	MaxConcurrencyThreshold     = 1024
	DefaultPrefixLength         = 4096
	DefaultConcurrencyThreshold = 10
	// DefaultAdaptivePrefixLength is PrefixLength's default when keys
	// follow the prompt's tree (FixedLengthKeys off, issue 21): the deepest
	// prefix the router looks at. A request routes on the shallowest
	// depth that is not hot, so a long limit costs no affinity on cold
	// prefixes; it lets a hot prefix longer than 4,096 units (a 10 KB
	// agent tool prompt, a 16 KB RAG document) be told apart by what
	// follows it. docs/balance.md gives the measurements behind the value.
	DefaultAdaptivePrefixLength = 32768
)

// ErrInvalid is wrapped by every validation error of a value a user gave: a
// routing config, an instance record, a component's Options. The command
// line maps it to exit code 2 (invalid input).
var ErrInvalid = errors.New("invalid")

// ErrNoInstance is wrapped by every "nothing can serve this now" answer,
// whoever gives it: an endpoint or a model's set with no instance that is
// not draining (lora), a pick whose candidates are all refused (router), an
// explanation with no candidate (admin maps it to Unavailable). There is one
// such error in the whole program, so one errors.Is serves every caller.
var ErrNoInstance = errors.New("no instance available")

// ErrInvalidConfig is wrapped by every validation error of a RoutingConfig;
// it wraps ErrInvalid.
var ErrInvalidConfig = fmt.Errorf("fleet: %w routing config", ErrInvalid)

// PrefixAwareConfig is SageMaker's PrefixAwareRoutingConfig.
type PrefixAwareConfig struct {
	// PrefixLength is how much of a prompt forms the routing key: bytes of
	// the raw body on invoke paths, Unicode code points of message text on
	// OpenAI paths. With adaptive keys (the default) it is the deepest
	// prefix the router looks at. Zero means DefaultAdaptivePrefixLength
	// for PREFIX_AWARE with adaptive keys, DefaultPrefixLength otherwise
	// (the other strategies use the key only to split variants, and read
	// no more of a body than that needs before the pick).
	PrefixLength int `json:"PrefixLength,omitempty"`
	// ConcurrencyThreshold is the number of in-flight requests an instance
	// takes before new requests spill to the next candidate. Zero means
	// DefaultConcurrencyThreshold.
	ConcurrencyThreshold int `json:"ConcurrencyThreshold,omitempty"`
	// HotKeyReplication turns on popularity-aware replication (an extension
	// of SageMaker's shape): a key hot enough to need more than one
	// instance gets the first k of its ring order, chosen by load
	// (docs/balance.md). False (the default) keeps one instance per key.
	HotKeyReplication bool `json:"HotKeyReplication,omitempty"`
	// FixedLengthKeys (prefixrouter's) keeps SageMaker's exact keys: the
	// first PrefixLength units of every prompt, one depth, no popularity
	// unless HotKeyReplication. False (the default) makes keys follow the
	// prompt's tree: a request routes on the shallowest prefix that is not
	// hot, and popular prefixes are placed by the replicas' agreed
	// popularity (issue 21, docs/balance.md).
	FixedLengthKeys bool `json:"FixedLengthKeys,omitempty"`
}

// RoutingConfig is one endpoint's routing configuration, in the JSON shape of
// SageMaker's RoutingConfig. The zero value means PREFIX_AWARE with defaults.
type RoutingConfig struct {
	RoutingStrategy          Strategy           `json:"RoutingStrategy"`
	PrefixAwareRoutingConfig *PrefixAwareConfig `json:"PrefixAwareRoutingConfig,omitempty"`
	// TenantCacheSalt (prefixrouter's, not SageMaker's) sets vLLM's
	// cache_salt on OpenAI requests that carry a tenant id
	// (prompt_cache_key) to a keyed hash of the tenant, so that two tenants
	// never share cached KV blocks, even on one instance. False (the zero
	// value) leaves request bodies as they are.
	TenantCacheSalt bool `json:"TenantCacheSalt,omitempty"`
	// ProductionVariants (SageMaker's endpoint-config shape) split the
	// endpoint's traffic between variants by weight when a request names
	// no X-Amzn-SageMaker-Target-Variant. An instance belongs to the
	// variant its label "variant" names ("AllTraffic" without one). Empty
	// (the zero value) means no split: every instance serves every request.
	ProductionVariants []ProductionVariant `json:"ProductionVariants,omitempty"`
	// FirstByteTimeoutInMilliseconds (prefixrouter's, not SageMaker's)
	// bounds the wait for the first byte of a streamed answer's body on
	// this endpoint: beyond it the call is cut and counts against the
	// instance's breaker, so an instance whose health check answers while
	// its generations hang is taken out (issue 12). Non-streamed answers
	// are not cut by it: their body comes when the generation ends (issue
	// 19). Zero (left out) means the replica's --upstream-first-byte-timeout;
	// otherwise 1..MaxFirstByteTimeoutMillis.
	FirstByteTimeoutInMilliseconds int `json:"FirstByteTimeoutInMilliseconds,omitempty"`
}

// MaxFirstByteTimeoutMillis bounds FirstByteTimeoutInMilliseconds (one
// hour): a generation that sends nothing for longer is hung by any measure.
const MaxFirstByteTimeoutMillis = 3_600_000

// ProductionVariant is one variant's share of an endpoint's traffic.
type ProductionVariant struct {
	VariantName          string  `json:"VariantName"`
	InitialVariantWeight float64 `json:"InitialVariantWeight"`
}

// DefaultRoutingConfig is the configuration of an endpoint that has none.
func DefaultRoutingConfig() RoutingConfig {
	return RoutingConfig{
		RoutingStrategy: PrefixAware,
		PrefixAwareRoutingConfig: &PrefixAwareConfig{
			PrefixLength:         DefaultAdaptivePrefixLength,
			ConcurrencyThreshold: DefaultConcurrencyThreshold,
		},
	}
}

// Validate checks the strategy and the ranges of the prefix-aware settings.
// Zero values are accepted and mean the defaults (see WithDefaults).
func (c RoutingConfig) Validate() error {
	if c.RoutingStrategy != "" && !c.RoutingStrategy.Valid() {
		return fmt.Errorf("%w: RoutingStrategy %q is not one of RANDOM, LEAST_OUTSTANDING_REQUESTS, PREFIX_AWARE", ErrInvalidConfig, c.RoutingStrategy)
	}
	seen := map[string]bool{}
	total := 0.0
	for _, v := range c.ProductionVariants {
		if v.VariantName == "" || len(v.VariantName) > 63 || seen[v.VariantName] {
			return fmt.Errorf("%w: ProductionVariants: VariantName %q must be 1..63 characters and unique", ErrInvalidConfig, v.VariantName)
		}
		seen[v.VariantName] = true
		if !(v.InitialVariantWeight >= 0 && v.InitialVariantWeight <= 1e6) {
			return fmt.Errorf("%w: ProductionVariants: InitialVariantWeight %v of %q must be in 0..1e6", ErrInvalidConfig, v.InitialVariantWeight, v.VariantName)
		}
		total += v.InitialVariantWeight
	}
	if len(c.ProductionVariants) > 0 && total <= 0 {
		return fmt.Errorf("%w: ProductionVariants: the weights sum to 0", ErrInvalidConfig)
	}
	if ms := c.FirstByteTimeoutInMilliseconds; ms < 0 || ms > MaxFirstByteTimeoutMillis {
		return fmt.Errorf("%w: FirstByteTimeoutInMilliseconds %d is outside 1..%d (or left out: the replica's --upstream-first-byte-timeout)", ErrInvalidConfig, ms, MaxFirstByteTimeoutMillis)
	}
	if p := c.PrefixAwareRoutingConfig; p != nil {
		if p.PrefixLength != 0 && (p.PrefixLength < MinPrefixLength || p.PrefixLength > MaxPrefixLength) {
			return fmt.Errorf("%w: PrefixLength %d is outside %d..%d", ErrInvalidConfig, p.PrefixLength, MinPrefixLength, MaxPrefixLength)
		}
		if p.ConcurrencyThreshold != 0 && (p.ConcurrencyThreshold < MinConcurrencyThreshold || p.ConcurrencyThreshold > MaxConcurrencyThreshold) {
			return fmt.Errorf("%w: ConcurrencyThreshold %d is outside %d..%d", ErrInvalidConfig, p.ConcurrencyThreshold, MinConcurrencyThreshold, MaxConcurrencyThreshold)
		}
	}
	return nil
}

// WithDefaults returns c with every zero value replaced by its default. It does
// not validate. It copies c whole (the nested config too) before filling
// zeros, so a field added to the struct is carried through without being
// listed here (TestWithDefaultsCarriesEveryField).
func (c RoutingConfig) WithDefaults() RoutingConfig {
	out := c
	def := DefaultRoutingConfig()
	if out.RoutingStrategy == "" {
		out.RoutingStrategy = def.RoutingStrategy
	}
	// A missing nested config takes the defaults below, not
	// DefaultRoutingConfig's: its PrefixLength is PREFIX_AWARE's.
	var p PrefixAwareConfig
	if c.PrefixAwareRoutingConfig != nil {
		p = *c.PrefixAwareRoutingConfig
	}
	if p.PrefixLength == 0 {
		p.PrefixLength = DefaultPrefixLength
		if out.RoutingStrategy == PrefixAware && !p.FixedLengthKeys {
			p.PrefixLength = DefaultAdaptivePrefixLength
		}
	}
	if p.ConcurrencyThreshold == 0 {
		p.ConcurrencyThreshold = DefaultConcurrencyThreshold
	}
	out.PrefixAwareRoutingConfig = &p
	return out
}

// Resolved is an endpoint's routing configuration with every default filled
// in and validated, in the fields the data plane reads. A snapshot carries
// it (Endpoint.Resolved), so nothing on the request path re-normalizes a
// RoutingConfig (grpc-go's ringhash parseConfig does the same once).
type Resolved struct {
	Strategy             Strategy
	PrefixLength         int
	ConcurrencyThreshold int
	HotKeyReplication    bool
	FixedLengthKeys      bool
	TenantCacheSalt      bool
	// FirstByteTimeout is the endpoint's own; zero means the replica's
	// default applies.
	FirstByteTimeout time.Duration
	// Variants are the ProductionVariants in order, nil without a split.
	Variants []ProductionVariant
}

// Resolve validates c and returns it resolved. Every field of RoutingConfig
// reaches the result (TestResolveCarriesEveryField fails otherwise).
func (c RoutingConfig) Resolve() (Resolved, error) {
	if err := c.Validate(); err != nil {
		return Resolved{}, err
	}
	d := c.WithDefaults()
	p := d.PrefixAwareRoutingConfig
	return Resolved{
		Strategy:             d.RoutingStrategy,
		PrefixLength:         p.PrefixLength,
		ConcurrencyThreshold: p.ConcurrencyThreshold,
		HotKeyReplication:    p.HotKeyReplication,
		FixedLengthKeys:      p.FixedLengthKeys,
		TenantCacheSalt:      d.TenantCacheSalt,
		FirstByteTimeout:     time.Duration(d.FirstByteTimeoutInMilliseconds) * time.Millisecond,
		Variants:             d.ProductionVariants,
	}, nil
}

// Instance is one model-server instance as registered in etcd.
type Instance struct {
	ID           string            `json:"id"`
	Addr         string            `json:"addr"` // base URL, e.g. http://10.0.0.7:8000
	Adapters     []string          `json:"adapters,omitempty"`
	MaxAdapters  int               `json:"maxAdapters,omitempty"`
	Weight       int               `json:"weight,omitempty"` // 0 means 1; at most MaxWeight
	Labels       map[string]string `json:"labels,omitempty"`
	Draining     bool              `json:"draining"`
	RegisteredAt time.Time         `json:"registeredAt"`
	// Engine names the model server's engine (engine.VLLM, engine.SGLang,
	// engine.LlamaCpp, engine.TGI), detected by the agent or forced with
	// `register --engine`. Empty (records of older agents) means unknown:
	// engine.Generic. A name this build does not know is kept and read as
	// Generic too.
	Engine string `json:"engine,omitempty"`
	// AdapterIndex gives, for an engine that selects adapters by position
	// (llama-server: the order of its --lora flags), each adapter's
	// position; nil for the others. Every key is one of Adapters, and for
	// such an engine every adapter has one.
	AdapterIndex map[string]int `json:"adapterIndex,omitempty"`
	// Listed are the model ids the instance's own /v1/models lists (its
	// base model and adapters), which the replica reads for a static fleet
	// (issue 20). They name models in metric labels only: routing never
	// reads them, so a static fleet routes as its flag declares.
	Listed []string `json:"-"`
	// Saturated is set by the agent while the server's requests in flight
	// have stayed at or above the endpoint's concurrency threshold for its
	// saturation window, and cleared after they stayed below half of it as
	// long (hysteresis). (A popular key is "hot": package hotkey.)
	Saturated bool `json:"saturated,omitempty"`
	// BusyAdapters are, while Saturated, the adapters that carry the load:
	// in use in most of the agent's recent samples (see
	// agent.Options.SaturationWindow). Placement grows the set of an
	// adapter that every member lists here.
	BusyAdapters []string `json:"busyAdapters,omitempty"`
	// ActiveAdapters are the adapters that served a request within the
	// agent's active window, sorted; an adapter that no member lists is
	// cold and its set shrinks back to MinReplicas.
	ActiveAdapters []string `json:"activeAdapters,omitempty"`
	// Revision is the etcd mod revision of the record (0 for static
	// fleets): it tells a router that a record changed since it last
	// looked, e.g. after the agent re-polled a stale adapter list.
	Revision int64 `json:"-"`
}

// MaxWeight bounds an instance's weight (0..MaxWeight, 0 meaning 1): the
// ring hashes one seed per unit of weight on every lookup, so one record of
// weight 1e9 would make every replica allocate gigabytes (issue 12). It
// equals ring.MaxWeight; a ratio of 100 to 1 covers any real fleet.
const MaxWeight = 100

// Bounds of what one instance record may list (issue 19: a record with
// 50,000 labels was accepted, and every replica holds every record). A
// record beyond them is refused whole, like any invalid record.
const (
	// MaxLabels bounds an instance's labels; MaxLabelKeyLength and
	// MaxLabelValueLength their keys and values, in bytes.
	MaxLabels           = 64
	MaxLabelKeyLength   = 128
	MaxLabelValueLength = 512
	// MaxAdapterNames bounds each of an instance's adapter lists (loaded,
	// busy, active); MaxAdapterNameLength each name, in bytes. vLLM keeps
	// at most --max-cpu-loras adapters loaded, typically tens to hundreds.
	MaxAdapterNames      = 4096
	MaxAdapterNameLength = 512
)

// EffectiveWeight returns the weight used for hashing: at least 1.
func (in Instance) EffectiveWeight() int {
	if in.Weight < 1 {
		return 1
	}
	return in.Weight
}

// HasAdapter reports whether the instance has the named adapter loaded.
func (in Instance) HasAdapter(name string) bool {
	for _, a := range in.Adapters {
		if a == name {
			return true
		}
	}
	return false
}

// Validate checks the fields a router relies on.
func (in Instance) Validate() error {
	if err := ValidateName("instance id", in.ID); err != nil {
		return err
	}
	if in.Addr == "" {
		return fmt.Errorf("fleet: instance %q has no addr", in.ID)
	}
	if in.Weight < 0 || in.Weight > MaxWeight {
		return fmt.Errorf("fleet: %w instance: %q has weight %d, outside 0..%d", ErrInvalid, in.ID, in.Weight, MaxWeight)
	}
	if len(in.Labels) > MaxLabels {
		return fmt.Errorf("fleet: %w instance: %q has %d labels, more than %d", ErrInvalid, in.ID, len(in.Labels), MaxLabels)
	}
	for k, v := range in.Labels {
		if k == "" || len(k) > MaxLabelKeyLength || len(v) > MaxLabelValueLength {
			return fmt.Errorf("fleet: %w instance: %q has a label key of %d bytes (1..%d) or value of %d bytes (at most %d)", ErrInvalid, in.ID, len(k), MaxLabelKeyLength, len(v), MaxLabelValueLength)
		}
	}
	for _, list := range []struct {
		name  string
		names []string
	}{{"adapters", in.Adapters}, {"busyAdapters", in.BusyAdapters}, {"activeAdapters", in.ActiveAdapters}} {
		if len(list.names) > MaxAdapterNames {
			return fmt.Errorf("fleet: %w instance: %q lists %d %s, more than %d", ErrInvalid, in.ID, len(list.names), list.name, MaxAdapterNames)
		}
		for _, a := range list.names {
			if len(a) > MaxAdapterNameLength {
				return fmt.Errorf("fleet: %w instance: %q lists %s with a name of %d bytes, more than %d", ErrInvalid, in.ID, list.name, len(a), MaxAdapterNameLength)
			}
		}
	}
	if err := engine.ValidateName(in.Engine); err != nil {
		return fmt.Errorf("fleet: %w instance: %q: %w", ErrInvalid, in.ID, err)
	}
	seen := make(map[int]string, len(in.AdapterIndex))
	for name, i := range in.AdapterIndex {
		if i < 0 || i >= MaxAdapterIndex || !in.HasAdapter(name) {
			return fmt.Errorf("fleet: %w instance: %q: adapterIndex %q: %d must be 0..%d and name one of its adapters", ErrInvalid, in.ID, name, i, MaxAdapterIndex-1)
		}
		if other, dup := seen[i]; dup {
			return fmt.Errorf("fleet: %w instance: %q: adapters %q and %q have the same index %d", ErrInvalid, in.ID, min(name, other), max(name, other), i)
		}
		seen[i] = name
	}
	if p, _ := engine.Lookup(in.Engine); p.Adapters.Select == engine.ByIndex && len(in.AdapterIndex) != len(in.Adapters) {
		return fmt.Errorf("fleet: %w instance: %q: engine %s selects adapters by position: adapterIndex must give each of %v one", ErrInvalid, in.ID, in.Engine, in.Adapters)
	}
	return nil
}

// MaxAdapterIndex bounds AdapterIndex's positions (an engine with this many
// adapters loaded at start is beyond any real deployment).
const MaxAdapterIndex = 1024

// Endpoint is one endpoint's instances and routing configuration.
type Endpoint struct {
	Name string
	// Config is the stored configuration with its defaults filled in
	// (for display and for writing back).
	Config RoutingConfig
	// Resolved is Config validated and resolved once, when the snapshot
	// was built: what the data plane reads.
	Resolved Resolved
	// Instances are sorted by ID, draining ones included (routers skip them).
	Instances []Instance
	// Adapters is the adapter catalogue with its placement state, sorted
	// by name.
	Adapters []Adapter
	// Popular are the endpoint's popular prefixes as its router replicas
	// published them, merged (MergePopularity), sorted by key; nil when
	// none were published (issue 21).
	Popular []PopularKey
	// Served is each instance's share of the endpoint's recent requests as
	// its router replicas sent them (MergeServed, by instance id); nil when
	// none published any.
	Served map[string]float64
}

// Snapshot is an immutable view of the whole fleet. Build one with
// NewSnapshot and never modify it afterwards: it is shared by every request.
type Snapshot struct {
	// Endpoints by name.
	Endpoints map[string]*Endpoint
	// Revision is the etcd revision the snapshot reflects (0 for static fleets).
	Revision int64
	// Replicas is the number of router replicas registered (at least 1).
	Replicas int
	// ReplicaRates holds, by replica id, the request rate (requests per
	// second) each registered router replica published in its record, -1
	// for one that published none: the weights of the threshold's
	// traffic share (docs/concurrency.md). Nil for a static fleet.
	ReplicaRates map[string]float64
	// BuiltAt is when the snapshot was built.
	BuiltAt time.Time
}

// NewSnapshot builds a snapshot, copying and sorting the given endpoints'
// instances by id so that every replica sees the same order.
func NewSnapshot(endpoints []Endpoint, revision int64, replicas int, now time.Time) *Snapshot {
	return newSnapshot(endpoints, revision, replicas, now, false)
}

// NewSnapshotOwning is NewSnapshot for a caller that hands over its
// endpoints' Instances slices already sorted by id, with unique ids: each
// becomes the snapshot's as it is, neither copied nor checked, so the
// caller must never modify it again. The membership watcher builds one per
// change of a fleet of thousands, where the copy cost as much as the rest
// of the snapshot and checking the order a fifth of it (issue 22); its
// merge keeps the list sorted. An unsorted list would give replicas
// different orders: use NewSnapshot for anything else.
func NewSnapshotOwning(endpoints []Endpoint, revision int64, replicas int, now time.Time) *Snapshot {
	return newSnapshot(endpoints, revision, replicas, now, true)
}

func newSnapshot(endpoints []Endpoint, revision int64, replicas int, now time.Time, owning bool) *Snapshot {
	if replicas < 1 {
		replicas = 1
	}
	s := &Snapshot{Endpoints: make(map[string]*Endpoint, len(endpoints)), Revision: revision, Replicas: replicas, BuiltAt: now}
	byID := func(a, b Instance) int { return strings.Compare(a.ID, b.ID) }
	for _, ep := range endpoints {
		insts := ep.Instances
		if !owning {
			insts = slices.Clone(insts)
			slices.SortFunc(insts, byID)
		}
		ads := append([]Adapter(nil), ep.Adapters...)
		sort.Slice(ads, func(i, j int) bool { return ads[i].Name < ads[j].Name })
		res, err := ep.Config.Resolve()
		if err != nil {
			// Callers validate first (the watcher keeps the default for
			// an invalid stored config); never route on an invalid one.
			res, _ = RoutingConfig{}.Resolve()
		}
		s.Endpoints[ep.Name] = &Endpoint{Name: ep.Name, Config: ep.Config.WithDefaults(), Resolved: res, Instances: insts, Adapters: ads, Popular: ep.Popular, Served: ep.Served}
	}
	return s
}

// WithReplicas returns a snapshot of s's endpoints (shared, not copied:
// both snapshots are immutable) at revision with other router replicas:
// those of rates (see ReplicaRates), at least 1. A change of the replicas
// alone (a rate published) builds this, and a router keeps its views of
// endpoints that did not change.
func (s *Snapshot) WithReplicas(revision int64, rates map[string]float64, now time.Time) *Snapshot {
	return &Snapshot{Endpoints: s.Endpoints, Revision: revision, Replicas: max(1, len(rates)), ReplicaRates: rates, BuiltAt: now}
}

// Endpoint returns the named endpoint, or nil.
func (s *Snapshot) Endpoint(name string) *Endpoint {
	if s == nil {
		return nil
	}
	return s.Endpoints[name]
}

// InstanceCount returns the number of instances (draining included) over all endpoints.
func (s *Snapshot) InstanceCount() int {
	n := 0
	if s == nil {
		return 0
	}
	for _, ep := range s.Endpoints {
		n += len(ep.Instances)
	}
	return n
}

// Ranges of an adapter's replica counts (issue 11).
const (
	DefaultMinReplicas = 1
	DefaultMaxReplicas = 3
	// MaxAdapterReplicas bounds MaxReplicas: a sticky set larger than this
	// would be the whole fleet in all but the largest deployments.
	MaxAdapterReplicas = 64
)

// Adapter is one catalogued LoRA adapter of an endpoint: where to load it
// from and how many instances should hold it, plus the placement state
// the agents agreed on (see lora.Place).
type Adapter struct {
	// Name is the adapter's id: what requests name in "model" or the
	// target-model header, and what the model server lists once loaded.
	Name string `json:"-"`
	// Source is what vLLM's POST /v1/load_lora_adapter takes as lora_path.
	Source string `json:"source"`
	// MinReplicas is the size of the set the adapter keeps when cold.
	// Zero means DefaultMinReplicas.
	MinReplicas int `json:"minReplicas,omitempty"`
	// MaxReplicas caps growth under load. Zero means DefaultMaxReplicas
	// (but never below MinReplicas).
	MaxReplicas int `json:"maxReplicas,omitempty"`

	// Replicas is the current target size k, read from the adapter's
	// placement key; zero means MinReplicas. It is clamped to the range.
	Replicas int `json:"-"`
	// ScaledAt is when Replicas last changed (zero: never).
	ScaledAt time.Time `json:"-"`
	// PlacementRevision is the etcd mod revision of the placement state (0:
	// none yet), what a writer compares before changing Replicas.
	PlacementRevision int64 `json:"-"`
}

// ErrInvalidAdapter is wrapped by every validation error of an Adapter; it
// wraps ErrInvalid.
var ErrInvalidAdapter = fmt.Errorf("fleet: %w adapter", ErrInvalid)

// ErrAdapterNotFound is wrapped when an operation names an adapter that is
// not in the catalogue.
var ErrAdapterNotFound = errors.New("fleet: adapter not in the catalogue")

// Validate checks the name, the source and the replica range. Zero replica
// counts are accepted and mean the defaults.
func (a Adapter) Validate() error {
	if p := nameProblem("name", a.Name); p != "" {
		return fmt.Errorf("%w %s", ErrInvalidAdapter, p)
	}
	if a.Source == "" || len(a.Source) > 4096 {
		return fmt.Errorf("%w %q: source must be 1..4096 bytes", ErrInvalidAdapter, a.Name)
	}
	if a.MinReplicas < 0 || a.MaxReplicas < 0 || a.MinReplicas > MaxAdapterReplicas || a.MaxReplicas > MaxAdapterReplicas {
		return fmt.Errorf("%w %q: replicas must be 0..%d, got min %d max %d", ErrInvalidAdapter, a.Name, MaxAdapterReplicas, a.MinReplicas, a.MaxReplicas)
	}
	if a.MaxReplicas != 0 && a.MaxReplicas < a.Min() {
		return fmt.Errorf("%w %q: maxReplicas %d is below minReplicas %d", ErrInvalidAdapter, a.Name, a.MaxReplicas, a.Min())
	}
	return nil
}

// Min returns the effective minimum replica count.
func (a Adapter) Min() int {
	if a.MinReplicas == 0 {
		return DefaultMinReplicas
	}
	return a.MinReplicas
}

// Max returns the effective maximum replica count: at least Min.
func (a Adapter) Max() int {
	m := a.MaxReplicas
	if m == 0 {
		m = DefaultMaxReplicas
	}
	return max(m, a.Min())
}

// Target returns the current target size k, clamped to Min..Max.
func (a Adapter) Target() int {
	return min(max(a.Replicas, a.Min()), a.Max())
}

// Adapter returns the catalogued adapter named name.
func (ep *Endpoint) Adapter(name string) (Adapter, bool) {
	if ep == nil {
		return Adapter{}, false
	}
	i := sort.Search(len(ep.Adapters), func(i int) bool { return ep.Adapters[i].Name >= name })
	if i < len(ep.Adapters) && ep.Adapters[i].Name == name {
		return ep.Adapters[i], true
	}
	return Adapter{}, false
}

// Duration names a duration setting for NonNegative.
type Duration struct {
	Name  string // the setting and its flag, e.g. "IdleTimeout (--idle-timeout)"
	Value time.Duration
}

// NonNegative reports every negative duration through bad, the one check
// the options trees share (zero means a default or off; below zero is a
// mistake).
func NonNegative(bad func(format string, args ...any), ds ...Duration) {
	for _, d := range ds {
		if d.Value < 0 {
			bad("%s %v is negative", d.Name, d.Value)
		}
	}
}
