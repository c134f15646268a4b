package membership

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// testPKI is a throwaway CA with a server certificate for 127.0.0.1 and a
// client certificate, as PEM files in a temporary directory.
type testPKI struct {
	caCert                string
	serverCert, serverKey string
	clientCert, clientKey string
}

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T, dir, name string) (testCA, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".pem")
	writePEMFile(t, path, "CERTIFICATE", der)
	return testCA{cert: cert, key: key}, path
}

// issue signs a leaf certificate and writes it and its key; it returns the
// two paths.
func (ca testCA) issue(t *testing.T, dir, name string, serial int64, usage x509.ExtKeyUsage, ips ...net.IP) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	writePEMFile(t, certPath, "CERTIFICATE", der)
	writePEMFile(t, keyPath, "EC PRIVATE KEY", kder)
	return certPath, keyPath
}

func writePEMFile(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	ca, caPath := newTestCA(t, dir, "ca")
	var p testPKI
	p.caCert = caPath
	p.serverCert, p.serverKey = ca.issue(t, dir, "server", 2, x509.ExtKeyUsageServerAuth, net.ParseIP("127.0.0.1"))
	p.clientCert, p.clientKey = ca.issue(t, dir, "client", 3, x509.ExtKeyUsageClientAuth)
	return p
}

// TestEmbeddedClientTLSCertAuth runs a live etcd with client TLS and
// --client-cert-auth and checks that ClientOptions's CACert/Cert/Key reach
// it, and that a client without a certificate or trusting the wrong CA is
// refused within a short deadline.
func TestEmbeddedClientTLSCertAuth(t *testing.T) {
	pki := newTestPKI(t)
	e, err := StartEmbedded(t.TempDir(), "https://127.0.0.1:0", WithFastTicks(),
		WithClientTLS(pki.serverCert, pki.serverKey, pki.caCert, true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if !strings.HasPrefix(e.ClientURL(), "https://127.0.0.1:") || strings.HasSuffix(e.ClientURL(), ":0") {
		t.Fatalf("ClientURL = %q, want https://127.0.0.1:<port>", e.ClientURL())
	}

	t.Run("client certificate", func(t *testing.T) {
		cli, err := NewClient(ClientOptions{Endpoints: e.Endpoints(), CACert: pki.caCert, Cert: pki.clientCert, Key: pki.clientKey})
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
		cli, err := NewClient(ClientOptions{Endpoints: e.Endpoints(), CACert: pki.caCert})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		refused(t, cli)
		// The cause as gRPC sees it is racy (the alert or a broken pipe);
		// a bare TLS connection shows the server demands a certificate.
		pool := x509.NewCertPool()
		ca, err := os.ReadFile(pki.caCert)
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
		_, otherCA := newTestCA(t, t.TempDir(), "other-ca")
		cli, err := NewClient(ClientOptions{Endpoints: e.Endpoints(), CACert: otherCA, Cert: pki.clientCert, Key: pki.clientKey})
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
	if err != nil || !set || c.RoutingStrategy != fleet.PrefixAware || c.PrefixLength() != 2048 || c.ConcurrencyThreshold() != 3 {
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
