package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"

	"github.com/sony/gobreaker/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prefixrouter/prefixrouter/admin/adminpb"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/router"
)

// service implements adminpb.AdminServer.
type service struct {
	adminpb.UnimplementedAdminServer
	o Options
}

var _ adminpb.AdminServer = (*service)(nil)

func (s *service) GetFleet(_ context.Context, req *adminpb.GetFleetRequest) (*adminpb.GetFleetResponse, error) {
	snap := s.o.Snapshots.Snapshot()
	if snap == nil {
		return nil, status.Error(codes.Unavailable, "admin: no fleet snapshot loaded yet")
	}
	names := make([]string, 0, len(snap.Endpoints))
	if req.GetEndpoint() != "" {
		if snap.Endpoint(req.GetEndpoint()) == nil {
			return nil, status.Errorf(codes.NotFound, "admin: endpoint %q not found", req.GetEndpoint())
		}
		names = append(names, req.GetEndpoint())
	} else {
		for name := range snap.Endpoints {
			names = append(names, name)
		}
		sort.Strings(names)
	}
	resp := &adminpb.GetFleetResponse{
		Revision: snap.Revision,
		Replicas: int32(snap.Replicas),
		BuiltAt:  timestamppb.New(snap.BuiltAt),
		Age:      durationpb.New(s.o.Now().Sub(snap.BuiltAt)),
	}
	for _, name := range names {
		ep := snap.Endpoints[name]
		pe := &adminpb.Endpoint{Name: ep.Name, Config: configToPB(ep.Config)}
		if s.o.Overrides != nil {
			for _, o := range s.o.Overrides(ep.Resolved) {
				pe.Overridden = append(pe.Overridden, &adminpb.Override{Flag: o.Flag, Given: o.Given, Stored: o.Stored})
			}
		}
		for _, in := range ep.Instances {
			pe.Instances = append(pe.Instances, s.instanceToPB(ep.Name, in))
		}
		resp.Endpoints = append(resp.Endpoints, pe)
	}
	return resp, nil
}

func (s *service) instanceToPB(endpoint string, in fleet.Instance) *adminpb.Instance {
	pi := &adminpb.Instance{
		Id:          in.ID,
		Addr:        in.Addr,
		Adapters:    in.Adapters,
		MaxAdapters: int32(in.MaxAdapters),
		Weight:      int32(in.EffectiveWeight()),
		Draining:    in.Draining,
		Labels:      in.Labels,
	}
	if !in.RegisteredAt.IsZero() {
		pi.RegisteredAt = timestamppb.New(in.RegisteredAt)
	}
	if s.o.Statuses != nil {
		if st, ok := s.o.Statuses.Status(endpoint, in.ID); ok {
			pi.State = &adminpb.InstanceState{
				InFlight:     st.InFlight,
				ExternalLoad: st.ExternalLoad,
				Breaker:      breakerToPB(st.Breaker),
				Healthy:      st.Healthy,
			}
		}
	}
	return pi
}

func breakerToPB(b gobreaker.State) adminpb.BreakerState {
	switch b {
	case gobreaker.StateClosed:
		return adminpb.BreakerState_BREAKER_STATE_CLOSED
	case gobreaker.StateHalfOpen:
		return adminpb.BreakerState_BREAKER_STATE_HALF_OPEN
	case gobreaker.StateOpen:
		return adminpb.BreakerState_BREAKER_STATE_OPEN
	}
	return adminpb.BreakerState_BREAKER_STATE_UNSPECIFIED
}

