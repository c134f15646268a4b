// Package bench generates prefix-sharing LLM workloads, drives them open-loop against a router or model servers, and reports latency, KV-cache hit rates and the hit rate of an unbounded-cache oracle.
//
// A run has four parts:
//
//   - a Preset (documented parameters, with sources) turned into a deterministic
//     Stream of OpenAI chat requests by a seed;
//   - Run, which sends the stream with Poisson (or bursty) arrivals, warms up,
//     measures TTFT and end-to-end latency client-side and scrapes the
//     instances' vLLM metrics before and after the measured window;
//   - an Oracle: one unbounded prefix cache that sees the same stream, the
//     most any routing can reach;
//   - a Result (table, JSON) and a Comparison of several runs (Markdown, HTML
//     with inline SVG charts).
//
// Minimal use:
//
//	res, err := bench.Run(ctx, bench.Options{
//		Targets:  []string{"http://127.0.0.1:8080"},
//		Preset:   "shared-8k",
//		Rate:     10,
//		Requests: 500,
//		Warmup:   50,
//	})
//	if err == nil {
//		_ = res.WriteTable(os.Stdout)
//	}
package bench
