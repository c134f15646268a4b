package extproc_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/sony/gobreaker/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/prefixrouter/prefixrouter/extproc"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

// forge plays one request whose response the peer reports as a 503 from
// the picked instance (a failure whatever the engine), and returns that
// instance's address.
func forge(t *testing.T, c *cluster) string {
	t.Helper()
	e := c.open(t)
	e.headers("/invocations", nil, nil, true)
	dest := e.pickAnswer()
	e.respond(dest[0], 503)
	e.respondEnd()
	return dest[0]
}

// forgeUntilOpen forges up to n reports of a 503 and reports whether one
// opened the picked instance's breaker (after which picks are refused).
func forgeUntilOpen(t *testing.T, c *cluster, n int) bool {
	t.Helper()
	for range n {
		addr := forge(t, c)
		if st, _ := c.router.Status(endpoint, c.ids[addr]); st.Breaker == gobreaker.StateOpen {
			return true
		}
	}
	return false
}

// TestForgedOutcomesFromUnauthenticatedPeers reproduces issue 19: the
// ext_proc port had no authentication and 17 forged "served with :status
// 500" reports opened every breaker (here 503s, which count as failures
// whatever the engine). A peer that is not authenticated is
// still served picks, but its reports do not move a breaker; an
// authenticated peer's do.
func TestForgedOutcomesFromUnauthenticatedPeers(t *testing.T) {
	c := startCluster(t, fleetOf(t, 3), extproc.Options{})
	for range 17 {
		forge(t, c)
	}
	for id := range c.addrs {
		if st, _ := c.router.Status(endpoint, id); st.Breaker != gobreaker.StateClosed || st.InFlight != 0 {
			t.Fatalf("after 17 forged 503s: instance %s breaker %v, in flight %d; want closed, 0", id, st.Breaker, st.InFlight)
		}
	}
	// The same reports from a peer with the token count (five in a row
	// open a breaker, overload's default).
	trusted := startCluster(t, fleetOf(t, 3), extproc.Options{Token: "envoy-token"})
	if !forgeUntilOpen(t, trusted, 17) {
		t.Fatal("17 503s reported by an authenticated peer opened no breaker")
	}
}

// TestTokenRequired: with a token, a stream without it (or with another)
// is refused, UNAUTHENTICATED; gRPC health stays open to probes.
func TestTokenRequired(t *testing.T) {
	c := startCluster(t, fleetOf(t, 2), extproc.Options{Token: "envoy-token"})
	for _, token := range []string{"", "wrong"} {
		c.token = token
		e := c.open(t)
		e.headers("/invocations", nil, nil, true)
		if _, err := e.stream.Recv(); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("token %q: %v, want UNAUTHENTICATED", token, err)
		}
	}
	c.token = "envoy-token"
	e := c.open(t)
	e.headers("/invocations", nil, nil, true)
	e.pickAnswer()
}

// TestBodyBeforeHeadersRefused: a stream whose first request message is a
// body was picked as an invoke request on the default endpoint (issue 19);
// it is refused, INVALID_ARGUMENT, and holds no slot.
func TestBodyBeforeHeadersRefused(t *testing.T) {
	c := startCluster(t, fleetOf(t, 2), extproc.Options{})
	for _, first := range []func(*envoy){
		func(e *envoy) { e.body([]byte(`{"inputs":"x"}`), true) },
		func(e *envoy) { e.trailers() },
	} {
		e := c.open(t)
		first(e)
		if r, err := e.stream.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("answer %v, %v; want INVALID_ARGUMENT", r, err)
		}
	}
	if n := c.totalInFlight(t); n != 0 {
		t.Fatalf("%d slots held", n)
	}
}

// TestMutualTLS: with client certificates required, a peer without one
// fails the handshake, and a peer with one is authenticated: its reports
// count.
func TestMutualTLS(t *testing.T) {
	pki, other := testsupport.NewPKI(t), testsupport.NewPKI(t)
	pool := func(p testsupport.PKI) *x509.CertPool {
		b, err := os.ReadFile(p.CACert)
		if err != nil {
			t.Fatal(err)
		}
		cp := x509.NewCertPool()
		cp.AppendCertsFromPEM(b)
		return cp
	}
	serverCert, err := tls.LoadX509KeyPair(pki.ServerCert, pki.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, fleetOf(t, 3), extproc.Options{TLS: &tls.Config{
		Certificates: []tls.Certificate{serverCert}, ClientCAs: pool(pki), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	}})
	dial := func(p testsupport.PKI) extprocv3.ExternalProcessorClient {
		cert, err := tls.LoadX509KeyPair(p.ClientCert, p.ClientKey)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(c.epp.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs: pool(pki), Certificates: []tls.Certificate{cert}, ServerName: "127.0.0.1",
		})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return extprocv3.NewExternalProcessorClient(conn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A client certificate from another CA: the handshake fails.
	s, err := dial(other).Process(ctx)
	if err == nil {
		_, err = s.Recv()
	}
	if err == nil || status.Code(err) == codes.OK {
		t.Fatal("a foreign client certificate was accepted")
	}
	c.client = dial(pki)
	if !forgeUntilOpen(t, c, 17) {
		t.Fatal("503s reported by a peer with a client certificate opened no breaker")
	}
}