func configToPB(c fleet.RoutingConfig) *adminpb.RoutingConfig {
	c = c.WithDefaults()
	pc := &adminpb.RoutingConfig{
		Strategy:                       string(c.RoutingStrategy),
		PrefixLength:                   int32(c.PrefixAwareRoutingConfig.PrefixLength),
		ConcurrencyThreshold:           int32(c.PrefixAwareRoutingConfig.ConcurrencyThreshold),
		HotKeyReplication:              c.PrefixAwareRoutingConfig.HotKeyReplication,
		FixedLengthKeys:                c.PrefixAwareRoutingConfig.FixedLengthKeys,
		TenantCacheSalt:                c.TenantCacheSalt,
		FirstByteTimeoutInMilliseconds: int32(c.FirstByteTimeoutInMilliseconds),
	}
	for _, v := range c.ProductionVariants {
		pc.ProductionVariants = append(pc.ProductionVariants, &adminpb.ProductionVariant{VariantName: v.VariantName, InitialVariantWeight: v.InitialVariantWeight})
	}
	return pc
}

// configFromPB is configToPB's inverse, before defaults: zero fields (and a
// nil config) stay zero, so Validate and WithDefaults judge them.
func configFromPB(pc *adminpb.RoutingConfig) fleet.RoutingConfig {
	c := fleet.RoutingConfig{
		RoutingStrategy: fleet.Strategy(pc.GetStrategy()),
		PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{
			PrefixLength:         int(pc.GetPrefixLength()),
			ConcurrencyThreshold: int(pc.GetConcurrencyThreshold()),
			HotKeyReplication:    pc.GetHotKeyReplication(),
			FixedLengthKeys:      pc.GetFixedLengthKeys(),
		},
		TenantCacheSalt:                pc.GetTenantCacheSalt(),
		FirstByteTimeoutInMilliseconds: int(pc.GetFirstByteTimeoutInMilliseconds()),
	}
	for _, v := range pc.GetProductionVariants() {
		c.ProductionVariants = append(c.ProductionVariants, fleet.ProductionVariant{VariantName: v.GetVariantName(), InitialVariantWeight: v.GetInitialVariantWeight()})
	}
	return c
}

func (s *service) GetRoutingConfig(ctx context.Context, req *adminpb.GetRoutingConfigRequest) (*adminpb.GetRoutingConfigResponse, error) {
	if err := validateEndpoint(req.GetEndpoint()); err != nil {
		return nil, err
	}
	resp := &adminpb.GetRoutingConfigResponse{}
	if ep := s.o.Snapshots.Snapshot().Endpoint(req.GetEndpoint()); ep != nil {
		resp.Applied = configToPB(ep.Config)
	}
	if s.o.Configs == nil {
		if resp.Applied == nil {
			return nil, status.Errorf(codes.NotFound, "admin: endpoint %q not found", req.GetEndpoint())
		}
		resp.Config = resp.Applied
		return resp, nil
	}
	c, set, err := s.o.Configs.GetConfig(ctx, req.GetEndpoint())
	if err != nil {
		if errors.Is(err, fleet.ErrInvalidConfig) {
			// The stored value is bad, not the request: routers keep the
			// previous config until someone writes a valid one.
			return nil, status.Errorf(codes.FailedPrecondition, "admin: %v", err)
		}
		return nil, storeError("read", err)
	}
	if !set && resp.Applied == nil {
		// Nothing stored and no instance registered: most likely a typo.
		return nil, status.Errorf(codes.NotFound, "admin: endpoint %q not found (no instance and no stored config)", req.GetEndpoint())
	}
	resp.Config = configToPB(c)
	resp.Stored = set
	return resp, nil
}

