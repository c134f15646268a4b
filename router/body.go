package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
)

// Route before the body ends (issue 9). An invoke key needs only the first
// PrefixLength bytes of the body: the router reads those, picks, and then
// streams the rest of the body to the instance while the client is still
// sending it. Memory per in-flight request is then PrefixLength plus the
// transport's write buffer, not the body. Bodies that fit in the head, and
// bodies declared at up to wholeBody bytes, are read whole before the pick
// (replayable, and sent with their headers in one write).

// readHead reads the start of the body: at most need+1 bytes, so that a
// body of need bytes or fewer is known to be complete, or all of a body
// declared at under wholeBody bytes. It returns the bytes
// read and, when the body goes on, the reader of the rest (nil when head is
// the whole body). The limit is enforced on both: the rest reader fails
// with *http.MaxBytesError past it.
func readHead(w http.ResponseWriter, req *http.Request, limit int64, need int) (head []byte, rest io.Reader, _ *routeError) {
	if req.ContentLength > limit {
		return nil, nil, &routeError{http.StatusRequestEntityTooLarge, codeTooLarge, fmt.Sprintf("request body of %d bytes exceeds the limit of %d bytes", req.ContentLength, limit)}
	}
	body := http.MaxBytesReader(w, req.Body, limit)
	size := need + 1
	if req.ContentLength >= 0 && (req.ContentLength < int64(size) || req.ContentLength < wholeBody) {
		size = int(req.ContentLength) + 1 // all of it, and room for the EOF read
	}
	// Take no more than the head's pool class, whatever a client declares
	// (issue 12): what comes later is streamed, or grown as it arrives.
	head = getHead(size)
	for len(head) < size {
		n, err := body.Read(head[len(head):size])
		head = head[:len(head)+n]
		if err == io.EOF {
			return head, nil, nil
		}
		if err != nil {
			return nil, nil, bodyError(err, limit)
		}
	}
	return head, body, nil
}

// wholeBody is the declared length up to which a body is read whole before
// the pick, even when the key needs less: such a body is replayable on a
// retry and leaves for the instance in one write with its headers, and
// reading it costs fewer system calls than a head and a stream (issue 9:
// a 16 KiB body streamed after its 4 KiB head took two upstream writes and
// two more reads). Memory per request stays bounded by this, PrefixLength
// and the transport's write buffer.
const wholeBody = 32 << 10

// openAIHeadStart is the first size at which readOpenAIHead tries the key:
// smaller bodies are read whole, as before.
const openAIHeadStart = 16 << 10

// maxHeadClass is the largest head buffer: a body whose key is not known
// within it is read on into the body arena (heldbody.go).
const maxHeadClass = 64 << 10

// readOpenAIHead reads the start of an OpenAI body until it holds the key's
// inputs (parseOpenAIHead), trying at 16 KiB and then at each doubling, so
// the walks cost at most twice one walk of what was read. It returns the
// bytes read and, when it stopped before the end, the reader of the rest;
// a body whose key needs its end (model or prompt_cache_key after the
// prompt, or absent) is read whole. Up to maxHeadClass the bytes are in
// pooled head buffers; beyond, in a buffer lent by the router's body arena
// (waiting for room, 503 when none comes), which goes back once the
// instance has been sent it: such a body is returned with a rest (empty
// when the body ended) and checked whole here, since the caller then reads
// it as a head.
func (r *Router) readOpenAIHead(w http.ResponseWriter, req *http.Request, limit int64, chat bool, prefixLen int) (head []byte, rest io.Reader, _ *routeError) {
	if req.ContentLength > limit {
		return nil, nil, &routeError{http.StatusRequestEntityTooLarge, codeTooLarge, fmt.Sprintf("request body of %d bytes exceeds the limit of %d bytes", req.ContentLength, limit)}
	}
	body := http.MaxBytesReader(w, req.Body, limit)
	size := openAIHeadStart + 1
	if req.ContentLength >= 0 && req.ContentLength < max(int64(size), wholeBody) {
		size = int(req.ContentLength) + 1 // all of it, and room for the EOF read
	}
	head = getHead(size)
	var held *heldBuf
	fail := func(e *routeError) ([]byte, io.Reader, *routeError) {
		if held != nil {
			r.arena.recycle(held) // never lent on: nothing else reads it
		} else {
			putHead(head)
		}
		return nil, nil, e
	}
	try := cap(head) // the length at which the key is tried next
	for {
		n, err := body.Read(head[len(head):cap(head)])
		head = head[:len(head)+n]
		if err == io.EOF {
			if held == nil {
				return head, nil, nil
			}
			if _, err := parseOpenAI(head, chat, prefixLen); err != nil {
				return fail(&routeError{http.StatusBadRequest, codeInvalidJSON, "invalid request body: " + err.Error()})
			}
			return head, &heldRest{a: r.arena, h: held}, nil
		}
		if err != nil {
			return fail(bodyError(err, limit))
		}
		if len(head) >= try {
			if _, ok := parseOpenAIHead(head, chat, prefixLen); ok {
				if held != nil {
					return head, &heldRest{a: r.arena, h: held, r: body}, nil
				}
				return head, body, nil
			}
			try = 2 * len(head)
		}
		if len(head) < cap(head) {
			continue
		}
		// Full: grow with what arrives, never by what a client declares
		// beyond the head classes.
		if cap(head) < maxHeadClass {
			next := getHead(2 * len(head))
			next = append(next, head...)
			putHead(head)
			head = next
			continue
		}
		if held != nil {
			// The arena buffer holds the declared length: the body
			// went past it (a chunked body past MaxBodyBytes fails
			// in the MaxBytesReader first).
			return fail(&routeError{http.StatusBadRequest, codeBadBody, "reading the request body: longer than declared"})
		}
		h, err := r.arena.acquire(req.Context(), heldNeed(req.ContentLength, limit))
		if err != nil {
			return fail(r.arena.fullError(err))
		}
		held = h
		next := append(h.buf, head...)
		putHead(head)
		head = next
	}
}

