//go:build unix

package upstream

import (
	"errors"
	"net"
	"syscall"
)

// alive reports whether an idle connection is still open and quiet: a
// non-blocking one-byte peek (one system call) that finds neither the
// instance's close (EOF, reset) nor unexpected bytes. net/http's Transport
// learns the same from the reader goroutine it keeps on every idle
// connection; a peek at reuse costs less than a goroutine per connection.
func alive(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	ok = false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, rerr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		ok = errors.Is(rerr, syscall.EAGAIN) || errors.Is(rerr, syscall.EWOULDBLOCK)
		return true // never wait: the answer is the peek's
	})
	return err == nil && ok
}

// isReset reports an error of a connection the instance reset or closed
// under a write: ECONNRESET, EPIPE, ECONNABORTED.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED)
}
