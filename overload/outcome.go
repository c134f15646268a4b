package overload

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// One rule decides what counts against an instance's breaker: the
// instance's faults, never the client's (issue 19, issue 20;
// docs/operations.md, "What counts against a breaker").
//
//   - Failed, always: a transport error (dial, reset, a broken stream),
//     an upstream timeout (the first-byte timeout of a streamed answer),
//     502, 503, 504.
//   - Never: a 2xx or 3xx; a 4xx (the request was wrong); 501 and 505 (the
//     request asked for what the server does not do); a client that went
//     away or whose own deadline ended the request; a non-streamed
//     generation that outlasted a response-header timeout (ErrNotJudged).
//   - A 500 (and any 5xx not named above) is a server error, judged by
//     what the instance's engine profile says of it (SetServerErrors): it
//     counts when the profile says a 500 means the engine failed (vLLM,
//     SGLang, TGI); never when the profile says it is the engine's answer
//     to a request it could not take and the engine fails otherwise
//     (llama.cpp's llama-server: a malformed request, a prompt beyond its
//     context; its own failures are crashes, hangs and 503s); and for an
//     engine of no known profile only when it repeats across different
//     requests: once ServerErrorKeys different routing keys got one from
//     the instance within ServerErrorWindow. One client repeating one bad
//     request is one key and never trips the breaker; an engine that
//     fails whatever it is sent fails for many keys.

// Verdict is what one outcome says about the instance that served it.
type Verdict uint8

// The verdicts Classify gives.
const (
	// Served: the instance answered; the breaker counts a success.
	Served Verdict = iota
	// Unjudged: the outcome says nothing about the instance (the client
	// went away or gave up); the breaker ignores it.
	Unjudged
	// Failed: the instance failed; the breaker counts a failure.
	Failed
	// ServerError: a 500 or another unnamed 5xx, which the instance's
	// engine may send for a request it could not take: State decides by
	// the engine's profile and the request's routing key.
	ServerError
)

// StatusError reports an upstream HTTP response status to a done callback.
type StatusError struct {
	Code int
	// Key is the request's routing key: server errors count only when
	// they repeat across different keys (see the rule above). Zero when
	// the caller has none.
	Key uint64
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("overload: upstream status %d", e.Code)
}

// ErrClientGone marks an outcome where the client went away; like
// context.Canceled it is neither a success nor a failure of the instance.
var ErrClientGone = errors.New("overload: client went away")

// ErrNotJudged marks an outcome that says nothing about the instance for
// another reason than the client's leaving: a non-streamed generation that
// outlasted a response-header timeout (its length is the client's
// max_tokens, not the instance's health).
var ErrNotJudged = errors.New("overload: outcome says nothing about the instance")

// UpstreamStatus converts an upstream status code into the error a done callback
// takes: nil for success, a *StatusError otherwise.
func UpstreamStatus(code int) error { return UpstreamStatusFor(code, 0) }

// UpstreamStatusFor is UpstreamStatus for the request with routing key key.
func UpstreamStatusFor(code int, key uint64) error {
	if code < 500 {
		return nil
	}
	return &StatusError{Code: code, Key: key}
}

// Classify applies the rule above to one outcome, as a done callback
// receives it.
func Classify(err error) Verdict {
	if err == nil {
		return Served
	}
	if IsExcluded(err) {
		return Unjudged
	}
	var se *StatusError
	if !errors.As(err, &se) {
		return Failed // transport errors and timeouts
	}
	switch se.Code {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return Failed
	case http.StatusNotImplemented, http.StatusHTTPVersionNotSupported:
		return Served
	}
	if se.Code < 500 {
		return Served
	}
	return ServerError
}

// IsFailure reports whether an outcome may count against the instance's
// breaker: Failed always, ServerError depending on the instance (see
// Classify). A client that went away is not a failure (see IsExcluded).
func IsFailure(err error) bool {
	v := Classify(err)
	return v == Failed || v == ServerError
}

// IsExcluded reports whether an outcome says nothing about the instance: the
// client canceled the request or went away, or ErrNotJudged.
func IsExcluded(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, ErrClientGone) || errors.Is(err, ErrNotJudged)
}

// serverErrorKeys remembers the routing keys of the requests that an
// instance lately answered with an ambiguous server error: it tells an
// instance that fails whatever it is sent from one request that makes it
// fail.
type serverErrorKeys struct {
	mu sync.Mutex // guards keys and at; taken only on ambiguous server errors
	// keys holds at most need distinct keys, the most recent last; at[i]
	// is when keys[i] last got a server error.
	keys []uint64
	at   []time.Time
}

// repeated records that the request with key got a server error at now and
// reports whether need different keys (this one included) got one within
// window up to now. The answer depends only on the sequence of (key, time)
// it was given.
func (r *serverErrorKeys) repeated(key uint64, now time.Time, need int, window time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	j := 0
	for i, k := range r.keys {
		if k == key || now.Sub(r.at[i]) >= window {
			continue // this key moves to the end; old ones leave
		}
		r.keys[j], r.at[j] = k, r.at[i]
		j++
	}
	r.keys, r.at = r.keys[:j], r.at[:j]
	if len(r.keys) >= need {
		// Only the latest need keys matter: drop the oldest.
		n := copy(r.keys, r.keys[1:])
		copy(r.at, r.at[1:])
		r.keys, r.at = r.keys[:n], r.at[:n]
	}
	r.keys, r.at = append(r.keys, key), append(r.at, now)
	return len(r.keys) >= need
}
