package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/lora"
)

// This file is the data plane's side of adapter placement (issue 11): a
// request for a catalogued adapter that no instance reports loaded yet
// waits, bounded, for a snapshot in which one does; an instance that
// answers "adapter not found" for an adapter its record lists is retried
// elsewhere and reported stale. Waiting takes no lock: every view carries
// a channel closed when the next view replaces it.

// errWaitQueueFull and errWaitTimeout end a wait for an adapter.
var (
	errWaitQueueFull = errors.New("router: too many requests waiting for adapters")
	errWaitTimeout   = errors.New("router: adapter not loaded in time")
	// errAdapterGone is the transport error when every member refused the
	// adapter and none came back within AdapterWait.
	errAdapterGone = errors.New("router: adapter not found on any member")
)

// AdapterWaiting returns how many requests wait for a catalogued adapter
// to be loaded (or for another holder) now, on every front end.
func (r *Router) AdapterWaiting() int64 { return r.waiting.Load() }

// waitLoaded waits until a view in which model of endpoint has a set, at
// most AdapterWait, with at most AdapterWaitQueue requests waiting at once.
// accept, if not nil, must also approve the set (the stale retry waits for
// a set other than the one that refused). It returns that view.
func (r *Router) waitLoaded(ctx context.Context, v *view, endpoint, model string, accept func(*endpointView, *lora.Set) bool) (*view, *endpointView, *lora.Set, error) {
	return r.waitLoadedUntil(ctx, v, endpoint, model, accept, time.Now().Add(r.opts.AdapterWait))
}

// waitLoadedUntil is waitLoaded with the wait's deadline.
func (r *Router) waitLoadedUntil(ctx context.Context, v *view, endpoint, model string, accept func(*endpointView, *lora.Set) bool, deadline time.Time) (*view, *endpointView, *lora.Set, error) {
	if n := r.waiting.Add(1); n > int64(r.opts.AdapterWaitQueue) {
		r.waiting.Add(-1)
		r.metrics.adapterWaits.WithLabelValues(endpoint, adapterWaitQueueFull).Inc()
		return nil, nil, nil, fmt.Errorf("%w (%d)", errWaitQueueFull, r.opts.AdapterWaitQueue)
	}
	defer r.waiting.Add(-1)
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		select {
		case <-v.next:
		case <-ctx.Done():
			r.metrics.adapterWaits.WithLabelValues(endpoint, adapterWaitClientGone).Inc()
			return nil, nil, nil, ctx.Err()
		case <-timer.C:
			r.metrics.adapterWaits.WithLabelValues(endpoint, adapterWaitTimeout).Inc()
			return nil, nil, nil, fmt.Errorf("%w: %q not reported loaded within %v", errWaitTimeout, model, r.opts.AdapterWait)
		}
		v = r.view.Load()
		ev := v.endpoints[endpoint]
		if ev == nil {
			continue
		}
		set, err := ev.table.Set(model)
		switch {
		case err == nil && (accept == nil || accept(ev, set)):
			r.metrics.adapterWaits.WithLabelValues(endpoint, adapterWaitLoaded).Inc()
			return v, ev, set, nil
		case err == nil, errors.Is(err, lora.ErrNotLoaded), errors.Is(err, fleet.ErrNoInstance):
			// Not yet: keep waiting for the next view.
		default:
			return nil, nil, nil, err // e.g. removed from the catalogue
		}
	}
}

// failedHolders are the instances that failed one request for an adapter
// (refused it, or could not be dialled with no other member left), each
// with its record's revision when it did.
type failedHolders map[string]int64

func (f *failedHolders) add(in *fleet.Instance) {
	if *f == nil {
		*f = failedHolders{}
	}
	(*f)[in.ID] = in.Revision
}

// avoid reports whether in failed the request and its record has not
// changed since: a new revision means its agent re-polled and reloaded,
// or the instance registered again after a restart.
func (f failedHolders) avoid(in *fleet.Instance) bool {
	rev, ok := f[in.ID]
	return ok && in.Revision <= rev
}

// accept is waitLoaded's condition: set has a member not to avoid.
func (f failedHolders) accept(_ *endpointView, set *lora.Set) bool {
	for i := 0; i < set.Len(); i++ {
		if !f.avoid(set.Instance(i)) {
			return true
		}
	}
	return false
}

// staleAdapter reports whether resp is an instance's "adapter not found"
// for the attempt's adapter while its record lists it: vLLM answers 404
// NotFoundError for a model it does not serve. It consumes and closes the
// body when it returns true.
func (a *attempt) staleAdapter(resp *http.Response) bool {
	if resp.StatusCode != http.StatusNotFound || a.model == "" || !a.cur.iv.inst.HasAdapter(a.model) {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return true
}

// reportStale tells Options.OnStale that inst's record is stale.
func (r *Router) reportStale(endpoint, inst, adapter string) {
	if r.opts.OnStale != nil {
		r.opts.OnStale(endpoint, inst, adapter)
	}
}
