package bench

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/sim"
)

// With the simulator running k times faster than real time, the bench
// reports TTFT in the simulator's time: k times the wall-clock TTFT it
// measured. One instance, one request at a time, one document: the first
// request's prompt is uncached and fits one step; the later ones hit the
// document.
//
// The check brackets each reported TTFT between two wall-clock intervals
// the test measures itself, times k. Below: the simulator's handler, from
// the request's arrival to its first written byte (which it writes only
// once the first token is out, so after at least the step's d/k of wall
// time); the client's TTFT contains that interval. Above: from the end of
// the previous response (for the first, from calling Run) to the end of
// this one, which contains the client's TTFT. Unscaled (k = 1 reported at
// k = 10) the first figure falls below k times the handler's time;
// scaled twice it exceeds k times the bracket. Both bounds hold whatever
// the load, which inflates the client's and the handler's overhead (and a
// fixed ±25 % around the profile's prefill failed under load: 2030 tokens
// reported 428.9 ms against the profile's 59.9 ms). The uncached
// request's figure must also cover the profile's prefill
// (PrefillDuration includes the step floor), and the log line gives it
// against the profile, less the least overhead the cached requests showed.
func TestTimeScaleReportsServerTime(t *testing.T) {
	tests := []struct {
		name      string
		scale     float64
		profile   string
		docTokens int
	}{
		// 70B at ~7,850 tokens: ~300 ms simulated, ~30 ms of wall time.
		{"scale 10", 10, sim.ProfileH100x8Llama70B, 7800},
		// Real time, a small prompt: ~60 ms.
		{"real time", 0, sim.ProfileH200Llama8B, 2000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := sim.New(sim.Options{ID: "sim-0", Profile: tt.profile, TimeScale: max(tt.scale, 1)})
			if err != nil {
				t.Fatal(err)
			}
			var handled wallLog // the handler: arrival → first byte written
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				s.ServeHTTP(&firstWrite{ResponseWriter: w, in: time.Now(), log: &handled}, r)
			}))
			tr := &closeLog{base: http.DefaultTransport.(*http.Transport).Clone()}
			t.Cleanup(func() {
				srv.Close()
				s.Close()
				tr.base.CloseIdleConnections()
			})
			prof := s.Profile()
			p := &Preset{Name: "prefill", Kind: KindSharedPrefix, Documents: 1, DocumentTokens: tt.docTokens,
				QuestionTokens: IntRange{20, 40}, Output: LengthDist{Median: 2}}
			called := time.Now()
			res, err := Run(t.Context(), Options{Targets: []string{srv.URL}, Workload: p, Requests: 4, Seed: 1,
				Concurrency: 1, TimeScale: tt.scale, Client: &http.Client{Transport: tr}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Succeeded != 4 {
				t.Fatalf("ok %d, errors %v", res.Succeeded, res.Errors)
			}
			k := max(tt.scale, 1)
			if want := timeScaleOf(k); res.TimeScale != want {
				t.Fatalf("result time scale %v, want %v", res.TimeScale, want)
			}
			first := res.Samples[0]
			if first.Index != 0 || first.CachedTokens != 0 || first.PromptTokens > prof.TokenBudget {
				t.Fatalf("first request %+v: want an uncached prompt of one step (budget %d)", first, prof.TokenBudget)
			}
			// One request at a time: the samples (by index), the handler's
			// and the transport's logs are in the same order.
			served, closed := handled.get(), tr.get()
			if len(served) != 4 || len(closed) != 4 {
				t.Fatalf("%d requests handled, %d responses closed, want 4", len(served), len(closed))
			}
			prev := called
			for i, smp := range res.Samples {
				if smp.Index != i {
					t.Fatalf("sample %d has index %d", i, smp.Index)
				}
				lo, hi := ms(served[i].end.Sub(served[i].start))*k, ms(closed[i].Sub(prev))*k
				prev = closed[i]
				if smp.TTFTMs < lo || smp.TTFTMs > hi {
					t.Fatalf("request %d: TTFT %.1f ms, want between %g × the handler's %.1f ms of wall time (%.1f ms) and %g × the %.1f ms from the previous response's end to this one's (%.1f ms)",
						i, smp.TTFTMs, k, lo/k, lo, k, hi/k, hi)
				}
				if i > 0 && smp.CachedTokens == 0 {
					t.Fatalf("request %d missed the document's cache", smp.Index)
				}
			}
			overhead := math.Inf(1)
			for _, smp := range res.Samples[1:] {
				overhead = math.Min(overhead, smp.TTFTMs-ms(prof.PrefillDuration(smp.PromptTokens, smp.CachedTokens)))
			}
			overhead = max(overhead, 0)
			want := ms(prof.PrefillDuration(first.PromptTokens, 0))
			t.Logf("uncached %d tokens: TTFT %.1f ms, profile %.1f ms, overhead (from the cached requests) %.1f ms; handler %.1f ms × %g",
				first.PromptTokens, first.TTFTMs, want, overhead, ms(served[0].end.Sub(served[0].start)), k)
			if first.TTFTMs < want {
				t.Fatalf("TTFT %.1f ms for %d uncached tokens, below the profile's prefill %.1f ms", first.TTFTMs, first.PromptTokens, want)
			}
		})
	}
}

// span is a wall-clock interval.
type span struct{ start, end time.Time }

// wallLog collects the handler's spans in the order they end.
type wallLog struct {
	mu    sync.Mutex
	spans []span
}

