package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/gguf"
	"github.com/prefixrouter/prefixrouter/internal/llamacpp"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/probe"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// llamaAnswer is what a test reads of a llama-server chat answer, streamed
// (the last chunk carries usage and timings) or not.
type llamaAnswer struct {
	instance, decision string
	prompt             int // usage.prompt_tokens
	evaluated          int // timings.prompt_n: the prompt tokens not served by the cache
	chunks             int // SSE data chunks before [DONE]; 0 when not streamed
	finish             string
}

// llamaChat sends one chat request through base and reads the answer; any
// failure fails the test.
func llamaChat(t *testing.T, hc *http.Client, base, system, user string, stream bool) llamaAnswer {
	t.Helper()
	o := chatLlama(t.Context(), hc, base, lfOutcome{stream: stream}, system, user, 8)
	if !o.ok() {
		t.Fatalf("chat answer: %v", o)
	}
	return llamaAnswer{instance: o.instance, decision: o.decision, prompt: o.prompt, evaluated: o.evaluated, chunks: o.chunks, finish: o.finish}
}

// document is a system prompt of about n words of pseudo-English, opened
// by its number so that documents differ from their first character (the
// routing key is their prefix).
func document(i, n int) string {
	words := strings.Fields("the a model server cache prefix token route fleet instance request answer " +
		"router replica ring adapter tenant stream batch queue memory layer head vector value key")
	rng := rand.New(rand.NewPCG(uint64(i), 7))
	var b strings.Builder
	fmt.Fprintf(&b, "Document %d.", i)
	for range n {
		b.WriteByte(' ')
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()
}

// startLlamaServers starts the llama-servers of opts (its Kit and Model
// from the environment: a random-weight model the test writes), stopped
// when the test ends; it skips the test, saying why, when no engine is
// set.
func startLlamaServers(t *testing.T, ctx context.Context, opts llamacpp.Options) *llamacpp.Fleet {
	t.Helper()
	kit, err := llamacpp.FromEnv()
	if errors.Is(err, llamacpp.ErrNoEngine) {
		t.Skipf("no llama.cpp engine: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	opts.Kit = kit
	if opts.Model, err = kit.ModelIn(t.TempDir(), gguf.Llama{Seed: 1}); err != nil {
		t.Fatal(err)
	}
	f, err := llamacpp.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// TestLlamaCppBehindTheRouter is issue 20's real engine in CI: llama.cpp's
// llama-server (3 instances, a random-weight model the test writes) behind
// a router replica over a static fleet, as `serve --static-instances`
// runs it. Each document's two requests (one streamed, one not) reach the
// same instance, whose prefix cache then serves the document: the engine
// says so in its answer's timings and in its /metrics, and the router
// counts the cached tokens.
func TestLlamaCppBehindTheRouter(t *testing.T) {
	ctx := testsupport.Context(t, 3*time.Minute)
	f := startLlamaServers(t, ctx, llamacpp.Options{Instances: 3, Slots: 2, Context: 4096})
	byID := map[string]*llamacpp.Server{}
	var insts []fleet.Instance
	for _, s := range f.Servers() {
		byID[s.ID] = s
		insts = append(insts, fleet.Instance{ID: s.ID, Addr: s.URL})
	}
	rep := startStatic(t, insts, func(o *replica.Options) {
		o.Routing = fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware,
			PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: fleet.MinPrefixLength, ConcurrencyThreshold: 4}}
	})
	hc := &http.Client{Timeout: time.Minute}
	t.Cleanup(hc.CloseIdleConnections)
	processed := func() map[string]float64 {
		m := map[string]float64{}
		for id, s := range byID {
			n, err := s.PromptProcessed(ctx, hc)
			if err != nil {
				t.Fatalf("%s /metrics: %v", id, err)
			}
			m[id] = n
		}
		return m
	}

	const docs = 4
	before := processed()
	evaluated := map[string]int{} // per instance: timings.prompt_n summed
	var prompt, warmEvaluated, warmPrompt int
	for d := range docs {
		doc := document(d, 500)
		// Odd documents go streamed first, even ones plain first: both
		// kinds of answer pass through cold and warm.
		cold := llamaChat(t, hc, rep.URL(), doc, "What is the first word?", d%2 == 1)
		warm := llamaChat(t, hc, rep.URL(), doc, "And the last one?", d%2 == 0)
		t.Logf("document %d: %s (%s); cold %d of %d prompt tokens evaluated, warm %d of %d; %d and %d chunks",
			d, cold.instance, cold.decision, cold.evaluated, cold.prompt, warm.evaluated, warm.prompt, cold.chunks, warm.chunks)
		if cold.instance == "" || warm.instance != cold.instance || warm.decision != router.DecisionAffinity {
			t.Fatalf("document %d: instances %q then %q (decision %q): the same prefix must reach the same instance", d, cold.instance, warm.instance, warm.decision)
		}
		for _, a := range []llamaAnswer{cold, warm} {
			if a.prompt < 300 || a.evaluated <= 0 || a.finish == "" {
				t.Fatalf("document %d: answer without usage, timings or finish reason: %+v", d, a)
			}
			evaluated[a.instance] += a.evaluated
			prompt += a.prompt
		}
		if (cold.chunks == 0) == (warm.chunks == 0) {
			t.Fatalf("document %d: %d and %d chunks, want one streamed answer and one not", d, cold.chunks, warm.chunks)
		}
		// The engine's own word on the cache: the warm request evaluated
		// only what follows the cached document.
		if cold.evaluated < cold.prompt/2 || warm.evaluated > warm.prompt/4 {
			t.Fatalf("document %d: evaluated %d of %d cold, %d of %d warm: no prefix-cache hit", d, cold.evaluated, cold.prompt, warm.evaluated, warm.prompt)
		}
		warmEvaluated += warm.evaluated
		warmPrompt += warm.prompt
	}
	// The engines' /metrics agree with their answers, instance by instance.
	after := processed()
	var total float64
	for id := range byID {
		delta := after[id] - before[id]
		total += delta
		if delta != float64(evaluated[id]) {
			t.Errorf("%s: %s grew by %v, its answers' timings say %d tokens evaluated", id, probe.LlamaCppPromptTokens, delta, evaluated[id])
		}
	}
	t.Logf("engines evaluated %v of %d prompt tokens (%.1f %% from cache); warm requests %d of %d",
		total, prompt, 100*(1-total/float64(prompt)), warmEvaluated, warmPrompt)

	// The router counted the prompt tokens, and those the caches served.
	routed := map[string]float64{}
	fams, err := rep.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range fams {
		for _, m := range fam.GetMetric() {
			routed[fam.GetName()] += m.GetCounter().GetValue()
		}
	}
	if got := routed["prefixrouter_prompt_tokens_total"]; got != float64(prompt) {
		t.Errorf("prefixrouter_prompt_tokens_total %v, want the %d the answers reported", got, prompt)
	}
	if cached := routed["prefixrouter_cached_prompt_tokens_total"]; cached <= 0 || cached != float64(prompt)-total {
		t.Errorf("prefixrouter_cached_prompt_tokens_total %v, want llama.cpp's cached tokens (usage.prompt_tokens minus timings.prompt_n): %v", cached, float64(prompt)-total)
	}
}
