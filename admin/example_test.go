package admin_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/prefixrouter/prefixrouter/admin"
	"github.com/prefixrouter/prefixrouter/admin/adminpb"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/router"
)

// A static fleet (no etcd): the config can be read but not set.
func ExampleNewServer() {
	snap := fleet.NewSnapshot([]fleet.Endpoint{{
		Name:      "chat",
		Instances: []fleet.Instance{{ID: "i-0", Addr: "http://127.0.0.1:8001"}},
	}}, 0, 1, time.Now())
	rt, err := router.New(router.Options{DefaultEndpoint: "chat"})
	if err != nil {
		panic(err)
	}
	defer rt.Close()
	rt.Update(snap)
	srv, err := admin.NewServer(admin.Options{Snapshots: rt, Statuses: rt, Ready: rt.Ready})
	if err != nil {
		panic(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(lis)
	defer srv.GracefulStop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	c := adminpb.NewAdminClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	got, err := c.GetRoutingConfig(ctx, &adminpb.GetRoutingConfigRequest{Endpoint: "chat"})
	if err != nil {
		panic(err)
	}
	fmt.Println(got.Config.Strategy, got.Config.PrefixLength, got.Config.ConcurrencyThreshold, got.Stored)

	_, err = c.SetRoutingConfig(ctx, &adminpb.SetRoutingConfigRequest{Endpoint: "chat", Config: &adminpb.RoutingConfig{Strategy: "RANDOM"}})
	fmt.Println(status.Code(err))
	// Output:
	// PREFIX_AWARE 32768 10 false
	// Unavailable
}
