package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/prefixrouter/prefixrouter/engine"
)

// Names of the vLLM metrics that the router, the agent and bench read. The
// simulator (internal/sim) exports the same names.
const (
	// VLLMRequestsRunning and VLLMRequestsWaiting are gauges: requests in
	// the running batch and in the queue.
	VLLMRequestsRunning = "vllm:num_requests_running"
	VLLMRequestsWaiting = "vllm:num_requests_waiting"
	// VLLMCacheConfigInfo is an info gauge whose labels carry the KV cache
	// configuration (num_gpu_blocks, block_size).
	VLLMCacheConfigInfo = "vllm:cache_config_info"
	// VLLMLoRARequestsInfo is an info gauge whose labels list the LoRA
	// adapters with running and waiting requests (running_lora_adapters,
	// waiting_lora_adapters, comma-separated) and the adapter slots
	// (max_lora). Read it with Metrics.LoRAUse.
	VLLMLoRARequestsInfo = "vllm:lora_requests_info"
	// LlamaCppPromptTokens is llama.cpp's llama-server counter of the
	// prompt tokens it evaluated (server.cpp n_prompt_tokens_processed_total,
	// with --metrics): those its prefix cache served are not counted, and
	// it counts no hits nor queries. bench and the real-engine tests read it.
	LlamaCppPromptTokens = "llamacpp:prompt_tokens_total"
)

// Lists of metric names. Callers must not modify them.
var (
	// LoadMetrics are vLLM's gauges whose sum is the number of requests it
	// still has to finish. The router and the agent read each engine's own
	// (Metrics.EngineLoad); these remain for callers that name vLLM's.
	LoadMetrics = []string{VLLMRequestsRunning, VLLMRequestsWaiting}
	// PrefixCacheHits and PrefixCacheQueries are vLLM's prefix-cache
	// counters (both in tokens), as alternatives newest first: vLLM v1
	// exports vllm:prefix_cache_*, v0 exported vllm:gpu_prefix_cache_*.
	// Read them with Metrics.SumFirst.
	PrefixCacheHits    = []string{"vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits"}
	PrefixCacheQueries = []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries"}
)

// ErrNotExported is wrapped by the errors of Sum and SumFirst when none of
// the names asked for is in the exposition, so that a server which does not
// export them reads as unknown, not as zero.
var ErrNotExported = errors.New("probe: metric not exported")

// maxMetricsBytes bounds what Scrape reads: a vLLM exposition is tens of
// kilobytes; this only stops a broken server from exhausting memory.
const maxMetricsBytes = 32 << 20

// Metrics is one parsed Prometheus text exposition: its metric families by
// name.
type Metrics map[string]*dto.MetricFamily

// Series is one time series of a family: its labels and its value.
type Series struct {
	Labels map[string]string
	Value  float64
}

// ParseMetrics reads a Prometheus text exposition (format 0.0.4, as
// /metrics serves to an Accept of text/plain). Metric names may be any
// UTF-8, as vLLM's colons require.
func ParseMetrics(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("probe: parse metrics: %w", err)
	}
	return Metrics(fams), nil
}

// Scrape GETs url and parses its Prometheus text exposition. Any status but
// 200 is an error; a transport error is wrapped, so that callers can tell a
// refused connection (errors.As *net.OpError) from a bad answer.
func Scrape(ctx context.Context, c *http.Client, url string) (Metrics, error) {
	// The plain text format: expfmt's text parser does not read OpenMetrics.
	body, err := get(ctx, c, url, "text/plain;version=0.0.4", func(code int) bool { return code == http.StatusOK })
	if err != nil {
		return nil, err
	}
	defer body.Close()
	return ParseMetrics(io.LimitReader(body, maxMetricsBytes))
}

// Sum adds the values of every series (e.g. one per model or engine) of
// every named family that is present. It fails, wrapping ErrNotExported,
// if none is.
func (m Metrics) Sum(names ...string) (float64, error) {
	sum, found := 0.0, false
	for _, n := range names {
		if f, ok := m[n]; ok {
			found = true
			sum += sumFamily(f)
		}
	}
	if !found {
		return 0, fmt.Errorf("%w: none of %s", ErrNotExported, strings.Join(names, ", "))
	}
	return sum, nil
}

