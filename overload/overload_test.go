package overload

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// TestClassify is the rule's table (outcome.go): which outcomes count
// against a breaker.
func TestClassify(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	tests := []struct {
		name string
		err  error
		want Verdict
	}{
		{"success", nil, Served},
		{"200", UpstreamStatus(200), Served},
		{"400", UpstreamStatus(400), Served},
		{"404", UpstreamStatus(404), Served},
		{"413", UpstreamStatus(413), Served},
		{"429", UpstreamStatus(429), Served},
		{"500", UpstreamStatus(500), ServerError},
		{"500 with a key", UpstreamStatusFor(500, 7), ServerError},
		{"501", UpstreamStatus(501), Served},
		{"502", UpstreamStatus(502), Failed},
		{"503", UpstreamStatus(503), Failed},
		{"504", UpstreamStatus(504), Failed},
		{"505", UpstreamStatus(505), Served},
		{"507", UpstreamStatus(507), ServerError},
		{"dial", dial, Failed},
		{"timeout", context.DeadlineExceeded, Failed},
		{"reset", errors.New("read: connection reset by peer"), Failed},
		{"client canceled", context.Canceled, Unjudged},
		{"client canceled wrapped", fmt.Errorf("copy: %w", context.Canceled), Unjudged},
		{"client gone", ErrClientGone, Unjudged},
		{"not judged", fmt.Errorf("%w: %w", ErrNotJudged, context.DeadlineExceeded), Unjudged},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Classify(tc.err); got != tc.want {
				t.Errorf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
			}
			if got, want := IsFailure(tc.err), tc.want == Failed || tc.want == ServerError; got != want {
				t.Errorf("IsFailure(%v) = %v, want %v", tc.err, got, want)
			}
			if got, want := IsExcluded(tc.err), tc.want == Unjudged; got != want {
				t.Errorf("IsExcluded(%v) = %v, want %v", tc.err, got, want)
			}
		})
	}
}

func TestReplicaShare(t *testing.T) {
	tests := []struct{ t, r, want int }{
		{10, 1, 10}, {10, 2, 5}, {10, 3, 4}, {10, 10, 1}, {10, 20, 1}, {1, 5, 1}, {0, 1, 1}, {7, 0, 7},
	}
	for _, tc := range tests {
		got := ReplicaShare(tc.t, tc.r)
		if got != tc.want {
			t.Errorf("ReplicaShare(%d,%d) = %d, want %d", tc.t, tc.r, got, tc.want)
		}
		r := max(tc.r, 1)
		if tc.t >= 1 && r*got > tc.t+r-1 {
			t.Errorf("bound violated: %d*%d > %d+%d-1", r, got, tc.t, r)
		}
	}
}

func TestBreakerOptions(t *testing.T) {
	defaults := BreakerOptions{
		ConsecutiveFailures: DefaultConsecutiveFailures, OpenTimeout: DefaultOpenTimeout, HalfOpenMaxRequests: DefaultHalfOpenMaxRequests,
		ServerErrorKeys: DefaultServerErrorKeys, ServerErrorWindow: DefaultServerErrorWindow, MaxEjectionPercent: DefaultMaxEjectionPercent,
	}
	set := BreakerOptions{ConsecutiveFailures: 2, OpenTimeout: time.Second, HalfOpenMaxRequests: 3, ServerErrorKeys: 1, ServerErrorWindow: time.Minute, MaxEjectionPercent: 100}
	with := func(f func(*BreakerOptions)) BreakerOptions { o := defaults; f(&o); return o }
	tests := []struct {
		in      BreakerOptions
		want    BreakerOptions
		wantErr string
	}{
		{BreakerOptions{}, defaults, ""},
		{set, set, ""},
		{BreakerOptions{OpenTimeout: -1}, with(func(o *BreakerOptions) { o.OpenTimeout = -1 }), "OpenTimeout"},
		{BreakerOptions{ServerErrorKeys: -1}, with(func(o *BreakerOptions) { o.ServerErrorKeys = -1 }), "ServerErrorKeys -1 is negative"},
		{BreakerOptions{ServerErrorWindow: -1}, with(func(o *BreakerOptions) { o.ServerErrorWindow = -1 }), "ServerErrorWindow"},
		{BreakerOptions{MaxEjectionPercent: 101}, with(func(o *BreakerOptions) { o.MaxEjectionPercent = 101 }), "--max-ejection-percent) 101 is outside 1..100"},
		{BreakerOptions{MaxEjectionPercent: -5}, with(func(o *BreakerOptions) { o.MaxEjectionPercent = -5 }), "--max-ejection-percent) -5"},
	}
	for _, tc := range tests {
		if got := tc.in.withDefaults(); got != tc.want {
			t.Errorf("withDefaults(%+v) = %+v, want %+v", tc.in, got, tc.want)
		}
		err := tc.in.Validate()
		if (err != nil) != (tc.wantErr != "") || (err != nil && (!strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, fleet.ErrInvalid))) {
			t.Errorf("Validate(%+v) = %v, want an fleet.ErrInvalid error containing %q", tc.in, err, tc.wantErr)
		}
	}
}

