// Package probe runs periodic probes of model-server instances (health,
// load, adapters) and holds the one Prometheus-text parser that the router,
// the agent and bench share. It knows nothing of routing: what a probe
// finds goes to a callback (or to the small Instance interface, which
// overload.State implements).
//
// # Prober
//
// A Prober owns one goroutine that runs rounds: a first round at Start,
// then one every Options.Interval of Options.Clock. Each round asks for its
// targets, probes them at most Options.Concurrency at a time, each within
// Options.Timeout, and hands every outcome to the kind's observer. Close
// cancels the probes in flight and waits for the goroutine.
//
//	p, err := probe.Start(probe.Options{Interval: 10 * time.Second},
//		// The targets of a round.
//		func() []string { return []string{modelsURL} },
//		// One probe.
//		func(ctx context.Context, url string) (probe.Models, error) {
//			return probe.FetchModels(ctx, client, url)
//		},
//		// Its outcome.
//		func(url string, m probe.Models, err error) { ... })
//	if err != nil { ... }
//	defer p.Close()
//
// Two kinds come ready-made over a []Target (URL + Instance):
//
//   - StartHealth: GET of the health path; a status below 500 is healthy;
//     Health.UnhealthyThreshold failures in a row mark the instance down
//     (Instance.ObserveProbe), one success marks it up again.
//   - StartLoad: scrape of /metrics; the requests the target's engine
//     reports running and waiting (Metrics.EngineLoad of the profile its
//     record names, package engine) minus this replica's own in-flight
//     requests is the instance's external load (Instance.SetExternalLoad),
//     unknown (-1) when the scrape fails or lacks the engine's gauges.
//
// Tests pass a clockwork.FakeClock: after Start, FakeClock.BlockUntilContext(ctx, 1)
// returns once the first round is done (the prober then waits on the clock's
// only timer), and each Advance(Interval) followed by BlockUntilContext runs
// exactly one more round.
//
// # Metrics
//
// ParseMetrics and Scrape read a Prometheus text exposition into Metrics;
// EngineLoad reads an engine profile's load gauges; Sum adds every series
// of named families (LoadMetrics), SumFirst reads the
// first present of alternative names (PrefixCacheHits), Series gives the
// labels (VLLMCacheConfigInfo), LoRAUse reads the adapters in use and the
// adapter slots (VLLMLoRARequestsInfo). The metric names are defined here
// once.
package probe
