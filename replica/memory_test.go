package replica_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// filler reads n bytes of 'a' without holding them.
type filler struct{ n int }

func (f *filler) Read(p []byte) (int, error) {
	if f.n == 0 {
		return 0, io.EOF
	}
	k := min(len(p), f.n)
	for i := range p[:k] {
		p[i] = 'a'
	}
	f.n -= k
	return k, nil
}

// procStatus reads a field of /proc/self/status in bytes (Linux).
func procStatus(t *testing.T, field string) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// TestModelLastBodiesBoundedRSS reproduces issue 19's memory probe: 64
// concurrent 6 MiB OpenAI bodies whose model member is last took +900 MiB
// RSS (about 14 MiB per request). They are read whole before the pick, but
// into the router's body buffer (32 MiB by default, one for the replica):
// the bodies wait their turn for it, all are served, and the process's
// peak RSS grows less than 64 MiB. Run with the GC target `serve` sets
// (--gc-percent 400). The client and the model server are in this process
// too; neither holds a body (the client generates it, the server discards
// it).
func TestModelLastBodiesBoundedRSS(t *testing.T) {
	if raceEnabled {
		t.Skip("RSS under the race detector means nothing")
	}
	defer debug.SetGCPercent(debug.SetGCPercent(replica.DefaultGCPercent))
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `{"choices":[]}`)
	}))
	defer up.Close()
	rep, err := replica.Start(context.Background(), replica.Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
		Static: []fleet.Instance{{ID: "a", Addr: up.URL, Labels: map[string]string{"model": "base"}}},
		Router: router.Options{DefaultEndpoint: "chat"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close(context.Background())
	const (
		clients = 64
		size    = router.DefaultMaxBodyBytes // 6 MiB, the default limit
	)
	prefix, suffix := `{"messages":[{"role":"user","content":"`, `"}],"stream":false,"model":"base"}`
	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	send := func() (int, error) {
		body := io.MultiReader(strings.NewReader(prefix), &filler{n: size - len(prefix) - len(suffix)}, strings.NewReader(suffix))
		req, err := http.NewRequest(http.MethodPost, rep.URL()+"/v1/chat/completions", body)
		if err != nil {
			return 0, err
		}
		req.ContentLength = size
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			return resp.StatusCode, fmt.Errorf("%s", bytes.TrimSpace(b))
		}
		return 200, nil
	}
	// Warm up with a small request; then the baseline.
	if resp, err := client.Post(rep.URL()+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"base","messages":[{"role":"user","content":"hi"}]}`)); err != nil {
		t.Fatal(err)
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	runtime.GC()
	debug.FreeOSMemory()
	base := procStatus(t, "VmRSS")
	// Reset the peak (VmHWM) to now: Linux's clear_refs, value 5.
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Skipf("cannot reset the RSS peak: %v", err)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for range clients {
		wg.Go(func() {
			if code, err := send(); err != nil {
				errs <- fmt.Errorf("status %d: %w", code, err)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	peak := procStatus(t, "VmHWM")
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	growth := peak - base
	t.Logf("%d concurrent %d-byte bodies with model last: RSS %d MiB before, peak %d MiB (+%d MiB), %v", clients, size, base>>20, peak>>20, growth>>20, took.Round(time.Millisecond))
	if growth >= 64<<20 {
		t.Fatalf("peak RSS grew by %d MiB, want < 64 MiB", growth>>20)
	}
}
