package router

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

// adaptiveCfg is PREFIX_AWARE with adaptive keys (the default) and the
// default PrefixLength.
func adaptiveCfg(threshold int) fleet.RoutingConfig {
	return fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{ConcurrencyThreshold: threshold}}
}

// publish merges the harnesses' popularity at now and puts it into every
// harness's snapshot, as the replicas' watchers do with what etcd holds.
func publish(t *testing.T, now time.Time, hs ...*harness) []fleet.PopularKey {
	t.Helper()
	var ps []fleet.Popularity
	for _, h := range hs {
		p, ok := h.r.Popularity("ep", now)
		if !ok {
			t.Fatal("an adaptive endpoint publishes no popularity")
		}
		ps = append(ps, p)
	}
	merged := fleet.MergePopularity(ps)
	for _, h := range hs {
		h.ep.Popular = merged
		h.update()
	}
	return merged
}

// agentChat is turn turn of agent session s: a 10,000-character tool
// prompt shared by every session, the session's task, then per turn an
// answer and a tool output, the whole history re-sent.
func agentChat(s, turn int) string {
	msgs := []any{msg("system", strings.Repeat("Tools: read, edit, run. ", 420)), msg("user", fmt.Sprintf("task %d: ", s)+strings.Repeat("fix the bug. ", 80))}
	for i := range turn {
		msgs = append(msgs, msg("assistant", fmt.Sprintf("call %d of session %d", i, s)), msg("user", strings.Repeat(fmt.Sprintf("output %d.%d ", s, i), 150)))
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	return string(b)
}

// TestAdaptiveColdRoutesAsFixed: with nothing popular, an adaptive
// endpoint routes every request on the key a fixed-length endpoint of
// SageMaker's default PrefixLength (4,096) gives it: the same instance for
// invoke bodies longer and shorter than 4,096 bytes and for chat bodies
// with one long message (chaos's movement figures rest on this).
func TestAdaptiveColdRoutesAsFixed(t *testing.T) {
	bs := newBackends(t, 7)
	ad := newHarness(t, hopts{cfg: adaptiveCfg(100)}, bs...)
	fixed := fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{ConcurrencyThreshold: 100, FixedLengthKeys: true}}
	fx := newHarness(t, hopts{cfg: fixed}, bs...)
	if got := ad.r.view.Load().endpoints["ep"].prefixLen; got != fleet.DefaultAdaptivePrefixLength {
		t.Fatalf("adaptive PrefixLength %d, want %d", got, fleet.DefaultAdaptivePrefixLength)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		n := 100 + rng.IntN(12000)
		text := strings.Repeat(fmt.Sprintf("doc %d ", i), n/4+1)[:n]
		bodies := map[string]string{
			"/invocations":         fmt.Sprintf(`{"inputs":%q}`, text),
			"/v1/chat/completions": chatJSON(msg("system", text)),
		}
		for path, body := range bodies {
			a, err := ad.r.Explain(context.Background(), PickRequest{Path: path, Body: []byte(body)})
			if err != nil {
				t.Fatal(err)
			}
			f, err := fx.r.Explain(context.Background(), PickRequest{Path: path, Body: []byte(body)})
			if err != nil {
				t.Fatal(err)
			}
			if a.Instance != f.Instance || a.Key != f.Key {
				t.Fatalf("%s, %d units: adaptive %s (key %x), fixed %s (key %x)", path, n, a.Instance, a.Key, f.Instance, f.Key)
			}
		}
	}
}

func chatJSON(msgs ...any) string {
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	return string(b)
}

