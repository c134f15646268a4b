package admin_test

import (
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prefixrouter/prefixrouter/admin"
	"github.com/prefixrouter/prefixrouter/admin/adminpb"
)

// TestEveryMethodClassified: a new Admin method must be declared mutating
// or read, so that it cannot slip past the token by omission.
func TestEveryMethodClassified(t *testing.T) {
	for _, m := range adminpb.Admin_ServiceDesc.Methods {
		full := "/" + adminpb.Admin_ServiceDesc.ServiceName + "/" + m.MethodName
		switch m.MethodName {
		case "SetRoutingConfig", "PutAdapter", "DeleteAdapter":
			if !admin.IsMutating(full) {
				t.Errorf("%s changes state but is not mutating", full)
			}
		case "GetFleet", "GetRoutingConfig", "ExplainRoute", "ListAdapters":
			if admin.IsMutating(full) {
				t.Errorf("%s reads but is mutating", full)
			}
		default:
			t.Errorf("%s is not classified: add it to admin's mutating or reads list and here", full)
		}
	}
	if len(adminpb.Admin_ServiceDesc.Streams) != 0 {
		t.Error("the Admin service grew a stream: classify it")
	}
}

// TestAdminToken: with a token, calls without it (or with a wrong one) are
// refused Unauthenticated before they run; the health service stays open;
// OpenReads lets reads through but never writes.
func TestAdminToken(t *testing.T) {
	const token = "s3cret-token"
	withToken := func(tok string) metadata.MD { return metadata.Pairs("authorization", "Bearer "+tok) }
	for _, tc := range []struct {
		name      string
		openReads bool
	}{{"reads need the token", false}, {"open reads", true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, admin.Options{Token: token, OpenReads: tc.openReads, Configs: &fakeStore{}})
			read := func(md metadata.MD) error {
				c := ctx(t)
				if md != nil {
					c = metadata.NewOutgoingContext(c, md)
				}
				_, err := h.client.GetFleet(c, &adminpb.GetFleetRequest{})
				return err
			}
			write := func(md metadata.MD) error {
				c := ctx(t)
				if md != nil {
					c = metadata.NewOutgoingContext(c, md)
				}
				_, err := h.client.SetRoutingConfig(c, &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{Strategy: "RANDOM"}})
				return err
			}
			for _, md := range []metadata.MD{nil, withToken("wrong"), metadata.Pairs("authorization", "Basic "+token)} {
				if err := write(md); status.Code(err) != codes.Unauthenticated {
					t.Errorf("write with %v = %v, want Unauthenticated", md, err)
				}
				err := read(md)
				if tc.openReads && err != nil {
					t.Errorf("read with %v and open reads = %v", md, err)
				}
				if !tc.openReads && status.Code(err) != codes.Unauthenticated {
					t.Errorf("read with %v = %v, want Unauthenticated", md, err)
				}
			}
			if err := write(withToken(token)); err != nil {
				t.Errorf("write with the token = %v", err)
			}
			if err := read(withToken(token)); err != nil {
				t.Errorf("read with the token = %v", err)
			}
			if _, err := healthpb.NewHealthClient(h.conn).Check(ctx(t), &healthpb.HealthCheckRequest{}); err != nil {
				t.Errorf("health check without a token = %v", err)
			}
		})
	}
}
