package sim

import (
	"errors"
	"fmt"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// Sentinel errors, classified with errors.Is.
var (
	// ErrUnknownProfile is returned for a profile name that is not built in.
	ErrUnknownProfile = errors.New("sim: unknown profile")
	// ErrInvalidOptions wraps every Options validation failure.
	ErrInvalidOptions = fmt.Errorf("sim: %w options", fleet.ErrInvalid)
	// ErrClosed is returned by methods of a Server after Close.
	ErrClosed = errors.New("sim: server closed")
)
