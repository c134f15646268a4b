package overload

import "github.com/sony/gobreaker/v2"

// Status is one instance's state at one moment: the one value that metrics,
// the admin API, chaos reports and tests read. It is a copy, consistent per
// field but not across fields (each is read atomically on its own).
type Status struct {
	// ID is the instance id.
	ID string
	// InFlight is the number of requests this replica has in flight on the
	// instance.
	InFlight int64
	// ExternalLoad is the load from other sources as last polled; -1 when
	// unknown (not polled, or the last scrape failed).
	ExternalLoad int64
	// Breaker is the state of the instance's circuit breaker.
	Breaker gobreaker.State
	// Healthy is false when active health checks marked the instance down
	// (always true when it is not probed).
	Healthy bool
}

// Status returns the instance's current status. Reading the breaker takes
// its lock (gobreaker moves an open breaker past its timeout on read), so
// Status is for observers; picks use the lock-free accessors.
func (s *State) Status() Status {
	return Status{
		ID:           s.id,
		InFlight:     s.inFlight.Load(),
		ExternalLoad: s.external.Load(),
		Breaker:      s.breaker.State(),
		Healthy:      !s.down.Load(),
	}
}
