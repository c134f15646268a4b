package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
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

// resetURL is the /reset_prefix_cache URL on the host of metricsURL.
func resetURL(metricsURL string) (string, error) {
	u, err := url.Parse(metricsURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("bench: metrics URL %q: want http(s)://host[:port]/path", metricsURL)
	}
	return (&url.URL{Scheme: u.Scheme, User: u.User, Host: u.Host, Path: "/reset_prefix_cache"}).String(), nil
}

// resetAll resets every instance's prefix cache, one at a time, and fails
// on the first answer that is not 2xx: a run that meant to start cold must
// not silently start warm.
func (r *runner) resetAll(ctx context.Context) error {
	for _, m := range r.cfg.MetricsURLs {
		u, err := resetURL(m)
		if err != nil {
			return err
		}
		if err := resetOne(ctx, r.hc, u); err != nil {
			return err
		}
	}
	return nil
}

func resetOne(ctx context.Context, hc *http.Client, u string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return fmt.Errorf("bench: reset prefix cache %s: %w", u, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("bench: reset prefix cache %s: %w", u, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		hint := ""
		if resp.StatusCode == http.StatusNotFound {
			hint = " (vLLM serves it only with VLLM_SERVER_DEV_MODE=1)"
		}
		return fmt.Errorf("bench: reset prefix cache %s: status %d%s: %s", u, resp.StatusCode, hint, truncate(strings.TrimSpace(string(body)), 200))
	}
	return nil
}

// readCapacities fills r.instanceKV (the smallest instance's capacity) and
// r.fleetKV (their sum) when every metrics URL exports
// vllm:cache_config_info; otherwise it leaves both 0, which the regime
// line reports as "capacity unknown". Scrape errors are not fatal here:
// the hit-rate scrapes report them.
func (r *runner) readCapacities(ctx context.Context) {
	var smallest, sum int64
	for _, u := range r.cfg.MetricsURLs {
		s, err := readMetrics(ctx, r.hc, u)
		if err != nil || s.capacityTokens <= 0 {
			return
		}
		if smallest == 0 || s.capacityTokens < smallest {
			smallest = s.capacityTokens
		}
		sum += s.capacityTokens
	}
	r.instanceKV, r.fleetKV = smallest, sum
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
