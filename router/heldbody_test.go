package router

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

// TestBodyArena: buffers are lent within the limit, in arrival order, reused
// once given back; a dropped buffer returns its budget without reuse; a wait
// that runs out is errArenaFull.
func TestBodyArena(t *testing.T) {
	a := newBodyArena(1<<20, 600<<10, DefaultBodyBufferWait)
	ctx := context.Background()
	if c := a.class(1); c != minHeldClass {
		t.Fatalf("class(1) = %d", c)
	}
	if c := a.class(300 << 10); c != 512<<10 {
		t.Fatalf("class(300 KiB) = %d", c)
	}
	if c := a.class(590 << 10); c != 600<<10 {
		t.Fatalf("class(590 KiB) = %d, want the top", c)
	}
	h1, err := a.acquire(ctx, 512<<10) // 512 KiB of 1 MiB
	if err != nil {
		t.Fatal(err)
	}
	h2, err := a.acquire(ctx, 400<<10) // 512 KiB: the budget is taken
	if err != nil {
		t.Fatal(err)
	}
	// Two waiters, the large one first: the small one waits behind it.
	got := make(chan string, 2)
	var wg sync.WaitGroup
	for _, w := range []struct {
		name string
		n    int
	}{{"large", 600 << 10}, {"small", 100 << 10}} {
		wg.Go(func() {
			h, err := a.acquire(ctx, w.n)
			if err != nil {
				t.Error(err)
				return
			}
			got <- w.name
			a.recycle(h)
		})
		// In line before the next one starts.
		want := 1
		if w.name == "small" {
			want = 2
		}
		testsupport.Eventually(t, 5*time.Second, w.name+" in line", func() bool {
			a.mu.Lock()
			defer a.mu.Unlock()
			return len(a.waiters) == want
		})
	}
	a.recycle(h1) // 512 KiB idle: not enough for the large one (600 KiB)
	select {
	case name := <-got:
		t.Fatalf("%s served while the large one waits for room", name)
	default:
	}
	a.drop(h2) // budget back: the idle 512 KiB buffer is dropped for the large one
	wg.Wait()
	if first, second := <-got, <-got; first+second != "largesmall" && first+second != "smalllarge" {
		t.Fatalf("served %s and %s", first, second)
	}
	if a.size > a.limit {
		t.Fatalf("arena holds %d bytes, over its limit %d", a.size, a.limit)
	}
	// A buffer given back is lent again.
	h3, _ := a.acquire(ctx, 600<<10)
	h3.buf = append(h3.buf, 'x')
	a.recycle(h3)
	h4, _ := a.acquire(ctx, 600<<10)
	if &h4.buf[:1][0] != &h3.buf[0] {
		t.Fatal("a recycled buffer was not reused")
	}
	// A wait that runs out.
	fired := make(chan time.Time)
	a.after = func(time.Duration) <-chan time.Time { return fired }
	h5, _ := a.acquire(ctx, 100<<10) // the idle 128 KiB buffer: 728 KiB held
	errc := make(chan error, 1)
	go func() {
		_, err := a.acquire(ctx, 600<<10)
		errc <- err
	}()
	close(fired)
	if err := <-errc; err != errArenaFull {
		t.Fatalf("wait ran out: %v, want errArenaFull", err)
	}
	a.recycle(h4)
	a.recycle(h5)
	// The request's end drops a buffer not given back.
	cctx, cancel := context.WithCancel(ctx)
	h6, _ := a.acquire(cctx, 100<<10)
	before := a.size
	cancel()
	testsupport.Eventually(t, 5*time.Second, "the buffer dropped", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return h6.done
	})
	if a.size != before-int64(cap(h6.buf)) {
		t.Fatalf("size %d after the drop, want %d", a.size, before-int64(cap(h6.buf)))
	}
}

