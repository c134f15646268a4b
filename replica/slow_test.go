package replica

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/router"
)

// startStatic starts a replica over a static fleet with the given limits.
func startStatic(t *testing.T, insts []fleet.Instance, lim Limits) *Replica {
	t.Helper()
	rep, err := Start(context.Background(), Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Static: insts, Logger: quiet, Limits: lim,
		Router: router.Options{DefaultEndpoint: "chat"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rep.Close(context.Background()) })
	return rep
}

// post sends one small invocation on a fresh connection and returns the status.
func post(t *testing.T, url string) int {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Post(url+"/invocations", "application/json", strings.NewReader(`{"inputs":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// waitClosed reads conn until the server closes it (or within bounds it
// does not), discarding whatever response comes first.
func waitClosed(conn net.Conn, within time.Duration) error {
	_ = conn.SetReadDeadline(time.Now().Add(within))
	_, err := io.Copy(io.Discard, conn)
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "reset by peer") {
		return nil
	}
	return err
}

// TestSlowBodiesCutOff reproduces issue 12's memory exhaustion: 200 sockets
// declare a 6 MiB body and send nothing. They must cost the replica far less
// than 200 × 6 MiB while other clients are served, and be closed by the body
// deadline.
func TestSlowBodiesCutOff(t *testing.T) {
	const n, bodyTimeout = 200, 5 * time.Second
	rep := startStatic(t, backends(t, 1), Limits{BodyReadTimeout: bodyTimeout})
	before := HeapInUse()
	goroutines := runtime.NumGoroutine()
	conns := make([]net.Conn, n)
	start := time.Now()
	for i := range conns {
		c, err := net.Dial("tcp", rep.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := fmt.Fprintf(c, "POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", 6<<20); err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	// Every socket has a serving goroutine once the server took it.
	testsupport.Eventually(t, 5*time.Second, "slow sockets accepted", func() bool { return runtime.NumGoroutine() >= goroutines+n })
	for range 20 {
		if code := post(t, rep.URL()); code != 200 {
			t.Fatalf("a normal client got %d while slow sockets were held", code)
		}
	}
	during := HeapInUse()
	if time.Since(start) >= bodyTimeout {
		t.Fatalf("setup took %v, longer than the body deadline: the heap was not measured while the sockets were held", time.Since(start))
	}
	grew := int64(during) - int64(before)
	t.Logf("heap grew by %d KiB with %d slow sockets held", grew>>10, n)
	if grew > 64<<20 {
		t.Fatalf("heap grew by %d MiB, want < 64 MiB", grew>>20)
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, c := range conns {
		wg.Go(func() {
			if err := waitClosed(c, bodyTimeout+10*time.Second); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a slow socket was not closed by the body deadline: %v", err)
	}
	if took := time.Since(start); took < bodyTimeout {
		t.Fatalf("slow sockets closed after %v, before the %v deadline", took, bodyTimeout)
	}
}

// TestIdleKeepAlivesClosed: 1,000 keep-alive connections that each made one
// request and went quiet are closed by the server after the idle timeout.
func TestIdleKeepAlivesClosed(t *testing.T) {
	const n, idle = 1000, 500 * time.Millisecond
	rep := startStatic(t, backends(t, 1), Limits{IdleTimeout: idle})
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", rep.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, c := range conns {
		wg.Go(func() {
			sent := time.Now() // the server's idle clock starts after this
			if _, err := io.WriteString(c, "GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				errs <- err
				return
			}
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				errs <- err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.Close {
				errs <- errors.New("the server did not keep the connection alive")
				return
			}
			_ = c.SetReadDeadline(time.Now().Add(idle + 10*time.Second))
			if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
				errs <- fmt.Errorf("idle connection: read = %v, want EOF", err)
				return
			}
			if d := time.Since(sent); d < idle {
				errs <- fmt.Errorf("closed %v after the request, before the idle timeout", d)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestConnectionCap: beyond MaxConns a new connection is not served until
// one closes.
func TestConnectionCap(t *testing.T) {
	rep := startStatic(t, backends(t, 1), Limits{MaxConns: 2, IdleTimeout: time.Minute})
	held := make([]net.Conn, 2)
	for i := range held {
		c, err := net.Dial("tcp", rep.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		if _, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
			t.Fatal(err)
		}
		held[i] = c
	}
	third, err := net.Dial("tcp", rep.Addr()) // the kernel accepts; the server does not
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	if _, err := io.WriteString(third, "GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(third)
	_ = third.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := br.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("third connection over a cap of 2: read = %v, want no answer", err)
	}
	held[0].Close()
	_ = third.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("third connection after one closed: %v %v", resp, err)
	}
}

// TestStalledStreamReleasesSlot: a client that stops reading a stream has
// it aborted after the write-idle limit, and the instance's in-flight count
// returns to 0.
func TestStalledStreamReleasesSlot(t *testing.T) {
	upstreamDone := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(upstreamDone)
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := []byte("data: " + strings.Repeat("x", 32<<10) + "\n\n")
		// Bounded: at most 1 GiB or 30 s, far beyond what the socket
		// buffers take before the router's write stalls.
		deadline := time.Now().Add(30 * time.Second)
		for i := 0; i < 1<<15 && time.Now().Before(deadline); i++ {
			if _, err := w.Write(chunk); err != nil {
				return
			}
			http.NewResponseController(w).Flush()
		}
	}))
	defer srv.Close()
	rep := startStatic(t, []fleet.Instance{{ID: "s", Addr: srv.URL}}, Limits{WriteIdleTimeout: 300 * time.Millisecond})
	c, err := net.Dial("tcp", rep.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
		t.Fatal(err)
	}
	inFlight := func() int64 {
		st, _ := rep.Router().Status("chat", "s")
		return st.InFlight
	}
	testsupport.Eventually(t, 5*time.Second, "stream in flight", func() bool { return inFlight() == 1 })
	// The client reads nothing from here on.
	select {
	case <-upstreamDone:
	case <-time.After(20 * time.Second):
		t.Fatal("the stalled stream was not aborted")
	}
	testsupport.Eventually(t, 5*time.Second, "slot released", func() bool { return inFlight() == 0 })
}
