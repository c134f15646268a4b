package router

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/overload"
)

// Classes of the routing sequence's errors, for errors.Is (route.go): an
// unknown model wraps lora.ErrUnknownModel, one not ready yet
// lora.ErrModelNotReady, nothing that can serve fleet.ErrNoInstance.
var (
	// ErrUnknownEndpoint: the endpoint is not in the snapshot.
	ErrUnknownEndpoint = errors.New("router: endpoint not found")
	// ErrInvalidRequest: the data plane rejects the request as malformed
	// (4xx before any pick).
	ErrInvalidRequest = errors.New("router: invalid request")
)

// MaxExplainCandidates bounds Explanation.Candidates: spill beyond the first
// few candidates is rare, and ranking a whole large set costs O(n) per entry.
const MaxExplainCandidates = 16

// Explanation is where a request would go with no load: the routing
// sequence's answer without admission. The admin API renders it whole.
type Explanation struct {
	// Endpoint and Strategy: where the request goes and how it is routed.
	// Instance and Candidates are the ring's answer whatever the strategy
	// (RANDOM and LEAST_OUTSTANDING_REQUESTS do not follow it).
	Endpoint string
	Strategy fleet.Strategy
	// Instance is the instance the request goes to with no load: a
	// session's instance; else the ring primary of Key within the model's
	// set and the request's variant (and the proxy's subset), the
	// PREFIX_AWARE choice when it has room. For a key that hot-key
	// replication spreads over HotReplicas candidates, it is the one an
	// idle fleet gives this request (the request's spread hash among them).
	Instance string
	// Decision is DecisionSession for a session's request, else
	// DecisionAffinity.
	Decision string
	// HotReplicas is how many leading candidates hot-key replication
	// currently spreads Key over (from this replica's estimate, or with
	// adaptive keys the agreed popularity); 1 when the key is cold or
	// replication is off.
	HotReplicas int
	// Candidates are instance ids in Key's spill order within the model's
	// set and the variant, Instance first, at most MaxExplainCandidates.
	Candidates []string
	// Key is the routing key: with adaptive keys, of the depth the
	// request routes on.
	Key uint64
	// Model, Tenant and Variant are what the key was built from and the
	// variant the request is held to; empty when there is none.
	Model, Tenant, Variant string
	// PrefixLength is the endpoint's prefix length (units of the path's
	// API: bytes on invoke paths, characters on OpenAI paths).
	PrefixLength int
}

// kindForPath tells which API a data-plane path speaks: paths ending in
// chat/completions or /v1/completions are OpenAI, others invoke.
func kindForPath(path string) apiKind {
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return kindChat
	case strings.HasSuffix(path, "/v1/completions"):
		return kindCompletions
	}
	return kindInvoke
}

// Explain is the admin front end: it runs the routing sequence (route.go)
// on req, whose body is whole, and tells where the request would go with
// no load, without sending it, admitting it or counting it. ctx bounds the
// wait for a catalogued adapter, as on the data plane. req.Endpoint, when
// set, names the endpoint; otherwise the path does. The error wraps the
// sequence's class (ErrUnknownEndpoint, ErrInvalidRequest,
// lora.ErrUnknownModel, lora.ErrModelNotReady, fleet.ErrNoInstance).
func (r *Router) Explain(ctx context.Context, req PickRequest) (Explanation, error) {
	kind := kindForPath(req.Path)
	header := req.Header
	if header == nil {
		header = http.Header{}
	}
	endpoint := cmp.Or(req.Endpoint, r.endpointOf(req.Path))
	rt, err := r.route(routeInput{
		ctx: ctx, kind: kind, endpoint: endpoint, header: header,
		src:    heldBody{body: req.Body, complete: true, limit: r.opts.MaxBodyBytes},
		subset: req.Subset, explain: true,
	})
	ex := Explanation{Endpoint: endpoint, Key: rt.key, Model: rt.model, Tenant: rt.tenant, Variant: rt.variant}
	if rt.ev != nil {
		ex.Strategy, ex.PrefixLength = rt.ev.strategy, rt.ev.prefixLen
	}
	if err != nil {
		return ex, err
	}
	ex.HotReplicas, ex.Decision = 1, DecisionAffinity
	if rt.session != nil {
		ex.Instance, ex.Decision, ex.Candidates = rt.session.inst.ID, DecisionSession, []string{rt.session.inst.ID}
		return ex, nil
	}
	var buf [MaxExplainCandidates]int
	all := rt.set.Ring().Candidates(rt.key, min(rt.set.Len(), MaxExplainCandidates), buf[:0])
	if rt.hot.nlead > 0 {
		all = rt.hot.order(all) // adaptive keys: the depth's instances first
	}
	k := min(rt.hot.k, len(all))
	var hot []int // the hot key's first k candidates the request may take
	for j, i := range all {
		if rt.skip.has(i) || rt.ev.instance(rt.set, i) == nil {
			continue
		}
		if j < k {
			hot = append(hot, i)
		}
		ex.Candidates = append(ex.Candidates, rt.set.Instance(i).ID)
	}
	if len(ex.Candidates) == 0 {
		return ex, &routeError{http.StatusServiceUnavailable, codeNoInstance, fmt.Sprintf("no instance of endpoint %q can take the request", endpoint)}
	}
	ex.Instance = ex.Candidates[0]
	if k > 1 && len(hot) > 0 {
		ex.HotReplicas = k
		ex.Instance = rt.set.Instance(hot[spreadChoice(hot, rt.hot.spread)]).ID
	}
	return ex, nil
}

// Choose returns the instance the request would go to with no load (see
// Explain), whatever the endpoint's strategy: chaos and agreement tests
// compare it across replicas. The body is read and restored.
func (r *Router) Choose(endpoint string, req *http.Request) (string, error) {
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(io.LimitReader(req.Body, r.opts.MaxBodyBytes+1))
		if err != nil {
			return "", fmt.Errorf("%w: read body: %w", ErrInvalidRequest, err)
		}
		_ = req.Body.Close()
		req.Body = io.NopCloser(bytes.NewReader(b))
		body = b
	}
	ex, err := r.Explain(req.Context(), PickRequest{Endpoint: endpoint, Path: req.URL.Path, Header: req.Header, Body: body})
	if err != nil {
		return "", err
	}
	return ex.Instance, nil
}

// Status reports the live status of an instance of the current snapshot; ok
// is false when the endpoint or the instance is not in it.
func (r *Router) Status(endpoint, id string) (st overload.Status, ok bool) {
	v := r.view.Load()
	if v == nil {
		return st, false
	}
	ev := v.endpoints[endpoint]
	if ev == nil {
		return st, false
	}
	iv := ev.instances[id]
	if iv == nil || iv.state == nil {
		return st, false
	}
	return iv.state.Status(), true
}
