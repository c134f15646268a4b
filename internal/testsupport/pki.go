package testsupport

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a throwaway certificate authority with a server certificate for
// 127.0.0.1 and localhost and a client certificate, as PEM files in a
// temporary directory: for TLS and mTLS tests on loopback.
type PKI struct {
	CACert                string
	ServerCert, ServerKey string
	ClientCert, ClientKey string
}

// NewPKI writes a new PKI under t.TempDir(). Two PKIs do not trust each
// other, which is how tests present wrong credentials.
func NewPKI(t testing.TB) PKI {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p := PKI{CACert: filepath.Join(dir, "ca.pem")}
	writePEM(t, p.CACert, "CERTIFICATE", caDER)
	issue := func(name string, serial int64, usage x509.ExtKeyUsage, server bool) (string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		}
		if server {
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
			tmpl.DNSNames = []string{"localhost"}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		cert, keyPath := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		writePEM(t, cert, "CERTIFICATE", der)
		writePEM(t, keyPath, "EC PRIVATE KEY", kder)
		return cert, keyPath
	}
	p.ServerCert, p.ServerKey = issue("server", 2, x509.ExtKeyUsageServerAuth, true)
	p.ClientCert, p.ClientKey = issue("client", 3, x509.ExtKeyUsageClientAuth, false)
	return p
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
