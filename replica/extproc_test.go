package replica

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prefixrouter/prefixrouter/extproc"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/router"
)

// TestExtProcListener: with ExtProcListen the replica serves the endpoint
// picker and its health next to the HTTP data plane, both picking alike; on
// Close the picker stops with the rest.
func TestExtProcListener(t *testing.T) {
	insts := backends(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := Start(ctx, Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", ExtProcListen: "127.0.0.1:0",
		Router: router.Options{DefaultEndpoint: "chat"}, Static: insts, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close(context.Background())
	conn, err := grpc.NewClient(rep.ExtProcAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, svc := range []string{extproc.HealthLiveness, extproc.HealthReadiness, extproc.HealthExtProc} {
		r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v %v", svc, r, err)
		}
	}

	// A body-less invoke request: the pick comes on the headers.
	resp, err := http.Post(rep.URL()+"/invocations", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var want string
	for _, in := range insts {
		if in.ID == resp.Header.Get(router.HeaderInstance) {
			u, _ := url.Parse(in.Addr)
			want = u.Host
		}
	}
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers:     &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/invocations")}}},
		EndOfStream: true,
	}}}); err != nil {
		t.Fatal(err)
	}
	ans, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var got string
	for _, h := range ans.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == extproc.HeaderDestination {
			got, _, _ = strings.Cut(string(h.GetHeader().GetRawValue()), ",")
		}
	}
	if got == "" || got != want {
		t.Fatalf("ext_proc primary %q, HTTP data plane %q", got, want)
	}
	_ = stream.CloseSend()
	if err := rep.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestExtProcPeersAuthenticated: with --ext-proc-token and mTLS flags the
// replica's picker refuses a peer without the token, and one without a
// client certificate fails the handshake; the token gets a pick.
func TestExtProcPeersAuthenticated(t *testing.T) {
	pki := testsupport.NewPKI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := Start(ctx, Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", ExtProcListen: "127.0.0.1:0",
		ExtProc: ExtProcSecurity{Token: "envoy-token", ListenerTLS: ListenerTLS{TLSCert: pki.ServerCert, TLSKey: pki.ServerKey}},
		Router:  router.Options{DefaultEndpoint: "chat"}, Static: backends(t, 2), Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close(context.Background())
	caPEM, err := os.ReadFile(pki.CACert)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	conn, err := grpc.NewClient(rep.ExtProcAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pick := func(ctx context.Context) error {
		stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
		if err != nil {
			return err
		}
		if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers:     &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/invocations")}}},
			EndOfStream: true,
		}}}); err != nil {
			return err
		}
		_, err = stream.Recv()
		_ = stream.CloseSend()
		return err
	}
	if err := pick(ctx); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("without the token: %v, want UNAUTHENTICATED", err)
	}
	if err := pick(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer envoy-token")); err != nil {
		t.Fatalf("with the token: %v", err)
	}
	// Cleartext to a TLS listener fails.
	plain, err := grpc.NewClient(rep.ExtProcAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := healthpb.NewHealthClient(plain).Check(ctx, &healthpb.HealthCheckRequest{}); err == nil {
		t.Fatal("a cleartext client reached the TLS listener")
	}
}
