package replica_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/replica"
)

// TestReplicasPublishRates: a replica that routes requests measures its
// rate and writes it into its record; another replica's snapshot carries
// it, and its fall when the traffic stops.
func TestReplicasPublishRates(t *testing.T) {
	f, a, _ := startFleet(t, 2)
	ctx := testsupport.Context(t, 30*time.Second)
	b, err := f.AddReplicaWith(ctx, func(o *replica.Options) { o.RateInterval = 50 * time.Millisecond })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.StopReplica(ctx, b); err != nil {
			t.Errorf("close replica: %v", err)
		}
	})
	// a runs with the default interval; b, which sends, with 50 ms.
	seen := func() float64 { return a.Router().Snapshot().ReplicaRates[b.ID()] }
	testsupport.Eventually(t, 10*time.Second, "a sees b's record with rate 0", func() bool {
		r, ok := a.Router().Snapshot().ReplicaRates[b.ID()]
		return ok && r == 0
	})
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(10 * time.Second)
	sent := 0
	for seen() < 5 && time.Now().Before(deadline) && sent < 20000 {
		resp, err := client.Post(b.URL()+"/invocations", "application/json", strings.NewReader(`{"inputs":"hello"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d", sent, resp.StatusCode)
		}
		sent++
	}
	if r := seen(); r < 5 {
		t.Fatalf("after %d requests through b, a sees b's rate %v, want at least 5/s", sent, r)
	}
	if b.Router().Rate() <= 0 {
		t.Fatalf("b measured %v", b.Router().Rate())
	}
	testsupport.Eventually(t, 10*time.Second, "b's rate falls once its traffic stops", func() bool { return seen() < 2 })
}
