package bench

import (
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/internal/sim"
)

func take(t *testing.T, p Preset, seed int64, o StreamOptions, n int) []Request {
	t.Helper()
	s, err := p.NewStream(seed, o)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]Request, n)
	for i := range out {
		out[i] = s.Next()
	}
	return out
}

func TestPresetsDeterministic(t *testing.T) {
	for _, p := range Presets() {
		t.Run(p.Name, func(t *testing.T) {
			o := StreamOptions{Tenants: 3, AdapterMix: 0.3, Adapters: []string{"a1", "a2"}}
			a := take(t, p, 7, o, 40)
			b := take(t, p, 7, o, 40)
			c := take(t, p, 8, o, 40)
			if !reflect.DeepEqual(a, b) {
				t.Fatal("same seed gave different streams")
			}
			if reflect.DeepEqual(a, c) {
				t.Fatal("different seeds gave the same stream")
			}
			if p.WorkingSetTokens() <= 0 {
				t.Fatalf("working set %d", p.WorkingSetTokens())
			}
			for _, r := range a {
				if r.MaxTokens < 1 || len(r.Messages) == 0 {
					t.Fatalf("request %d: max tokens %d, %d messages", r.Index, r.MaxTokens, len(r.Messages))
				}
			}
		})
	}
}

func TestLookupPreset(t *testing.T) {
	for _, n := range PresetNames() {
		if p, err := LookupPreset(n); err != nil || p.Name != n || p.Validate() != nil {
			t.Fatalf("%s: %v %v", n, err, p.Validate())
		}
	}
	if _, err := LookupPreset("nope"); err == nil {
		t.Fatal("unknown preset accepted")
	}
}

func TestTextSizes(t *testing.T) {
	for _, n := range []int{1, 17, 50, 3000, 8000} {
		if got := sim.CountTokens(Text(1, "x", n, 3)); got != n {
			t.Fatalf("Text(%d tokens) counts %d tokens", n, got)
		}
	}
	if Text(1, "x", 0) != "" {
		t.Fatal("0 tokens is not empty")
	}
}

func TestDocumentSizesAndQuestions(t *testing.T) {
	tests := []struct {
		preset       string
		docTokens    int
		qMin, qMax   int
		fixedOutput  int
		distinctDocs bool
	}{
		{"shared-8k", 8000, 50, 300, 0, true},
		{"shared-8k-uniform", 8000, 50, 300, 0, true},
		{"bot", 3000, 50, 50, 0, true},
		{"gsp", 2048, 128, 128, 256, true},
	}
	for _, tt := range tests {
		t.Run(tt.preset, func(t *testing.T) {
			p, _ := LookupPreset(tt.preset)
			firstBlock := map[string]int{}
			for _, r := range take(t, p, 3, StreamOptions{}, 300) {
				doc, q := r.Messages[0].Content, r.Messages[1].Content
				if got := sim.CountTokens(doc); got != tt.docTokens {
					t.Fatalf("document %d: %d tokens, want %d", r.Document, got, tt.docTokens)
				}
				if got := sim.CountTokens(q); got < tt.qMin || got > tt.qMax {
					t.Fatalf("question: %d tokens, want %d-%d", got, tt.qMin, tt.qMax)
				}
				if tt.fixedOutput > 0 && r.MaxTokens != tt.fixedOutput {
					t.Fatalf("output %d, want %d", r.MaxTokens, tt.fixedOutput)
				}
				// Distinct documents must differ within their first characters
				// (the first 16 hex digits), so within the first block.
				key := doc[:16]
				if d, ok := firstBlock[key]; ok && d != r.Document {
					t.Fatalf("documents %d and %d share their first 16 characters", d, r.Document)
				}
				firstBlock[key] = r.Document
			}
		})
	}
}

func TestOutputDistribution(t *testing.T) {
	// Azure conversation outputs: median 129, mean 211 before clipping at
	// 2,048 (which trims the mean a little). 4,000 draws: the median's
	// standard error is ~2.5 % here, so 10 % bounds are loose but can fail.
	p, _ := LookupPreset("shared-8k")
	rs := take(t, p, 11, StreamOptions{}, 4000)
	v := make([]float64, len(rs))
	sum := 0.0
	for i, r := range rs {
		v[i] = float64(r.MaxTokens)
		sum += v[i]
	}
	q := quantiles(v)
	if q.P50 < 116 || q.P50 > 142 {
		t.Fatalf("median output %.0f, want ~129", q.P50)
	}
	if mean := sum / float64(len(v)); mean < 170 || mean > 230 {
		t.Fatalf("mean output %.0f, want ~200", mean)
	}
}

