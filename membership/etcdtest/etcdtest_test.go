package etcdtest

import (
	"context"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
)

func TestRestartKeepsData(t *testing.T) {
	e := Start(t)
	cli := Client(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	e2 := Restart(t, e)
	if e2.ClientURL() != e.ClientURL() {
		t.Fatalf("restarted on %s, want %s", e2.ClientURL(), e.ClientURL())
	}
	// The old client reconnects to the same URL and finds the key.
	resp, err := cli.Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("after restart: %v %v", resp, err)
	}
}

// TestClusterSurvivesLeaderKill: a 3-member cluster elects a new leader
// when its leader is killed, a client of every member keeps reading and
// writing, and the killed member rejoins with the writes it missed.
func TestClusterSurvivesLeaderKill(t *testing.T) {
	c := StartCluster(t, 3)
	cli := client(t, c.Endpoints())
	// A write that reaches a member while the survivors elect may be
	// dropped (etcd answers it after its request timeout): each attempt
	// gets a second.
	put := func(v string) []error {
		var errs []error
		testsupport.Eventually(t, 10*time.Second, "put "+v, func() bool {
			pctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := cli.Put(pctx, "k", v)
			errs = append(errs, err)
			return err == nil
		})
		return errs
	}
	put("v1")
	old := leader(t, c)
	start := time.Now()
	if err := c.Kill(old); err != nil {
		t.Fatal(err)
	}
	if c.Running(old) {
		t.Fatalf("member %d runs after Kill", old)
	}
	t.Logf("put attempts after the kill: %v", put("v2"))
	now := leader(t, c)
	t.Logf("leader %d killed; member %d leads, a put succeeded %v later", old, now, time.Since(start).Round(time.Millisecond))
	if now == old {
		t.Fatalf("killed member %d still leads", old)
	}
	if err := c.Restart(old); err != nil {
		t.Fatal(err)
	}
	// The restarted member alone answers with the write it missed.
	one, err := membership.NewClient(membership.ClientOptions{Endpoints: []string{c.Endpoints()[old]}})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := one.Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v2" {
		t.Fatalf("restarted member %d: %v %v, want v2", old, resp, err)
	}
}

// leader waits for a leader among the running members.
func leader(t *testing.T, c *membership.EmbeddedCluster) int {
	t.Helper()
	i := -1
	testsupport.Eventually(t, 10*time.Second, "a leader", func() bool { i = c.Leader(); return i >= 0 })
	return i
}
