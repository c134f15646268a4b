package probe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/engine"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

const vllmText = `# HELP vllm:num_requests_running Number of requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2.0
vllm:num_requests_waiting{model_name="n"} 1.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="1024"} 1.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0"} 10
vllm:prefix_cache_hits_total{engine="1"} 5
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total 99
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 2
vllm:e2e_request_latency_seconds_sum 7
vllm:e2e_request_latency_seconds_count 2
# TYPE other counter
other_total 99
`

func mustParse(t *testing.T, text string) Metrics {
	t.Helper()
	m, err := ParseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestSum(t *testing.T) {
	m := mustParse(t, vllmText)
	for _, tc := range []struct {
		name    string
		names   []string
		want    float64
		missing bool
	}{
		{"load", LoadMetrics, 6, false},
		{"one present", []string{"absent", VLLMRequestsRunning}, 3, false},
		{"untyped and counter", []string{"other_total"}, 99, false},
		{"histogram counts nothing", []string{"vllm:e2e_request_latency_seconds"}, 0, false},
		{"absent", []string{"absent", "also_absent"}, 0, true},
		{"no names", nil, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := m.Sum(tc.names...)
			if got != tc.want || errors.Is(err, ErrNotExported) != tc.missing || (err != nil) != tc.missing {
				t.Fatalf("Sum = %v, %v; want %v (missing %v)", got, err, tc.want, tc.missing)
			}
		})
	}
}

func TestSumFirst(t *testing.T) {
	m := mustParse(t, vllmText)
	// v1's name wins over v0's, which this exposition also has.
	if got, err := m.SumFirst(PrefixCacheHits...); got != 15 || err != nil {
		t.Fatalf("SumFirst(hits) = %v, %v; want 15", got, err)
	}
	if got, err := m.SumFirst("vllm:gpu_prefix_cache_hits_total"); got != 99 || err != nil {
		t.Fatalf("SumFirst(v0 hits) = %v, %v; want 99", got, err)
	}
	if _, err := m.SumFirst(PrefixCacheQueries...); !errors.Is(err, ErrNotExported) {
		t.Fatalf("SumFirst(queries) err = %v, want ErrNotExported", err)
	}
}

func TestSeries(t *testing.T) {
	m := mustParse(t, vllmText)
	s := m.Series(VLLMRequestsWaiting)
	if len(s) != 2 || s[0].Labels["model_name"] != "m" || s[0].Value != 2 || s[1].Labels["model_name"] != "n" || s[1].Value != 1 {
		t.Fatalf("Series(waiting) = %+v", s)
	}
	info := m.Series(VLLMCacheConfigInfo)
	if len(info) != 1 || info[0].Labels["block_size"] != "16" || info[0].Labels["num_gpu_blocks"] != "1024" {
		t.Fatalf("Series(cache_config_info) = %+v", info)
	}
	if m.Series("absent") != nil {
		t.Fatal("Series of an absent family is not nil")
	}
}

func TestLoRAUse(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		inUse      []string
		slots      int
	}{
		{"absent", "vllm:num_requests_running 1\n", nil, 0},
		{"idle", `vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7e9` + "\n", nil, 2},
		{"running and waiting", `vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",waiting_lora_adapters="chat"} 1.7e9` + "\n", []string{"chat", "sql"}, 4},
		// vLLM keeps the label sets of earlier moments, each at the time
		// it was last set: only the newest says what is in use now.
		{"earlier series are history", `vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",waiting_lora_adapters="chat"} 1.7000001e9
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters="eu"} 1.7000003e9
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7000002e9
`, []string{"eu"}, 4},
		{"nothing in use now", `vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql",waiting_lora_adapters=""} 1.7e9
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.8e9
`, nil, 2},
		{"slots not a number", `vllm:lora_requests_info{max_lora="many",running_lora_adapters="a",waiting_lora_adapters=""} 1` + "\n", []string{"a"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inUse, slots := mustParse(t, tc.text).LoRAUse()
			if !slices.Equal(inUse, tc.inUse) || slots != tc.slots {
				t.Fatalf("LoRAUse = %q, %d; want %q, %d", inUse, slots, tc.inUse, tc.slots)
			}
		})
	}
}

func TestParseMetricsRejects(t *testing.T) {
	for _, in := range []string{
		"vllm:num_requests_running{ 3\n",
		"{{{",
		"# TYPE x gauge\n# TYPE x counter\nx 1\n",
	} {
		if _, err := ParseMetrics(strings.NewReader(in)); err == nil {
			t.Errorf("ParseMetrics(%q) accepted", in)
		}
	}
}