// heldRest is the rest of a body whose head is an arena buffer: the
// client's body after the head (nil when it ended). The first read of it
// means the head has been sent: the buffer goes back to the arena, and the
// body can no longer be replayed (streamBody.Read).
type heldRest struct {
	a *bodyArena
	h *heldBuf
	r io.Reader
}

func (h *heldRest) Read(p []byte) (int, error) {
	if h.r == nil {
		return 0, io.EOF
	}
	return h.r.Read(p)
}

// headSent gives the head's buffer back.
func (h *heldRest) headSent() { h.a.recycle(h.h) }

// putHead returns a body buffer of the request of ctx once nothing reads
// it (the request has ended and no transport holds the body): an arena
// buffer to the arena, a head buffer to its pool.
func (r *Router) putHead(ctx context.Context, b []byte) {
	if h := r.arena.lookup(ctx, b); h != nil {
		r.arena.recycle(h)
		return
	}
	putHead(b)
}

// readRest reads the rest of a streamed body after head: for the callers
// that need the whole body after all (a hot key's spread hash reads its
// end). The whole body is held in a buffer lent by the body arena, as a
// body whose key comes late is (issue 19: it was grown outside any bound):
// head's own when head is one, else one sized by the declared length,
// waiting for room as readOpenAIHead does. It returns the body and the
// empty rest whose first read gives the buffer back once the instance has
// been sent the body.
func (r *Router) readRest(req *http.Request, head []byte, rest io.Reader, limit int64) ([]byte, io.Reader, *routeError) {
	// On an error head stays the caller's (it gives it back with the
	// request); on success it is given back here, or it is the start of
	// the arena's buffer returned.
	var h *heldBuf
	var buf []byte
	hr, inArena := rest.(*heldRest)
	if inArena {
		// head starts the arena's buffer, which was sized for the whole
		// body.
		h, rest, buf = hr.h, hr.r, head
	} else {
		held, err := r.arena.acquire(req.Context(), heldNeed(req.ContentLength, limit))
		if err != nil {
			return nil, nil, r.arena.fullError(err)
		}
		h = held
		buf = append(h.buf, head...)
	}
	fail := func(e *routeError) ([]byte, io.Reader, *routeError) {
		if !inArena {
			r.arena.recycle(h) // head's own buffer, if it is one, goes back with the request
		}
		return nil, nil, e
	}
	for rest != nil {
		if len(buf) == cap(buf) {
			return fail(&routeError{http.StatusBadRequest, codeBadBody, "reading the request body: longer than declared"})
		}
		n, err := rest.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return fail(bodyError(err, limit))
		}
	}
	if !inArena {
		putHead(head)
	}
	return buf, &heldRest{a: r.arena, h: h}, nil
}

// heldNeed is the arena buffer a body declared at declared bytes (-1: not
// declared) needs: all of it, room for its EOF read and for a tenant's
// cache salt (a salted body streams through tailSalter, which adds it).
func heldNeed(declared, limit int64) int {
	if declared < 0 {
		declared = limit
	}
	return int(declared) + 1 + saltRoom
}