func (l *wallLog) add(start, end time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.spans = append(l.spans, span{start, end})
}

func (l *wallLog) get() []span {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.spans)
}

// firstWrite logs the span from the request's arrival (in) to its
// response's first byte (the header), before that byte goes out, so before
// the client can have read it; Unwrap lets http.ResponseController flush
// through it.
type firstWrite struct {
	http.ResponseWriter
	in     time.Time
	log    *wallLog
	marked bool
}

func (w *firstWrite) mark() {
	if !w.marked {
		w.marked = true
		w.log.add(w.in, time.Now())
	}
}

func (w *firstWrite) WriteHeader(code int) {
	w.mark()
	w.ResponseWriter.WriteHeader(code)
}

func (w *firstWrite) Write(b []byte) (int, error) {
	w.mark()
	return w.ResponseWriter.Write(b)
}

func (w *firstWrite) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// closeLog is a transport that notes when each response body is closed.
type closeLog struct {
	base   *http.Transport
	mu     sync.Mutex
	closed []time.Time
}

func (c *closeLog) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	resp.Body = &noteClose{ReadCloser: resp.Body, log: c}
	return resp, nil
}

func (c *closeLog) get() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.closed)
}

type noteClose struct {
	io.ReadCloser
	log  *closeLog
	once sync.Once
}

func (b *noteClose) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() {
		b.log.mu.Lock()
		b.log.closed = append(b.log.closed, time.Now())
		b.log.mu.Unlock()
	})
	return err
}

// Rate, Duration and Timeout are in server time: at scale 10 a 2 s
// window at 20 req/s takes about 0.2 s of wall time and sends about 40
// requests, and a 1 s timeout fires after 0.1 s of wall time but is
// reported as 1 s.
func TestTimeScaleWallClock(t *testing.T) {
	f := newFake(t, "i", nil)
	start := time.Now()
	res, err := Run(t.Context(), Options{Targets: []string{f.URL}, Workload: smallPreset(), Rate: 20, Duration: 2 * time.Second, TimeScale: 10, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	wall := time.Since(start)
	// Poisson(40): below 15 or above 80 has negligible odds; unscaled
	// arrivals (20 req/s over 0.2 s wall) would send about 4.
	if res.Requests < 15 || res.Requests > 80 || wall > 1500*time.Millisecond {
		t.Fatalf("%d requests in %v of wall time", res.Requests, wall)
	}
	if res.DurationSec < 1.5 || res.DurationSec > 15 {
		t.Fatalf("measured window %.2f s of server time, want about 2", res.DurationSec)
	}
	if got := float64(res.Succeeded) / res.DurationSec; math.Abs(res.ThroughputRPS-got) > 1e-9 || res.ThroughputRPS > 60 {
		t.Fatalf("throughput %.2f req/s, %d ok over %.2f s", res.ThroughputRPS, res.Succeeded, res.DurationSec)
	}

	slow := newFake(t, "slow", func(f *fakeServer) { f.firstDelay = 5 * time.Second })
	start = time.Now()
	res, err = Run(t.Context(), Options{Targets: []string{slow.URL}, Workload: smallPreset(), Requests: 1, Timeout: time.Second, TimeScale: 10})
	if err != nil {
		t.Fatal(err)
	}
	wall = time.Since(start)
	if res.Errors[ErrKindTimeout] != 1 || wall > 900*time.Millisecond {
		t.Fatalf("errors %v after %v of wall time, want a timeout after about 100 ms", res.Errors, wall)
	}
	if e2e := res.Samples[0].E2EMs; e2e < 950 || e2e > 5000 {
		t.Fatalf("timed-out request reported at %.0f ms, want about 1000 (server time)", e2e)
	}
}

func TestTimeScaleInReports(t *testing.T) {
	const note = "time scale 10× (figures in simulated time)"
	fast := &Result{Label: "fast", Preset: "p", TimeScale: 10}
	rt := &Result{Label: "real", Preset: "p"}
	var tab bytes.Buffer
	if err := fast.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tab.String(), note) {
		t.Fatalf("table lacks %q:\n%s", note, tab.String())
	}
	tab.Reset()
	if err := rt.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(tab.String(), "time scale") {
		t.Fatalf("real-time table mentions a time scale:\n%s", tab.String())
	}
	tests := []struct {
		name string
		runs []*Result
		want []string
		not  []string
	}{
		{"mixed", []*Result{fast, rt}, []string{"fast / p: " + note}, []string{"real / p: time", "all runs"}},
		{"all scaled", []*Result{fast, {Label: "also", Preset: "p", TimeScale: 10}}, []string{"all runs: " + note}, []string{"fast / p: time"}},
		{"real time", []*Result{rt}, nil, []string{"time scale", "Time scale"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Comparison{Runs: tt.runs}
			var md, html bytes.Buffer
			if err := c.WriteMarkdown(&md); err != nil {
				t.Fatal(err)
			}
			if err := c.WriteHTML(&html); err != nil {
				t.Fatal(err)
			}
			for _, out := range []string{md.String(), html.String()} {
				for _, w := range tt.want {
					if !strings.Contains(out, w) {
						t.Fatalf("lacks %q:\n%s", w, out)
					}
				}
				for _, n := range tt.not {
					if strings.Contains(out, n) {
						t.Fatalf("has %q:\n%s", n, out)
					}
				}
			}
		})
	}
}
