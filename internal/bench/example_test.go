package bench_test

import (
	"fmt"

	"github.com/prefixrouter/prefixrouter/internal/bench"
)

// The presets' working sets, and what an unbounded single cache reaches on
// the first 1,000 requests after 100 warmup requests (seed 1, no tenants).
func ExampleOracleRun() {
	for _, p := range bench.Presets() {
		sum, footprint, err := bench.OracleRun(p, 1, bench.StreamOptions{}, 100, 1000)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%-18s working set %9d tokens  footprint %9d tokens  oracle hit %5.1f%%\n",
			p.Name, p.WorkingSetTokens(), footprint, 100*sum.HitRate)
	}
	// Output:
	// shared-8k          working set   1600000 tokens  footprint   1513584 tokens  oracle hit  86.5%
	// shared-8k-uniform  working set   2048000 tokens  footprint   2225584 tokens  oracle hit  81.4%
	// shared-8k-seed     working set   1600000 tokens  footprint   1721584 tokens  oracle hit  85.9%
	// shared-8k-hot      working set   1600000 tokens  footprint    921584 tokens  oracle hit  91.6%
	// bot                working set    300000 tokens  footprint    369600 tokens  oracle hit  94.6%
	// gsp                working set    131072 tokens  footprint    262144 tokens  oracle hit  93.0%
	// chat               working set    181312 tokens  footprint    766480 tokens  oracle hit  58.7%
	// agentic            working set    350952 tokens  footprint   1614160 tokens  oracle hit  94.4%
	// agent              working set    369280 tokens  footprint   1154160 tokens  oracle hit  88.5%
	// llamacpp-tiny      working set      3200 tokens  footprint     27536 tokens  oracle hit  93.3%
	// sharegpt-like      working set       400 tokens  footprint   1154048 tokens  oracle hit   0.9%
}
