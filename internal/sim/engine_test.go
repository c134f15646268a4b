package sim

import (
	"math"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

// vengine is an engine driven in virtual time by the test.
type vengine struct {
	*engine
	now time.Duration
}

func newVEngine(t *testing.T, capTokens, budget int) *vengine {
	t.Helper()
	p, err := LookupProfile(ProfileH200Llama8B)
	if err != nil {
		t.Fatal(err)
	}
	return &vengine{engine: newEngine(&p, capTokens, 256, budget, newMetrics("m", capTokens))}
}

// submit queues prompts (texts) at the current virtual time.
func (v *vengine) submit(maxTokens int, texts ...string) []*seq {
	var out []*seq
	for _, tx := range texts {
		s := newSeq("", "", tx, maxTokens, make(chan struct{}, 1))
		v.add(s, v.now)
		out = append(out, s)
	}
	return out
}

// step runs one step; false when idle.
func (v *vengine) step() bool {
	st := v.schedule()
	if st == nil {
		return false
	}
	v.now += st.dur
	v.complete(st, v.now)
	return true
}

func (v *vengine) drain(t *testing.T) {
	t.Helper()
	for i := 0; v.step(); i++ {
		if i > 100000 {
			t.Fatal("engine does not go idle")
		}
	}
}

func tokens(name string, n int) string { return doc(name, n/BlockTokens+1)[:n*CharsPerToken] }

func within(t *testing.T, what string, got, want time.Duration, tol float64) {
	t.Helper()
	if e := math.Abs(got.Seconds()-want.Seconds()) / want.Seconds(); e > tol {
		t.Errorf("%s = %v, want %v ±%.0f %% (off by %.1f %%)", what, got, want, 100*tol, 100*e)
	}
}

func TestEngineConcurrentPrefillsContend(t *testing.T) {
	one := newVEngine(t, 900_000, 8192)
	a := one.submit(1, tokens("a", 8192))
	one.drain(t)
	single := a[0].firstAt

	two := newVEngine(t, 900_000, 8192)
	ab := two.submit(1, tokens("a", 8192), tokens("b", 8192))
	two.drain(t)
	last := max(ab[0].doneAt, ab[1].doneAt)
	t.Logf("one 8k prefill: %v; two at once: first tokens %v and %v", single, ab[0].firstAt, ab[1].firstAt)
	within(t, "one 8,192-token prefill", single, 258*time.Millisecond, 0.10) // calibration row
	within(t, "two concurrent 8,192-token prefills", last, 2*single, 0.10)
}

func TestEngineChunkedPrefillMatchesOnePass(t *testing.T) {
	// 16,384 tokens with an 8,192 budget take two steps; the chunks must
	// add up to the one-pass cost (calibration: 578 ms).
	v := newVEngine(t, 900_000, 8192)
	s := v.submit(1, tokens("a", 16384))
	v.drain(t)
	within(t, "chunked 16,384-token prefill", s[0].firstAt, 578*time.Millisecond, 0.10)
}

func TestEngineCachedTTFT(t *testing.T) {
	v := newVEngine(t, 900_000, 8192)
	document := tokens("doc", 8192)
	first := v.submit(4, document+tokens("q1", 50))
	v.drain(t)
	start := v.now
	second := v.submit(4, document+tokens("q2", 50))
	v.drain(t)
	ttft := second[0].firstAt - start
	if got := second[0].cached.Load(); got != 8192 {
		t.Fatalf("cached tokens %d, want the 8,192-token document", got)
	}
	p := v.prof
	suffix := p.PrefillDuration(8192+50, 8192) // floor + suffix cost
	t.Logf("uncached TTFT %v, cached TTFT %v (model %v)", first[0].firstAt, ttft, suffix)
	if ttft != suffix {
		t.Errorf("cached TTFT %v, want the cost model's %v", ttft, suffix)
	}
	within(t, "cached TTFT", ttft, 26762*time.Microsecond, 0.10) // calibration row 8242/8192
	if ttft*5 > first[0].firstAt {
		t.Errorf("cached TTFT %v is not far below the uncached %v", ttft, first[0].firstAt)
	}
	// Hits and queries count tokens, like vLLM's.
	if q, h := testsupport.Value(t, v.m.queries), testsupport.Value(t, v.m.hits); q != 2*(8192+50) || h != 8192 {
		t.Errorf("queries %v hits %v, want %d and 8192", q, h, 2*(8192+50))
	}
}

func TestEngineQueueingBeyondBudget(t *testing.T) {
	v := newVEngine(t, 900_000, 8192)
	ss := v.submit(1, tokens("a", 8000), tokens("b", 8000), tokens("c", 8000), tokens("d", 8000))
	v.step()
	if got := testsupport.Value(t, v.m.waiting); got != 2 {
		t.Errorf("waiting %v after the first step, want 2 (c and d queue behind the budget)", got)
	}
	v.drain(t)
	one := v.prof.PrefillDuration(8000, 0)
	for i := 1; i < len(ss); i++ {
		if ss[i].firstAt <= ss[i-1].firstAt {
			t.Errorf("request %d first token at %v, not after request %d's %v", i, ss[i].firstAt, i-1, ss[i-1].firstAt)
		}
	}
	within(t, "last of four 8k prompts", ss[3].firstAt, 4*one, 0.15)
}

func TestEngineWaitsForBlocks(t *testing.T) {
	// Room for one 1,000-token request (with its 24 output tokens) at a time.
	v := newVEngine(t, 1100, 8192)
	ss := v.submit(24, tokens("a", 1000), tokens("b", 1000))
	v.step()
	if r, w := testsupport.Value(t, v.m.running), testsupport.Value(t, v.m.waiting); r != 1 || w != 1 {
		t.Fatalf("running %v waiting %v, want 1 and 1: b must wait for blocks", r, w)
	}
	v.drain(t)
	if ss[1].firstAt <= ss[0].doneAt-1 {
		t.Errorf("b started (%v) before a freed its blocks (%v)", ss[1].firstAt, ss[0].doneAt)
	}
	if u := testsupport.Value(t, v.m.usage); u != 0 {
		t.Errorf("usage %v when idle", u)
	}
}

func TestEngineAbortFreesBlocks(t *testing.T) {
	v := newVEngine(t, 900_000, 8192)
	ss := v.submit(1000, tokens("a", 2000), tokens("b", 2000))
	v.step()
	v.step()
	if r := testsupport.Value(t, v.m.running); r != 2 {
		t.Fatalf("running %v, want 2", r)
	}
	v.abort(ss[0])
	v.step()
	if r := testsupport.Value(t, v.m.running); r != 1 {
		t.Errorf("running %v after an abort, want 1", r)
	}
	v.abort(ss[1])
	if v.step() {
		t.Error("engine still busy after aborting everything")
	}
	if r, u := testsupport.Value(t, v.m.running), testsupport.Value(t, v.m.usage); r != 0 || u != 0 {
		t.Errorf("running %v usage %v after aborting everything", r, u)
	}
	// The aborted prefills were computed: their blocks stay cached.
	again := v.submit(1, tokens("a", 2000))
	v.drain(t)
	if got := again[0].cached.Load(); got != 1984 {
		t.Errorf("resubmitted prompt hit %d tokens, want 1984", got)
	}
}

func TestEngineResetKeepsRunningPrefixes(t *testing.T) {
	v := newVEngine(t, 900_000, 8192)
	v.submit(1, tokens("done", 2000))
	v.drain(t)
	long := v.submit(1000, tokens("running", 2000))
	v.step() // prefilled, decoding
	if n := v.cache.dropUnpinned(); n != 125 {
		t.Errorf("dropped %d blocks, want the finished prompt's 125 full blocks", n)
	}
	again := v.submit(1, tokens("done", 2000), tokens("running", 2000))
	for range 3 {
		v.step()
	}
	if got := again[0].cached.Load(); got != 0 {
		t.Errorf("finished prompt hit %d tokens after the reset, want 0", got)
	}
	if got := again[1].cached.Load(); got != 1984 {
		t.Errorf("running prompt hit %d tokens after the reset, want 1984 (its blocks are pinned)", got)
	}
	v.abort(long[0])
	v.drain(t)
}

func TestEngineDecodeSteps(t *testing.T) {
	v := newVEngine(t, 900_000, 8192)
	ss := v.submit(11, tokens("a", 1024))
	v.drain(t)
	decode := ss[0].doneAt - ss[0].firstAt
	// 10 decode steps at batch 1, 1 K context: the 21 ms floor each.
	within(t, "10 decode steps", decode, 10*21045*time.Microsecond, 0.10)
	if got := testsupport.Value(t, v.m.genTokens); got != 11 {
		t.Errorf("generated %v tokens, want 11", got)
	}
}
