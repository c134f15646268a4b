package bench

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
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
		for range 100 {
			r.Samples = append(r.Samples, Sample{TTFTMs: p90})
		}
		return r, nil
	}
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
		for i := range 100 {
			x := Sample{TTFTMs: 500}
			if float64(i) >= good*10 {
				x.TTFTMs = 5000
			}
			r.Samples = append(r.Samples, x)
		}
		if o.Rate > 30 {
			r.TTFT.P90 = 5000
		}
		return r, nil
	}
	res, err := Capacity(context.Background(), CapacityOptions{StartRate: 4, Growth: 2, Refine: -1, TargetP90: time.Second, run: run})
	if err != nil {
		t.Fatal(err)
	}
	if res.Rate != 16 || res.BestRate != 8 || math.Abs(res.BestGoodput-8) > 1e-9 || math.Abs(res.Goodput-6) > 1e-9 {
		t.Fatalf("highest held %g (goodput %g), best goodput %g at %g; want 16 (6) and 8 at 8", res.Rate, res.Goodput, res.BestGoodput, res.BestRate)
	}
}
