package proxybench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// sample is one measured run of closed-loop clients against one target.
type sample struct {
	requests int
	errors   int
	firstErr error
	elapsed  time.Duration
	p50, p99 time.Duration
	cpu      time.Duration // the proxy process's CPU time during the run; 0 for direct
}

func (s sample) rate() float64 { return float64(s.requests) / s.elapsed.Seconds() }

// load sends bodies to t from clients closed-loop clients (each sends its
// next request when the last answer has been read) for warmup, unmeasured,
// then for d or until maxRequests answers, whichever comes first.
func load(ctx context.Context, t *target, bodies [][]byte, clients int, warmup, d time.Duration, maxRequests int) (sample, error) {
	tr := &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients, DisableCompression: true, ForceAttemptHTTP2: false}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	send := func(i int) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.urls[i%len(t.urls)], bytes.NewReader(bodies[i]))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		return err
	}
	// One phase: every client loops until the deadline or the shared
	// budget of requests is spent.
	phase := func(d time.Duration, budget int, record bool) (lat [][]time.Duration, errs int, firstErr error) {
		lat = make([][]time.Duration, clients)
		var (
			left   atomic.Int64
			nerr   atomic.Int64
			errMu  sync.Mutex // guards firstErr
			wg     sync.WaitGroup
			finish = time.Now().Add(d)
		)
		left.Store(int64(budget))
		for c := range clients {
			wg.Go(func() {
				i := c * len(bodies) / clients // clients start at different documents
				for ctx.Err() == nil && time.Now().Before(finish) && left.Add(-1) >= 0 {
					start := time.Now()
					err := send(i % len(bodies))
					if err != nil {
						nerr.Add(1)
						errMu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						errMu.Unlock()
					} else if record {
						lat[c] = append(lat[c], time.Since(start))
					}
					i++
				}
			})
		}
		wg.Wait()
		return lat, int(nerr.Load()), firstErr
	}
	phase(warmup, maxRequests, false)
	if err := ctx.Err(); err != nil {
		return sample{}, err
	}
	cpu0, err := t.cpu()
	if err != nil {
		return sample{}, err
	}
	start := time.Now()
	lat, nerr, firstErr := phase(d, maxRequests, true)
	elapsed := time.Since(start)
	cpu1, err := t.cpu()
	if err != nil {
		return sample{}, err
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	return sample{
		requests: len(all), errors: nerr, firstErr: firstErr, elapsed: elapsed,
		p50: percentile(all, 0.50), p99: percentile(all, 0.99), cpu: cpu1 - cpu0,
	}, ctx.Err()
}

// cpu is the proxy process's CPU time so far; 0 for direct.
func (t *target) cpu() (time.Duration, error) {
	if t.pid == 0 {
		return 0, nil
	}
	return cpuTime(t.pid)
}
