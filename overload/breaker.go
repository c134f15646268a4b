package overload

import (
	"cmp"
	"errors"
	"fmt"
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
	// DefaultServerErrorKeys is how many different routing keys must get an
	// ambiguous server error from one instance within the window before
	// such errors count: one client's malformed request, sent again and
	// again, is one key; an engine that fails whatever it is sent fails
	// for any three prompts.
	DefaultServerErrorKeys = 3
	// DefaultServerErrorWindow is that window: three open timeouts, so
	// that an engine failing under a trickle of traffic is still
	// recognized, and short enough that unrelated errors minutes apart do
	// not add up.
	DefaultServerErrorWindow = 30 * time.Second
	// DefaultMaxEjectionPercent caps the share of an endpoint's instances
	// that breakers and health checks hold out of rotation at once: half,
	// rounded down, so at least half of an endpoint always takes traffic
	// (Envoy's healthy panic threshold is the same 50 %). Envoy's 10 %
	// outlier-ejection cap is written for large clusters; an LLM endpoint
	// has a few instances, each carrying a large share of the load, and
	// when more than half of them look failed at once the cause is more
	// likely shared (a client driving errors, the router's own network,
	// an overload the rest could not absorb either) than independent
	// faults. A one-instance endpoint is never ejected.
	DefaultMaxEjectionPercent = 50
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
	// ServerErrorKeys and ServerErrorWindow set when an ambiguous server
	// error (a 500 from an engine whose profile does not say that its 500
	// means it failed) counts: once ServerErrorKeys different routing keys
	// got one from the instance within ServerErrorWindow. Zero means
	// DefaultServerErrorKeys and DefaultServerErrorWindow; 1 key makes
	// every server error count.
	ServerErrorKeys   int
	ServerErrorWindow time.Duration
	// MaxEjectionPercent caps the share of an endpoint's instances that
	// breakers and health checks take out of rotation at once
	// (--max-ejection-percent, 1..100, rounded down to instances): no
	// breaker opens past it, and when health checks mark more instances
	// down than it allows, the endpoint panics and picks ignore both.
	// Zero means DefaultMaxEjectionPercent; 100 means no cap.
	MaxEjectionPercent int
}

// withDefaults returns s with zero fields replaced by their defaults.
func (s BreakerOptions) withDefaults() BreakerOptions {
	s.ConsecutiveFailures = cmp.Or(s.ConsecutiveFailures, DefaultConsecutiveFailures)
	s.OpenTimeout = cmp.Or(s.OpenTimeout, DefaultOpenTimeout)
	s.HalfOpenMaxRequests = cmp.Or(s.HalfOpenMaxRequests, DefaultHalfOpenMaxRequests)
	s.ServerErrorKeys = cmp.Or(s.ServerErrorKeys, DefaultServerErrorKeys)
	s.ServerErrorWindow = cmp.Or(s.ServerErrorWindow, DefaultServerErrorWindow)
	s.MaxEjectionPercent = cmp.Or(s.MaxEjectionPercent, DefaultMaxEjectionPercent)
	return s
}

// Validate rejects negative durations and counts and a percentage above
// 100; its errors wrap fleet.ErrInvalid.
func (s BreakerOptions) Validate() error {
	var errs []error
	if s.OpenTimeout < 0 {
		errs = append(errs, fmt.Errorf("overload: %w: OpenTimeout (--breaker-open-timeout) %v is negative", fleet.ErrInvalid, s.OpenTimeout))
	}
	if s.ServerErrorKeys < 0 {
		errs = append(errs, fmt.Errorf("overload: %w: ServerErrorKeys %d is negative", fleet.ErrInvalid, s.ServerErrorKeys))
	}
	if s.ServerErrorWindow < 0 {
		errs = append(errs, fmt.Errorf("overload: %w: ServerErrorWindow %v is negative", fleet.ErrInvalid, s.ServerErrorWindow))
	}
	if s.MaxEjectionPercent < 0 || s.MaxEjectionPercent > 100 {
		errs = append(errs, fmt.Errorf("overload: %w: MaxEjectionPercent (--max-ejection-percent) %d is outside 1..100", fleet.ErrInvalid, s.MaxEjectionPercent))
	}
	return errors.Join(errs...)
}

// errUnjudged is what a done callback hands gobreaker for an outcome that
// says nothing about the instance: gobreaker excludes it.
var errUnjudged = errors.New("overload: outcome not judged")

// newBreaker returns a breaker with settings s (defaults applied). mayTrip
// is asked, under the breaker's mutex, before it opens: the ejection cap.
func newBreaker(name string, s BreakerOptions, mayTrip func() bool, onChange func(from, to gobreaker.State)) *gobreaker.TwoStepCircuitBreaker[struct{}] {
	return gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        name,
		MaxRequests: s.HalfOpenMaxRequests,
		Timeout:     s.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= s.ConsecutiveFailures && mayTrip()
		},
		OnStateChange: func(_ string, from, to gobreaker.State) { onChange(from, to) },
		// The done callback has judged the outcome (State.judge): nil
		// for a success, errUnjudged to exclude it, the failure otherwise.
		IsSuccessful: func(err error) bool { return err == nil },
		IsExcluded:   func(err error) bool { return err == errUnjudged },
	})
}
