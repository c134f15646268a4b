// Package etcdtest starts throwaway embedded etcd members and clusters for
// tests.
package etcdtest

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/membership"
)

// Start starts a single-member etcd in t.TempDir() on a free loopback port,
// with short election timeouts (the minimum lease TTL is then 1 s), and
// closes it when the test ends.
func Start(t testing.TB) *membership.Embedded {
	t.Helper()
	return StartCluster(t, 1).Member(0)
}

// Restart closes e (if it is still running) and starts a new member on the
// same data directory and client URL, so that clients reconnect and find
// their keys: the way to test an etcd outage. The new member is closed when
// the test ends.
func Restart(t testing.TB, e *membership.Embedded) *membership.Embedded {
	t.Helper()
	e.Close()
	n, err := e.Restart()
	if err != nil {
		t.Fatalf("etcdtest: restart: %v", err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// Client returns a client of e built by membership.NewClient, closed when
// the test ends.
func Client(t testing.TB, e *membership.Embedded) *clientv3.Client {
	t.Helper()
	return client(t, e.Endpoints())
}

// StartCluster starts an n-member etcd cluster in t.TempDir() on free
// loopback ports, with short election timeouts, and closes it when the test
// ends. Clients get every member (Endpoints).
func StartCluster(t testing.TB, n int) *membership.EmbeddedCluster {
	t.Helper()
	c, err := membership.StartEmbeddedCluster(t.TempDir(), n, membership.WithFastTicks())
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// ClusterClient returns a client of every member of c built by
// membership.NewClient, closed when the test ends.
func ClusterClient(t testing.TB, c *membership.EmbeddedCluster) *clientv3.Client {
	t.Helper()
	return client(t, c.Endpoints())
}

func client(t testing.TB, endpoints []string) *clientv3.Client {
	t.Helper()
	cli, err := membership.NewClient(membership.ClientOptions{Endpoints: endpoints})
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
