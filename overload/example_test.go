package overload_test

import (
	"fmt"

	"github.com/prefixrouter/prefixrouter/overload"
)

func ExampleReplicaShare() {
	// ConcurrencyThreshold 10 shared by 3 router replicas: each admits 4,
	// so the instance sees at most 12 = 10+3-1 in the worst case.
	fmt.Println(overload.ReplicaShare(10, 3))
	// Output: 4
}

func ExampleTrafficShare() {
	// ConcurrencyThreshold 8; this replica routes 60 of the fleet's 80
	// requests per second (a skewed DNS share), so it may put 6 on one
	// instance; a replica routing 2 of them keeps 1.
	fmt.Println(overload.TrafficShare(8, 60, 80), overload.TrafficShare(8, 2, 80))
	// Output: 6 1
}

func ExampleState_TryAcquire() {
	st := overload.NewState("i-1", overload.BreakerOptions{})
	done, ok := st.TryAcquire(overload.Whole(1))
	_, again := st.TryAcquire(overload.Whole(1))
	fmt.Println(ok, again, st.InFlight())
	done(overload.UpstreamStatus(200)) // the response ended
	fmt.Println(st.InFlight())
	// Output:
	// true false 1
	// 0
}
