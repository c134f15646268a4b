package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/prefixrouter/prefixrouter/overload"
	"github.com/prefixrouter/prefixrouter/upstream"
)

// DefaultUpstreamIdleTimeout is the idle timeout `serve` starts with
// (--upstream-idle-timeout): Envoy's stream_idle_timeout default. In
// Options the zero value means off.
const DefaultUpstreamIdleTimeout = 5 * time.Minute

// errUpgraded is the outcome of an instance that answered 101 Switching
// Protocols: the router never asks for an upgrade, so the answer is a
// protocol error, and its connection is closed. It carries the status (not
// a 5xx): the instance answered, and the breaker does not count it (issue
// 19: five 101s, which clients could ask for with an Upgrade header, opened
// a breaker).
var errUpgraded = fmt.Errorf("router: the instance answered 101 Switching Protocols, which the router never asks for: %w: %w", upstream.ErrSwitchingProtocols, &overload.StatusError{Code: http.StatusSwitchingProtocols})

// errUpstreamIdle cuts an answer whose instance sent nothing for the idle
// timeout while the proxy waited for its next bytes. It wraps
// context.DeadlineExceeded: it counts against the instance.
var errUpstreamIdle = fmt.Errorf("router: the instance sent nothing within the upstream idle timeout: %w", context.DeadlineExceeded)

// upstreamGuard is the transport under the proxy: every try goes through it.
// It keeps protocol upgrades from reaching instances and bounds the silence
// between an answer's bytes.
type upstreamGuard struct {
	next http.RoundTripper
	idle time.Duration // zero: no idle timeout
}

func (g upstreamGuard) RoundTrip(out *http.Request) (*http.Response, error) {
	stripUpgrade(out.Header)
	var cancel context.CancelCauseFunc
	if g.idle > 0 {
		var ctx context.Context
		ctx, cancel = context.WithCancelCause(out.Context())
		out = out.WithContext(ctx)
	}
	resp, err := g.next.RoundTrip(out)
	if err == nil && resp.StatusCode == http.StatusSwitchingProtocols {
		// The net/http transport (https instances) hands the switched
		// connection over as the body.
		resp.Body.Close()
		resp, err = nil, upstream.ErrSwitchingProtocols
	}
	if errors.Is(err, upstream.ErrSwitchingProtocols) {
		err = errUpgraded
	}
	if err != nil || cancel == nil {
		if cancel != nil {
			cancel(nil)
		}
		return resp, err
	}
	b := &idleBody{rc: resp.Body, ctx: out.Context(), cancel: cancel, d: g.idle}
	b.t = time.AfterFunc(g.idle, b.fire)
	b.t.Stop()
	resp.Body = b
	return resp, nil
}

// stripUpgrade removes the upgrade a client asked for (ReverseProxy passes
// Upgrade and Connection: Upgrade on): a model server must never switch a
// connection of the router's to another protocol.
func stripUpgrade(h http.Header) {
	if _, ok := h["Upgrade"]; !ok && !httpguts.HeaderValuesContainsToken(h["Connection"], "upgrade") {
		return
	}
	h.Del("Upgrade")
	h.Del("Connection")
}

// idleBody arms the idle timer while a read waits for the instance, and
// only then: a client that stops reading stalls the copy, not the
// instance (--write-idle-timeout covers that client).
type idleBody struct {
	rc      io.ReadCloser
	ctx     context.Context // the try's, cancelled with errUpstreamIdle
	cancel  context.CancelCauseFunc
	d       time.Duration
	t       *time.Timer
	reading atomic.Bool
}

func (b *idleBody) Read(p []byte) (int, error) {
	b.reading.Store(true)
	b.t.Reset(b.d)
	n, err := b.rc.Read(p)
	b.t.Stop()
	b.reading.Store(false)
	if err != nil && err != io.EOF && context.Cause(b.ctx) == errUpstreamIdle {
		err = errUpstreamIdle // the net/http transport reports the cancellation only
	}
	return n, err
}

func (b *idleBody) fire() {
	if b.reading.Load() {
		b.cancel(errUpstreamIdle)
	}
}

func (b *idleBody) Close() error {
	b.t.Stop()
	err := b.rc.Close()
	b.cancel(nil)
	return err
}
