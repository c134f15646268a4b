// Package sim simulates an LLM model server (vLLM with automatic prefix caching) with a block KV cache and a cost model calibrated on a real GPU.
//
// A Server answers the OpenAI and SageMaker inference paths like vLLM does,
// but instead of running a model it schedules each request on a step-based
// continuous-batching engine whose step durations come from a Profile, and
// it emits filler tokens. Requests that share leading prompt blocks hit the
// simulated prefix cache and skip that part of the prefill, exactly as the
// router under test expects a real prefix-caching server to behave.
//
//	srv, err := sim.New(sim.Options{ID: "sim-0", Profile: "h200-llama8b", TimeScale: 10})
//	if err != nil { ... }
//	defer srv.Close()
//	http.ListenAndServe("127.0.0.1:8001", srv)
//
// See docs/simulator.md for the cost model, the cache and the scheduler.
package sim
