package hotkey_test

import (
	"fmt"
	"math/rand/v2"

	"github.com/prefixrouter/prefixrouter/hotkey"
)

// A key with 40 % of the requests in a set of 7 instances carries
// 0.4 × 7 = 2.8 instances' fair shares, x = 2.8 / 0.5 = 5.6 at the default
// threshold (half a fair share of one key per instance): it gets
// k = ceil(5.6 / 1.2) = 5 instances, while a key with 1 % keeps one.
func ExampleSketch() {
	s, err := hotkey.New(hotkey.Options{})
	if err != nil {
		panic(err)
	}
	const hot, warm = 0xfeed0000_00000000, 0xbeef0000_00000000
	rng := rand.New(rand.NewPCG(1, 1))
	for range 10000 {
		switch u := rng.Float64(); {
		case u < 0.40:
			s.Observe(hot, 7)
		case u < 0.41:
			s.Observe(warm, 7)
		default:
			s.Observe(rng.Uint64(), 7) // cold keys, each seen about once
		}
	}
	fmt.Println("hot key:", s.K(hot, 7), "instances; 1 % key:", s.K(warm, 7))
	// Output: hot key: 5 instances; 1 % key: 1
}
