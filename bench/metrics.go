package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Names of vLLM's prefix-cache counters (both in tokens), newest first:
// vLLM v1 exports vllm:prefix_cache_*, v0 exported vllm:gpu_prefix_cache_*.
var (
	hitNames   = []string{"vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits"}
	queryNames = []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries"}
)

// scrape is one reading of an instance's /metrics.
type scrape struct {
	hits, queries float64
	found         bool
	// capacityTokens is num_gpu_blocks × block_size from
	// vllm:cache_config_info, 0 if absent.
	capacityTokens int64
}

func readMetrics(ctx context.Context, hc *http.Client, u string) (scrape, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return scrape{}, fmt.Errorf("bench: metrics %s: %w", u, err)
	}
	// The plain text format: expfmt's text parser does not read OpenMetrics.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := hc.Do(req)
	if err != nil {
		return scrape{}, fmt.Errorf("bench: metrics %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return scrape{}, fmt.Errorf("bench: metrics %s: status %d", u, resp.StatusCode)
	}
	return parseMetrics(io.LimitReader(resp.Body, 32<<20))
}

func parseMetrics(r io.Reader) (scrape, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return scrape{}, fmt.Errorf("bench: parse metrics: %w", err)
	}
	var s scrape
	var okH, okQ bool
	s.hits, okH = sumFirst(fams, hitNames)
	s.queries, okQ = sumFirst(fams, queryNames)
	s.found = okH && okQ
	if f, ok := fams["vllm:cache_config_info"]; ok && len(f.GetMetric()) > 0 {
		var blocks, size int64
		for _, lp := range f.GetMetric()[0].GetLabel() {
			switch lp.GetName() {
			case "num_gpu_blocks":
				blocks, _ = strconv.ParseInt(lp.GetValue(), 10, 64)
			case "block_size":
				size, _ = strconv.ParseInt(lp.GetValue(), 10, 64)
			}
		}
		s.capacityTokens = blocks * size
	}
	return s, nil
}

// sumFirst sums over all label sets of the first family found among names
// (several models or engines on one server each have a label set).
func sumFirst(fams map[string]*dto.MetricFamily, names []string) (float64, bool) {
	for _, n := range names {
		f, ok := fams[n]
		if !ok {
			continue
		}
		total := 0.0
		for _, m := range f.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				total += m.GetCounter().GetValue()
			case m.GetUntyped() != nil:
				total += m.GetUntyped().GetValue()
			case m.GetGauge() != nil:
				total += m.GetGauge().GetValue()
			}
		}
		return total, true
	}
	return 0, false
}
