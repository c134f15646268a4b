package admin

import (
	"context"
	"crypto/subtle"
	"strings"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prefixrouter/prefixrouter/admin/adminpb"
)

// mutating lists the Admin methods that change state. Every other method
// of the Admin service reads (TestEveryMethodClassified keeps the two lists
// complete).
var mutating = map[string]bool{
	adminpb.Admin_SetRoutingConfig_FullMethodName: true,
	adminpb.Admin_PutAdapter_FullMethodName:       true,
	adminpb.Admin_DeleteAdapter_FullMethodName:    true,
}

// reads lists the Admin methods that only read.
var reads = map[string]bool{
	adminpb.Admin_GetFleet_FullMethodName:         true,
	adminpb.Admin_GetRoutingConfig_FullMethodName: true,
	adminpb.Admin_ExplainRoute_FullMethodName:     true,
	adminpb.Admin_ListAdapters_FullMethodName:     true,
}

// IsMutating reports whether a full gRPC method name changes state.
func IsMutating(fullMethod string) bool { return mutating[fullMethod] }

// authorizer checks the bearer token of admin calls (go-grpc-middleware's
// auth interceptor calls it): mutating calls always need it; reads (the
// Admin service's and reflection's) need it unless openReads. The health
// service is never behind it: load balancers probe without credentials.
type authorizer struct {
	token     []byte
	openReads bool
}

func (a authorizer) authorize(ctx context.Context) (context.Context, error) {
	method, _ := grpc.Method(ctx)
	if a.openReads && !mutating[method] {
		return ctx, nil
	}
	tok, err := auth.AuthFromMD(ctx, "bearer")
	if err != nil {
		return nil, err // Unauthenticated: no or malformed authorization
	}
	if subtle.ConstantTimeCompare([]byte(tok), a.token) != 1 {
		return nil, status.Error(codes.Unauthenticated, "admin: invalid bearer token")
	}
	return ctx, nil
}

// isHealth matches the standard health service.
func isHealth(method string) bool {
	return strings.HasPrefix(method, "/grpc.health.v1.Health/")
}
