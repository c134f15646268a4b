package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

// TestUpdateDuringOutageNotLost: an instance update attempted while the
// registration's owner is busy re-granting a lost lease (etcd down) must
// still be written once etcd is back, as InstanceRegistration.Update
// promises. It is the regression test of a bug where the update was
// dropped when the caller's context ended before the owner took it.
func TestUpdateDuringOutageNotLost(t *testing.T) {
	// The lease is lost after a TTL without a keepalive answer, timed by
	// etcd's client: the test member's minimum TTL keeps that wait short.
	c := newCluster(t, time.Second)
	c.startReplicas(1)
	bs, regs := fleetOf(t, c, 1)
	c.stopEtcd()
	// The keepalive saw no answer for a TTL: the owner is now granting.
	testsupport.Eventually(t, 20*time.Second, "lease lost", func() bool { return regs[0].LeaseID() == 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err := regs[0].SetAdapters(ctx, []string{"lora-late"})
	cancel()
	t.Logf("SetAdapters during the outage: %v; Instance() reports %v", err, regs[0].Instance().Adapters)
	c.restartEtcd()
	testsupport.Eventually(t, 15*time.Second, "adapter set during the outage on the replica", func() bool {
		in, ok := lookup(c.replicas[0], bs[0].id)
		return ok && in.HasAdapter("lora-late")
	})
}
