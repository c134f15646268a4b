package e2e

import (
	"context"
	"os"
	"testing"
	"time"
)

// TestUpdateDuringOutageNotLost: an instance update attempted while the
// registration's owner is busy re-granting a lost lease (etcd down) must
// still be written once etcd is back, as InstanceRegistration.Update
// promises. It fails today (the update is dropped when the caller's
// context ends before the owner takes it; see docs/concurrency.md), so it
// runs only with PREFIXROUTER_E2E_KNOWN_BUGS=1.
func TestUpdateDuringOutageNotLost(t *testing.T) {
	if os.Getenv("PREFIXROUTER_E2E_KNOWN_BUGS") == "" {
		t.Skip("known bug in membership.Registration (update dropped during a re-grant); set PREFIXROUTER_E2E_KNOWN_BUGS=1")
	}
	c := newCluster(t, 2*time.Second)
	c.startReplicas(1, replicaOptions{})
	bs, regs := fleetOf(t, c, 1)
	c.etcd.Close()
	// The keepalive saw no answer for a TTL: the owner is now granting.
	waitFor(t, 20*time.Second, "lease lost", func() bool { return regs[0].LeaseID() == 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err := regs[0].SetAdapters(ctx, []string{"lora-late"})
	cancel()
	t.Logf("SetAdapters during the outage: %v; Instance() reports %v", err, regs[0].Instance().Adapters)
	c.restartEtcd()
	waitFor(t, 15*time.Second, "adapter set during the outage on the replica", func() bool {
		in, ok := lookup(c.replicas[0], bs[0].id)
		return ok && in.HasAdapter("lora-late")
	})
}
