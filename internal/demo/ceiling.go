package demo

import (
	"time"

	"github.com/prefixrouter/prefixrouter/internal/sim"
)

// serviceModel is what one request of a capacity step costs an instance's
// GPU in the simulator's cost model (sim.Profile), at the step's mean
// prompt and output lengths and requests in flight per instance. A fleet
// kept busy finishes instances / Service(h) requests per second, so the
// ratio of two strategies' service times at their hit rates is the
// throughput gain cache hits can buy (issue 22: why PREFIX_AWARE's gain at
// the latency target is what it is).
//
// A hit skips the prefill of its cached tokens; the decode of the output
// is the same either way. A decode step reads the weights once for the
// whole batch plus each sequence's KV cache, so a request's share of the
// decode is output × (step base / batch + KV cost of its context): at the
// few requests per instance a TTFT target allows, the step base dominates
// and decode outweighs the prefill a hit saves.
type serviceModel struct {
	// Batch is the requests in flight per instance.
	Batch float64
	// MissPrefill and HitPrefill are one prompt's prefill without and with
	// its document cached; Decode is one request's share of the decode
	// steps.
	MissPrefill, HitPrefill, Decode time.Duration
	// hitTokens is how many prompt tokens a hit skips; prompt the mean
	// prompt.
	hitTokens, prompt float64
}

// newServiceModel builds the model for prompts of prompt tokens of which a
// hit skips hitTokens, output tokens generated, batch requests in flight
// per instance.
func newServiceModel(prof sim.Profile, prompt, output float64, hitTokens int, batch float64) serviceModel {
	p, hit := max(int(prompt+0.5), 1), min(hitTokens, max(int(prompt+0.5), 1)-1)
	batch = max(batch, 1)
	ctx := prompt + output/2 // a sequence's mean context while it decodes
	step := max(prof.DecodeFloor.Seconds(), prof.DecodeBaseSec+prof.DecodeKVTokenSec*batch*ctx)
	return serviceModel{
		Batch: batch, MissPrefill: prof.PrefillDuration(p, 0), HitPrefill: prof.PrefillDuration(p, max(hit, 0)),
		Decode:    time.Duration(output * step / batch * float64(time.Second)),
		hitTokens: float64(max(hit, 0)), prompt: prompt,
	}
}

// Service returns the mean GPU time per request at token hit rate h, and
// the share of it that is prefill. A token hit rate h means a fraction h ×
// prompt / hitTokens of the requests hit (at most all of them).
func (m serviceModel) Service(h float64) (time.Duration, float64) {
	f := 1.0
	if m.hitTokens > 0 {
		f = min(max(h*m.prompt/m.hitTokens, 0), 1)
	} else {
		f = 0
	}
	prefill := f*float64(m.HitPrefill) + (1-f)*float64(m.MissPrefill)
	total := prefill + float64(m.Decode)
	return time.Duration(total), prefill / total
}
