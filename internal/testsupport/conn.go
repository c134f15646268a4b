package testsupport

import (
	"net"
	"sync"
	"testing"
)

// ServeEachConn serves every connection to a new loopback listener with
// handle on its own goroutine (which closes the connection after it) until
// the test ends, when it closes the listener and waits for every handler,
// and returns the listener's address. A handler that blocks must be
// released by the test before its cleanups run (a defer does).
func ServeEachConn(t testing.TB, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}