func TestTrafficShare(t *testing.T) {
	tests := []struct {
		t          int
		own, total float64
		want       int
	}{
		{8, 1, 2, 4},   // half the traffic: half the threshold, no rounding up of an exact quotient
		{8, 3, 4, 6},   // a skewed DNS share
		{8, 0.7, 1, 6}, // ceil(5.6)
		{8, 1, 100, 1}, // a light replica keeps one
		{8, 0, 10, 1},  // no traffic of its own yet
		{8, 5, 5, 8},   // alone
		{8, 6, 5, 8},   // a local rate above a stale total: never above t
		{8, 5, 0, 8},   // nothing published: nothing to share with
		{8, 1, math.NaN(), 8},
		{0, 1, 2, 1},
		{1, 1, 32, 1},
		{32, 24, 32, 24},
	}
	for _, tc := range tests {
		if got := TrafficShare(tc.t, tc.own, tc.total); got != tc.want {
			t.Errorf("TrafficShare(%d, %v, %v) = %d, want %d", tc.t, tc.own, tc.total, got, tc.want)
		}
	}
	// Shares of replicas that carry all the traffic sum to at most t plus
	// one per replica (each rounds up by less than one).
	rates := []float64{70, 10, 10, 5, 3, 1, 1}
	total, sum := 0.0, 0
	for _, r := range rates {
		total += r
	}
	for _, r := range rates {
		sum += TrafficShare(10, r, total)
	}
	if sum > 10+len(rates) {
		t.Errorf("shares sum to %d, above t + r = %d", sum, 10+len(rates))
	}
}

func TestTryAcquireThreshold(t *testing.T) {
	tests := []struct {
		threshold, share int
		external         int64
		admitted         int
	}{
		{threshold: 4, share: 4, external: -1, admitted: 4},
		{threshold: 4, share: 2, external: -1, admitted: 2},
		{threshold: 4, share: 1, external: -1, admitted: 1},
		{threshold: 4, share: 0, external: -1, admitted: 1}, // a share is at least 1
		{threshold: 4, share: 4, external: 1, admitted: 3},  // known load: within the whole threshold
		{threshold: 4, share: 2, external: 1, admitted: 2},  // ... and within the share: a burst between polls stays bounded
		{threshold: 4, share: 4, external: 4, admitted: 0},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("T%d_share%d_ext%d", tc.threshold, tc.share, tc.external), func(t *testing.T) {
			s := NewState("a", BreakerOptions{})
			s.SetExternalLoad(tc.external)
			l := Limit{Threshold: tc.threshold, Share: tc.share}
			var dones []Done
			for range tc.threshold + 5 {
				if d, ok := s.TryAcquire(l); ok {
					dones = append(dones, d)
				}
			}
			if len(dones) != tc.admitted {
				t.Fatalf("admitted %d, want %d", len(dones), tc.admitted)
			}
			if n := s.Sent(); n != uint64(tc.admitted) {
				t.Fatalf("sent %d, want the %d admitted (refused requests are not sent)", n, tc.admitted)
			}
			if s.HasRoom(l) {
				t.Fatal("HasRoom after filling")
			}
			for _, d := range dones {
				d(nil)
				d(nil) // second call ignored
			}
			if n := s.InFlight(); n != 0 {
				t.Fatalf("in flight %d after release", n)
			}
		})
	}
}

