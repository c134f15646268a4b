package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultAdapterLoadTime is the simulated time a load_lora_adapter call
// takes when Options.AdapterLoadTime is zero: reading a rank-16 adapter
// of an 8B model (tens of MB) from local disk and moving it to the GPU.
const DefaultAdapterLoadTime = 300 * time.Millisecond

// adapters is the server's set of loaded LoRA adapters, as vLLM keeps it:
// capped at MaxLoras, the least recently used adapter (by load or request)
// evicted to make room, an adapter with requests in flight never evicted.
// It is touched once per request and per load; its mutex guards every
// field.
type adapters struct {
	mu       sync.Mutex
	lastUse  map[string]int64 // adapter → use sequence number (LRU order)
	inflight map[string]int   // adapter → requests in flight
	clock    int64            // incremented on every use
	max      int              // 0: unlimited
}

func newAdapters(names []string, maxLoras int) *adapters {
	a := &adapters{lastUse: map[string]int64{}, inflight: map[string]int{}, max: maxLoras}
	a.set(names)
	return a
}

// set replaces the loaded adapters (SetAdapters, Options.Adapters): an
// operator's command, not capped.
func (a *adapters) set(names []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lastUse = map[string]int64{}
	for _, n := range names {
		a.clock++
		a.lastUse[n] = a.clock
	}
}

// list returns the loaded adapters, sorted.
func (a *adapters) list() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Sorted(maps.Keys(a.lastUse))
}

// acquire marks a request on name; false if name is not loaded.
func (a *adapters) acquire(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.lastUse[name]; !ok {
		return false
	}
	a.clock++
	a.lastUse[name] = a.clock
	a.inflight[name]++
	return true
}

func (a *adapters) release(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inflight[name]--; a.inflight[name] <= 0 {
		delete(a.inflight, name)
	}
}

// errFull is a load refused because every loaded adapter has requests in
// flight.
var errFull = fmt.Errorf("sim: every adapter slot is busy")

// load adds name, evicting the least recently used idle adapter when the
// set is full. It returns the evicted adapter ("" if none) and whether
// name was already loaded.
func (a *adapters) load(name string) (evicted string, already bool, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.lastUse[name]; ok {
		return "", true, nil
	}
	if a.max > 0 && len(a.lastUse) >= a.max {
		var oldest int64
		for n, use := range a.lastUse {
			if a.inflight[n] == 0 && (evicted == "" || use < oldest) {
				evicted, oldest = n, use
			}
		}
		if evicted == "" {
			return "", false, errFull
		}
		delete(a.lastUse, evicted)
	}
	a.clock++
	a.lastUse[name] = a.clock
	return evicted, false, nil
}

// unload removes name; false if it was not loaded.
func (a *adapters) unload(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.lastUse[name]; !ok {
		return false
	}
	delete(a.lastUse, name)
	return true
}

// running returns the adapters with requests in flight, sorted.
func (a *adapters) running() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Sorted(maps.Keys(a.inflight))
}

// loraInfo exports vLLM's vllm:lora_requests_info: an info gauge (value:
// the scrape's Unix time) whose labels list the adapters in use. The
// simulator reports every adapter with a request in flight as running.
type loraInfo struct {
	a    *adapters
	desc *prometheus.Desc
}

func newLoRAInfo(a *adapters) *loraInfo {
	return &loraInfo{a: a, desc: prometheus.NewDesc("vllm:lora_requests_info", "Running stats on lora requests.",
		[]string{"max_lora", "running_lora_adapters", "waiting_lora_adapters"}, nil)}
}

func (l *loraInfo) Describe(ch chan<- *prometheus.Desc) { ch <- l.desc }

func (l *loraInfo) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(l.desc, prometheus.GaugeValue, float64(time.Now().Unix()),
		strconv.Itoa(l.a.max), strings.Join(l.a.running(), ","), "")
}

// loadRequest is vLLM's body of POST /v1/load_lora_adapter and
// /v1/unload_lora_adapter.
type loadRequest struct {
	LoraName string `json:"lora_name"`
	LoraPath string `json:"lora_path"`
}

func readLoadRequest(r *http.Request, needPath bool) (loadRequest, *apiError) {
	var req loadRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		return req, badRequest("malformed JSON body: %v", err)
	}
	if req.LoraName == "" || (needPath && req.LoraPath == "") {
		return req, badRequest("lora_name and lora_path must be given")
	}
	return req, nil
}

// loadAdapter serves vLLM's POST /v1/load_lora_adapter (with
// VLLM_ALLOW_RUNTIME_LORA_UPDATING): after the load time it adds the
// adapter, evicting the least recently used one when MaxLoras are loaded.
// 400 if it is already loaded, as vLLM answers.
func (s *Server) loadAdapter(w http.ResponseWriter, r *http.Request) {
	req, aerr := readLoadRequest(r, true)
	if aerr == nil && req.LoraName == s.cfg.BaseModel {
		aerr = badRequest("%q is the base model", req.LoraName)
	}
	if aerr != nil {
		writeError(w, aerr.status, aerr.msg)
		return
	}
	if err := s.sleep(r.Context(), s.cfg.AdapterLoadTime); err != nil {
		return
	}
	evicted, already, err := s.adapters.load(req.LoraName)
	switch {
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	case already:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("The lora adapter '%s' has already been loaded.", req.LoraName))
		return
	}
	s.cfg.Logger.Info("sim: adapter loaded", "id", s.cfg.ID, "adapter", req.LoraName, "source", req.LoraPath, "evicted", evicted)
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.LoraName)
}

// unloadAdapter serves vLLM's POST /v1/unload_lora_adapter; 404 if the
// adapter is not loaded.
func (s *Server) unloadAdapter(w http.ResponseWriter, r *http.Request) {
	req, aerr := readLoadRequest(r, false)
	if aerr != nil {
		writeError(w, aerr.status, aerr.msg)
		return
	}
	if !s.adapters.unload(req.LoraName) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("The lora adapter '%s' cannot be found.", req.LoraName))
		return
	}
	s.cfg.Logger.Info("sim: adapter unloaded", "id", s.cfg.ID, "adapter", req.LoraName)
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", req.LoraName)
}

// sleep waits the simulated duration d (d/TimeScale of real time) or
// until ctx ends.
func (s *Server) sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(time.Duration(float64(d) / s.cfg.TimeScale))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