func (s *service) SetRoutingConfig(ctx context.Context, req *adminpb.SetRoutingConfigRequest) (*adminpb.SetRoutingConfigResponse, error) {
	if err := validateEndpoint(req.GetEndpoint()); err != nil {
		return nil, err
	}
	c := configFromPB(req.GetConfig())
	if err := c.Validate(); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if s.o.Configs == nil {
		return nil, status.Error(codes.Unavailable, "admin: routing config cannot be set: the router runs without etcd (static fleet)")
	}
	if err := s.o.Configs.PutConfig(ctx, req.GetEndpoint(), c); err != nil {
		return nil, writeError(err)
	}
	from := ""
	if p, ok := peer.FromContext(ctx); ok {
		from = p.Addr.String()
	}
	n := c.WithDefaults()
	s.o.Logger.InfoContext(ctx, "admin: routing config set", "endpoint", req.GetEndpoint(),
		"strategy", n.RoutingStrategy, "prefixLength", n.PrefixAwareRoutingConfig.PrefixLength, "concurrencyThreshold", n.PrefixAwareRoutingConfig.ConcurrencyThreshold,
		"hotKeyReplication", n.PrefixAwareRoutingConfig.HotKeyReplication, "fixedLengthKeys", n.PrefixAwareRoutingConfig.FixedLengthKeys, "tenantCacheSalt", n.TenantCacheSalt, "productionVariants", len(n.ProductionVariants),
		"firstByteTimeoutMs", n.FirstByteTimeoutInMilliseconds, "peer", from)
	return &adminpb.SetRoutingConfigResponse{Config: configToPB(n)}, nil
}

func (s *service) ExplainRoute(ctx context.Context, req *adminpb.ExplainRouteRequest) (*adminpb.ExplainRouteResponse, error) {
	if err := validateEndpoint(req.GetEndpoint()); err != nil {
		return nil, err
	}
	if s.o.Explainer == nil {
		return nil, status.Error(codes.Unimplemented, "admin: this router does not explain routes")
	}
	snap := s.o.Snapshots.Snapshot()
	if snap == nil {
		return nil, status.Error(codes.Unavailable, "admin: no fleet snapshot loaded yet")
	}
	ep := snap.Endpoint(req.GetEndpoint())
	if ep == nil {
		return nil, status.Errorf(codes.NotFound, "admin: endpoint %q not found", req.GetEndpoint())
	}
	path := req.GetPath()
	if path == "" {
		path = "/endpoints/" + req.GetEndpoint() + "/invocations"
	}
	header := make(http.Header, len(req.GetHeaders()))
	for k, v := range req.GetHeaders() {
		header.Set(k, v)
	}
	body := req.GetBody()
	if t, ok := req.GetPayload().(*adminpb.ExplainRouteRequest_BodyText); ok {
		body = []byte(t.BodyText)
	}
	ex, err := s.o.Explainer.Explain(ctx, router.PickRequest{Endpoint: req.GetEndpoint(), Path: path, Header: header, Body: body, Subset: req.GetSubset()})
	if err != nil {
		return nil, explainError(err)
	}
	resp := &adminpb.ExplainRouteResponse{
		Endpoint:     req.GetEndpoint(),
		Strategy:     string(ex.Strategy),
		Instance:     ex.Instance,
		Candidates:   ex.Candidates,
		RoutingKey:   fmt.Sprintf("%016x", ex.Key),
		Model:        ex.Model,
		Tenant:       ex.Tenant,
		PrefixLength: int32(ex.PrefixLength),
		HotReplicas:  int32(ex.HotReplicas),
		Decision:     ex.Decision,
		Variant:      ex.Variant,
	}
	for _, in := range ep.Instances {
		if in.ID == ex.Instance {
			resp.InstanceAddr = in.Addr
			break
		}
	}
	return resp, nil
}

// validateEndpoint applies the fleet's rule for names, so that a bad name
// is InvalidArgument here rather than an opaque store error.
func validateEndpoint(name string) error {
	if err := fleet.ValidateName("endpoint name", name); err != nil {
		return status.Errorf(codes.InvalidArgument, "admin: %v", err)
	}
	return nil
}

// storeError maps a config store failure: the caller's deadline or
// cancellation keeps its code; anything else is etcd being unreachable or
// failing, which a retry may fix.
func storeError(op string, err error) error {
	if st := status.FromContextError(err); st.Code() != codes.Unknown {
		return st.Err()
	}
	return status.Errorf(codes.Unavailable, "admin: %s routing config: %v", op, err)
}