func TestTryAcquireBounded(t *testing.T) {
	tests := []struct {
		threshold int
		external  int64
		bound     int64
		admitted  int
	}{
		{threshold: 10, external: -1, bound: 0, admitted: 10}, // no bound: threshold only
		{threshold: 10, external: -1, bound: 3, admitted: 3},  // load before each < 3
		{threshold: 2, external: -1, bound: 5, admitted: 2},   // threshold tighter
		{threshold: 10, external: 2, bound: 3, admitted: 1},   // external counts: 2+0 < 3, 2+1 ≥ 3
		{threshold: 10, external: 3, bound: 3, admitted: 0},
		{threshold: 10, external: 0, bound: 1, admitted: 1}, // bound ≥ 1 admits an idle instance
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("T%d_ext%d_bound%d", tc.threshold, tc.external, tc.bound), func(t *testing.T) {
			s := NewState("a", BreakerOptions{})
			s.SetExternalLoad(tc.external)
			var dones []Done
			for range tc.threshold + 5 {
				if d, ok := s.TryAcquireBounded(Whole(tc.threshold), tc.bound); ok {
					dones = append(dones, d)
				}
			}
			if len(dones) != tc.admitted {
				t.Fatalf("admitted %d, want %d", len(dones), tc.admitted)
			}
			if n := s.Sent(); n != uint64(tc.admitted) {
				t.Fatalf("sent %d, want the %d admitted (refused requests are not sent)", n, tc.admitted)
			}
			for _, d := range dones {
				d(nil)
			}
			if n := s.InFlight(); n != 0 {
				t.Fatalf("in flight %d after release", n)
			}
		})
	}
}

func TestTryAcquireConcurrentNeverOvershoots(t *testing.T) {
	s := NewState("a", BreakerOptions{})
	const threshold = 8
	var peak, cur atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				d, ok := s.TryAcquire(Whole(threshold))
				if !ok {
					continue
				}
				n := cur.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				cur.Add(-1)
				d(nil)
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > threshold {
		t.Fatalf("peak %d above threshold %d", p, threshold)
	}
	if n := s.InFlight(); n != 0 {
		t.Fatalf("in flight %d", n)
	}
}

// TestBreakerOpensAndRecovers runs in a synctest bubble: gobreaker reads
// time.Now itself, so the bubble's fake clock is what moves both the breaker
// and State's mirror of it through the open timeout, in no real time.
func TestBreakerOpensAndRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 10 * time.Second
		s := NewState("a", BreakerOptions{ConsecutiveFailures: 3, OpenTimeout: timeout})
		dial := &net.OpError{Op: "dial", Err: errors.New("refused")}
		for i := range 3 {
			d, ok := s.Acquire()
			if !ok {
				t.Fatalf("attempt %d rejected before the breaker opened", i)
			}
			d(dial)
		}
		if !s.Open() || s.Status().Breaker != gobreaker.StateOpen {
			t.Fatalf("breaker not open after 3 failures: %v", s.Status().Breaker)
		}
		if _, ok := s.Acquire(); ok {
			t.Fatal("open breaker admitted")
		}
		if _, ok := s.TryAcquire(Whole(10)); ok {
			t.Fatal("open breaker admitted under threshold")
		}
		time.Sleep(timeout - time.Nanosecond)
		if !s.Open() {
			t.Fatal("breaker reported closed before its open timeout")
		}
		if _, ok := s.Acquire(); ok {
			t.Fatal("open breaker admitted before its open timeout")
		}
		// gobreaker half-opens once its expiry is strictly in the past.
		time.Sleep(2 * time.Nanosecond)
		if s.Open() {
			t.Fatal("breaker still reported open after its open timeout")
		}
		probe, ok := s.Acquire()
		if !ok {
			t.Fatal("half-open breaker rejected the probe")
		}
		if st := s.Status().Breaker; st != gobreaker.StateHalfOpen {
			t.Fatalf("breaker %v while its probe is out, want half-open", st)
		}
		if _, ok := s.Acquire(); ok {
			t.Fatal("half-open breaker admitted a second probe")
		}
		probe(nil)
		if st := s.Status().Breaker; st != gobreaker.StateClosed {
			t.Fatalf("breaker %v after a successful probe, want closed", st)
		}
		if n := s.InFlight(); n != 0 {
			t.Fatalf("in flight %d", n)
		}
	})
}