// saltRoom is what a tenant's cache salt adds to a body at most.
const saltRoom = len(`,"cache_salt":""}`) + saltLen

// bodyError is the client-facing rejection of a body that could not be read:
// 413 past the limit, 400 otherwise.
func bodyError(err error, limit int64) *routeError {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return &routeError{http.StatusRequestEntityTooLarge, codeTooLarge, fmt.Sprintf("request body exceeds the limit of %d bytes", limit)}
	}
	return &routeError{http.StatusBadRequest, codeBadBody, "reading the request body: " + publicError(err)}
}

// streamed is the state of a body routed before it ended, shared by every
// upstream body made from it (the first try and its replays). The
// transport reads the body on its own goroutine, so the fields are atomic.
type streamed struct {
	head []byte    // the bytes read for the key
	rest io.Reader // the client's body after head (limited)
	// restRead is set once a byte of rest has been handed to the transport:
	// from then on the body cannot be replayed.
	restRead atomic.Bool
	// ended is set once rest reached EOF: the instance has the whole body.
	ended atomic.Bool
	// err is the client side's read error (an abort, a timeout, the limit),
	// which is not the instance's fault; nil until one happens.
	err atomic.Pointer[error]
	// onEnd runs once, on the transport's goroutine, when rest reaches EOF.
	onEnd func()
}

// errNotReplayable fails a retry whose body was already partly streamed to
// an instance: those bytes are gone from the client's reader.
var errNotReplayable = errors.New("router: the request body was already partly streamed to an instance and cannot be re-sent")

// body returns a new upstream body: head, then rest. It fails once bytes of
// rest have been read by an earlier try.
func (s *streamed) body() (io.ReadCloser, error) {
	if s.restRead.Load() {
		return nil, errNotReplayable
	}
	return &streamBody{s: s, head: s.head}, nil
}

// clientErr is the client side's read error, nil when there was none.
func (s *streamed) clientErr() error {
	if p := s.err.Load(); p != nil {
		return *p
	}
	return nil
}

// streamBody is one upstream body of a streamed request. Close does not
// close the client's body (the server does, after the handler), so a
// transport that closes a body it could not send leaves it replayable.
type streamBody struct {
	s    *streamed
	head []byte // what is left of head
}

func (b *streamBody) Read(p []byte) (int, error) {
	if len(b.head) > 0 {
		n := copy(p, b.head)
		b.head = b.head[n:]
		return n, nil
	}
	s := b.s
	if s.ended.Load() {
		return 0, io.EOF
	}
	if hr, ok := s.rest.(*heldRest); ok {
		// The head is sent: from now on the body cannot be replayed,
		// and its arena buffer is free.
		s.restRead.Store(true)
		hr.headSent()
	}
	n, err := s.rest.Read(p)
	if n > 0 {
		s.restRead.Store(true)
	}
	switch {
	case err == io.EOF:
		if !s.ended.Swap(true) && s.onEnd != nil {
			s.onEnd()
		}
	case err != nil:
		s.err.CompareAndSwap(nil, &err)
	}
	return n, err
}

func (b *streamBody) Close() error { return nil }

// Head buffers are pooled (issue 9: a 16 KiB body allocated per request was
// two thirds of the router's allocated bytes under load, and drove the
// collector). Classes of 4 to 64 KiB, each with 1 KiB of room over its
// power of two, so that a body of exactly that size and the byte of its
// EOF read fit; larger heads are allocated.
var headClasses = [...]int{5 << 10, 9 << 10, 17 << 10, 33 << 10, 65 << 10}

var headPools [len(headClasses)]sync.Pool

// getHead returns an empty slice of at least size bytes' capacity.
func getHead(size int) []byte {
	for i, c := range headClasses {
		if size <= c {
			if b, ok := headPools[i].Get().(*[]byte); ok {
				return (*b)[:0]
			}
			return make([]byte, 0, c)
		}
	}
	return make([]byte, 0, size)
}

// putHead returns a head buffer to its pool once nothing reads it: its
// request has ended and no transport holds the body. Slices of other
// capacities (grown, or allocated past the classes) are left to the
// collector.
func putHead(b []byte) {
	c := cap(b)
	for i, hc := range headClasses {
		if c == hc {
			b = b[:0]
			headPools[i].Put(&b)
			return
		}
	}
}
