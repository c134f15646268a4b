package proxybench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/subprocess"
)

// target is what the load is sent to: the backends directly, or a proxy
// process in front of them.
type target struct {
	name  string
	urls  []string            // body i goes to urls[i%len(urls)]
	pid   int                 // the proxy's process, whose CPU is measured; 0 for direct
	admin string              // prefixrouter's admin address (profiles), "" otherwise
	proc  *subprocess.Process // nil for direct
	log   *bytes.Buffer       // the proxy's output, quoted when it fails to start
}

func directTarget(b *backends) *target {
	urls := make([]string, len(b.urls))
	for i, u := range b.urls {
		urls[i] = u + "/invocations"
	}
	return &target{name: "direct", urls: urls}
}

// freePort returns a loopback address nothing listens on at the moment.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("proxybench: free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// startPrefixrouter runs `bin serve` with a static fleet of the backends,
// the defaults and PrefixLength 4096, and waits until it routes.
func startPrefixrouter(ctx context.Context, bin string, b *backends, pprof bool) (*target, error) {
	listen, err := freePort()
	if err != nil {
		return nil, err
	}
	admin, err := freePort()
	if err != nil {
		return nil, err
	}
	static := make([]string, len(b.urls))
	for i, u := range b.urls {
		static[i] = fmt.Sprintf("b%d=%s", i, u)
	}
	args := []string{"serve", "--listen", listen, "--admin-listen", admin,
		"--static-instances", strings.Join(static, ","), "--prefix-length", "4096", "--log-level", "error"}
	if pprof {
		args = append(args, "--pprof")
	}
	t := &target{name: "prefixrouter", urls: []string{"http://" + listen + "/invocations"}, admin: admin}
	return t, t.start(ctx, bin, args...)
}

// haproxyConfig is the configuration of issue 9's table: the first 4096
// body bytes hashed on a consistent ring with bounded load, the body
// buffered (up to tune.bufsize) before the choice.
func haproxyConfig(listen string, backends []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
    tune.bufsize 65536
    maxconn 4096

defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    option http-buffer-request

frontend fe
    bind %s
    default_backend be

backend be
    balance hash req.body,bytes(0,4096)
    hash-type consistent
    hash-balance-factor 125
`, listen)
	for i, u := range backends {
		fmt.Fprintf(&b, "    server b%d %s\n", i, strings.TrimPrefix(u, "http://"))
	}
	return b.String()
}

// startHAProxy runs haproxy in the foreground with haproxyConfig.
func startHAProxy(ctx context.Context, bin, dir string, b *backends) (*target, error) {
	listen, err := freePort()
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(haproxyConfig(listen, b.urls)), 0o600); err != nil {
		return nil, fmt.Errorf("proxybench: haproxy config: %w", err)
	}
	t := &target{name: "haproxy", urls: []string{"http://" + listen + "/invocations"}}
	return t, t.start(ctx, bin, "-db", "-f", cfg)
}

// start launches the proxy and polls it with a request until it answers
// 200, for at most 30 s.
func (t *target) start(ctx context.Context, bin string, args ...string) error {
	t.log = &bytes.Buffer{}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = t.log, t.log
	p, err := subprocess.Start(cmd)
	if err != nil {
		return fmt.Errorf("proxybench: start %s: %w", t.name, err)
	}
	t.proc, t.pid = p, p.Pid()
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, t.urls[0], strings.NewReader(`{"inputs":"ready?"}`))
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.Exited():
			return fmt.Errorf("proxybench: %s exited before it served (%v): %s", t.name, p.Err(), t.log.String())
		case <-ctx.Done():
			t.Close()
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Close()
			return fmt.Errorf("proxybench: %s did not answer within 30 s: %s", t.name, t.log.String())
		}
	}
}

// Close stops the proxy (SIGTERM, then SIGKILL after 10 s) and waits for
// it to exit.
func (t *target) Close() {
	if t.proc != nil {
		t.proc.Stop(10 * time.Second)
	}
}
