package bench

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeRun is a fleet that holds a 1 s TTFT p90 target up to capacity
// req/s and misses it above; every request succeeds.
func fakeRun(capacity float64, rates *[]float64) func(context.Context, Options) (*Result, error) {
	return func(_ context.Context, o Options) (*Result, error) {
		*rates = append(*rates, o.Rate)
		p90 := 500.0
		if o.Rate > capacity {
			p90 = 5000
		}
		r := &Result{Rate: o.Rate, Succeeded: 100, SuccessRate: 1, DurationSec: 100 / o.Rate, TTFT: Quantiles{P50: p90 / 2, P90: p90}}
		r.Samples = evenSamples(101, o.Rate, p90)
		return r, nil
	}
}

// evenSamples are n successful requests sent every 1/rate s, each
// answered within a millisecond with the given TTFT: the busy window holds
// n − 1 completions over (n − 1)/rate s.
func evenSamples(n int, rate, ttftMs float64) []Sample {
	var out []Sample
	for i := range n {
		out = append(out, Sample{Index: i, StartMs: float64(i) * 1000 / rate, TTFTMs: ttftMs, E2EMs: 1})
	}
	return out
}

func TestCapacitySearch(t *testing.T) {
	tests := []struct {
		name     string
		capacity float64
		opts     CapacityOptions
		// wantLo and wantHi bracket the rate found; wantSteps the number
		// of runs; bounded whether the search hit MaxRate still holding.
		wantLo, wantHi float64
		wantSteps      int
		bounded        bool
	}{
		// 4, 6, 9, 13.5 (missed), then bisection between 9 and 13.5.
		{name: "grows then bisects", capacity: 10, opts: CapacityOptions{StartRate: 4, Refine: 3}, wantLo: 9, wantHi: 10, wantSteps: 7},
		{name: "start already misses", capacity: 1, opts: CapacityOptions{StartRate: 4}, wantSteps: 1},
		{name: "capped", capacity: 1000, opts: CapacityOptions{StartRate: 4, MaxRate: 10}, wantLo: 10, wantHi: 10, wantSteps: 4, bounded: true},
		{name: "no refinement", capacity: 10, opts: CapacityOptions{StartRate: 4, Refine: -1}, wantLo: 9, wantHi: 9, wantSteps: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rates []float64
			o := tt.opts
			o.TargetP90 = time.Second
			o.run = fakeRun(tt.capacity, &rates)
			res, err := Capacity(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Steps) != tt.wantSteps || len(rates) != tt.wantSteps {
				t.Fatalf("%d steps at rates %v, want %d", len(res.Steps), rates, tt.wantSteps)
			}
			if tt.wantLo == 0 {
				if res.Step != -1 || res.Rate != 0 {
					t.Fatalf("found %g req/s at step %d, want none", res.Rate, res.Step)
				}
				return
			}
			if res.Rate < tt.wantLo || res.Rate > tt.wantHi || res.Bounded != tt.bounded {
				t.Fatalf("found %g req/s (bounded %v), want %g..%g (bounded %v); steps %v", res.Rate, res.Bounded, tt.wantLo, tt.wantHi, tt.bounded, rates)
			}
			if s := res.Steps[res.Step]; !s.Held || s.Rate != res.Rate || math.Abs(res.Goodput-res.Rate) > 1e-9 {
				t.Fatalf("outcome step %+v, goodput %g: every request met the target, so goodput is the rate", s, res.Goodput)
			}
			if res.BestGoodput != res.Goodput || res.BestRate != res.Rate {
				t.Fatalf("best goodput %g at %g, want the highest held step's %g at %g (goodput grows with the rate here)", res.BestGoodput, res.BestRate, res.Goodput, res.Rate)
			}
			for _, s := range res.Steps {
				if s.Held != (s.Rate <= tt.capacity) {
					t.Fatalf("step %+v judged wrong against capacity %g", s, tt.capacity)
				}
			}
		})
	}
}

func TestCapacityOptionsValidate(t *testing.T) {
	for _, o := range []CapacityOptions{
		{},
		{StartRate: 5, MaxRate: 2},
		{StartRate: 5, Growth: 0.5},
		{StartRate: 5, MinSuccess: 2},
		{StartRate: 5, TargetP90: -time.Second},
	} {
		if _, err := Capacity(context.Background(), o); err == nil {
			t.Errorf("Capacity(%+v) accepted", o)
		}
	}
	var rates []float64
	failing := CapacityOptions{StartRate: 4, run: func(context.Context, Options) (*Result, error) {
		rates = append(rates, 0)
		return nil, errors.New("fleet gone")
	}}
	if res, err := Capacity(context.Background(), failing); err == nil || !strings.Contains(err.Error(), "fleet gone") || res == nil || len(rates) != 1 {
		t.Fatalf("a failing run: %v, %+v after %d runs", err, res, len(rates))
	}
}

