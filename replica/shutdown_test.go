package replica

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/router"
)

// TestShutdownUnderLoadBehindProber: a load balancer that probes /readyz
// every 50 ms spreads load over two replicas; one is shut down as on
// SIGTERM. Its /readyz must turn 503 before its listener closes, so that
// not one request fails.
func TestShutdownUnderLoadBehindProber(t *testing.T) {
	const probeEvery = 50 * time.Millisecond
	insts := backends(t, 2)
	start := func() *Replica {
		rep, err := Start(context.Background(), Options{
			Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Static: insts, Logger: quiet,
			Router:     router.Options{DefaultEndpoint: "chat"},
			DrainDelay: 6 * probeEvery,
		})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	a, b := start(), start()
	defer b.Close(context.Background())
	defer a.Close(context.Background())
	urls := []string{a.URL(), b.URL()}
	var ready [2]atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	// The prober: one GET of each /readyz per period.
	wg.Go(func() {
		tick := time.NewTicker(probeEvery)
		defer tick.Stop()
		for {
			for i, u := range urls {
				resp, err := hc.Get(u + "/readyz")
				ok := err == nil && resp.StatusCode == 200
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				ready[i].Store(ok)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	testsupport.Eventually(t, 5*time.Second, "both replicas ready", func() bool { return ready[0].Load() && ready[1].Load() })
	var sent, failed, toA atomic.Int64
	var firstErr atomic.Value
	// The load: 8 workers, each bounded in count and time.
	loadDone := make(chan struct{})
	var load sync.WaitGroup
	for w := range 8 {
		load.Go(func() {
			deadline := time.Now().Add(20 * time.Second)
			for i := 0; i < 5000 && time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				pick := (w + i) % 2
				if !ready[pick].Load() {
					pick = 1 - pick
				}
				if pick == 0 {
					toA.Add(1)
				}
				sent.Add(1)
				resp, err := hc.Post(urls[pick]+"/invocations", "application/json", strings.NewReader(`{"inputs":"x"}`))
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, resp.Status)
				}
			}
		})
	}
	go func() { load.Wait(); close(loadDone) }()
	testsupport.Eventually(t, 5*time.Second, "load on replica a", func() bool { return toA.Load() > 100 })
	shutStart := time.Now()
	if err := a.Shutdown(testsupport.Context(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	after := sent.Load()
	testsupport.Eventually(t, 10*time.Second, "load after the shutdown", func() bool { return sent.Load() > after+100 })
	cancel()
	<-loadDone
	t.Logf("%d requests, %d to a; shutdown took %v", sent.Load(), toA.Load(), time.Since(shutStart).Round(time.Millisecond))
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of %d requests failed (first: %v)", n, sent.Load(), firstErr.Load())
	}
}
