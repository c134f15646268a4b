package replica

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prefixrouter/prefixrouter/admin/adminpb"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/router"
)

// TestAdminTLSAndToken serves the admin port with mTLS and a token: a client
// without a certificate, or with one from another CA, fails the handshake; a
// client with a good certificate but no token is refused Unauthenticated;
// with both, gRPC and /metrics work; health needs no token.
func TestAdminTLSAndToken(t *testing.T) {
	pki, other := testsupport.NewPKI(t), testsupport.NewPKI(t)
	const token = "t0ken"
	rep, err := Start(context.Background(), Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Static: backends(t, 1), Logger: quiet,
		Router: router.Options{DefaultEndpoint: "chat"},
		Admin:  AdminSecurity{Token: token, ListenerTLS: ListenerTLS{TLSCert: pki.ServerCert, TLSKey: pki.ServerKey, ClientCA: pki.CACert}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close(context.Background())
	tlsFor := func(p *testsupport.PKI) *tls.Config {
		pem, err := os.ReadFile(pki.CACert)
		if err != nil {
			t.Fatal(err)
		}
		tc := &tls.Config{RootCAs: x509.NewCertPool()}
		tc.RootCAs.AppendCertsFromPEM(pem)
		if p != nil {
			pair, err := tls.LoadX509KeyPair(p.ClientCert, p.ClientKey)
			if err != nil {
				t.Fatal(err)
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		return tc
	}
	dial := func(tc *tls.Config) adminpb.AdminClient {
		conn, err := grpc.NewClient(rep.AdminAddr(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return adminpb.NewAdminClient(conn)
	}
	ctx := testsupport.Context(t, 20*time.Second)
	withToken := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)

	for name, tc := range map[string]*tls.Config{"no client certificate": tlsFor(nil), "certificate of another CA": tlsFor(&other)} {
		cctx, cancel := context.WithTimeout(withToken, 3*time.Second)
		_, err := dial(tc).GetFleet(cctx, &adminpb.GetFleetRequest{})
		cancel()
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s: GetFleet = %v, want a failed handshake (Unavailable)", name, err)
		}
	}
	good := dial(tlsFor(&pki))
	if _, err := good.GetFleet(ctx, &adminpb.GetFleetRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("GetFleet without a token = %v, want Unauthenticated", err)
	}
	if _, err := good.SetRoutingConfig(ctx, &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{Strategy: "RANDOM"}}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("SetRoutingConfig without a token = %v, want Unauthenticated", err)
	}
	if resp, err := good.GetFleet(withToken, &adminpb.GetFleetRequest{}); err != nil || len(resp.GetEndpoints()) != 1 {
		t.Errorf("GetFleet with the token = %v, %v", resp, err)
	}
	conn, err := grpc.NewClient(rep.AdminAddr(), grpc.WithTransportCredentials(credentials.NewTLS(tlsFor(&pki))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health without a token = %v", err)
	}
	tr := &http.Transport{TLSClientConfig: tlsFor(&pki)}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://" + rep.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/metrics over TLS = %d", resp.StatusCode)
	}
}

// TestAdminTLSBadFilesFailAtStart: a missing certificate fails Start with
// a message naming the file.
func TestAdminTLSBadFilesFailAtStart(t *testing.T) {
	_, err := Start(context.Background(), Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Static: backends(t, 1), Logger: quiet,
		Router: router.Options{DefaultEndpoint: "chat"},
		Admin:  AdminSecurity{ListenerTLS: ListenerTLS{TLSCert: "/nonexistent/cert.pem", TLSKey: "/nonexistent/key.pem"}},
	})
	if err == nil || !containsAll(err.Error(), "admin TLS", "/nonexistent/cert.pem") {
		t.Fatalf("Start = %v, want an admin TLS error naming the file", err)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
