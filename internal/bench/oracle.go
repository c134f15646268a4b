package bench

import "github.com/prefixrouter/prefixrouter/internal/sim"

// Oracle is one prefix cache of unbounded size that sees the whole request
// stream: the highest hit rate any routing over any fleet can reach. It
// hashes prompts exactly like the simulator (sim.BlockHashes over the
// rendered prompt, with the adapter and salt as extras). Not safe for
// concurrent use.
type Oracle struct {
	seen map[uint64]struct{}
	// Counted totals (only Observe calls with measure set).
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
	Requests     int   `json:"requests"`
}

// NewOracle returns an empty oracle.
func NewOracle() *Oracle { return &Oracle{seen: make(map[uint64]struct{})} }

// Observe runs one prompt through the cache: its cached tokens are the
// longest run of leading blocks already seen times sim.BlockTokens, then
// all its full blocks are cached. measure says whether the request counts
// in the totals (warmup requests fill the cache but do not count).
func (o *Oracle) Observe(adapter, salt, prompt string, measure bool) (cached, promptTokens int) {
	hs := sim.BlockHashes(adapter, salt, prompt)
	run := 0
	for run < len(hs) {
		if _, ok := o.seen[hs[run]]; !ok {
			break
		}
		run++
	}
	for _, h := range hs[run:] {
		o.seen[h] = struct{}{}
	}
	cached, promptTokens = run*sim.BlockTokens, sim.CountTokens(prompt)
	if measure {
		o.PromptTokens += int64(promptTokens)
		o.CachedTokens += int64(cached)
		o.Requests++
	}
	return cached, promptTokens
}

// HitRate is cached over prompt tokens of the measured requests (0 if none).
func (o *Oracle) HitRate() float64 { return ratio(o.CachedTokens, o.PromptTokens) }

// DistinctTokens is the number of distinct block tokens the cache holds:
// the stream's whole prefix footprint, warmup included.
func (o *Oracle) DistinctTokens() int64 { return int64(len(o.seen)) * sim.BlockTokens }

func ratio(a, b int64) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// OracleRun generates requests of p's stream (after warmup unmeasured
// ones) and runs them through a fresh Oracle, without sending anything:
// the best hit rate any fleet can reach on that stream, and the stream's
// footprint (distinct block tokens, warmup included).
func OracleRun(p Preset, seed int64, o StreamOptions, warmup, requests int) (OracleSummary, int64, error) {
	s, err := p.NewStream(seed, o)
	if err != nil {
		return OracleSummary{}, 0, err
	}
	or := NewOracle()
	for i := 0; i < warmup+requests; i++ {
		r := s.Next()
		or.Observe(r.Adapter, r.Tenant, r.Prompt(), i >= warmup)
	}
	return OracleSummary{PromptTokens: or.PromptTokens, CachedTokens: or.CachedTokens, HitRate: or.HitRate()}, or.DistinctTokens(), nil
}
