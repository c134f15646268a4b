package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/prefixrouter/prefixrouter/admin"
	"github.com/prefixrouter/prefixrouter/admin/adminpb"
)

func newAdminCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "admin",
		Short: "Inspect a running router replica through its gRPC admin API",
	}
	c.AddCommand(newAdminFleetCmd())
	return c
}

func newAdminFleetCmd() *cobra.Command {
	var (
		addr     string
		endpoint string
		asJSON   bool
		timeout  time.Duration
		cred     adminCreds
	)
	c := &cobra.Command{
		Use:   "fleet",
		Short: "Show a replica's fleet snapshot with each instance's live state on that replica",
		Long: `admin fleet calls GetFleet on a replica's admin listener (serve --admin-listen; plaintext
gRPC, see docs/admin-api.md) and prints one row per instance: id, address, draining, and that
replica's view of it: healthy (active health checks), requests in flight, external load
(polled from the instance's /metrics; "unknown" when not polled) and circuit breaker state.
--json prints the GetFleetResponse in protobuf's JSON mapping, every field included.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if addr == "" {
				return usageErr("--admin-addr is required")
			}
			if timeout <= 0 {
				return usageErr("--timeout must be positive, got %v", timeout)
			}
			tc, err := cred.transport()
			if err != nil {
				return err
			}
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(tc))
			if err != nil {
				return usageErr("--admin-addr %q: %w", addr, err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			if cred.token != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+cred.token)
			}
			resp, err := adminpb.NewAdminClient(conn).GetFleet(ctx, &adminpb.GetFleetRequest{Endpoint: endpoint})
			if err != nil {
				return fmt.Errorf("admin fleet: %s: %w", addr, err)
			}
			if asJSON {
				b, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(resp)
				if err != nil {
					return fmt.Errorf("admin fleet: %w", err)
				}
				// protojson varies its whitespace on purpose; indent it
				// the same way every time for people and diffs.
				var out bytes.Buffer
				if err := json.Indent(&out, b, "", "  "); err != nil {
					return fmt.Errorf("admin fleet: %w", err)
				}
				out.WriteByte('\n')
				_, err = out.WriteTo(cmd.OutOrStdout())
				return err
			}
			return admin.WriteFleet(cmd.OutOrStdout(), resp)
		},
	}
	f := c.Flags()
	f.StringVar(&addr, "admin-addr", "127.0.0.1:9090", "the replica's admin address (its --admin-listen)")
	f.StringVar(&endpoint, "endpoint", "", "only this endpoint (default: all)")
	f.BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	f.DurationVar(&timeout, "timeout", 10*time.Second, "give up on the call after this long")
	f.StringVar(&cred.token, "admin-token", "", "bearer token of the replica's --admin-token (prefer $PREFIXROUTER_ADMIN_TOKEN)")
	f.StringVar(&cred.caCert, "admin-cacert", "", "PEM CA that signed the replica's --admin-tls-cert (enables TLS)")
	f.StringVar(&cred.cert, "admin-cert", "", "PEM client certificate for a replica with --admin-client-ca")
	f.StringVar(&cred.key, "admin-key", "", "PEM key of --admin-cert")
	return c
}

// adminCreds are how a CLI command authenticates to a replica's admin port.
type adminCreds struct {
	token, caCert, cert, key string
}

// transport returns TLS credentials when a CA or client certificate is
// given, plaintext otherwise.
func (c adminCreds) transport() (credentials.TransportCredentials, error) {
	if c.caCert == "" && c.cert == "" {
		return insecure.NewCredentials(), nil
	}
	if (c.cert == "") != (c.key == "") {
		return nil, usageErr("--admin-cert and --admin-key must be given together")
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.caCert != "" {
		pem, err := os.ReadFile(c.caCert)
		if err != nil {
			return nil, usageErr("--admin-cacert: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, usageErr("--admin-cacert %s holds no PEM certificate", c.caCert)
		}
	}
	if c.cert != "" {
		pair, err := tls.LoadX509KeyPair(c.cert, c.key)
		if err != nil {
			return nil, usageErr("--admin-cert/--admin-key: %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(tc), nil
}