// modelLast is a chat body of about n bytes whose model comes after the
// messages, as OpenAI's Python SDK writes it.
func modelLast(n int, model string) string {
	return `{"messages":[{"role":"user","content":"` + strings.Repeat("w", n) + `"}],"model":"` + model + `"}`
}

// TestHeldBodiesRouteAndReturn: bodies whose model comes after their first
// 64 KiB route by that model through the arena, reach the instance whole,
// and give their buffer back; with a budget for two at a time, 12
// concurrent ones all pass (waiting their turn); a malformed one is a 400;
// with the budget held and no room coming, one is a 503 naming the buffer.
func TestHeldBodiesRouteAndReturn(t *testing.T) {
	var mu sync.Mutex
	got := map[string]int{} // body length by model
	backend := func(id string) *backend {
		b := newBackend(t, id)
		b.handler = func(w http.ResponseWriter, r *http.Request) {
			raw, _ := io.ReadAll(r.Body)
			var v struct{ Model string }
			if err := json.Unmarshal(raw, &v); err != nil {
				t.Errorf("%s received an invalid body of %d bytes: %v", id, len(raw), err)
			}
			mu.Lock()
			got[id+"/"+v.Model] = len(raw)
			mu.Unlock()
			_, _ = io.WriteString(w, `{}`)
		}
		return b
	}
	base, lora := backend("base-0"), backend("lora-0")
	r, err := New(Options{DefaultEndpoint: "ep", Logger: slog.New(slog.DiscardHandler), MaxBodyBytes: 1 << 20, BodyBufferBytes: 2 * int64(heldNeed(1<<20, 1<<20))})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Instances: []fleet.Instance{
		{ID: "base-0", Addr: base.srv.URL, Labels: map[string]string{"model": "base"}},
		{ID: "lora-0", Addr: lora.srv.URL, Labels: map[string]string{"model": "base"}, Adapters: []string{"lora-x"}},
	}}}, 0, 1, time.Now()))
	srv := httptest.NewServer(r)
	defer srv.Close()
	post := func(body string) (int, string) {
		resp, err := srv.Client().Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get(HeaderInstance) + " " + string(b)
	}
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			body := modelLast(900<<10-i, "lora-x")
			if code, from := post(body); code != 200 || !strings.HasPrefix(from, "lora-0") {
				t.Errorf("body %d: %d from %s", i, code, from)
			}
		})
	}
	wg.Wait()
	if n := got["lora-0/lora-x"]; n < 800<<10 {
		t.Fatalf("the instance got %d bytes of a model-last body", n)
	}
	r.arena.mu.Lock()
	lent, size := len(r.arena.lent), r.arena.size
	r.arena.mu.Unlock()
	if lent != 0 || size > 2*int64(heldNeed(1<<20, 1<<20)) {
		t.Fatalf("after the bodies: %d buffers lent, %d bytes held; want 0 and at most the budget", lent, size)
	}
	if code, msg := post(modelLast(200<<10, "lora-x")[:200<<10+30] + `,"model":"lora-x"}`); code != 400 {
		t.Fatalf("malformed held body: %d %s", code, msg)
	}
	// Hold the whole budget, and let the wait run out at once.
	h1, _ := r.arena.acquire(context.Background(), heldNeed(1<<20, 1<<20))
	h2, _ := r.arena.acquire(context.Background(), heldNeed(1<<20, 1<<20))
	fired := make(chan time.Time)
	close(fired)
	r.arena.after = func(time.Duration) <-chan time.Time { return fired }
	code, msg := post(modelLast(200<<10, "base"))
	if code != http.StatusServiceUnavailable || !strings.Contains(msg, codeBodyBuffer) {
		t.Fatalf("with no room: %d %s, want 503 %s", code, msg, codeBodyBuffer)
	}
	r.arena.recycle(h1)
	r.arena.recycle(h2)
	if code, from := post(modelLast(200<<10, "base")); code != 200 {
		t.Fatalf("after room came back: %d %s", code, from)
	}
}

