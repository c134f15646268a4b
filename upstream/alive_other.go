//go:build !unix

package upstream

import "net"

// alive cannot peek without blocking here; a closed connection is found
// when the request on it fails.
func alive(net.Conn) bool { return true }

// isReset cannot tell a reset portably here; only an end of stream makes a
// request re-sendable (connBroke).
func isReset(error) bool { return false }
