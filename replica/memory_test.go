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
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

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
	const clients, size = 64, router.DefaultMaxBodyBytes // 6 MiB, the default limit
	_, send := bigBodies(t, replica.Options{
		Static: []fleet.Instance{{ID: "a", Addr: up.URL, Labels: map[string]string{"model": "base"}}},
		Router: router.Options{DefaultEndpoint: "chat"},
	}, clients, size, "/v1/chat/completions", `{"messages":[{"role":"user","content":"`, `"}],"stream":false,"model":"base"}`)
	rssUnder64MiB(t, "6 MiB bodies with model last", clients, send)
}

// peakRSSGrowth runs send on clients goroutines at once and returns how
// far the process's peak RSS rose above its RSS after a collection before
// them, and how long they took. Every send must succeed.
func peakRSSGrowth(t *testing.T, clients int, send func() (int, error)) (int64, time.Duration) {
	t.Helper()
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
	return peak - base, took
}

// tailServer is a model server that reads each body to its end, holding
// only its last bytes, and answers 500 when check refuses them.
func tailServer(t *testing.T, check func(tail []byte) error) string {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var tail [256]byte
		n := 0
		buf := make([]byte, 32<<10)
		for {
			k, err := r.Body.Read(buf)
			if k > 0 {
				keep := buf[max(0, k-len(tail)):k]
				if n+len(keep) > len(tail) {
					copy(tail[:], tail[n+len(keep)-len(tail):n])
					n = len(tail) - len(keep)
				}
				n += copy(tail[n:], keep)
			}
			if err != nil {
				break
			}
		}
		if err := check(tail[:n]); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, `{"choices":[]}`)
	}))
	t.Cleanup(up.Close)
	return up.URL
}

// startQuiet starts a replica with opts on loopback ports, logging nothing;
// it is closed when the test ends.
func startQuiet(t *testing.T, opts replica.Options) *replica.Replica {
	t.Helper()
	opts.Listen, opts.AdminListen, opts.Logger = "127.0.0.1:0", "127.0.0.1:0", slog.New(slog.DiscardHandler)
	rep, err := replica.Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rep.Close(context.Background()) })
	return rep
}

// bigBodies starts a replica with opts over the instances at addrs and
// returns a sender of one body of size bytes (prefix, 'a's, suffix) to
// path, declared, as a client of clients connections sends it.
func bigBodies(t *testing.T, opts replica.Options, clients, size int, path, prefix, suffix string) (*replica.Replica, func() (int, error)) {
	t.Helper()
	rep := startQuiet(t, opts)
	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	return rep, func() (int, error) {
		body := io.MultiReader(strings.NewReader(prefix), &filler{n: size - len(prefix) - len(suffix)}, strings.NewReader(suffix))
		req, err := http.NewRequest(http.MethodPost, rep.URL()+path, body)
		if err != nil {
			return 0, err
		}
		req.ContentLength = int64(size)
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
}

// TestSaltedBodiesBoundedRSS: on an endpoint with TenantCacheSalt, 64
// concurrent 6 MiB tenant bodies were each read whole, and copied once
// more with the salt (issue 19: bodies beyond what the key needs must
// stream on every path). Their key is in their first bytes: they stream,
// the salt goes in at their end (the model server checks it is there),
// and the peak RSS grows less than 64 MiB.
func TestSaltedBodiesBoundedRSS(t *testing.T) {
	if raceEnabled {
		t.Skip("RSS under the race detector means nothing")
	}
	defer debug.SetGCPercent(debug.SetGCPercent(replica.DefaultGCPercent))
	up := tailServer(t, func(tail []byte) error {
		if !bytes.Contains(tail, []byte(`"cache_salt":"`)) || !bytes.HasSuffix(tail, []byte(`"}`)) {
			return fmt.Errorf("the body ends %q: no cache salt", tail[max(0, len(tail)-80):])
		}
		return nil
	})
	const clients, size = 64, router.DefaultMaxBodyBytes
	_, send := bigBodies(t, replica.Options{
		Static:  []fleet.Instance{{ID: "a", Addr: up, Labels: map[string]string{"model": "base"}}},
		Routing: fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, TenantCacheSalt: true},
		Router:  router.Options{DefaultEndpoint: "chat"},
	}, clients, size, "/v1/chat/completions", `{"model":"base","prompt_cache_key":"tenant-1","messages":[{"role":"user","content":"`, `"}]}`)
	rssUnder64MiB(t, "salted bodies", clients, send)
}

// rssUnder64MiB sends one body to warm up (it must succeed), then runs
// peakRSSGrowth and fails at a growth of 64 MiB or more.
func rssUnder64MiB(t *testing.T, what string, clients int, send func() (int, error)) {
	t.Helper()
	if code, err := send(); err != nil {
		t.Fatalf("status %d: %v", code, err)
	}
	growth, took := peakRSSGrowth(t, clients, send)
	t.Logf("%d concurrent %s: peak RSS +%d MiB, %v", clients, what, growth>>20, took.Round(time.Millisecond))
	if growth >= 64<<20 {
		t.Fatalf("peak RSS grew by %d MiB, want < 64 MiB", growth>>20)
	}
}