// writeError maps a store write's error: a record the store refuses as
// invalid is InvalidArgument, one that is not there NotFound, anything else
// the store's own failure.
func writeError(err error) error {
	switch {
	case errors.Is(err, fleet.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, fleet.ErrAdapterNotFound):
		return status.Error(codes.NotFound, err.Error())
	}
	return storeError("write", err)
}

func explainError(err error) error {
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	switch {
	case errors.Is(err, router.ErrUnknownEndpoint), errors.Is(err, lora.ErrUnknownModel):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, router.ErrInvalidRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, fleet.ErrNoInstance), errors.Is(err, lora.ErrModelNotReady):
		return status.Error(codes.Unavailable, err.Error())
	}
	if st := status.FromContextError(err); st.Code() != codes.Unknown {
		return st.Err()
	}
	return status.Errorf(codes.Internal, "admin: explain: %v", err)
}

func adapterToPB(a fleet.Adapter) *adminpb.Adapter {
	return &adminpb.Adapter{Name: a.Name, Source: a.Source, MinReplicas: int32(a.Min()), MaxReplicas: int32(a.Max()), Replicas: int32(a.Target())}
}

func (s *service) ListAdapters(ctx context.Context, req *adminpb.ListAdaptersRequest) (*adminpb.ListAdaptersResponse, error) {
	if err := validateEndpoint(req.GetEndpoint()); err != nil {
		return nil, err
	}
	if s.o.Adapters == nil {
		return nil, status.Error(codes.Unavailable, "admin: no adapter catalogue: the router runs without etcd (static fleet)")
	}
	ads, err := s.o.Adapters.ListAdapters(ctx, req.GetEndpoint())
	if err != nil {
		return nil, storeError("read", err)
	}
	resp := &adminpb.ListAdaptersResponse{}
	for _, a := range ads {
		resp.Adapters = append(resp.Adapters, adapterToPB(a))
	}
	return resp, nil
}

func (s *service) PutAdapter(ctx context.Context, req *adminpb.PutAdapterRequest) (*adminpb.PutAdapterResponse, error) {
	if err := validateEndpoint(req.GetEndpoint()); err != nil {
		return nil, err
	}
	pa := req.GetAdapter()
	a := fleet.Adapter{Name: pa.GetName(), Source: pa.GetSource(), MinReplicas: int(pa.GetMinReplicas()), MaxReplicas: int(pa.GetMaxReplicas())}
	if err := a.Validate(); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if s.o.Adapters == nil {
		return nil, status.Error(codes.Unavailable, "admin: no adapter catalogue: the router runs without etcd (static fleet)")
	}
	if err := s.o.Adapters.PutAdapter(ctx, req.GetEndpoint(), a); err != nil {
		return nil, writeError(err)
	}
	s.o.Logger.InfoContext(ctx, "admin: adapter put", "endpoint", req.GetEndpoint(), "adapter", a.Name, "source", a.Source, "min", a.Min(), "max", a.Max())
	return &adminpb.PutAdapterResponse{Adapter: adapterToPB(a)}, nil
}

func (s *service) DeleteAdapter(ctx context.Context, req *adminpb.DeleteAdapterRequest) (*adminpb.DeleteAdapterResponse, error) {
	if err := validateEndpoint(req.GetEndpoint()); err != nil {
		return nil, err
	}
	if err := (fleet.Adapter{Name: req.GetName(), Source: "-"}).Validate(); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if s.o.Adapters == nil {
		return nil, status.Error(codes.Unavailable, "admin: no adapter catalogue: the router runs without etcd (static fleet)")
	}
	if err := s.o.Adapters.DeleteAdapter(ctx, req.GetEndpoint(), req.GetName()); err != nil {
		return nil, writeError(err)
	}
	s.o.Logger.InfoContext(ctx, "admin: adapter deleted", "endpoint", req.GetEndpoint(), "adapter", req.GetName())
	return &adminpb.DeleteAdapterResponse{}, nil
}
