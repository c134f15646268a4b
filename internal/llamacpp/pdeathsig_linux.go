package llamacpp

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal has the kernel stop the server if this process dies
// without Close (a test binary killed at its timeout): no engine outlives
// its test.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