func TestScrape(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			if !strings.HasPrefix(r.Header.Get("Accept"), "text/plain") {
				http.Error(w, "want text", http.StatusNotAcceptable)
				return
			}
			fmt.Fprint(w, vllmText)
		case "/broken":
			fmt.Fprint(w, "{{{")
		default:
			http.Error(w, "down", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	m, err := Scrape(ctx, srv.Client(), srv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if load, err := m.Sum(LoadMetrics...); load != 6 || err != nil {
		t.Fatalf("load = %v, %v", load, err)
	}
	if _, err := Scrape(ctx, srv.Client(), srv.URL+"/down"); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("503 scrape: err = %v", err)
	}
	if _, err := Scrape(ctx, srv.Client(), srv.URL+"/broken"); err == nil {
		t.Fatal("unparsable scrape accepted")
	}
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	_, err = Scrape(ctx, srv.Client(), dead.URL+"/metrics")
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" {
		t.Fatalf("refused scrape: err = %v, want a dial *net.OpError", err)
	}
}

// FuzzParseMetrics: whatever a model server sends, ParseMetrics does not
// panic, and what it accepts reads consistently through Series, Sum and
// SumFirst.
func FuzzParseMetrics(f *testing.F) {
	f.Add([]byte(vllmText))
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := ParseMetrics(strings.NewReader(string(in)))
		if err != nil {
			return
		}
		const absent = "probe_fuzz_absent"
		if _, ok := m[absent]; ok {
			return // the checks below need a name the input lacks
		}
		if _, err := m.Sum(absent); !errors.Is(err, ErrNotExported) {
			t.Fatalf("Sum of an absent name: %v", err)
		}
		for name, fam := range m {
			series := m.Series(name)
			if len(series) != len(fam.GetMetric()) {
				t.Fatalf("%s: %d series, family has %d", name, len(series), len(fam.GetMetric()))
			}
			want := 0.0
			for i, s := range series {
				want += s.Value
				for _, lp := range fam.GetMetric()[i].GetLabel() {
					if _, ok := s.Labels[lp.GetName()]; !ok {
						t.Fatalf("%s: series %d lost label %q", name, i, lp.GetName())
					}
				}
			}
			sum, err := m.Sum(name, absent)
			if err != nil || !sameFloat(sum, want) {
				t.Fatalf("%s: Sum = %v, %v; series add up to %v", name, sum, err, want)
			}
			first, err := m.SumFirst(absent, name)
			if err != nil || !sameFloat(first, sum) {
				t.Fatalf("%s: SumFirst = %v, %v; Sum %v", name, first, err, sum)
			}
		}
	})
}

func sameFloat(a, b float64) bool { return a == b || (math.IsNaN(a) && math.IsNaN(b)) }

// TestEngineLoad reads running, waiting and KV cache usage from each
// engine's exposition in engine/testdata.
func TestEngineLoad(t *testing.T) {
	for _, tc := range []struct {
		file, engine string
		want         EngineLoad
	}{
		{"llamacpp-c392e50/metrics-busy.txt", engine.LlamaCpp, EngineLoad{Running: 2, Waiting: 1, KVCacheUsage: 0.527832}},
		{"llamacpp-c392e50/metrics-idle.txt", engine.LlamaCpp, EngineLoad{KVCacheUsage: 0}},
		{"vllm-source/metrics.txt", engine.VLLM, EngineLoad{Running: 5, Waiting: 1, KVCacheUsage: 0.5}},
		{"sglang-source/metrics.txt", engine.SGLang, EngineLoad{Running: 5, Waiting: 3, KVCacheUsage: 0.37}},
		{"llamacpp-c392e50/metrics-busy.txt", "", EngineLoad{Running: 2, Waiting: 1, KVCacheUsage: 0.527832}},
		{"sglang-source/metrics.txt", "", EngineLoad{Running: 5, Waiting: 3, KVCacheUsage: 0.37}},
	} {
		b := testsupport.EngineTestdata(t, tc.file)
		m, err := ParseMetrics(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		p, _ := engine.Lookup(tc.engine)
		got, err := m.EngineLoad(p)
		if err != nil || got != tc.want {
			t.Errorf("%s as %q: %+v, %v; want %+v", tc.file, tc.engine, got, err, tc.want)
		}
	}
	// Only one of the pair: the other counts 0; no KV gauge: -1.
	m, _ := ParseMetrics(strings.NewReader("llamacpp:requests_deferred 4\n"))
	p, _ := engine.Lookup(engine.LlamaCpp)
	if got, err := m.EngineLoad(p); err != nil || got != (EngineLoad{Waiting: 4, KVCacheUsage: -1}) {
		t.Errorf("deferred only: %+v, %v", got, err)
	}
	m, _ = ParseMetrics(strings.NewReader("other_total 1\n"))
	if _, err := m.EngineLoad(engine.Generic); !errors.Is(err, ErrNotExported) {
		t.Errorf("no engine gauges: err %v, want ErrNotExported", err)
	}
}
