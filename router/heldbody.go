package router

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"net/http"
	"sync"
	"time"
	"unsafe"
)

// Bodies held before the pick (issue 19). An OpenAI body's key may need
// its end: model and prompt_cache_key may follow the messages (OpenAI's
// Python SDK writes model after messages), and a body without
// prompt_cache_key is known to have none only at its end. Such a body is
// read whole before the pick. 64 concurrent 6 MiB bodies with model last
// took +900 MiB RSS: each grew its own buffer by doubling, and the garbage
// waited for the collector.
//
// Now a body is read into the pooled head buffers up to maxHeadClass
// (64 KiB); one whose key is not known by then is read on into a buffer
// from the router's body arena: one process-wide budget
// (Options.BodyBufferBytes, default 32 MiB) of reusable buffers, sized by
// the body's declared length. The buffer goes back to the arena as soon as
// the instance has been sent the bytes it holds (the body is then no longer
// replayable), not at the end of the answer. When the budget is taken, a
// body waits for room in arrival order for at most Options.BodyBufferWait
// (10 s by default), then is
// refused with 503 (ServiceUnavailable, Retry-After): memory stays bounded
// and the client may retry.

// DefaultBodyBufferBytes is the arena's budget when Options.BodyBufferBytes
// is zero (unless MaxBodyBytes needs more).
const DefaultBodyBufferBytes = 32 << 20

// DefaultBodyBufferWait bounds a body's wait for room in the arena when
// Options.BodyBufferWait is zero.
const DefaultBodyBufferWait = 10 * time.Second

// minHeldClass is the smallest arena buffer: twice the largest head class.
const minHeldClass = 128 << 10

// codeBodyBuffer is the error code of a body refused for want of room.
const codeBodyBuffer = "body_buffer_full"

// errArenaFull is a wait for room that ran out.
var errArenaFull = errors.New("router: no room in the body buffer")

// bodyArena lends the buffers of bodies held before the pick.
type bodyArena struct {
	limit int64         // bytes of buffers made and kept (in use or idle)
	top   int           // the largest buffer: heldNeed(MaxBodyBytes)
	wait  time.Duration // a body's wait for room
	// after starts the wait's timer (time.After; tests shorten it).
	after func(time.Duration) <-chan time.Time

	mu      sync.Mutex         // guards the fields below; taken once or twice per held body, never per request
	size    int64              // capacity of the buffers made and not dropped
	free    map[int][][]byte   // idle buffers by capacity
	lent    map[*byte]*heldBuf // buffers in use, by their first byte
	waiters []*arenaWaiter     // bodies waiting for room, first come first served
}

// arenaWaiter is a body waiting for a buffer of capacity need; buf is set,
// and ready signalled, when one is granted.
type arenaWaiter struct {
	need  int
	buf   []byte
	ready chan struct{}
}

// heldBuf is one lent buffer. Its state changes under the arena's mutex.
type heldBuf struct {
	buf  []byte
	ctx  context.Context // the borrowing request's
	stop func() bool     // stops the request-end watch
	done bool            // given back (recycled) or dropped
}

func newBodyArena(limit int64, top int, wait time.Duration) *bodyArena {
	return &bodyArena{limit: limit, top: top, wait: wait, after: time.After, free: map[int][][]byte{}, lent: map[*byte]*heldBuf{}}
}

// class is the capacity of the buffer for a body of n bytes: a power of
// two from minHeldClass, at most top.
func (a *bodyArena) class(n int) int {
	if n <= minHeldClass {
		return min(minHeldClass, a.top)
	}
	return min(1<<bits.Len(uint(n-1)), a.top)
}

