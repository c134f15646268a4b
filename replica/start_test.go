package replica

import (
	"errors"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/router"
)

// freeAddrs reserves n loopback ports and releases them, for options that
// must name their ports in advance so that the test can check them after.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ln.Addr().String())
		defer ln.Close()
	}
	return out
}

// TestStartFailureUnwindsEveryStep fails Start right after each of its steps
// in turn, with every part in play (embedded etcd, its own client, tracing,
// registration, ext_proc; or a static fleet and its prober), and checks that
// the failure stopped everything the earlier steps started: no goroutine
// left and every port free again. The last case fails nothing and checks
// Close the same way.
func TestStartFailureUnwindsEveryStep(t *testing.T) {
	var names []string
	for _, s := range (&Replica{}).steps() {
		names = append(names, s.name)
	}
	for _, fleetKind := range []string{"etcd", "static"} {
		for _, failAfter := range append(names, "") {
			name := failAfter
			if name == "" {
				name = "none (Close)"
			}
			t.Run(fleetKind+"/"+name, func(t *testing.T) { startAndUnwind(t, fleetKind == "static", failAfter) })
		}
	}
}

// startAndUnwind is one case of TestStartFailureUnwindsEveryStep.
func startAndUnwind(t *testing.T, static bool, failAfter string) {
	addrs := freeAddrs(t, 4)
	ignore := goleak.IgnoreCurrent()
	ctx := testsupport.Context(t, 30*time.Second)
	opts := Options{
		Listen: addrs[0], AdminListen: addrs[1], ExtProcListen: addrs[2],
		EmbeddedEtcdDir: t.TempDir(), EmbeddedEtcdClientURL: "http://" + addrs[3],
		// Nothing listens there; the exporter only dials to send
		// spans, and no span is sent.
		OTLPEndpoint: "http://127.0.0.1:1",
		Router:       router.Options{DefaultEndpoint: "chat"},
		Logger:       quiet,
	}
	if static {
		// Nothing listens at the instance either: its prober's
		// requests fail, which is all this test needs of it.
		opts.EmbeddedEtcdDir, opts.EmbeddedEtcdClientURL = "", ""
		opts.Static = []fleet.Instance{{ID: "i-0", Addr: "http://" + addrs[3]}}
	}
	rep, err := start(ctx, opts, failAfter)
	switch {
	case failAfter == "" && err != nil:
		t.Fatal(err)
	case failAfter == "":
		if rep.tracing == nil || rep.epp == nil || (rep.reg == nil) != static || (rep.static == nil) != !static {
			t.Fatalf("a part is missing: tracing %v, registration %v, ext_proc %v, static prober %v", rep.tracing != nil, rep.reg != nil, rep.epp != nil, rep.static != nil)
		}
		if err := rep.Close(ctx); err != nil {
			t.Fatal(err)
		}
	case !errors.Is(err, errInjected):
		t.Fatalf("start failing after %q: %v, want the injected failure", failAfter, err)
	}
	if err := goleak.Find(ignore); err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("%s still taken: %v", a, err)
		}
		ln.Close()
	}
}
