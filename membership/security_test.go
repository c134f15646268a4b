package membership

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

// TestEmbeddedClientTLSCertAuth runs a live etcd with client TLS and
// --client-cert-auth and checks that ClientOptions's CACert/Cert/Key reach
// it, and that a client without a certificate or trusting the wrong CA is
// refused within a short deadline.
func TestEmbeddedClientTLSCertAuth(t *testing.T) {
	pki := testsupport.NewPKI(t)
	e, err := StartEmbedded(t.TempDir(), "https://127.0.0.1:0", WithFastTicks(),
		WithClientTLS(pki.ServerCert, pki.ServerKey, pki.CACert, true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if !strings.HasPrefix(e.ClientURL(), "https://127.0.0.1:") || strings.HasSuffix(e.ClientURL(), ":0") {
		t.Fatalf("ClientURL = %q, want https://127.0.0.1:<port>", e.ClientURL())
	}

	t.Run("client certificate", func(t *testing.T) {
		cli, err := NewClient(ClientOptions{Endpoints: e.Endpoints(), CACert: pki.CACert, Cert: pki.ClientCert, Key: pki.ClientKey})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := cli.Put(ctx, "k", "v"); err != nil {
			t.Fatalf("Put over mTLS: %v", err)
		}
		resp, err := cli.Get(ctx, "k")
		if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
			t.Fatalf("Get over mTLS = %v, %v", resp, err)
		}
		configRoundTrip(ctx, t, cli)
	})

	t.Run("no client certificate", func(t *testing.T) {
		t.Parallel()
		cli, err := NewClient(ClientOptions{Endpoints: e.Endpoints(), CACert: pki.CACert})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		refused(t, cli)
		// The cause as gRPC sees it is racy (the alert or a broken pipe);
		// a bare TLS connection shows the server demands a certificate.
		pool := x509.NewCertPool()
		ca, err := os.ReadFile(pki.CACert)
		if err != nil || !pool.AppendCertsFromPEM(ca) {
			t.Fatalf("CA: %v", err)
		}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", strings.TrimPrefix(e.ClientURL(), "https://"), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
		if err == nil {
			defer conn.Close()
			_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
			_, err = conn.Read(make([]byte, 1))
		}
		if err == nil || !strings.Contains(err.Error(), "certificate required") && !strings.Contains(err.Error(), "bad certificate") {
			t.Fatalf("TLS without a client certificate: %v, want the server to demand one", err)
		}
		t.Logf("cause: %v", err)
	})

	t.Run("wrong CA", func(t *testing.T) {
		t.Parallel()
		otherCA := testsupport.NewPKI(t).CACert // a CA that did not sign the server
		cli, err := NewClient(ClientOptions{Endpoints: e.Endpoints(), CACert: otherCA, Cert: pki.ClientCert, Key: pki.ClientKey})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		refusedBecause(t, cli, "x509: certificate signed by unknown authority")
	})

	t.Run("plain http", func(t *testing.T) {
		t.Parallel()
		plain := "http://" + strings.TrimPrefix(e.ClientURL(), "https://")
		cli, err := NewClient(ClientOptions{Endpoints: []string{plain}})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		refused(t, cli)
	})
}

// refused checks that a Put through cli fails, and does so within the
// short deadline rather than hanging.
func refused(t *testing.T, cli *clientv3.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	_, err := cli.Put(ctx, "k", "nope")
	if err == nil {
		t.Fatal("Put succeeded, want it refused")
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("Put took %v to fail", d)
	}
	t.Logf("refused after %v: %v", time.Since(start).Round(time.Millisecond), err)
}

// refusedBecause is refused, and then asks the connection why with a
// fail-fast RPC (clientv3 waits for a ready connection, so its own error is
// only the deadline) and checks the cause names want.
func refusedBecause(t *testing.T, cli *clientv3.Client, want string) {
	t.Helper()
	refused(t, cli)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := pb.NewKVClient(cli.ActiveConnection()).Range(ctx, &pb.RangeRequest{Key: []byte("k")}, grpc.WaitForReady(false))
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("fail-fast RPC = %v, want an error naming %q", err, want)
	}
	t.Logf("cause: %v", err)
}

func configRoundTrip(ctx context.Context, t *testing.T, cli *clientv3.Client) {
	t.Helper()
	l := Layout{}
	want := fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: 2048, ConcurrencyThreshold: 3}}
	if err := PutConfig(ctx, cli, l, "ep1", want); err != nil {
		t.Fatalf("PutConfig: %v", err)
	}
	c, set, err := GetConfig(ctx, cli, l, "ep1")
	if err != nil || !set || c.RoutingStrategy != fleet.PrefixAware || resolved(c).PrefixLength != 2048 || resolved(c).ConcurrencyThreshold != 3 {
		t.Fatalf("GetConfig = %+v, %v, %v", c, set, err)
	}
}

// TestEmbeddedAuthUsernamePassword enables etcd auth (RBAC) on a live
// member and checks ClientOptions's Username/Password: the right password
// reads and writes, a wrong one fails at NewClient, and no credentials are
// refused.
func TestEmbeddedAuthUsernamePassword(t *testing.T) {
	e := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	admin, err := NewClient(ClientOptions{Endpoints: e.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.UserAdd(ctx, "root", "s3cret"); err != nil {
		t.Fatalf("UserAdd: %v", err)
	}
	if _, err := admin.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatalf("UserGrantRole: %v", err)
	}
	if _, err := admin.AuthEnable(ctx); err != nil {
		t.Fatalf("AuthEnable: %v", err)
	}

	t.Run("right password", func(t *testing.T) {
		cli, err := NewClient(ClientOptions{Endpoints: e.Endpoints(), Username: "root", Password: "s3cret", DialTimeout: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		if _, err := cli.Put(ctx, "k", "v"); err != nil {
			t.Fatalf("Put: %v", err)
		}
		resp, err := cli.Get(ctx, "k")
		if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
			t.Fatalf("Get = %v, %v", resp, err)
		}
		configRoundTrip(ctx, t, cli)
	})

	t.Run("wrong password", func(t *testing.T) {
		start := time.Now()
		cli, err := NewClient(ClientOptions{Endpoints: e.Endpoints(), Username: "root", Password: "wrong", DialTimeout: 3 * time.Second})
		if err == nil {
			cli.Close()
			t.Fatal("NewClient with a wrong password succeeded")
		}
		if d := time.Since(start); d > 4*time.Second {
			t.Fatalf("took %v to fail", d)
		}
		t.Logf("refused: %v", err)
	})

	t.Run("no credentials", func(t *testing.T) {
		// admin connected before auth was enabled and holds no token.
		refused(t, admin)
	})
}
