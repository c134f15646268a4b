package router

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/overload"
)

// Errors of Explain and Choose, for errors.Is. An unknown model wraps
// lora.ErrUnknownModel; an endpoint or model with no instance that can serve
// (nothing loaded yet, every instance draining) wraps ErrNoInstance.
var (
	// ErrUnknownEndpoint: the endpoint is not in the snapshot.
	ErrUnknownEndpoint = errors.New("router: endpoint not found")
	// ErrInvalidRequest: the data plane would reject the request as
	// malformed (4xx before any pick).
	ErrInvalidRequest = errors.New("router: invalid request")
)

// MaxExplainCandidates bounds Explanation.Candidates: spill beyond the first
// few candidates is rare, and ranking a whole large set costs O(n) per entry.
const MaxExplainCandidates = 16

// Explanation is where a request would go with no load.
type Explanation struct {
	// Strategy is the endpoint's routing strategy. Instance and Candidates
	// are the ring's answer whatever the strategy (RANDOM and
	// LEAST_OUTSTANDING_REQUESTS do not follow it).
	Strategy fleet.Strategy
	// Instance is the ring primary of Key within the model's set: the
	// PREFIX_AWARE choice when it has room. For a key that hot-key
	// replication spreads over HotReplicas candidates, it is the one an
	// idle fleet gives this request (the request's spread hash among them).
	Instance string
	// HotReplicas is how many leading candidates hot-key replication
	// currently spreads Key over (from this replica's estimate); 1 when
	// the key is cold or replication is off.
	HotReplicas int
	// Candidates are instance ids in Key's spill order within the model's
	// set, Instance first, at most MaxExplainCandidates.
	Candidates []string
	// Key is the routing key.
	Key uint64
	// Model and Tenant are what the key was built from; empty when the
	// request named none.
	Model, Tenant string
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

// Explain computes where a request to endpoint with this path, header and
// body would go with no load, without sending it or touching any instance's
// state. It parses exactly as the data plane does.
func (r *Router) Explain(endpoint, path string, header http.Header, body []byte) (Explanation, error) {
	v := r.view.Load()
	if v == nil {
		return Explanation{}, fmt.Errorf("%w: no fleet snapshot loaded", ErrNoInstance)
	}
	ev := v.endpoints[endpoint]
	if ev == nil {
		return Explanation{}, fmt.Errorf("%w: %q", ErrUnknownEndpoint, endpoint)
	}
	if int64(len(body)) > r.opts.MaxBodyBytes {
		return Explanation{}, fmt.Errorf("%w: request body of %d bytes exceeds the limit of %d bytes", ErrInvalidRequest, len(body), r.opts.MaxBodyBytes)
	}
	if header == nil {
		header = http.Header{}
	}
	rr, rerr := parseRequest(kindForPath(path), header, body, ev.prefixLen)
	if rerr != nil {
		return Explanation{}, fmt.Errorf("%w: %s", ErrInvalidRequest, rerr.msg)
	}
	ex := Explanation{Strategy: ev.strategy, Key: rr.key, Model: rr.model, Tenant: rr.tenant, PrefixLength: ev.prefixLen}
	set, err := ev.table.Set(rr.model)
	if err != nil {
		if errors.Is(err, lora.ErrNoInstance) {
			// Callers need only router's sentinel for "nothing can serve".
			return ex, fmt.Errorf("%w: %w", ErrNoInstance, err)
		}
		return ex, fmt.Errorf("router: endpoint %q: %w", endpoint, err)
	}
	var buf [MaxExplainCandidates]int
	idx := set.Ring().Candidates(rr.key, MaxExplainCandidates, buf[:0])
	if len(idx) == 0 {
		return ex, ErrNoInstance
	}
	ex.Candidates = make([]string, len(idx))
	for j, i := range idx {
		ex.Candidates[j] = set.Instance(i).ID
	}
	ex.Instance, ex.HotReplicas = ex.Candidates[0], 1
	if ev.hot != nil {
		// Read only: Explain does not count the request.
		if k := min(ev.hot.K(rr.key, set.Len()), len(idx)); k > 1 {
			ex.HotReplicas = k
			ex.Instance = ex.Candidates[spreadChoice(idx[:k], spreadHash(body))]
		}
	}
	return ex, nil
}

// Choose returns the instance the request would go to with no load: the ring
// primary of its key within its model's set (or, for a hot key, the one of
// its candidates an idle fleet gives this request), whatever the endpoint's
// strategy (chaos and agreement tests compare it across replicas). The body
// is read and restored. See Explain for the path rule and the errors.
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
	ex, err := r.Explain(endpoint, req.URL.Path, req.Header, body)
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
