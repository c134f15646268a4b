//go:build unix

package ring

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user and system) this process used so far.
// On a machine shared with other load a benchmark's wall time per op
// includes the time the scheduler gave to others; its CPU time does not.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
