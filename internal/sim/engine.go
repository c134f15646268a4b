package sim

import (
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// seq is one sequence (one prompt) in the engine.
type seq struct {
	// Set before submission, read-only afterwards.
	hashes    []uint64 // chained hashes of the prompt's full blocks
	prompt    int      // prompt tokens
	maxTokens int      // tokens to generate, exactly (ignore_eos)
	lora      bool     // runs on a LoRA adapter (LoRAStepOverhead)
	// notify gets a non-blocking send whenever the engine publishes
	// progress; the seqs of one HTTP request share it (capacity 1).
	notify chan struct{}

	// Written by the engine, read by the handler: cached is stored before
	// generated first moves, so a handler that sees a token sees the hit.
	cached    atomic.Int64
	generated atomic.Int64

	// Engine-private.
	arrival   time.Duration // simulated time
	firstAt   time.Duration // simulated time of the first token
	doneAt    time.Duration // simulated time of the last token
	computed  int           // prompt tokens in the KV cache (hit + computed)
	hit       int           // prompt tokens hit at admission
	gen       int           // generated tokens
	blocks    []int32
	committed int // leading prompt blocks registered in the cache
	aborted   bool
	done      bool
}

func (s *seq) publish() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// step is the work of one engine step, planned by schedule and applied by
// complete.
type step struct {
	chunks  []chunk
	decodes []*seq
	work    StepWork
	dur     time.Duration
}

type chunk struct {
	s *seq
	n int
}

// engine is the continuous-batching scheduler: a waiting queue (FCFS), a
// running batch, the KV cache and the cost model. It has no clock and no
// goroutine: schedule plans a step and says how long it takes, complete
// applies it at a given simulated time. run drives it in real time; tests
// drive it in virtual time. Only one goroutine may use it.
type engine struct {
	prof       *Profile
	cache      *kvCache
	maxRunning int
	budget     int
	waiting    []*seq
	running    []*seq
	m          *metrics
}

func newEngine(p *Profile, capacityTokens, maxRunning, budget int, m *metrics) *engine {
	return &engine{prof: p, cache: newKVCache(capacityTokens / BlockTokens), maxRunning: maxRunning, budget: budget, m: m}
}

// newSeq builds the sequence of one prompt. notify may be shared by the
// seqs of one HTTP request.
func newSeq(adapter, salt, text string, maxTokens int, notify chan struct{}) *seq {
	return &seq{hashes: BlockHashes(adapter, salt, text), prompt: max(CountTokens(text), 1), maxTokens: maxTokens, notify: notify, lora: adapter != ""}
}

// blocksFor is the number of blocks a sequence reserves at admission: its
// prompt and all its output. Reserving the output up front means a running
// sequence never runs out of blocks, so the engine never preempts; a
// request that does not fit waits instead (see docs/simulator.md).
func blocksFor(prompt, maxTokens int) int {
	return (prompt + maxTokens + BlockTokens - 1) / BlockTokens
}

// add queues s, arrived at simulated time now.
func (e *engine) add(s *seq, now time.Duration) {
	s.arrival = now
	e.waiting = append(e.waiting, s)
	e.gauges()
}

// abort marks s; schedule removes it and frees its blocks. A step in
// flight that carries s still completes, but s gets nothing from it.
func (e *engine) abort(s *seq) {
	if !s.done {
		s.aborted = true
	}
}

// schedule plans the next step like vLLM V1's scheduler: first the running
// sequences in order (a decode takes one token of the budget, an unfinished
// prefill the next chunk), then waiting requests in arrival order while the
// batch has room, the budget has tokens and the cache has blocks; the head
// of the queue that does not fit blocks the ones behind it. It returns nil
// when there is nothing to do.
func (e *engine) schedule() *step {
	e.reap()
	st := &step{}
	budget := e.budget
	for _, s := range e.running {
		if budget == 0 {
			break
		}
		if s.computed >= s.prompt {
			st.decodes = append(st.decodes, s)
			st.work.LoRA = st.work.LoRA || s.lora
			st.work.DecodeSeqs++
			st.work.DecodeContextTokens += s.prompt + s.gen
			budget--
			continue
		}
		n := min(s.prompt-s.computed, budget)
		st.work.LoRA = st.work.LoRA || s.lora
		st.chunks = append(st.chunks, chunk{s, n})
		st.work.Prefills = append(st.work.Prefills, PrefillChunk{Cached: s.hit, Start: s.computed - s.hit, Tokens: n})
		budget -= n
	}
	for len(e.waiting) > 0 && len(e.running) < e.maxRunning && budget > 0 {
		s := e.waiting[0]
		// At least one prompt token is computed, to produce logits: the
		// hit stops before the block holding the last prompt token.
		maxHit := min(len(s.hashes), (s.prompt-1)/BlockTokens)
		hit := e.cache.lookup(s.hashes[:maxHit])
		blocks, ok := e.cache.allocate(s.hashes, hit, blocksFor(s.prompt, s.maxTokens))
		if !ok {
			break
		}
		e.waiting = e.waiting[1:]
		s.blocks = blocks
		s.hit = hit * BlockTokens
		s.computed = s.hit
		s.committed = hit
		s.cached.Store(int64(s.hit))
		e.running = append(e.running, s)
		e.m.queries.Add(float64(s.prompt))
		e.m.hits.Add(float64(s.hit))
		n := min(s.prompt-s.computed, budget)
		st.work.LoRA = st.work.LoRA || s.lora
		st.chunks = append(st.chunks, chunk{s, n})
		st.work.Prefills = append(st.work.Prefills, PrefillChunk{Cached: s.hit, Tokens: n})
		budget -= n
	}
	e.gauges()
	if len(st.chunks) == 0 && len(st.decodes) == 0 {
		return nil
	}
	st.dur = e.prof.StepDuration(st.work)
	return st
}

// complete applies st, which ended at simulated time end: prefill chunks
// register their now-computed full blocks in the cache, a sequence whose
// prefill is complete emits its first token, decodes emit one token each,
// and finished sequences free their blocks.
func (e *engine) complete(st *step, end time.Duration) {
	var finished bool
	emit := func(s *seq) {
		s.gen++
		e.m.genTokens.Inc()
		if s.gen == 1 {
			s.firstAt = end
			e.m.ttft.Observe((end - s.arrival).Seconds())
		}
		if s.gen == s.maxTokens {
			s.done, s.doneAt = true, end
			finished = true
			e.cache.release(s.blocks)
			s.blocks = nil
			e.m.success.Inc()
			e.m.e2e.Observe((end - s.arrival).Seconds())
		}
		s.generated.Store(int64(s.gen))
		s.publish()
	}
	for _, c := range st.chunks {
		s := c.s
		if s.aborted {
			continue
		}
		s.computed += c.n
		for full := min(s.computed/BlockTokens, len(s.hashes)); s.committed < full; s.committed++ {
			e.cache.commit(s.blocks[s.committed], s.hashes[s.committed])
		}
		if s.computed == s.prompt {
			e.m.promptTokens.Add(float64(s.prompt))
			emit(s)
		}
	}
	for _, s := range st.decodes {
		if !s.aborted {
			emit(s)
		}
	}
	if finished {
		e.running = slices.DeleteFunc(e.running, func(s *seq) bool { return s.done })
	}
	e.gauges()
}

// reap drops aborted sequences and frees their blocks.
func (e *engine) reap() {
	drop := func(s *seq) bool {
		if !s.aborted {
			return false
		}
		s.done = true
		if s.blocks != nil {
			e.cache.release(s.blocks)
			s.blocks = nil
		}
		e.m.aborted.Inc()
		return true
	}
	e.waiting = slices.DeleteFunc(e.waiting, drop)
	e.running = slices.DeleteFunc(e.running, drop)
}

func (e *engine) gauges() {
	e.m.running.Set(float64(len(e.running)))
	e.m.waiting.Set(float64(len(e.waiting)))
	e.m.usage.Set(e.cache.usage())
}

// engineMsg enters the engine goroutine: seqs to queue, or to abort, or
// (reset non-nil) a prefix-cache reset whose dropped block count the
// engine sends on reset, which must have room for it.
type engineMsg struct {
	seqs  []*seq
	abort bool
	reset chan<- int
}

// run drives e in real time until quit closes: a step of simulated
// duration d takes d/scale of wall time. Simulated time advances by step
// durations while busy, so goroutine overhead does not leak into the
// simulated TTFT; when idle it catches up with the wall clock times scale.
// A step ends at a wall-clock deadline (start + its simulated end / scale),
// not d/scale after it began: a timer that fires late on a loaded machine
// (a wake-up of a few ms is a whole step at scale 12) makes the next steps
// run early until the engine is back on time, instead of slowing the
// simulated GPU for good, which clients, timing in wall time × scale, saw
// as a slower fleet (issue 22: capacity fell by half at load average 11).
func (e *engine) run(in <-chan engineMsg, quit <-chan struct{}, scale float64) {
	start := time.Now()
	var now time.Duration // simulated
	wallSim := func() time.Duration { return time.Duration(float64(time.Since(start)) * scale) }
	wallAt := func(sim time.Duration) time.Time { return start.Add(time.Duration(float64(sim) / scale)) }
	handle := func(m engineMsg, at time.Duration) {
		if m.reset != nil {
			m.reset <- e.cache.dropUnpinned()
		}
		for _, s := range m.seqs {
			if m.abort {
				e.abort(s)
			} else {
				e.add(s, at)
			}
		}
	}
	for {
		st := e.schedule()
		if st == nil {
			select {
			case m := <-in:
				now = max(now, wallSim())
				handle(m, now)
			case <-quit:
				return
			}
			continue
		}
		begin := now
		timer := time.NewTimer(time.Until(wallAt(begin + st.dur)))
	wait:
		for {
			select {
			case m := <-in:
				handle(m, min(max(wallSim(), begin), begin+st.dur))
			case <-timer.C:
				break wait
			case <-quit:
				timer.Stop()
				return
			}
		}
		now = begin + st.dur
		e.complete(st, now)
	}
}

// metrics are one server's Prometheus collectors under vLLM's names
// (vllm/v1/metrics/loggers.py), each with vLLM's model_name label.
type metrics struct {
	reg                                    *prometheus.Registry
	running, waiting, usage                prometheus.Gauge
	queries, hits, promptTokens, genTokens prometheus.Counter
	success, aborted                       prometheus.Counter
	ttft, e2e                              prometheus.Histogram
}

func newMetrics(model string, capacityTokens int) *metrics {
	reg := prometheus.NewRegistry()
	l := prometheus.Labels{"model_name": model}
	g := func(name, help string) prometheus.Gauge {
		x := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: l})
		reg.MustRegister(x)
		return x
	}
	c := func(name, help string, extra prometheus.Labels) prometheus.Counter {
		ls := prometheus.Labels{"model_name": model}
		for k, v := range extra {
			ls[k] = v
		}
		x := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: ls})
		reg.MustRegister(x)
		return x
	}
	h := func(name, help string, buckets []float64) prometheus.Histogram {
		x := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: l, Buckets: buckets})
		reg.MustRegister(x)
		return x
	}
	m := &metrics{
		reg:          reg,
		running:      g("vllm:num_requests_running", "Number of requests in the running batch."),
		waiting:      g("vllm:num_requests_waiting", "Number of requests waiting to be scheduled."),
		usage:        g("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent of blocks pinned by running requests."),
		queries:      c("vllm:prefix_cache_queries_total", "Prefix-cache queries, in prompt tokens.", nil),
		hits:         c("vllm:prefix_cache_hits_total", "Prefix-cache hits, in prompt tokens.", nil),
		promptTokens: c("vllm:prompt_tokens_total", "Prefilled prompt tokens (cached included).", nil),
		genTokens:    c("vllm:generation_tokens_total", "Generated tokens.", nil),
		success:      c("vllm:request_success_total", "Requests finished (always by length: the simulator ignores EOS).", prometheus.Labels{"finished_reason": "length"}),
		aborted:      c("prefixrouter_sim_requests_aborted_total", "Requests aborted by a client disconnect.", nil),
		// vLLM's buckets.
		ttft: h("vllm:time_to_first_token_seconds", "Time to first token, simulated seconds.",
			[]float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
		e2e: h("vllm:e2e_request_latency_seconds", "End-to-end request latency, simulated seconds.",
			[]float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}),
	}
	capG := g("prefixrouter_sim_kv_cache_capacity_tokens", "KV-cache capacity in tokens.")
	capG.Set(float64(capacityTokens))
	// vLLM's info metric (a gauge fixed at 1, labels from CacheConfig
	// .metrics_info(), no model_name), which clients read for the KV
	// capacity: block_size × num_gpu_blocks tokens.
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
		ConstLabels: prometheus.Labels{
			"block_size": strconv.Itoa(BlockTokens), "num_gpu_blocks": strconv.Itoa(capacityTokens / BlockTokens),
			"enable_prefix_caching": "True", "engine": "0",
		},
	})
	info.Set(1)
	reg.MustRegister(info)
	return m
}
