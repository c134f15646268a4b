package router

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/overload"
)

func TestBalanceBound(t *testing.T) {
	for _, tc := range []struct {
		factor float64
		total  int64
		n      int
		want   int64
	}{
		{1.25, 0, 3, 1},   // idle: ceil(1.25/3)
		{1.25, 1, 3, 1},   // ceil(2.5/3)
		{1.25, 2, 3, 2},   // ceil(3.75/3)
		{1.25, 99, 4, 32}, // ceil(125/4) = 31.25 → 32
		{1, 3, 4, 1},      // exact: 4/4
		{1.1, 9, 11, 1},   // exact 1.1×10/11 = 1; float math gives 1.0000000000000002
		{2, 0, 1, 2},
		{10, 63, 64, 10},
		{1.25, 5, 0, 0}, // empty set: no bound
	} {
		milli := int64(math.Round(tc.factor * 1000))
		if got := balanceBound(milli, tc.total, tc.n); got != tc.want {
			t.Errorf("balanceBound(%v, %d, %d) = %d, want %d", tc.factor, tc.total, tc.n, got, tc.want)
		}
	}
}

func TestNewValidatesBalanceFactor(t *testing.T) {
	for _, tc := range []struct {
		f  float64
		ok bool
	}{
		{0, true}, {1, true}, {1.25, true}, {10, true},
		{-1, false}, {0.5, false}, {0.999, false}, {10.01, false}, {math.NaN(), false}, {math.Inf(1), false},
	} {
		r, err := New(Options{DefaultEndpoint: "e", BalanceFactor: tc.f})
		if (err == nil) != tc.ok {
			t.Errorf("New(BalanceFactor %v): err %v, want ok=%v", tc.f, err, tc.ok)
		}
		if r != nil {
			r.Close()
		}
	}
}

// ringOrder returns the instance ids in the key's candidate order of the
// base set.
func ringOrder(t *testing.T, h *harness, key uint64) []string {
	t.Helper()
	set, err := h.r.view.Load().endpoints["ep"].table.Set("")
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, i := range set.Ring().Candidates(key, set.Len(), nil) {
		order = append(order, set.Instance(i).ID)
	}
	return order
}

// newBackends returns n backends, i-0 to i-(n-1).
func newBackends(t *testing.T, n int) []*backend {
	var bs []*backend
	for i := range n {
		bs = append(bs, newBackend(t, fmt.Sprintf("i-%d", i)))
	}
	return bs
}

// holdPicks picks n times for the key of body on endpoint "ep", with hot,
// and holds every pick until the test ends (it releases them, before the
// harness closes). It returns the key's ring order.
func holdPicks(t *testing.T, h *harness, body string, hot hotChoice, n int) []string {
	t.Helper()
	rr, _ := parseRequest(kindInvoke, http.Header{}, []byte(body), 1024)
	order := ringOrder(t, h, rr.key)
	v := h.r.view.Load()
	ev := v.endpoints["ep"]
	set, _ := ev.table.Set("")
	dones := make([]overload.Done, 0, n)
	t.Cleanup(func() {
		for _, d := range dones {
			d(nil)
		}
	})
	for range n {
		p, ok := h.r.pickKey(ev, set, rr.key, hot, v.snap.Replicas, bitset{})
		if !ok {
			t.Fatal("no pick")
		}
		dones = append(dones, p.done)
	}
	return order
}

// TestBalanceSpillAndReturn runs real HTTP: one request blocked on the
// primary puts it at the bound (ceil(1.25×2/3) = 1), so with a balance
// factor the next request spills to the next candidate, and returns to the
// primary once the blocked one drains. Without a factor the threshold (100)
// alone applies and the request stays on the primary.
func TestBalanceSpillAndReturn(t *testing.T) {
	for _, tc := range []struct {
		balance      float64
		wantWhenBusy string // DecisionAffinity or DecisionSpill
	}{
		{0, DecisionAffinity},
		{1.25, DecisionSpill},
	} {
		t.Run(fmt.Sprint("balance=", tc.balance), func(t *testing.T) {
			h := newHarness(t, hopts{cfg: prefixCfg(100), balance: tc.balance}, threeBackends(t)...)
			body := strings.Repeat("balance me ", 200)
			rr, _ := parseRequest(kindInvoke, http.Header{}, []byte(body), 1024)
			order := ringOrder(t, h, rr.key)

			var wg sync.WaitGroup
			var blocked result
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := h.do(context.Background(), "/invocations", body, map[string]string{"X-Test-Block": "1"})
				if err != nil {
					t.Error(err)
				}
				blocked = res
			}()
			primary := h.bySrvID[order[0]]
			testsupport.Eventually(t, 10*time.Second, "blocked request on the primary", func() bool { return primary.blocked.Load() == 1 })

			res := h.mustDo("/invocations", body, nil)
			want := order[0]
			if tc.wantWhenBusy == DecisionSpill {
				want = order[1]
			}
			if res.status != 200 || res.instance != want || res.decision != tc.wantWhenBusy {
				t.Fatalf("primary busy: status %d, went to %s (%s), want %s (%s)", res.status, res.instance, res.decision, want, tc.wantWhenBusy)
			}

			close(primary.release)
			wg.Wait()
			if blocked.instance != order[0] || blocked.decision != DecisionAffinity {
				t.Fatalf("blocked request went to %s (%s), want primary %s", blocked.instance, blocked.decision, order[0])
			}
			h.assertIdle()
			res = h.mustDo("/invocations", body, nil)
			if res.instance != order[0] || res.decision != DecisionAffinity {
				t.Fatalf("after drain went to %s (%s), want primary %s", res.instance, res.decision, order[0])
			}
		})
	}
}

