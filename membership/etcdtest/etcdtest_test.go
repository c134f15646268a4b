package etcdtest

import (
	"context"
	"testing"
	"time"
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
