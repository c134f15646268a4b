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

	"github.com/prefixrouter/prefixrouter/probe"
)

// scrape is one reading of an instance's /metrics.
type scrape struct {
	hits, queries float64
	found         bool
	// evaluated is llama.cpp's count of the prompt tokens it evaluated
	// (probe.LlamaCppPromptTokens), read when vLLM's counters are absent:
	// llama-server counts no hits, so the hit rate of a window is one minus
	// evaluated over the prompt tokens the answers reported.
	evaluated     float64
	evaluatedOnly bool
	// capacityTokens is num_gpu_blocks × block_size from
	// vllm:cache_config_info, 0 if absent.
	capacityTokens int64
}

func readMetrics(ctx context.Context, hc *http.Client, u string) (scrape, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := probe.Scrape(ctx, hc, u)
	if err != nil {
		return scrape{}, fmt.Errorf("bench: metrics %s: %w", u, err)
	}
	return readScrape(m), nil
}

// readScrape reads the prefix-cache counters and the KV capacity.
func readScrape(m probe.Metrics) scrape {
	var s scrape
	var errH, errQ error
	s.hits, errH = m.SumFirst(probe.PrefixCacheHits...)
	s.queries, errQ = m.SumFirst(probe.PrefixCacheQueries...)
	s.found = errH == nil && errQ == nil
	if !s.found {
		if v, err := m.Sum(probe.LlamaCppPromptTokens); err == nil {
			s.evaluated, s.evaluatedOnly, s.found = v, true, true
		}
	}
	if info := m.Series(probe.VLLMCacheConfigInfo); len(info) > 0 {
		blocks, _ := strconv.ParseInt(info[0].Labels["num_gpu_blocks"], 10, 64)
		size, _ := strconv.ParseInt(info[0].Labels["block_size"], 10, 64)
		s.capacityTokens = blocks * size
	}
	return s
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
