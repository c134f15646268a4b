package hotkey_test

import (
	"fmt"
	"math/rand/v2"

	"github.com/prefixrouter/prefixrouter/hotkey"
)

// A key with 40 % of the requests in a set of 7 instances needs
// 0.4 × 7 = 2.8 instances' worth of capacity: it gets k = ceil(2.8 / 1.2)
// = 3 of them, while a key with 1 % keeps one.
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
	// Output: hot key: 3 instances; 1 % key: 1
}