// TestCapacityAgainstAQueue runs the real search against a loopback server
// that serves one request at a time, each taking 20 ms before its first
// token: it cannot sustain 50 req/s, and at 80 req/s its queue pushes
// TTFT p90 far past the 250 ms target.
func TestCapacityAgainstAQueue(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a few seconds of load")
	}
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		time.Sleep(20 * time.Millisecond) // the one "GPU" is busy
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n"))
	}))
	defer srv.Close()
	res, err := Capacity(context.Background(), CapacityOptions{
		Run:       Options{Targets: []string{srv.URL}, Preset: "sharegpt-like", Requests: 40, Seed: 1, Label: "queue"},
		TargetP90: 250 * time.Millisecond, StartRate: 10, Growth: 2, MaxRate: 160, Refine: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	_ = res.WriteTable(&b)
	t.Log(b.String())
	if res.Step < 0 || res.Rate >= 50 || res.Bounded {
		t.Fatalf("found %g req/s (bounded %v); a 20 ms single server sustains under 50", res.Rate, res.Bounded)
	}
	if last := res.Steps[len(res.Steps)-1]; last.Held || last.Rate > 80 {
		t.Fatalf("the search went on past the first miss: %+v", res.Steps)
	}
	if res.Goodput <= 0 {
		t.Fatalf("goodput %g at the rate found", res.Goodput)
	}
}

// TestCapacityBestGoodput: a fleet that finishes at most 8 req/s still
// holds the TTFT target when offered more (prefill first, decode slows), but
// fewer requests meet it: the comparison reads the best goodput, not the
// highest offered rate that held.
func TestCapacityBestGoodput(t *testing.T) {
	run := func(_ context.Context, o Options) (*Result, error) {
		good := min(o.Rate, 8) - max(0, o.Rate-8)/4 // past 8 req/s, the backlog costs goodput
		r := &Result{Rate: o.Rate, Succeeded: 100, SuccessRate: 1, DurationSec: 10, TTFT: Quantiles{P90: 500}}
		// 100 requests over 10 s, all finished within it, then a last one.
		r.Samples = evenSamples(101, 10, 500)
		for i := range 100 {
			if float64(i) >= good*10 {
				r.Samples[i].TTFTMs = 5000
			}
		}
		r.Samples[100].TTFTMs = 5000
		if o.Rate > 30 {
			r.TTFT.P90 = 5000
		}
		return r, nil
	}
	res, err := Capacity(context.Background(), CapacityOptions{StartRate: 4, Growth: 2, Refine: -1, TargetP90: time.Second, run: run})
	if err != nil {
		t.Fatal(err)
	}
	if res.Rate != 16 || res.BestRate != 8 || math.Abs(res.BestGoodput-8*100/101.) > 1e-9 || math.Abs(res.Goodput-6*100/101.) > 1e-9 {
		t.Fatalf("highest held %g (goodput %g), best goodput %g at %g; want 16 (6) and 8 at 8", res.Rate, res.Goodput, res.BestGoodput, res.BestRate)
	}
}

// TestCapacityClosedLoop: with StartConcurrency the search varies the
// requests in flight (whole numbers, rate 0) and stops bisecting when the
// two bounds are adjacent.
func TestCapacityClosedLoop(t *testing.T) {
	var loads []int
	run := func(_ context.Context, o Options) (*Result, error) {
		if o.Rate != 0 {
			t.Errorf("a closed-loop step ran at rate %g", o.Rate)
		}
		loads = append(loads, o.Concurrency)
		p90 := 500.0
		if o.Concurrency > 20 {
			p90 = 5000
		}
		r := &Result{Succeeded: 100, SuccessRate: 1, TTFT: Quantiles{P90: p90}}
		r.Samples = evenSamples(101, float64(o.Concurrency), p90)
		return r, nil
	}
	res, err := Capacity(context.Background(), CapacityOptions{StartConcurrency: 4, Refine: 10, TargetP90: time.Second, run: run})
	if err != nil {
		t.Fatal(err)
	}
	// 4, 6, 9, 14, 21 (missed), then sqrt(14·21) → 17, 19, 20, and 20|21
	// are adjacent.
	if want := []int{4, 6, 9, 14, 21, 17, 19, 20}; !slices.Equal(loads, want) {
		t.Fatalf("concurrencies %v, want %v", loads, want)
	}
	if res.Concurrency != 20 || res.Rate != 0 || res.Bounded || !res.Steps[res.Step].Held || res.Steps[res.Step].Concurrency != 20 {
		t.Fatalf("found %d in flight (rate %g, bounded %v), want 20", res.Concurrency, res.Rate, res.Bounded)
	}
	if res.BestStep != res.Step || math.Abs(res.BestGoodput-20) > 1e-9 {
		t.Fatalf("best goodput %g at step %d, want 20 req/s at step %d", res.BestGoodput, res.BestStep, res.Step)
	}
	var b strings.Builder
	if err := res.WriteTable(&b); err != nil || !strings.Contains(b.String(), "20 in flight") {
		t.Fatalf("table (%v):\n%s", err, b.String())
	}
	for _, o := range []CapacityOptions{{StartConcurrency: -1, StartRate: 1}, {StartConcurrency: 8, MaxConcurrency: 4}} {
		o.run = run
		if _, err := Capacity(context.Background(), o); err == nil {
			t.Errorf("Capacity(%+v) accepted", o)
		}
	}
}

// closedLoop returns the samples of n requests through a closed loop of c
// in flight where every request takes e2e seconds: c are sent at once at
// 0, and each completion sends the next. The first c have TTFT burstMs
// (they queued behind each other), the rest ttftMs; the last c take drain
// seconds, as the run's longest answers would.
func closedLoop(n, c int, e2e, drain, burstMs, ttftMs float64) []Sample {
	var out []Sample
	for i := range n {
		x := Sample{Index: i, StartMs: float64(i/c) * e2e * 1000, E2EMs: e2e * 1000, TTFTMs: ttftMs}
		if i < c {
			x.TTFTMs = burstMs
		}
		if i >= n-c {
			x.E2EMs = drain * 1000
		}
		out = append(out, x)
	}
	return out
}

func TestBusyWindow(t *testing.T) {
	open := evenSamples(41, 4, 100) // 40 completions over 10 s
	open[40].E2EMs = 30_000         // the run's longest answer, after the last send
	withErrs := evenSamples(41, 4, 100)
	withErrs[3].Error, withErrs[5].Error = ErrKindTimeout, ErrKindTimeout
	slow := evenSamples(41, 4, 100)
	for i := range 10 {
		slow[i].TTFTMs = 3000
	}
	tests := []struct {
		name                 string
		samples              []Sample
		c                    int
		wantCompleted        int
		wantSec, wantThr     float64
		wantAttain, wantGood float64
		wantP90              float64
	}{
		// 2 in flight, 1 s each: sends at 0,0,1,1,…,4,4; by the last send
		// (4 s) the 8 sent before it finished: 2 req/s, whatever the 30 s
		// drain. The burst's 5 s TTFT is not judged.
		{"closed loop", closedLoop(10, 2, 1, 30, 5000, 100), 2, 8, 4, 2, 1, 2, 100},
		// The same burst judged as an open loop's requests: 2 of 10 miss.
		{"burst judged in an open loop", closedLoop(10, 2, 1, 30, 5000, 100), 0, 8, 4, 2, 0.8, 1.6, 5000},
		{"open loop, drain left out", open, 0, 40, 10, 4, 1, 4, 100},
		{"failures neither complete nor attain", withErrs, 0, 38, 10, 3.8, 39. / 41, 3.8 * 39 / 41, 100},
		{"a quarter over the target", slow, 0, 40, 10, 4, 31. / 41, 4 * 31. / 41, 3000},
		{"no samples", nil, 0, 0, 0, 0, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := busyWindow(tt.samples, tt.c, 2*time.Second)
			near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
			if b.Completed != tt.wantCompleted || !near(b.Sec, tt.wantSec) || !near(b.Throughput, tt.wantThr) ||
				!near(b.Attainment, tt.wantAttain) || !near(b.Goodput, tt.wantGood) || b.TTFT.P90 != tt.wantP90 {
				t.Fatalf("got %+v; want %d completed over %g s, %g req/s, attainment %g, goodput %g, TTFT p90 %g",
					b, tt.wantCompleted, tt.wantSec, tt.wantThr, tt.wantAttain, tt.wantGood, tt.wantP90)
			}
		})
	}
}
