package router

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"syscall"
)

// This file keeps internal facts (instance addresses, router headers an
// instance forged) from reaching clients (issue 12 finding 9).

// headerPrefix starts every header the router itself sets on responses.
const headerPrefix = "X-Prefixrouter-"

// stripRouterHeaders deletes X-Prefixrouter-* headers an upstream sent, so
// that only the router's own reach the client (an instance must not forge
// which instance answered, or a router-made error code).
func stripRouterHeaders(h http.Header) {
	for k := range h {
		if strings.HasPrefix(k, headerPrefix) {
			delete(h, k)
		}
	}
}

// publicError describes a transport error for a client without the
// addresses its text carries ("dial tcp 10.0.0.7:8000: connect: connection
// refused" becomes "connection refused"); the full error goes to the log.
func publicError(err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return "no error"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "connection reset"
	case errors.Is(err, net.ErrClosed):
		return "connection closed"
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return "network error during " + op.Op
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return "name resolution failed"
	}
	return "upstream error"
}

// hasIdempotencyKey reports whether h carries a header that makes Go's
// Transport treat a POST as replayable (net/http Request.isReplayable).
func hasIdempotencyKey(h http.Header) bool {
	_, a := h["Idempotency-Key"]
	_, b := h["X-Idempotency-Key"]
	return a || b
}
