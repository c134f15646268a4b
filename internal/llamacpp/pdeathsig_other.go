//go:build !linux

package llamacpp

import "os/exec"

// setParentDeathSignal: only Linux has a parent-death signal; elsewhere a
// killed test may leave its servers running.
func setParentDeathSignal(*exec.Cmd) {}
