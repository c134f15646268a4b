//go:build !unix

package ring

import "time"

// processCPU is unknown here: the cpu-ns/op metrics read 0.
func processCPU() time.Duration { return 0 }
