package router

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/probe"
)

type modelList struct {
	Object string       `json:"object"`
	Data   []modelEntry `json:"data"`
}

type modelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// Bounds of GET /v1/models (issue 19: 40 concurrent calls while one
// instance listed 8 MiB of models took +2,378 MiB, every call asking every
// instance).
const (
	// modelsTimeout bounds the model-list queries sent to the instances.
	modelsTimeout = 2 * time.Second
	// modelsTTL is how long an endpoint's answer is served again; calls
	// meanwhile ask no instance, and calls while it is being built wait
	// for it. A new fleet snapshot starts a new answer at once.
	modelsTTL = 5 * time.Second
	// maxInstanceModelsBytes bounds the list read from one instance; a
	// longer one is left out (vLLM lists a thousand adapters in about
	// 200 KB).
	maxInstanceModelsBytes = 1 << 20
	// modelsFanOut bounds the instances asked at once.
	modelsFanOut = 8
	// maxListedModels bounds the names in the answer; beyond, the
	// instances' own lists are cut (the records' names come first).
	maxListedModels = 10000
)

// modelsCache holds the last answer of each endpoint.
type modelsCache struct {
	mu      sync.Mutex               // guards entries
	entries map[string]*modelsAnswer // by endpoint
}

// modelsAnswer is one endpoint's answer: built once by the first caller,
// shared by every caller until it expires or the endpoint's view changes.
type modelsAnswer struct {
	ev    *endpointView // the view it lists
	ready chan struct{} // closed once body is set
	body  []byte
	at    time.Time
}

// get returns ev's answer for endpoint, building it with build when there is
// no fresh one, or waiting (until ctx ends) for the caller that builds it.
func (c *modelsCache) get(ctx context.Context, endpoint string, ev *endpointView, now time.Time, build func() []byte) ([]byte, error) {
	c.mu.Lock()
	a := c.entries[endpoint]
	fresh := a != nil && a.ev == ev
	if fresh {
		select {
		case <-a.ready:
			fresh = now.Sub(a.at) < modelsTTL
		default: // being built: wait for it
		}
	}
	if !fresh {
		if c.entries == nil {
			c.entries = map[string]*modelsAnswer{}
		}
		a = &modelsAnswer{ev: ev, ready: make(chan struct{})}
		c.entries[endpoint] = a
		c.mu.Unlock()
		func() {
			defer close(a.ready) // waiters never hang, whatever build does
			a.body, a.at = build(), time.Now()
		}()
		return a.body, nil
	}
	c.mu.Unlock()
	select {
	case <-a.ready:
		return a.body, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// models answers GET /v1/models in OpenAI's list shape: the base models and
// adapters the endpoint's instances declare in the fleet (etcd records),
// together with what the non-draining instances' own /v1/models answer, so
// that every fleet source, a static one included, lists what it serves. An
// instance that does not answer within modelsTimeout, or lists more than
// maxInstanceModelsBytes, is left out. The answer is cached (modelsTTL).
func (r *Router) models(w http.ResponseWriter, req *http.Request, endpoint string) {
	v := r.view.Load()
	if v == nil {
		writeError(w, kindChat, http.StatusServiceUnavailable, codeNotLoaded, "no fleet snapshot loaded yet")
		return
	}
	ev := v.endpoints[endpoint]
	if ev == nil {
		writeError(w, kindChat, http.StatusNotFound, codeUnknownEndpoint, fmt.Sprintf("endpoint %q not found", endpoint))
		return
	}
	body, err := r.modelLists.get(req.Context(), endpoint, ev, time.Now(), func() []byte { return r.listModels(endpoint, ev) })
	if err != nil {
		return // the client went away while another call built the list
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// listModels asks ev's instances for their lists and renders the answer.
// The calls it serves share it, so it runs under its own deadline, not one
// client's.
func (r *Router) listModels(endpoint string, ev *endpointView) []byte {
	names := map[string]bool{}
	for _, m := range ev.table.Models() {
		names[m] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), modelsTimeout)
	defer cancel()
	client := probe.NewClient(r.opts.Transport)
	var (
		mu  sync.Mutex // guards names while the queries run
		wg  sync.WaitGroup
		sem = make(chan struct{}, modelsFanOut)
	)
	add := func(m string) {
		if len(names) < maxListedModels {
			names[m] = true
		}
	}
	for _, iv := range ev.instances {
		if iv.target == nil || iv.inst.Draining {
			continue
		}
		u := *iv.target
		u.Path = joinPath(u.Path, "/v1/models")
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
			case <-ctx.Done():
				return
			}
			m, err := probe.FetchModelsUpTo(ctx, client, u.String(), maxInstanceModelsBytes)
			if err != nil {
				r.log.Debug("router: model list of an instance", "endpoint", endpoint, "instance", iv.inst.ID, "err", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if m.Base != "" {
				add(m.Base)
			}
			for _, a := range m.Adapters {
				add(a)
			}
		})
	}
	wg.Wait()
	list := modelList{Object: "list", Data: make([]modelEntry, 0, len(names))}
	for _, m := range slices.Sorted(maps.Keys(names)) {
		list.Data = append(list.Data, modelEntry{ID: m, Object: "model", OwnedBy: "prefixrouter"})
	}
	out, _ := json.Marshal(list)
	return append(out, '\n')
}
