package e2e

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/agent"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/sim"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/router"
)

// TestFullInstanceEvictsLeastRecentlyUsed is issue 11's "a full instance
// evicts its least recently used adapter": two instances with 2 adapter
// slots each. Adapters s1 and s2 live on both (min 2); s2 is used on q,
// then s1, so s1 is the more recently used there. Both sets shrink to 1
// (on p): q keeps them as spare copies. A new adapter n is placed on q,
// which is full: q's agent evicts s2, the least recently used, keeps s1,
// and loads n. q's record drops s2, the router stops sending s2 there, and
// no request fails.
func TestFullInstanceEvictsLeastRecentlyUsed(t *testing.T) {
	if testing.Short() {
		t.Skip("a fleet with placement")
	}
	ctx := testsupport.Context(t, 2*time.Minute)
	f := startPlacing(t, ctx, localfleet.Options{
		Instances: 2, Replicas: 1,
		Sim:   sim.Options{MaxLoras: 2, AdapterLoadTime: 50 * time.Millisecond},
		Agent: agent.Options{LoadPollInterval: 20 * time.Millisecond, ActiveWindow: time.Minute},
	})
	ids := f.IDs()
	p, q := ids[0], ids[1]
	// Names whose rendezvous choice is p (s1, s2) or q (n).
	top := func(name string) string {
		e := &fleet.Endpoint{Instances: []fleet.Instance{{ID: p}, {ID: q}}, Adapters: []fleet.Adapter{{Name: name}}}
		return lora.Place(e).Set(name)[0]
	}
	var onP []string
	n := ""
	for i := 0; len(onP) < 2 || n == ""; i++ {
		name := fmt.Sprintf("lru-%d", i)
		if top(name) == p && len(onP) < 2 {
			onP = append(onP, name)
		} else if top(name) == q && n == "" {
			n = name
		}
	}
	s1, s2 := onP[0], onP[1]
	put := func(name string, minReplicas int) {
		t.Helper()
		if err := membership.PutAdapter(ctx, f.Client(), membership.Layout{}, ep, fleet.Adapter{Name: name, Source: "/adapters/" + name, MinReplicas: minReplicas, MaxReplicas: 2}); err != nil {
			t.Fatal(err)
		}
	}
	snap := func() *fleet.Endpoint { return f.Replicas()[0].Router().Snapshot().Endpoint(ep) }
	record := func(id string) fleet.Instance {
		for _, in := range snap().Instances {
			if in.ID == id {
				return in
			}
		}
		return fleet.Instance{}
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	// send posts one chat request for model to base and returns the
	// answering instance; any answer but 200 fails the test.
	send := func(base, model, prompt string) string {
		t.Helper()
		body := fmt.Sprintf(`{"model":%q,"max_tokens":8,"messages":[{"role":"user","content":%q}]}`, model, prompt)
		resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s for %s: %d %s", base, model, resp.StatusCode, b)
		}
		return resp.Header.Get(router.HeaderInstance)
	}
	rt := f.RouterURLs()[0]

	put(s1, 2)
	put(s2, 2)
	testsupport.Eventually(t, 20*time.Second, "s1 and s2 loaded on both instances", func() bool {
		return slices.Equal(loaded(snap(), s1), ids) && slices.Equal(loaded(snap(), s2), ids)
	})
	// s2 used through the router, some of it on q, until q's agent has
	// seen it in use.
	sentToQ := 0
	testsupport.Eventually(t, 30*time.Second, "s2 used on q", func() bool {
		for i := range 8 {
			if send(rt, s2, fmt.Sprintf("s2 question %d %d", sentToQ, i)) == q {
				sentToQ++
			}
		}
		return sentToQ > 0 && slices.Contains(record(q).ActiveAdapters, s2)
	})
	// Then s1, on q directly: every scrape that sees it comes after s2's
	// last request ended, so s1 is the more recently used.
	qAddr := record(q).Addr
	i := 0
	testsupport.Eventually(t, 30*time.Second, "s1 used on q after s2", func() bool {
		i++
		send(qAddr, s1, fmt.Sprintf("s1 question %d", i))
		return slices.Contains(record(q).ActiveAdapters, s1)
	})

	// Both sets shrink to their rendezvous choice p; q keeps spare copies.
	put(s1, 1)
	put(s2, 1)
	testsupport.Eventually(t, 10*time.Second, "the sets shrink to p", func() bool {
		pl := lora.Place(snap())
		return slices.Equal(pl.Set(s1), []string{p}) && slices.Equal(pl.Set(s2), []string{p}) && len(pl.Assigned(q)) == 0
	})
	if got := f.Instance(q).Sim.Adapters(); !slices.Contains(got, s1) || !slices.Contains(got, s2) {
		t.Fatalf("q holds %v: the spare copies of %s and %s were not kept", got, s1, s2)
	}

	// n is placed on q, whose 2 slots hold the two spares.
	put(n, 1)
	qs := f.Instance(q).Sim
	testsupport.Eventually(t, 20*time.Second, "q loads n", func() bool { return slices.Contains(qs.Adapters(), n) })
	// Requests for s2 right after the eviction, while routers may still
	// list q for it: refused there, retried on p (the stale retry).
	for i := range 20 {
		send(rt, s2, fmt.Sprintf("s2 after the eviction %d", i))
	}
	want := slices.Sorted(slices.Values([]string{s1, n}))
	if got := slices.Sorted(slices.Values(qs.Adapters())); !slices.Equal(got, want) {
		t.Fatalf("q holds %v after loading %s; want the least recently used %s evicted and %s kept", got, n, s2, s1)
	}
	testsupport.Eventually(t, 10*time.Second, "q's record drops s2", func() bool {
		return slices.Equal(record(q).Adapters, want)
	})
	for i := range 20 {
		if at := send(rt, s2, fmt.Sprintf("s2 question %d", i)); at != p {
			t.Fatalf("s2 answered by %s after q evicted it; want %s", at, p)
		}
	}
	t.Logf("q (%s) evicted %s, kept %s, loaded %s; %d requests for %s had reached q before, none after", q, s2, s1, n, sentToQ, s2)
}

// loaded returns the sorted ids of the non-draining instances reporting
// adapter.
func loaded(ep *fleet.Endpoint, adapter string) []string {
	var out []string
	for _, in := range ep.Instances {
		if !in.Draining && in.HasAdapter(adapter) {
			out = append(out, in.ID)
		}
	}
	slices.Sort(out)
	return out
}