// TestHotKeyBodiesBoundedRSS: a hot key's spread hash reads the end of its
// bodies, so they are read whole before the pick; 64 concurrent 6 MiB
// bodies of a hot key were each grown in memory outside any bound (issue
// 19). They are held in the router's body buffer (32 MiB), wait their
// turn for it, are all served, and the peak RSS grows less than 64 MiB.
func TestHotKeyBodiesBoundedRSS(t *testing.T) {
	if raceEnabled {
		t.Skip("RSS under the race detector means nothing")
	}
	defer debug.SetGCPercent(debug.SetGCPercent(replica.DefaultGCPercent))
	check := func([]byte) error { return nil }
	insts := []fleet.Instance{{ID: "a", Addr: tailServer(t, check)}, {ID: "b", Addr: tailServer(t, check)}}
	cfg := fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{
		PrefixLength: fleet.MinPrefixLength, FixedLengthKeys: true, HotKeyReplication: true,
	}}
	const clients, size = 64, router.DefaultMaxBodyBytes
	rep, send := bigBodies(t, replica.Options{Static: insts, Routing: cfg, Router: router.Options{DefaultEndpoint: "inv"}},
		clients, size, "/invocations", `{"inputs":"`, `"}`)
	// Make the key hot: every request so far has it.
	small := `{"inputs":"` + strings.Repeat("a", 2*fleet.MinPrefixLength) + `"}`
	hot := func() bool {
		ex, err := rep.Router().Explain(context.Background(), router.PickRequest{Path: "/invocations", Body: []byte(small)})
		return err == nil && ex.HotReplicas > 1
	}
	for i := 0; i < 1000 && !hot(); i++ {
		if resp, err := http.Post(rep.URL()+"/invocations", "application/json", strings.NewReader(small)); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	if !hot() {
		t.Fatal("the key is not hot after 1,000 requests")
	}
	rssUnder64MiB(t, "6 MiB bodies of a hot key", clients, send)
}

// TestExtProcBigBodiesPassedInChunks: 16 concurrent ext_proc streams of
// 6 MiB OpenAI bodies whose model member is last, sent in 64 KiB chunks as
// Envoy streams them, are all picked and every byte is passed on. The
// picker holds them in the router's body buffer (issue 19; the bound is
// router.TestHeldBodyBounded's) and passes them on in messages of at most
// 64 KiB: it sent each as one 6 MiB message, which a gRPC peer with the
// default 4 MiB receive limit refuses. The live heap (sampled after each
// collection) and RSS are logged, not bounded: every chunk is a gRPC
// message decoded into a new buffer on both sides (the client is in this
// process), and that garbage drives them here, not anything held.
func TestExtProcBigBodiesPassedInChunks(t *testing.T) {
	if raceEnabled {
		t.Skip("RSS under the race detector means nothing")
	}
	defer debug.SetGCPercent(debug.SetGCPercent(replica.DefaultGCPercent))
	rep := startQuiet(t, replica.Options{ExtProcListen: "127.0.0.1:0", Router: router.Options{DefaultEndpoint: "chat"},
		Static: []fleet.Instance{{ID: "a", Addr: "http://127.0.0.1:9", Labels: map[string]string{"model": "base"}}}})
	conn, err := grpc.NewClient(rep.ExtProcAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	const (
		clients = 16
		size    = router.DefaultMaxBodyBytes
		chunk   = 64 << 10
	)
	prefix, suffix := `{"messages":[{"role":"user","content":"`, `"}],"model":"base"}`
	fill := bytes.Repeat([]byte("a"), chunk)
	send := func() (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		st, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
		if err != nil {
			return 0, err
		}
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":path", RawValue: []byte("/v1/chat/completions")},
				{Key: "content-length", RawValue: []byte(strconv.Itoa(size))},
			}},
		}}}); err != nil {
			return 0, err
		}
		for sent := 0; sent < size; {
			b := fill[:min(chunk, size-sent)]
			switch {
			case sent == 0:
				b = append([]byte(prefix), fill[:len(b)-len(prefix)]...)
			case sent+len(b) == size:
				b = append(fill[:len(b)-len(suffix):len(b)-len(suffix)], suffix...)
			}
			sent += len(b)
			if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: sent == size}}}); err != nil {
				return 0, err
			}
		}
		r, err := st.Recv()
		if err != nil {
			return 0, err
		}
		if ir := r.GetImmediateResponse(); ir != nil {
			return int(ir.GetStatus().GetCode()), fmt.Errorf("%s", ir.GetBody())
		}
		for passed := 0; passed < size; {
			r, err := st.Recv()
			if err != nil {
				return 0, err
			}
			passed += len(r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody())
		}
		return 200, st.CloseSend()
	}
	if code, err := send(); err != nil {
		t.Fatalf("status %d: %v", code, err)
	}
	runtime.GC()
	base := liveHeap()
	var peak uint64
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			peak = max(peak, liveHeap())
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	growth, took := peakRSSGrowth(t, clients, send)
	close(done)
	<-sampled
	t.Logf("%d concurrent ext_proc streams of %d-byte bodies with model last: live heap %d MiB before, peak %d MiB; peak RSS +%d MiB; %v",
		clients, size, base>>20, peak>>20, growth>>20, took.Round(time.Millisecond))

}

// liveHeap is the heap the last collection found reachable.
func liveHeap() uint64 {
	m := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(m)
	return m[0].Value.Uint64()
}
