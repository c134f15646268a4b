package testsupport

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
)

// TestServeEachConnServesAndWaits: every connection gets its own handler,
// and the test's cleanups return only once every handler has, even one
// still blocked when the test body ended.
func TestServeEachConnServesAndWaits(t *testing.T) {
	var handled atomic.Int32
	t.Run("serve", func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		addr := ServeEachConn(t, func(c net.Conn) {
			_, _ = io.WriteString(c, "hi")
			<-release
			handled.Add(1)
		})
		for range 3 {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			got := make([]byte, 2)
			if _, err := io.ReadFull(c, got); err != nil || string(got) != "hi" {
				t.Fatalf("read %q, %v", got, err)
			}
		}
	})
	if n := handled.Load(); n != 3 {
		t.Fatalf("%d handlers done after the cleanups, want 3", n)
	}
}