func TestZipfSkew(t *testing.T) {
	// Rank k has probability (1/k)/H_200; H_200 = 5.878, so rank 1 gets 17.0 %
	// and rank 2 8.5 %. n = 20,000: the standard error of rank 1's share is
	// 0.27 %, so ±1.5 % is over 5 standard errors.
	p, _ := LookupPreset("shared-8k")
	s, _ := p.NewStream(5, StreamOptions{})
	const n = 20000
	counts := make([]int, p.Documents)
	for range n {
		counts[s.pickDoc()]++
	}
	h := 0.0
	for k := 1; k <= p.Documents; k++ {
		h += 1 / float64(k)
	}
	for _, k := range []int{1, 2, 10} {
		want := 1 / float64(k) / h
		got := float64(counts[k-1]) / n
		if math.Abs(got-want) > 0.015 {
			t.Fatalf("rank %d share %.4f, want %.4f", k, got, want)
		}
	}
	// The top 20 documents (10 %) take about 61 % of requests.
	top := 0
	for _, c := range counts[:20] {
		top += c
	}
	if f := float64(top) / n; f < 0.58 || f > 0.64 {
		t.Fatalf("top-20 share %.3f, want ~0.61", f)
	}
}

func TestUniformPopularity(t *testing.T) {
	// Chi-square with 255 degrees of freedom: mean 255, sd 22.6; 360 is
	// over 4.5 sd, failing by chance about once in 10^5 runs.
	p, _ := LookupPreset("shared-8k-uniform")
	s, _ := p.NewStream(9, StreamOptions{})
	const per = 100
	n := p.Documents * per
	counts := make([]int, p.Documents)
	for range n {
		counts[s.pickDoc()]++
	}
	chi := 0.0
	for _, c := range counts {
		d := float64(c - per)
		chi += d * d / per
	}
	if chi > 360 {
		t.Fatalf("chi-square %.1f over %d documents: not uniform", chi, p.Documents)
	}
}

func TestGSPCoversEveryPairOnce(t *testing.T) {
	p, _ := LookupPreset("gsp")
	rs := take(t, p, 2, StreamOptions{}, 64*16)
	seen := map[string]bool{}
	for _, r := range rs {
		k := r.Prompt()
		if seen[k] {
			t.Fatalf("prompt repeated within the first pass (request %d)", r.Index)
		}
		seen[k] = true
	}
}

func TestChatResendsHistory(t *testing.T) {
	for _, name := range []string{"chat", "agentic", "agent"} {
		t.Run(name, func(t *testing.T) {
			p, _ := LookupPreset(name)
			rs := take(t, p, 4, StreamOptions{Tenants: 2}, 400)
			turns := map[int]int{}
			for _, r := range rs {
				turns[r.Session]++
				if r.Turn != turns[r.Session]-1 {
					t.Fatalf("session %d: turn %d, want %d", r.Session, r.Turn, turns[r.Session]-1)
				}
				if r.After < 0 {
					if r.Turn != 0 {
						t.Fatalf("turn %d without a previous turn", r.Turn)
					}
					continue
				}
				prev := rs[r.After]
				if prev.Session != r.Session || prev.Tenant != r.Tenant || prev.Adapter != r.Adapter {
					t.Fatalf("request %d continues another session", r.Index)
				}
				// The previous prompt is a prefix of this one: its blocks hit.
				if !strings.HasPrefix(r.Prompt(), prev.Prompt()) {
					t.Fatalf("request %d does not re-send request %d's history", r.Index, prev.Index)
				}
				n := len(prev.Messages)
				if !reflect.DeepEqual(r.Messages[:n], prev.Messages) || r.Messages[n].Role != "assistant" ||
					sim.CountTokens(r.Messages[n].Content) != prev.MaxTokens || r.Messages[n+1].Role != "user" {
					t.Fatalf("request %d: history is not previous messages + answer of %d tokens + user turn", r.Index, prev.MaxTokens)
				}
			}
			for id, n := range turns {
				if n > p.Turns.Max {
					t.Fatalf("session %d has %d turns, max %d", id, n, p.Turns.Max)
				}
			}
		})
	}
}

func TestTenantsAndAdapters(t *testing.T) {
	p, _ := LookupPreset("bot")
	rs := take(t, p, 1, StreamOptions{Tenants: 4, AdapterMix: 0.25, Adapters: []string{"x", "y"}}, 4000)
	tenants := map[string]bool{}
	adapted := 0
	for _, r := range rs {
		tenants[r.Tenant] = true
		if r.Adapter != "" {
			adapted++
		}
	}
	if len(tenants) != 4 || tenants[""] {
		t.Fatalf("tenants %v", tenants)
	}
	// Binomial(4000, 0.25): sd 27, so ±150 is over 5 sd.
	if adapted < 850 || adapted > 1150 {
		t.Fatalf("%d of 4000 requests name an adapter, want ~1000", adapted)
	}
	if _, err := p.NewStream(1, StreamOptions{AdapterMix: 0.5}); err == nil {
		t.Fatal("adapter mix without adapters accepted")
	}
}