// TestAdaptiveAgentSessions is issue 21's agent case over real HTTP: 28
// sessions share a 10,000-character tool prompt (longer than 4,096) and
// each goes on for 8 turns. With fixed-length keys every request shares one
// key and lands on one instance. With adaptive keys, once the replicas
// have published the tool prompt as hot, it descends past it: the sessions
// spread over the instances, and every turn of a session after its first
// goes to the instance its first turn went to.
func TestAdaptiveAgentSessions(t *testing.T) {
	bs := newBackends(t, 7)
	h := newHarness(t, hopts{cfg: adaptiveCfg(100)}, bs...)
	fixed := newHarness(t, hopts{cfg: fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{ConcurrencyThreshold: 100, FixedLengthKeys: true}}}, bs...)
	now := time.Unix(1_700_000_000, 0)
	// Warm-up sessions make the tool prompt popular; then publish.
	for s := range 20 {
		for turn := range 4 {
			h.mustDo("/v1/chat/completions", agentChat(1000+s, turn), nil)
		}
	}
	pop := publish(t, now, h)
	hot := 0
	for _, k := range pop {
		if k.K > 1 {
			hot++
		}
	}
	if hot < 3 {
		t.Fatalf("published %d prefixes, %d hot: the tool prompt's depths should be hot: %+v", len(pop), hot, pop)
	}
	fixedOn := map[string]int{}
	perInstance := map[string]int{}
	moved := 0
	for s := range 28 {
		first := ""
		for turn := range 8 {
			body := agentChat(s, turn)
			res := h.mustDo("/v1/chat/completions", body, nil)
			if res.status != 200 {
				t.Fatalf("session %d turn %d: status %d", s, turn, res.status)
			}
			perInstance[res.instance]++
			if turn == 0 {
				first = res.instance
			} else if res.instance != first {
				moved++
			}
			fixedOn[fixed.mustDo("/v1/chat/completions", body, nil).instance]++
		}
	}
	t.Logf("adaptive: %v, %d turns moved; fixed: %v", perInstance, moved, fixedOn)
	if len(fixedOn) != 1 {
		t.Errorf("fixed-length keys spread the sessions over %d instances: the test's prompts do not share their first 4,096 characters", len(fixedOn))
	}
	if moved != 0 {
		t.Errorf("%d turns went to another instance than their session's first", moved)
	}
	if len(perInstance) < 6 {
		t.Errorf("28 sessions on %d of 7 instances, want them spread", len(perInstance))
	}
	for id, n := range perInstance {
		if n > 8*8 {
			t.Errorf("instance %s took %d of 224 requests: more than 8 sessions", id, n)
		}
	}
}

// TestAdaptiveIdenticalPromptsByLoad: a prompt that every request repeats
// whole is hot at every depth; it has no deeper key to tell requests
// apart, so its k instances share it by load, as hot-key replication does:
// requests held open spread over them instead of queuing on one.
func TestAdaptiveIdenticalPromptsByLoad(t *testing.T) {
	bs := newBackends(t, 7)
	h := newHarness(t, hopts{cfg: adaptiveCfg(100)}, bs...)
	body := fmt.Sprintf(`{"inputs":%q}`, strings.Repeat("the same prompt every time. ", 300))
	for range 200 {
		h.mustDo("/invocations", body, nil)
	}
	publish(t, time.Unix(1_700_000_000, 0), h)
	ex, err := h.r.Explain(context.Background(), PickRequest{Path: "/invocations", Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	if ex.HotReplicas != 7 {
		t.Fatalf("a prompt with every request: k = %d, want 7", ex.HotReplicas)
	}
	held := holdOpen(t, h, bs, body, 14)
	if len(held) != 7 {
		t.Fatalf("14 held requests on %v, want 2 on each of 7 instances", held)
	}
	for id, n := range held {
		if n != 2 {
			t.Errorf("instance %s holds %d, want 2", id, n)
		}
	}
}

// holdOpen sends n requests of body that the backends block, one at a
// time so that each pick sees the loads of the earlier ones, and returns
// how many each instance holds; then releases them.
func holdOpen(t *testing.T, h *harness, bs []*backend, body string, n int) map[string]int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range n {
		before := totalBlocked(bs)
		wg.Go(func() {
			_, _ = h.do(ctx, "/invocations", body, map[string]string{"X-Test-Block": "1"})
		})
		testsupport.Eventually(t, 10*time.Second, "request held", func() bool { return totalBlocked(bs) == before+1 })
	}
	held := map[string]int{}
	for _, b := range bs {
		if n := int(b.blocked.Load()); n > 0 {
			held[b.id] = n
		}
	}
	for _, b := range bs {
		close(b.release)
	}
	wg.Wait()
	return held
}
