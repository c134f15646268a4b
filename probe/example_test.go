package probe_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/prefixrouter/prefixrouter/probe"
)

func ExampleMetrics_Sum() {
	m, err := probe.ParseMetrics(strings.NewReader(`# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 2
vllm:num_requests_running{model_name="b"} 1
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 4
`))
	if err != nil {
		panic(err)
	}
	load, err := m.Sum(probe.LoadMetrics...)
	fmt.Println(load, err)
	_, err = m.SumFirst(probe.PrefixCacheHits...)
	fmt.Println(err)
	// Output:
	// 7 <nil>
	// probe: metric not exported: none of vllm:prefix_cache_hits_total, vllm:prefix_cache_hits, vllm:gpu_prefix_cache_hits_total, vllm:gpu_prefix_cache_hits
}

func ExampleStart() {
	clock := clockwork.NewFakeClock()
	round := 0
	p, err := probe.Start(probe.Options{Interval: time.Minute, Concurrency: 1, Clock: clock},
		func() []string { round++; return []string{"a", "b"} },
		func(_ context.Context, target string) (string, error) { return strings.ToUpper(target), nil },
		func(target, result string, err error) { fmt.Println(round, target, result, err) })
	if err != nil {
		panic(err)
	}
	defer p.Close()
	ctx := context.Background()
	_ = clock.BlockUntilContext(ctx, 1) // the first round is done
	clock.Advance(time.Minute)
	_ = clock.BlockUntilContext(ctx, 1) // and the second
	// Output:
	// 1 a A <nil>
	// 1 b B <nil>
	// 2 a A <nil>
	// 2 b B <nil>
}