// TestBreakerReopensOnFailedProbe: a failed probe of a half-open breaker
// opens it again for a whole open timeout.
func TestBreakerReopensOnFailedProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 10 * time.Second
		s := NewState("a", BreakerOptions{ConsecutiveFailures: 1, OpenTimeout: timeout})
		d, _ := s.Acquire()
		d(UpstreamStatus(503))
		time.Sleep(timeout + time.Nanosecond)
		probe, ok := s.Acquire()
		if !ok {
			t.Fatal("half-open breaker rejected the probe")
		}
		probe(UpstreamStatus(502))
		if !s.Open() || s.Status().Breaker != gobreaker.StateOpen {
			t.Fatalf("breaker %v after a failed probe, want open", s.Status().Breaker)
		}
		time.Sleep(timeout - time.Nanosecond)
		if _, ok := s.Acquire(); ok {
			t.Fatal("reopened breaker admitted before a new open timeout")
		}
		time.Sleep(2 * time.Nanosecond)
		if _, ok := s.Acquire(); !ok {
			t.Fatal("reopened breaker rejected the probe after its open timeout")
		}
	})
}

func TestClientCancelIsNotAFailure(t *testing.T) {
	s := NewState("a", BreakerOptions{ConsecutiveFailures: 2, OpenTimeout: time.Hour})
	for range 10 {
		d, ok := s.Acquire()
		if !ok {
			t.Fatal("rejected")
		}
		d(fmt.Errorf("proxy: %w", context.Canceled))
	}
	if st := s.Status().Breaker; st != gobreaker.StateClosed {
		t.Fatalf("breaker %v after client cancels", st)
	}
	// 4xx and 501 are the client's fault too.
	for _, code := range []int{400, 404, 413, 501, 505} {
		d, _ := s.Acquire()
		d(UpstreamStatus(code))
	}
	if st := s.Status().Breaker; st != gobreaker.StateClosed {
		t.Fatalf("breaker %v after client errors", st)
	}
	for range 2 {
		d, _ := s.Acquire()
		d(UpstreamStatus(503))
	}
	if st := s.Status().Breaker; st != gobreaker.StateOpen {
		t.Fatalf("breaker %v after two 503s, want open", st)
	}
}

func TestTrackerSyncKeepsState(t *testing.T) {
	tr := NewTracker(BreakerOptions{})
	m := tr.Sync([]string{"a", "b"})
	a := m["a"]
	d, _ := a.Acquire()
	m2 := tr.Sync([]string{"a", "c"})
	if m2["a"] != a || a.InFlight() != 1 {
		t.Fatal("instance a lost its state across Sync")
	}
	if tr.Get("b") != nil {
		t.Fatal("b not dropped")
	}
	if tr.Get("c") == nil || tr.Get("c").InFlight() != 0 {
		t.Fatal("c missing or not fresh")
	}
	if len(m) != 2 {
		t.Fatal("Sync modified a published map")
	}
	d(nil)
	if a.InFlight() != 0 {
		t.Fatal("leak")
	}
}

func BenchmarkTryAcquire(b *testing.B) {
	s := NewState("a", BreakerOptions{})
	b.ReportAllocs()
	for b.Loop() {
		d, ok := s.TryAcquire(Whole(10))
		if !ok {
			b.Fatal("rejected")
		}
		d(nil)
	}
}

func BenchmarkTryAcquireParallel(b *testing.B) {
	tr := NewTracker(BreakerOptions{})
	ids := make([]string, 16)
	for i := range ids {
		ids[i] = fmt.Sprintf("i%d", i)
	}
	tr.Sync(ids)
	b.ReportAllocs()
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		s := tr.Get(ids[int(n.Add(1))%len(ids)])
		for pb.Next() {
			if d, ok := s.TryAcquire(Whole(1024)); ok {
				d(nil)
			}
		}
	})
}
