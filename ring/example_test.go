package ring_test

import (
	"fmt"

	"github.com/cespare/xxhash/v2"

	"github.com/prefixrouter/prefixrouter/ring"
)

func Example() {
	r, err := ring.New([]ring.Member{
		{ID: "vllm-2", Weight: 1},
		{ID: "vllm-0", Weight: 1},
		{ID: "vllm-1", Weight: 2}, // twice the keys of the others
	})
	if err != nil {
		panic(err) // a weight above ring.MaxWeight
	}
	key := xxhash.Sum64String("tenant-a|adapter-x|You are a helpful assistant.")

	// The owner of the key, then where it spills when the owner is busy.
	buf := make([]int, 0, 3)
	for _, i := range r.Candidates(key, 3, buf) {
		fmt.Println(r.Members()[i].ID)
	}
	fmt.Println(r.Primary(key) == r.Candidates(key, 1, buf[:0])[0])
	fmt.Println(r.Index("vllm-1"), r.Index("vllm-9"))
	// Output:
	// vllm-2
	// vllm-1
	// vllm-0
	// true
	// 1 -1
}
