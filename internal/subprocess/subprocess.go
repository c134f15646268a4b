// Package subprocess runs a child process that a benchmark or a test
// depends on (an inference engine, a proxy under measurement): one
// goroutine waits for its exit, and Stop ends it gracefully, then by force,
// and waits for that goroutine.
package subprocess

import (
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Process is a started child process.
type Process struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // cmd.Wait's error; read only after exited is closed
}

// Start starts cmd and watches for its exit.
func Start(cmd *exec.Cmd) (*Process, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once the process has exited and been waited for.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Err is how the process exited (cmd.Wait's error); call it after Exited
// is closed.
func (p *Process) Err() error { return p.err }

// Signal sends sig to the process (a fault test's SIGKILL, SIGSTOP,
// SIGCONT); an exited process is left alone.
func (p *Process) Signal(sig os.Signal) error {
	select {
	case <-p.exited:
		return os.ErrProcessDone
	default:
	}
	return p.cmd.Process.Signal(sig)
}

// Stop sends SIGCONT (a stopped process could not act on what follows),
// then SIGTERM, waits up to grace, then kills the process, and
// returns once it has exited. Stopping an exited process does nothing.
func (p *Process) Stop(grace time.Duration) {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}
