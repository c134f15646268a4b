package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/probe"
)

// runPair makes two real runs (two "strategies") against loopback fakes.
func runPair(t *testing.T) []*Result {
	t.Helper()
	a, b := newFake(t, "inst-a", nil), newFake(t, "inst-b", nil)
	var out []*Result
	for _, label := range []string{"RANDOM", "PREFIX_AWARE"} {
		res, err := Run(t.Context(), Options{
			Targets: []string{a.URL, b.URL}, MetricsURLs: []string{a.URL + "/metrics", b.URL + "/metrics"},
			Workload: smallPreset(), Requests: 20, Warmup: 2, Seed: 6, Label: label, InstanceKVTokens: 500, Instances: 2,
		})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, res)
	}
	return out
}

func TestResultTableAndJSON(t *testing.T) {
	runs := runPair(t)
	var tab bytes.Buffer
	if err := runs[0].WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"RANDOM / small", "TTFT ms", "KV hit rate", "oracle", "regime", "inst-a", "fits the fleet, not one instance"} {
		if !strings.Contains(tab.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, tab.String())
		}
	}
	var js bytes.Buffer
	if err := runs[0].WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Result
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, runs[0]) {
		t.Fatalf("JSON round trip changed the result:\n%+v\n%+v", back, *runs[0])
	}
}

func TestComparisonMarkdownHTMLJSON(t *testing.T) {
	c := &Comparison{Title: "strategies", Environment: "two loopback fakes, unbounded caches", Runs: runPair(t)}
	var md bytes.Buffer
	if err := c.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# strategies", "two loopback fakes", "| RANDOM | small |", "| PREFIX_AWARE | small |", "Regimes", "working set 800 tokens", "`inst-a` 50.0%"} {
		if !strings.Contains(md.String(), want) {
			t.Fatalf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	var h bytes.Buffer
	if err := c.WriteHTML(&h); err != nil {
		t.Fatal(err)
	}
	page := h.String()
	for _, want := range []string{"<svg", "<path d=\"M", "RANDOM (n=20)", "inst-b", "two loopback fakes", "working set 800 tokens"} {
		if !strings.Contains(page, want) {
			t.Fatalf("html lacks %q", want)
		}
	}
	if isHTTPRef(page) || strings.Contains(page, "<script") || strings.Contains(page, "<link") {
		t.Fatal("html references something external")
	}
	var js bytes.Buffer
	if err := c.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Comparison
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || !reflect.DeepEqual(&back, c) {
		t.Fatalf("comparison JSON round trip: %v", err)
	}
}

func TestHTMLEscapesLabels(t *testing.T) {
	c := &Comparison{Title: "<b>x</b>", Runs: []*Result{{Label: `<script>alert(1)</script>`, Preset: "p"}}}
	var h bytes.Buffer
	if err := c.WriteHTML(&h); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(h.String(), "<script>") || strings.Contains(h.String(), "<b>x") {
		t.Fatal("labels not escaped")
	}
}

func TestParseMetricsNames(t *testing.T) {
	tests := []struct {
		name, text  string
		hits, query float64
		found       bool
		capacity    int64
	}{
		{"v1 with two engines", "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{engine=\"0\"} 10\nvllm:prefix_cache_hits_total{engine=\"1\"} 5\n# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{engine=\"0\"} 30\nvllm:prefix_cache_queries_total{engine=\"1\"} 20\n", 15, 50, true, 0},
		{"untyped", "vllm:prefix_cache_hits_total 1\nvllm:prefix_cache_queries_total 4\n", 1, 4, true, 0},
		{"v0 names", "# TYPE vllm:gpu_prefix_cache_hits_total counter\nvllm:gpu_prefix_cache_hits_total 2\n# TYPE vllm:gpu_prefix_cache_queries_total counter\nvllm:gpu_prefix_cache_queries_total 8\n", 2, 8, true, 0},
		{"absent", "# TYPE up gauge\nup 1\n", 0, 0, false, 0},
		{"llama.cpp evaluated only", "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 1247\n", 0, 0, true, 0},
		{"capacity", "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"100\"} 1\nvllm:prefix_cache_hits_total 0\nvllm:prefix_cache_queries_total 0\n", 0, 0, true, 1600},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := probe.ParseMetrics(strings.NewReader(tt.text))
			if err != nil {
				t.Fatal(err)
			}
			s := readScrape(m)
			if s.hits != tt.hits || s.queries != tt.query || s.found != tt.found || s.capacityTokens != tt.capacity {
				t.Fatalf("got %+v", s)
			}
		})
	}
}

func TestQuantilesAndRegime(t *testing.T) {
	q := quantiles([]float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10})
	if q.P50 != 5 || q.P90 != 9 || q.P99 != 10 || q.Mean != 5.5 || q.N != 10 {
		t.Fatalf("%+v", q)
	}
	tests := []struct {
		ws, inst int64
		n        int
		want     RegimeClass
	}{
		{100, 0, 4, RegimeUnknown},
		{100, 100, 4, RegimeFitsOne},
		{101, 100, 4, RegimeFitsFleet},
		{400, 100, 4, RegimeFitsFleet},
		{401, 100, 4, RegimeOverflows},
	}
	// Unequal instances: the fleet is their sum, not n × the smallest.
	if got := classify(250, 100, 300, 2); got != RegimeFitsFleet {
		t.Fatalf("classify(250, 100, fleet 300, 2) = %q", got)
	}
	for _, tt := range tests {
		if got := classify(tt.ws, tt.inst, tt.inst*int64(tt.n), tt.n); got != tt.want {
			t.Fatalf("classify(%d, %d, %d) = %q, want %q", tt.ws, tt.inst, tt.n, got, tt.want)
		}
	}
}

func TestBalanceOf(t *testing.T) {
	for _, tc := range []struct {
		shares            []float64
		n                 int
		max, maxMean, gin float64
	}{
		{[]float64{0.25, 0.25, 0.25, 0.25}, 4, 0.25, 1, 0},
		{[]float64{1}, 4, 1, 4, 0.75},         // all on one of four: (n-1)/n
		{[]float64{0.5, 0.5}, 4, 0.5, 2, 0.5}, // two of four idle
		{[]float64{0.1, 0.2, 0.3, 0.4}, 4, 0.4, 1.6, 0.25},
		{nil, 0, 0, 0, 0},
	} {
		b := balanceOf(tc.shares, tc.n)
		if math.Abs(b.MaxShare-tc.max) > 1e-9 || math.Abs(b.MaxOverMean-tc.maxMean) > 1e-9 || math.Abs(b.Gini-tc.gin) > 1e-9 {
			t.Errorf("balanceOf(%v, %d) = %+v, want max %v max/mean %v Gini %v", tc.shares, tc.n, b, tc.max, tc.maxMean, tc.gin)
		}
	}
}