// SumFirst adds the values of every series of the first family present
// among names, which are alternative names of one metric (see
// PrefixCacheHits). It fails, wrapping ErrNotExported, if none is present.
func (m Metrics) SumFirst(names ...string) (float64, error) {
	for _, n := range names {
		if f, ok := m[n]; ok {
			return sumFamily(f), nil
		}
	}
	return 0, fmt.Errorf("%w: none of %s", ErrNotExported, strings.Join(names, ", "))
}

// Series returns the series of family name in exposition order, nil if it
// is absent. A histogram's or summary's series has Value 0.
func (m Metrics) Series(name string) []Series {
	f, ok := m[name]
	if !ok {
		return nil
	}
	out := make([]Series, 0, len(f.GetMetric()))
	for _, s := range f.GetMetric() {
		labels := make(map[string]string, len(s.GetLabel()))
		for _, lp := range s.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		out = append(out, Series{Labels: labels, Value: value(s)})
	}
	return out
}

// EngineLoad is what a model server's gauges say of its load.
type EngineLoad struct {
	// Running and Waiting are the requests being processed and queued,
	// summed over the series (one per data-parallel rank or engine core).
	Running, Waiting float64
	// KVCacheUsage is the share (0..1) of the KV cache in use, the largest
	// over the series; -1 when the server does not export it.
	KVCacheUsage float64
}

// Requests is the number of requests the server still has to finish.
func (l EngineLoad) Requests() float64 { return l.Running + l.Waiting }

// EngineLoad reads p's load gauges (engine.Profile.LoadMetrics: for
// engine.Generic, those of the first known engine the exposition has). A
// missing running or waiting gauge counts 0 when the other is present; it
// fails, wrapping ErrNotExported, when neither is.
func (m Metrics) EngineLoad(p engine.Profile) (EngineLoad, error) {
	running, waiting := p.LoadMetrics()
	for i := range running {
		r, errR := m.SumFirst(running[i]...)
		w, errW := m.SumFirst(waiting[i]...)
		if errR != nil && errW != nil {
			continue
		}
		l := EngineLoad{Running: r, Waiting: w, KVCacheUsage: -1}
		for _, name := range p.CacheUsageMetrics() {
			if f, ok := m[name]; ok && len(f.GetMetric()) > 0 {
				l.KVCacheUsage = 0
				for _, s := range f.GetMetric() {
					l.KVCacheUsage = max(l.KVCacheUsage, value(s))
				}
				break
			}
		}
		return l, nil
	}
	var names []string
	for i := range running {
		names = append(names, running[i]...)
		names = append(names, waiting[i]...)
	}
	return EngineLoad{}, fmt.Errorf("%w: none of %s", ErrNotExported, strings.Join(names, ", "))
}

// LoRAUse reads VLLMLoRARequestsInfo: the adapters its current series
// lists as running or waiting, sorted and distinct, and that series' adapter
// slots (max_lora), 0 when absent or not a number. vLLM sets the gauge of
// the label set it sees to the current time and never removes the label
// sets of earlier moments, so the family holds one series per combination
// ever seen; the current one has the largest value (series tied at it are
// read together).
func (m Metrics) LoRAUse() (inUse []string, slots int) {
	series := m.Series(VLLMLoRARequestsInfo)
	if len(series) == 0 {
		return nil, 0
	}
	latest := series[0].Value
	for _, s := range series[1:] {
		latest = max(latest, s.Value)
	}
	for _, s := range series {
		if s.Value != latest {
			continue
		}
		for _, label := range []string{"running_lora_adapters", "waiting_lora_adapters"} {
			for _, a := range strings.Split(s.Labels[label], ",") {
				if a != "" {
					inUse = append(inUse, a)
				}
			}
		}
		slots, _ = strconv.Atoi(s.Labels["max_lora"])
	}
	slices.Sort(inUse)
	return slices.Compact(inUse), slots
}

func sumFamily(f *dto.MetricFamily) float64 {
	sum := 0.0
	for _, s := range f.GetMetric() {
		sum += value(s)
	}
	return sum
}

func value(s *dto.Metric) float64 {
	switch {
	case s.Gauge != nil:
		return s.GetGauge().GetValue()
	case s.Counter != nil:
		return s.GetCounter().GetValue()
	case s.Untyped != nil:
		return s.GetUntyped().GetValue()
	}
	return 0 // histograms and summaries: nothing here reads them
}