// TestBalancePickLoads checks the admission rule on pick with loads set as
// external load (the poller's path) on the candidates in ring order.
func TestBalancePickLoads(t *testing.T) {
	for _, tc := range []struct {
		name      string
		balance   float64
		threshold int
		loads     [3]int64 // external load of order[0], order[1], order[2]
		wantIdx   int      // index into order
		want      string
	}{
		{"idle", 1.25, 100, [3]int64{0, 0, 0}, 0, DecisionAffinity},
		{"primary at bound", 1.25, 100, [3]int64{1, 0, 0}, 1, DecisionSpill},       // bound ceil(2.5/3) = 1
		{"primary below bound", 1.25, 100, [3]int64{1, 1, 0}, 0, DecisionAffinity}, // bound ceil(3.75/3) = 2
		{"two at bound", 1.25, 100, [3]int64{4, 4, 0}, 2, DecisionSpill},           // bound ceil(11.25/3) = 4
		{"even load", 1.25, 100, [3]int64{5, 5, 5}, 0, DecisionAffinity},           // bound ceil(20/3) = 7
		{"factor 2", 2, 100, [3]int64{2, 1, 0}, 0, DecisionAffinity},               // bound ceil(8/3) = 3
		{"factor 2 at bound", 2, 100, [3]int64{4, 0, 0}, 1, DecisionSpill},         // bound ceil(10/3) = 4
		{"off", 0, 100, [3]int64{50, 0, 0}, 0, DecisionAffinity},
		{"threshold still applies", 1.25, 5, [3]int64{5, 2, 2}, 1, DecisionSpill}, // bound 4; order[0] fails both
		{"threshold fails all: fallback", 1.25, 2, [3]int64{2, 2, 2}, -1, DecisionFallback},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, hopts{cfg: prefixCfg(tc.threshold), balance: tc.balance}, threeBackends(t)...)
			body := []byte(strings.Repeat("pick me ", 100))
			rr, _ := parseRequest(kindInvoke, http.Header{}, body, 1024)
			order := ringOrder(t, h, rr.key)
			for k, id := range order {
				h.state(id).SetExternalLoad(tc.loads[k])
			}
			v := h.r.view.Load()
			ev := v.endpoints["ep"]
			set, _ := ev.table.Set("")
			p, ok := h.r.pickKey(ev, set, rr.key, hotChoice{}, v.snap.Replicas, bitset{})
			if !ok {
				t.Fatal("no pick")
			}
			defer p.done(nil)
			if p.decision != tc.want || (tc.wantIdx >= 0 && p.iv.inst.ID != order[tc.wantIdx]) {
				t.Fatalf("picked %s (%s), want order[%d] (%s); order %v", p.iv.inst.ID, p.decision, tc.wantIdx, tc.want, order)
			}
		})
	}
}

// TestBalanceHotKeySpreads sends one hot key many times without releasing:
// without a factor the primary takes everything up to the threshold; with
// 1.25 no instance ever exceeds the bound of the final total, and the
// primary still holds the most.
func TestBalanceHotKeySpreads(t *testing.T) {
	const n, reqs = 8, 400
	for _, balance := range []float64{0, 1.25} {
		t.Run(fmt.Sprint("balance=", balance), func(t *testing.T) {
			h := newHarness(t, hopts{cfg: prefixCfg(1000), balance: balance}, newBackends(t, n)...)
			order := holdPicks(t, h, "hot prefix", hotChoice{}, reqs)
			maxLoad, primary := int64(0), h.state(order[0]).InFlight()
			for _, id := range order {
				maxLoad = max(maxLoad, h.state(id).InFlight())
			}
			if balance == 0 {
				if primary != reqs {
					t.Fatalf("no factor: primary holds %d of %d", primary, reqs)
				}
				return
			}
			bound := int64(math.Ceil(balance * reqs / n)) // 63
			if maxLoad > bound || primary != maxLoad {
				t.Fatalf("max load %d (primary %d), bound %d", maxLoad, primary, bound)
			}
		})
	}
}
