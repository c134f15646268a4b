package replica_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// TestWeightBombIgnored reproduces issue 12's crash: a record of weight 1e9
// (and one of 2^31, which overflows int32 offsets) beside normal instances.
// Both records must be ignored and counted, the others keep routing, and the
// replica's heap must not grow by the gigabytes the ring would have taken.
func TestWeightBombIgnored(t *testing.T) {
	ctx := testsupport.Context(t, 30*time.Second)
	f, rep, _ := startFleet(t, 2)
	cli := f.Client()
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	invoke := func() int {
		resp, err := hc.Post(rep.URL()+"/invocations", "application/json", strings.NewReader(`{"inputs":"hello"}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	testsupport.Eventually(t, 5*time.Second, "two instances routed", func() bool {
		s := rep.Router().Snapshot().Endpoint("chat")
		return s != nil && len(s.Instances) == 2
	})
	if code := invoke(); code != 200 {
		t.Fatalf("before: status %d", code)
	}
	before := replica.HeapInUse()
	l := membership.Layout{}
	for id, w := range map[string]string{"bomb-1e9": "1000000000", "bomb-2p31": "2147483648"} {
		if _, err := cli.Put(ctx, l.InstanceKey("chat", id), `{"id":"`+id+`","addr":"http://127.0.0.1:9","weight":`+w+`}`); err != nil {
			t.Fatal(err)
		}
	}
	testsupport.Eventually(t, 5*time.Second, "both records counted as invalid", func() bool {
		return testsupport.Sum(t, rep.Registry(), "prefixrouter_membership_invalid_records_total", map[string]string{"kind": "instance"}) == 2
	})
	for range 50 {
		if code := invoke(); code != 200 {
			t.Fatalf("after the bombs: status %d", code)
		}
	}
	if n := len(rep.Router().Snapshot().Endpoint("chat").Instances); n != 2 {
		t.Fatalf("instances = %d, want the two valid ones", n)
	}
	after := replica.HeapInUse()
	if after > before && after-before > 10<<20 {
		t.Fatalf("heap grew by %d bytes, want < 10 MiB", after-before)
	}
	t.Logf("heap before %d, after %d bytes", before, after)
}

// connCounter is a loopback listener that counts the connections it
// accepts and closes them.
type connCounter struct {
	ln   net.Listener
	n    atomic.Int64
	done chan struct{}
}

func countConns(t *testing.T, addr string) *connCounter {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := &connCounter{ln: ln, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c.n.Add(1)
			conn.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-c.done })
	return c
}

func (c *connCounter) port() string { return strconv.Itoa(c.ln.Addr().(*net.TCPAddr).Port) }

// TestSSRFRecordsGetNoConnection writes records that point at a file, an FTP
// URL, the cloud metadata address, a URL with user info and an address
// outside --allowed-upstreams. None may receive a connection, health probes
// included, while a valid instance is probed and served.
func TestSSRFRecordsGetNoConnection(t *testing.T) {
	ctx := testsupport.Context(t, 30*time.Second)
	f, err := localfleet.Start(ctx, localfleet.Options{
		Endpoint: "chat", FastEtcd: true,
		Replica: replica.Options{
			AllowedUpstreams: []string{"127.0.0.1/32"},
			Router:           router.Options{HealthCheckInterval: 10 * time.Millisecond, LoadPollInterval: 10 * time.Millisecond},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	cli := f.Client()
	var probes atomic.Int64
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			probes.Add(1)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer good.Close()
	if _, err := f.Register(ctx, fleet.Instance{ID: "good", Addr: good.URL}, 0); err != nil {
		t.Fatal(err)
	}
	inside := countConns(t, "127.0.0.1:0")
	outside := countConns(t, "127.0.0.2:0")
	rep, err := f.AddReplica(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hostile := map[string]string{
		"file":       "file:///etc/passwd",
		"ftp":        "ftp://127.0.0.1:" + inside.port() + "/",
		"metadata":   "http://169.254.169.254/latest/meta-data/",
		"userinfo":   "http://admin:pw@127.0.0.1:" + inside.port(),
		"query":      "http://127.0.0.1:" + inside.port() + "/?x=1",
		"notallowed": "http://127.0.0.2:" + outside.port(),
	}
	l := membership.Layout{}
	for id, addr := range hostile {
		if _, err := cli.Put(ctx, l.InstanceKey("chat", id), `{"id":"`+id+`","addr":"`+addr+`"}`); err != nil {
			t.Fatal(err)
		}
	}
	testsupport.Eventually(t, 5*time.Second, "hostile records counted", func() bool {
		return testsupport.Sum(t, rep.Registry(), "prefixrouter_membership_invalid_records_total", map[string]string{"kind": "upstream"}) == float64(len(hostile))
	})
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	for range 20 {
		resp, err := hc.Post(rep.URL()+"/invocations", "application/json", strings.NewReader(`{"inputs":"x"}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get(router.HeaderInstance) != "good" {
			t.Fatalf("status %d from %q", resp.StatusCode, resp.Header.Get(router.HeaderInstance))
		}
	}
	// Several probe rounds must have run since the records arrived.
	from := probes.Load()
	testsupport.Eventually(t, 5*time.Second, "probe rounds", func() bool { return probes.Load() >= from+3 })
	if n, m := inside.n.Load(), outside.n.Load(); n != 0 || m != 0 {
		t.Fatalf("hostile addresses received %d and %d connections, want 0", n, m)
	}
	if n := len(rep.Router().Snapshot().Endpoint("chat").Instances); n != 1 {
		t.Fatalf("instances = %d, want only the valid one", n)
	}
}

// TestInvalidEndpointKeyIgnored: a record under an endpoint name that is
// not valid UTF-8 (or has a space) is ignored and counted, and /metrics
// stays 200 (issue 12: metric creation panicked on such a label).
func TestInvalidEndpointKeyIgnored(t *testing.T) {
	ctx := testsupport.Context(t, 30*time.Second)
	f, rep, ins := startFleet(t, 1)
	cli := f.Client()
	good := fleet.Instance{ID: ins[0].ID, Addr: ins[0].URL()}
	l := membership.Layout{}
	for _, ep := range []string{"\xff\xfe", "a b", "caf\xc3"} {
		if _, err := cli.Put(ctx, l.InstanceKey(ep, "x"), `{"id":"x","addr":"`+good.Addr+`"}`); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, l.ConfigKey(ep), `{"RoutingStrategy":"RANDOM"}`); err != nil {
			t.Fatal(err)
		}
	}
	testsupport.Eventually(t, 5*time.Second, "bad endpoint records counted", func() bool {
		return testsupport.Sum(t, rep.Registry(), "prefixrouter_membership_invalid_records_total", map[string]string{"kind": "endpoint"}) == 6
	})
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	// Traffic creates the per-endpoint series that a bad name broke.
	inv, err := hc.Post(rep.URL()+"/invocations", "application/json", strings.NewReader(`{"inputs":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, inv.Body)
	inv.Body.Close()
	if inv.StatusCode != 200 {
		t.Fatalf("invocation: %d", inv.StatusCode)
	}
	resp, err := hc.Get("http://" + rep.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `endpoint="chat"`) {
		t.Fatalf("/metrics = %d\n%s", resp.StatusCode, body)
	}
	if n := len(rep.Router().Snapshot().Endpoints); n != 1 {
		t.Fatalf("endpoints in the snapshot = %d, want only chat", n)
	}
}

// TestRecordsAtOwnListenersRefused reproduces issue 19's loop: a record
// pointing at the replica's own data port (inside the default allow list)
// turned 30 requests into 180 router requests. Records at the data and admin
// ports, in the spellings 127.0.0.1 and localhost, must be ignored and
// counted, and 30 requests must stay 30.
func TestRecordsAtOwnListenersRefused(t *testing.T) {
	f, rep, _ := startFleet(t, 1)
	loops := map[string]string{
		"loop-data":  "http://" + rep.Addr(),
		"loop-name":  "http://localhost:" + portOf(rep.Addr()),
		"loop-admin": "http://127.0.0.1:" + portOf(rep.AdminAddr()),
	}
	refusedAndNoLoop(t, f, rep, loops)
}

// portOf is the port of a host:port address.
func portOf(hostPort string) string { return hostPort[strings.LastIndex(hostPort, ":")+1:] }

// refusedAndNoLoop writes records for chat's instances, waits until each
// is counted as an invalid upstream, and checks that 30 requests reach
// instance i-0 and the router 30 times.
func refusedAndNoLoop(t *testing.T, f *localfleet.Fleet, rep *replica.Replica, records map[string]string) {
	t.Helper()
	ctx := testsupport.Context(t, 30*time.Second)
	l := membership.Layout{}
	for id, addr := range records {
		if _, err := f.Client().Put(ctx, l.InstanceKey("chat", id), `{"id":"`+id+`","addr":"`+addr+`"}`); err != nil {
			t.Fatal(err)
		}
	}
	testsupport.Eventually(t, 5*time.Second, "the records counted as invalid upstreams", func() bool {
		return testsupport.Sum(t, rep.Registry(), "prefixrouter_membership_invalid_records_total", map[string]string{"kind": "upstream"}) == float64(len(records))
	})
	before := testsupport.Sum(t, rep.Registry(), "prefixrouter_requests_total", nil)
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	for i := range 30 {
		resp, err := hc.Post(rep.URL()+"/invocations", "application/json", strings.NewReader(`{"inputs":"loop `+string(rune('a'+i%26))+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get(router.HeaderInstance) != "i-0" {
			t.Fatalf("request %d: status %d from %q", i, resp.StatusCode, resp.Header.Get(router.HeaderInstance))
		}
	}
	if got := testsupport.Sum(t, rep.Registry(), "prefixrouter_requests_total", nil) - before; got != 30 {
		t.Fatalf("the router served %v requests for 30 sent: records loop back to it", got)
	}
}

// TestRecordsNamingOwnListenersRefused: a record whose host name resolves
// to the replica's own data or admin port looped as its IP literal did
// (issue 19: only literals and localhost were refused), and a name that
// resolves to a metadata address reached it. Names are resolved when the
// record is accepted (the resolver here answers loopback and metadata
// addresses for made-up names; nothing is looked up on the network): such
// records are ignored and counted, the others kept, and 30 requests stay 30.
func TestRecordsNamingOwnListenersRefused(t *testing.T) {
	names := map[string][]netip.Addr{
		"router.internal": {netip.MustParseAddr("127.0.0.1")},
		"admin.internal":  {netip.MustParseAddr("::ffff:127.0.0.1")},
		"meta.internal":   {netip.MustParseAddr("fd00:ec2::254")},
		"link.internal":   {netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("169.254.169.254")},
	}
	f, rep, _ := startFleetWith(t, 1, func(o *replica.Options) {
		o.AllowedUpstreams = append(slices.Clone(fleet.DefaultUpstreams), ".internal")
		o.Resolver = func(_ context.Context, host string) ([]netip.Addr, error) {
			if as, ok := names[host]; ok {
				return slices.Clone(as), nil
			}
			return nil, errors.New("no such host")
		}
	})
	refused := map[string]string{
		"loop-data":  "http://router.internal:" + portOf(rep.Addr()),
		"loop-admin": "http://admin.internal:" + portOf(rep.AdminAddr()),
		"metadata":   "http://meta.internal/",
		"link-local": "http://link.internal:8000",
	}
	refusedAndNoLoop(t, f, rep, refused)
}