// acquire lends a buffer of at least n bytes (n <= top), waiting for room
// until ctx ends or the arena's wait passes. When ctx ends (the request is
// over, or its client gone) a buffer not given back by then is dropped:
// its budget returns, and the collector takes it once nothing refers to it.
func (a *bodyArena) acquire(ctx context.Context, n int) (*heldBuf, error) {
	w := &arenaWaiter{need: a.class(n), ready: make(chan struct{})}
	a.mu.Lock()
	if len(a.waiters) == 0 {
		if buf, ok := a.takeLocked(w.need); ok {
			a.mu.Unlock()
			return a.lend(ctx, buf), nil
		}
	}
	a.waiters = append(a.waiters, w)
	a.mu.Unlock()
	var err error
	select {
	case <-w.ready:
		return a.lend(ctx, w.buf), nil
	case <-a.after(a.wait):
		err = errArenaFull
	case <-ctx.Done():
		err = ctx.Err()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if w.buf != nil { // granted meanwhile: keep it idle for the next
		a.free[cap(w.buf)] = append(a.free[cap(w.buf)], w.buf)
	}
	for i, x := range a.waiters {
		if x == w {
			a.waiters = append(a.waiters[:i], a.waiters[i+1:]...)
			break
		}
	}
	a.grantLocked()
	return nil, err
}

// lend registers buf as lent for the request of ctx.
func (a *bodyArena) lend(ctx context.Context, buf []byte) *heldBuf {
	h := &heldBuf{buf: buf[:0], ctx: ctx}
	a.mu.Lock()
	a.lent[unsafe.SliceData(buf)] = h
	a.mu.Unlock()
	h.stop = context.AfterFunc(ctx, func() { a.drop(h) })
	return h
}

// takeLocked returns an idle buffer of capacity c, or makes one within the
// limit, dropping idle buffers of other capacities to make room.
func (a *bodyArena) takeLocked(c int) ([]byte, bool) {
	if l := a.free[c]; len(l) > 0 {
		buf := l[len(l)-1]
		a.free[c] = l[:len(l)-1]
		return buf, true
	}
	for size, l := range a.free {
		for a.size+int64(c) > a.limit && len(l) > 0 {
			l = l[:len(l)-1]
			a.size -= int64(size)
		}
		a.free[size] = l
	}
	if a.size+int64(c) > a.limit {
		return nil, false
	}
	a.size += int64(c)
	return make([]byte, c), true
}

// grantLocked serves the waiters in order while there is room; the first
// that does not fit holds the others back (so a large body is not starved
// by small ones).
func (a *bodyArena) grantLocked() {
	for len(a.waiters) > 0 {
		w := a.waiters[0]
		buf, ok := a.takeLocked(w.need)
		if !ok {
			return
		}
		a.waiters = a.waiters[1:]
		w.buf = buf
		close(w.ready)
	}
}

// recycle gives h's buffer back for reuse: nothing reads it any more.
func (a *bodyArena) recycle(h *heldBuf) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if h.done {
		return
	}
	h.done = true
	h.stop()
	full := h.buf[:cap(h.buf)]
	delete(a.lent, unsafe.SliceData(full))
	a.free[cap(full)] = append(a.free[cap(full)], full)
	a.grantLocked()
}

// drop returns h's budget without reusing its buffer, which something may
// still read (the request ended, or its client left, while the instance
// was being sent the body).
func (a *bodyArena) drop(h *heldBuf) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if h.done {
		return
	}
	h.done = true
	delete(a.lent, unsafe.SliceData(h.buf[:cap(h.buf)]))
	a.size -= int64(cap(h.buf))
	a.grantLocked()
}