// TestHeldBodyBounded: the ext_proc picker's held bodies (issue 19: each
// OpenAI body was held whole, outside any bound, until its end) are held
// as the HTTP data plane holds them. A body whose model comes first is
// picked on its head, before its end; one whose model is last is held past
// 64 KiB in a buffer lent by the arena, within its budget; with the budget
// taken and no room coming, a third is refused with 503 body_buffer_full;
// released buffers go back.
func TestHeldBodyBounded(t *testing.T) {
	r, err := New(Options{DefaultEndpoint: "ep", Logger: slog.New(slog.DiscardHandler), MaxBodyBytes: 1 << 20, BodyBufferBytes: 2 * int64(heldNeed(1<<20, 1<<20))})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Instances: []fleet.Instance{{ID: "i", Addr: "http://127.0.0.1:9"}}}}, 0, 1, time.Now()))
	const path = "/v1/chat/completions"
	// feed holds body in chunks, asking for a pick after each; ends: the
	// body's last chunk ends the request's.
	feed := func(b *HeldBody, body string, chunk int, ends bool) (*Picked, error) {
		for i := 0; i < len(body); i += chunk {
			if err := b.Append([]byte(body[i:min(i+chunk, len(body))])); err != nil {
				return nil, err
			}
			p, err := r.Pick(PickRequest{Path: path, Held: b, Complete: ends && i+chunk >= len(body)})
			if !errors.Is(err, ErrNeedBody) {
				return p, err
			}
		}
		return nil, ErrNeedBody
	}
	// Model and prompt_cache_key first: picked on the head.
	early := r.HoldBody(context.Background(), path, 600<<10)
	// (The prompt's first message holds the key's prefix: a message is
	// hashed once it is whole.)
	first := `{"model":"m","prompt_cache_key":null,"messages":[{"role":"system","content":"` + strings.Repeat("s", 40<<10) + `"},{"role":"user","content":"` + strings.Repeat("w", 600<<10) + `"}]}`
	p, err := feed(early, first, 4<<10, true)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(early.Bytes()); n >= 128<<10 {
		t.Fatalf("a body with model first was picked after %d of its %d bytes, want on a head under 128 KiB", n, len(first))
	}
	p.Done(200)
	early.Release()
	// Model last: held in the arena, two at a time.
	var held []*HeldBody
	for range 2 {
		b := r.HoldBody(context.Background(), path, 900<<10)
		if _, err := feed(b, modelLast(900<<10, "m")[:850<<10], 64<<10, false); !errors.Is(err, ErrNeedBody) {
			t.Fatalf("a model-last body before its end: %v, want ErrNeedBody", err)
		}
		held = append(held, b)
	}
	r.arena.mu.Lock()
	lent, size := len(r.arena.lent), r.arena.size
	r.arena.mu.Unlock()
	if lent != 2 || size > r.arena.limit {
		t.Fatalf("two held bodies: %d arena buffers lent, %d bytes; want 2, at most %d", lent, size, r.arena.limit)
	}
	fired := make(chan time.Time)
	close(fired)
	r.arena.after = func(time.Duration) <-chan time.Time { return fired }
	third := r.HoldBody(context.Background(), path, 900<<10)
	_, err = feed(third, modelLast(900<<10, "m"), 64<<10, true)
	var rej *Rejection
	if !errors.As(err, &rej) || rej.Status != http.StatusServiceUnavailable || !strings.Contains(string(rej.Body), codeBodyBuffer) {
		t.Fatalf("a third held body with no room: %v, want 503 %s", err, codeBodyBuffer)
	}
	third.Release()
	for _, b := range held {
		b.Release()
	}
	r.arena.mu.Lock()
	lent = len(r.arena.lent)
	r.arena.mu.Unlock()
	if lent != 0 {
		t.Fatalf("%d arena buffers still lent after Release", lent)
	}
}
