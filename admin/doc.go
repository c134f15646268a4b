// Package admin serves the router's gRPC admin API: the fleet snapshot, live routing configuration and route explanations.
//
// The server consumes small interfaces that the router and membership
// satisfy through thin adapters wired in replica; it imports
// neither of them:
//
//	srv, err := admin.NewServer(admin.Options{
//		Snapshots: rt,                 // Snapshot() *fleet.Snapshot
//		Statuses:  rt,                 // optional: Status(endpoint, id) overload.Status per instance
//		Configs:   store,              // nil with a static fleet: SetRoutingConfig → Unavailable
//		Explainer: explainer,          // optional: ExplainRoute
//		Ready:     rt.Ready,           // health service status (required)
//		Registry:  reg,                // grpc_server_* metrics
//		Logger:    logger,
//	})
//	go srv.Serve(lis)                  // e.g. the --admin-listen listener
//	defer srv.GracefulStop()           // health goes NOT_SERVING first
//
// To share a port with HTTP/1 handlers (as replica does with /metrics),
// dispatch HTTP/2 requests with Content-Type application/grpc to
// srv.GRPC().ServeHTTP, and stop with Drain, the HTTP server's Shutdown,
// then GracefulStop (see Drain).
//
// Besides prefixrouter.admin.v1.Admin the server registers the standard
// grpc.health.v1.Health service (overall status "" and the Admin service
// follow Ready) and server reflection, so grpcurl needs no .proto file.
// The API is described in docs/admin-api.md.
package admin