// lookup returns the buffer b starts in if it is lent to the request of
// ctx, nil otherwise (a head buffer, or an arena buffer already given back
// and maybe lent again).
func (a *bodyArena) lookup(ctx context.Context, b []byte) *heldBuf {
	if cap(b) < minHeldClass && cap(b) < a.top {
		return nil // a head buffer: no lock taken
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if h := a.lent[unsafe.SliceData(b[:cap(b)])]; h != nil && h.ctx == ctx {
		return h
	}
	return nil
}

// fullError is the rejection of a body that found no room.
func (a *bodyArena) fullError(err error) *routeError {
	if errors.Is(err, errArenaFull) {
		return &routeError{http.StatusServiceUnavailable, codeBodyBuffer, fmt.Sprintf("the router holds as many request bodies as its body buffer takes (%d bytes) and none freed room within %v: a body whose model or prompt_cache_key comes after its first 64 KiB is read whole before routing, and so is a hot key's; retry, or put model and prompt_cache_key first", a.limit, a.wait)}
	}
	return &routeError{statusClientClosed, codeBadBody, "the client went away while its body waited for room"}
}

// HeldBody is a request body a front end holds while it arrives, until the
// pick: the ext_proc picker's (issue 19: it held every OpenAI body whole,
// in a buffer grown by doubling outside any bound). It is held as the HTTP
// data plane holds a body it reads: in pooled head buffers up to 64 KiB,
// then in a buffer the body arena lends (waiting for room up to 10 s, then
// 503 body_buffer_full). Pick, given it in PickRequest.Held, decides an
// OpenAI key on the head as the HTTP data plane does, from 16 KiB and at
// each doubling; the front end then sends what it holds and Releases it.
// A HeldBody belongs to the goroutine serving its request.
type HeldBody struct {
	r        *Router
	ctx      context.Context
	kind     apiKind
	declared int64
	buf      []byte
	h        *heldBuf // the arena's buffer buf is in; nil while in a head buffer
	// try is the length from which Pick tries an OpenAI key on the head.
	try int
}

// HoldBody starts holding the body of a request to path (its API, as in
// PickRequest.Path) with context ctx and declared length declared (-1 when
// not declared: chunked). A body declared under 32 KiB is decided on
// whole, as on the HTTP data plane.
func (r *Router) HoldBody(ctx context.Context, path string, declared int64) *HeldBody {
	b := &HeldBody{r: r, ctx: ctx, kind: kindForPath(path), declared: declared, try: openAIHeadStart + 1}
	if declared >= 0 && declared < wholeBody {
		b.try = math.MaxInt
	}
	return b
}

// Append holds p after what the body held. Beyond MaxBodyBytes it keeps
// one byte more and drops the rest: Pick then answers 413. When the arena
// has no room within 10 s (or ctx ends first) it returns a *Rejection.
func (b *HeldBody) Append(p []byte) error {
	limit := int(b.r.opts.MaxBodyBytes) + 1
	p = p[:min(len(p), max(0, limit-len(b.buf)))]
	for len(b.buf)+len(p) > cap(b.buf) {
		if b.h != nil {
			// The arena's buffer holds the declared length and more.
			return b.r.rejectPick(b.kind, "unknown", "", &routeError{http.StatusBadRequest, codeBadBody, "reading the request body: longer than declared"})
		}
		if top := headClasses[len(headClasses)-1]; len(b.buf)+len(p) <= top {
			// Grow by doubling within the head classes.
			next := append(getHead(min(max(len(b.buf)+len(p), 2*cap(b.buf)), top)), b.buf...)
			putHead(b.buf)
			b.buf = next
			continue
		}
		h, err := b.r.arena.acquire(b.ctx, heldNeed(b.declared, b.r.opts.MaxBodyBytes))
		if err != nil {
			return b.r.rejectPick(b.kind, "unknown", "", b.r.arena.fullError(err))
		}
		b.h = h
		next := append(h.buf, b.buf...)
		putHead(b.buf)
		b.buf = next
	}
	b.buf = append(b.buf, p...)
	return nil
}

// Bytes is the body held so far. It is valid until Release.
func (b *HeldBody) Bytes() []byte { return b.buf }

// Release gives the body's buffer back: nothing reads Bytes (or a Picked's
// Body made from it) any more. Calls after the first do nothing.
func (b *HeldBody) Release() {
	if b.h != nil {
		b.r.arena.recycle(b.h)
	} else {
		putHead(b.buf)
	}
	b.buf, b.h = nil, nil
}

// BodiesHeld is how many request bodies hold a buffer of the body arena
// now.
func (r *Router) BodiesHeld() int {
	r.arena.mu.Lock()
	defer r.arena.mu.Unlock()
	return len(r.arena.lent)
}
