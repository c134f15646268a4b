package membership_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/membership"
)

// A router's watcher sees an instance register, change its adapters and
// leave.
func Example() {
	dir, _ := os.MkdirTemp("", "etcd")
	defer os.RemoveAll(dir)
	e, err := membership.StartEmbedded(dir, "http://127.0.0.1:0", membership.WithFastTicks())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	cli, err := membership.NewClient(membership.ClientOptions{Endpoints: e.Endpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	snaps := make(chan *fleet.Snapshot, 16)
	w := membership.StartWatcher(cli, membership.WatcherOptions{}, func(s *fleet.Snapshot) { snaps <- s })
	defer w.Close()
	<-snaps // the first list: an empty fleet

	reg, err := membership.RegisterInstance(ctx, cli, "ep1", fleet.Instance{ID: "i-1", Addr: "http://127.0.0.1:8000", Adapters: []string{"lora-a"}}, membership.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	show := func() {
		select {
		case s := <-snaps:
			if ep := s.Endpoint("ep1"); ep != nil {
				fmt.Println(ep.Instances[0].ID, ep.Instances[0].Adapters, ep.Config.RoutingStrategy)
			} else {
				fmt.Println("no ep1")
			}
		case <-time.After(5 * time.Second):
			fmt.Println("timeout")
		}
	}
	show()
	_ = reg.SetAdapters(ctx, []string{"lora-a", "lora-b"})
	show()
	_ = reg.Close(ctx)
	show()
	// Output:
	// i-1 [lora-a] PREFIX_AWARE
	// i-1 [lora-a lora-b] PREFIX_AWARE
	// no ep1
}
