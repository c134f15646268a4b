package admin_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/prefixrouter/prefixrouter/admin"
	"github.com/prefixrouter/prefixrouter/admin/adminpb"
)

func TestWriteFleet(t *testing.T) {
	resp := &adminpb.GetFleetResponse{
		Revision: 12, Replicas: 2, Age: durationpb.New(1500 * time.Millisecond),
		Endpoints: []*adminpb.Endpoint{{Name: "chat", Instances: []*adminpb.Instance{
			{Id: "i-a", Addr: "http://127.0.0.1:8001", State: &adminpb.InstanceState{
				InFlight: 3, ExternalLoad: -1, Breaker: adminpb.BreakerState_BREAKER_STATE_HALF_OPEN, Healthy: true}},
			{Id: "i-b", Addr: "http://127.0.0.1:8002", Draining: true, State: &adminpb.InstanceState{
				ExternalLoad: 7, Breaker: adminpb.BreakerState_BREAKER_STATE_OPEN}},
			{Id: "i-c", Addr: "http://127.0.0.1:8003"},
		}, Overridden: []*adminpb.Override{{Flag: "hot-key-replication", Given: "true", Stored: "false"}}}},
	}
	var b strings.Builder
	if err := admin.WriteFleet(&b, resp); err != nil {
		t.Fatal(err)
	}
	want := `revision=12 replicas=2 snapshot_age=1.5s
ENDPOINT  ID   ADDR                   DRAINING  HEALTHY  IN_FLIGHT  EXTERNAL_LOAD  BREAKER
chat      i-a  http://127.0.0.1:8001  false     true     3          unknown        half-open
chat      i-b  http://127.0.0.1:8002  true      false    0          7              open
chat      i-c  http://127.0.0.1:8003  false     -        -          -              -
overridden: endpoint chat runs hot-key-replication=false from its stored routing config, not --hot-key-replication=true given to this replica
`
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}
