package overload

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// Defaults of BreakerOptions, used where a field is zero.
const (
	// DefaultConsecutiveFailures opens a breaker after five failures in a row:
	// enough to ride out one bad connection, few enough that a dead instance
	// costs at most five dial errors (each retried elsewhere) per replica.
	DefaultConsecutiveFailures = 5
	// DefaultOpenTimeout is how long an open breaker rejects before it lets a
	// probe through. Shorter than gobreaker's 60 s because a restarted model
	// server is typically back within seconds and the lease-based membership
	// removes instances that are really gone.
	DefaultOpenTimeout = 10 * time.Second
	// DefaultHalfOpenMaxRequests lets one probe through a half-open breaker.
	DefaultHalfOpenMaxRequests = 1
)

// BreakerOptions configures the circuit breaker of every instance. The zero
// value means the defaults above.
type BreakerOptions struct {
	// ConsecutiveFailures is the number of failures in a row that opens the
	// breaker. Zero means DefaultConsecutiveFailures.
	ConsecutiveFailures uint32
	// OpenTimeout is how long the breaker stays open before half-opening.
	// Zero means DefaultOpenTimeout.
	OpenTimeout time.Duration
	// HalfOpenMaxRequests is the number of probes a half-open breaker lets
	// through; that many successes in a row close it. Zero means
	// DefaultHalfOpenMaxRequests.
	HalfOpenMaxRequests uint32
}

// withDefaults returns s with zero fields replaced by their defaults.
func (s BreakerOptions) withDefaults() BreakerOptions {
	if s.ConsecutiveFailures == 0 {
		s.ConsecutiveFailures = DefaultConsecutiveFailures
	}
	if s.OpenTimeout == 0 {
		s.OpenTimeout = DefaultOpenTimeout
	}
	if s.HalfOpenMaxRequests == 0 {
		s.HalfOpenMaxRequests = DefaultHalfOpenMaxRequests
	}
	return s
}

// Validate rejects negative durations; its errors wrap fleet.ErrInvalid.
func (s BreakerOptions) Validate() error {
	if s.OpenTimeout < 0 {
		return fmt.Errorf("overload: %w: OpenTimeout (--breaker-open-timeout) %v is negative", fleet.ErrInvalid, s.OpenTimeout)
	}
	return nil
}

// StatusError reports an upstream HTTP response status to a done callback.
type StatusError struct{ Code int }

func (e *StatusError) Error() string {
	return fmt.Sprintf("overload: upstream status %d", e.Code)
}

// ErrClientGone marks an outcome where the client went away; like
// context.Canceled it is neither a success nor a failure of the instance.
var ErrClientGone = errors.New("overload: client went away")

// UpstreamStatus converts an upstream status code into the error a done callback
// takes: nil for success, a *StatusError otherwise.
func UpstreamStatus(code int) error {
	if code < 500 {
		return nil
	}
	return &StatusError{Code: code}
}

// IsFailure reports whether an outcome counts against the instance's breaker:
// connection errors, upstream timeouts and 5xx statuses other than 501 (Not
// Implemented) and 505 (HTTP Version Not Supported), which say the request was
// wrong, not that the instance is unhealthy. A client that went away is not a
// failure (see IsExcluded).
func IsFailure(err error) bool {
	if err == nil || IsExcluded(err) {
		return false
	}
	var se *StatusError
	if errors.As(err, &se) {
		return se.Code >= 500 && se.Code != http.StatusNotImplemented && se.Code != http.StatusHTTPVersionNotSupported
	}
	return true
}

// IsExcluded reports whether an outcome says nothing about the instance: the
// client canceled the request or went away.
func IsExcluded(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, ErrClientGone)
}

func newBreaker(name string, s BreakerOptions, onChange func(from, to gobreaker.State)) *gobreaker.TwoStepCircuitBreaker[struct{}] {
	s = s.withDefaults()
	return gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        name,
		MaxRequests: s.HalfOpenMaxRequests,
		Timeout:     s.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= s.ConsecutiveFailures
		},
		// Called under the breaker's own mutex: only atomic stores in onChange.
		OnStateChange: func(_ string, from, to gobreaker.State) { onChange(from, to) },
		IsSuccessful:  func(err error) bool { return !IsFailure(err) },
		IsExcluded:    IsExcluded,
	})
}
