package sim

import "errors"

// Sentinel errors, classified with errors.Is.
var (
	// ErrUnknownProfile is returned for a profile name that is not built in.
	ErrUnknownProfile = errors.New("sim: unknown profile")
	// ErrInvalidConfig wraps every Config validation failure.
	ErrInvalidConfig = errors.New("sim: invalid config")
	// ErrClosed is returned by methods of a Server after Close.
	ErrClosed = errors.New("sim: server closed")
)
