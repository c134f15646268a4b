package e2e

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/prefixrouter/prefixrouter/internal/bench"
	"github.com/prefixrouter/prefixrouter/internal/sim"
	"github.com/prefixrouter/prefixrouter/probe"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// newOpenAI is OpenAI's Go SDK pointed at the router, without retries.
func newOpenAI(base string, hc *http.Client) openai.Client {
	return openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("test"), option.WithHTTPClient(hc), option.WithMaxRetries(0))
}

func TestOpenAISDK(t *testing.T) {
	f := startSims(t, 3, sim.Options{})
	rep := startStatic(t, f.insts, nil)
	rec := newRecorder(t)
	oa := newOpenAI(rep.URL(), rec.client())
	ctx := t.Context()
	model := sim.DefaultBaseModel
	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(strings.Repeat("You are terse. ", 40)), openai.UserMessage("hello")}

	chat, err := oa.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs, MaxTokens: openai.Int(5)})
	if err != nil || len(chat.Choices) != 1 || chat.Choices[0].Message.Content == "" || chat.Usage.PromptTokens == 0 {
		t.Fatalf("chat: %+v, %v", chat, err)
	}
	st := oa.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs, MaxTokens: openai.Int(5),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for st.Next() {
		acc.AddChunk(st.Current())
		chunks++
	}
	if err := st.Err(); err != nil || acc.Choices[0].Message.Content != chat.Choices[0].Message.Content || acc.Usage.PromptTokens != chat.Usage.PromptTokens {
		t.Fatalf("streamed chat: %d chunks %q usage %+v, %v", chunks, acc.Choices[0].Message.Content, acc.Usage, err)
	}
	st.Close()

	prompt := openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat("Once upon a time ", 30))}
	cmpl, err := oa.Completions.New(ctx, openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(model), Prompt: prompt, MaxTokens: openai.Int(4)})
	if err != nil || len(cmpl.Choices) != 1 || cmpl.Choices[0].Text == "" {
		t.Fatalf("completion: %+v, %v", cmpl, err)
	}
	cs := oa.Completions.NewStreaming(ctx, openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(model), Prompt: prompt, MaxTokens: openai.Int(4)})
	var text string
	for cs.Next() {
		if c := cs.Current(); len(c.Choices) > 0 {
			text += c.Choices[0].Text
		}
	}
	if err := cs.Err(); err != nil || text != cmpl.Choices[0].Text {
		t.Fatalf("streamed completion %q (want %q), %v", text, cmpl.Choices[0].Text, err)
	}
	cs.Close()

	// prompt_cache_key splits tenants: the same text under many tenant
	// ids lands on more than one instance, and each tenant stays on one.
	byTenant := map[string]string{}
	seen := map[string]bool{}
	for i := range 12 {
		tenant := "tenant-" + itoa(i%6)
		_, err := oa.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs, MaxTokens: openai.Int(1), PromptCacheKey: openai.String(tenant)})
		if err != nil {
			t.Fatal(err)
		}
		id := rec.last().Get(router.HeaderInstance)
		if prev, ok := byTenant[tenant]; ok && prev != id {
			t.Fatalf("tenant %s moved from %s to %s", tenant, prev, id)
		}
		byTenant[tenant] = id
		seen[id] = true
	}
	if len(seen) < 2 {
		t.Fatalf("6 tenants with one text all on %v: prompt_cache_key does not split tenants", seen)
	}

	// The model list of a static fleet: what the instances serve.
	page, err := oa.Models.List(ctx)
	if err != nil || len(page.Data) == 0 || page.Data[0].ID != model {
		t.Fatalf("models.list: %+v, %v", page, err)
	}

	// A malformed request: *openai.Error with status 400.
	var apiErr *openai.Error
	_, err = oa.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs}, option.WithJSONSet("messages", "not a list"))
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Code != "invalid_json" {
		t.Fatalf("malformed request: %T %v, want *openai.Error 400", err, err)
	}
}

// TestTenantCacheSalt: with the salt on, two tenants sending the same text
// to one instance share no cached token, by the simulator's own metrics,
// while one tenant's repeats hit; with it off they share.
func TestTenantCacheSalt(t *testing.T) {
	text := strings.Repeat("The same long shared document, word for word. ", 60)
	for _, salt := range []bool{true, false} {
		f := startSims(t, 1, sim.Options{})
		rep := startStatic(t, f.insts, func(o *replica.Options) { o.Routing.TenantCacheSalt = salt })
		oa := newOpenAI(rep.URL(), newRecorder(t).client())
		hits := func() float64 {
			m, err := probe.Scrape(t.Context(), f.srvs[0].Client(), f.insts[0].Addr+"/metrics")
			if err != nil {
				t.Fatal(err)
			}
			v, err := m.Sum("vllm:prefix_cache_hits_total")
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		send := func(tenant string) float64 {
			before := hits()
			_, err := oa.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: sim.DefaultBaseModel,
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)}, MaxTokens: openai.Int(1), PromptCacheKey: openai.String(tenant)},
				option.WithJSONSet("cache_salt", "a salt the client picked")) // overridden by the router when salting
			if err != nil {
				t.Fatal(err)
			}
			return hits() - before
		}
		first, repeat, other := send("tenant-a"), send("tenant-a"), send("tenant-b")
		t.Logf("salt %v: cached tokens: first %v, same tenant again %v, other tenant %v", salt, first, repeat, other)
		if first != 0 || repeat == 0 {
			t.Fatalf("salt %v: first %v, repeat %v: one tenant's repeats must hit", salt, first, repeat)
		}
		if salt && other != 0 {
			t.Fatalf("salt on: another tenant hit %v cached tokens of tenant-a's", other)
		}
		if !salt && other == 0 {
			t.Fatal("salt off: the other tenant hit nothing, so this test could not tell salting from no salting")
		}
	}
}

// TestRouterHitRateMatchesSimulator: over a bench run through the router,
// the router's token counters (read from usage as responses stream past)
// agree with the simulators' own prefix-cache counters within 1 %.
func TestRouterHitRateMatchesSimulator(t *testing.T) {
	f := startSims(t, 3, sim.Options{})
	rep := startStatic(t, f.insts, nil)
	var metricsURLs []string
	for _, in := range f.insts {
		metricsURLs = append(metricsURLs, in.Addr+"/metrics")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	for _, api := range []string{bench.APIOpenAI, bench.APIInvoke} {
		res, err := bench.Run(ctx, bench.Options{
			Targets: []string{rep.URL()}, MetricsURLs: metricsURLs, Preset: "bot", Requests: 150, Seed: 7,
			Concurrency: 8, Model: sim.DefaultBaseModel, API: api, Tenants: 4, Client: hc, Endpoint: ep,
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Succeeded != res.Requests {
			t.Fatalf("%s: %d of %d requests succeeded", api, res.Succeeded, res.Requests)
		}
	}
	var simHits, simQueries float64
	for _, u := range metricsURLs {
		m, err := probe.Scrape(ctx, hc, u)
		if err != nil {
			t.Fatal(err)
		}
		h, err1 := m.Sum("vllm:prefix_cache_hits_total")
		q, err2 := m.Sum("vllm:prefix_cache_queries_total")
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		simHits, simQueries = simHits+h, simQueries+q
	}
	m, err := probe.Scrape(ctx, hc, "http://"+rep.AdminAddr()+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	cached, err1 := m.Sum("prefixrouter_cached_prompt_tokens_total")
	prompt, err2 := m.Sum("prefixrouter_prompt_tokens_total")
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	t.Logf("router: %v cached of %v prompt tokens (%.1f %%); simulators: %v hits of %v queries (%.1f %%)",
		cached, prompt, 100*cached/prompt, simHits, simQueries, 100*simHits/simQueries)
	if simHits == 0 || math.Abs(cached-simHits) > 0.01*simHits || math.Abs(prompt-simQueries) > 0.01*simQueries {
		t.Fatalf("router counters disagree with the simulators' by more than 1 %%")
	}
	for _, s := range m.Series("prefixrouter_cached_prompt_tokens_total") {
		// The static fleet declares no model, but the replica asks each
		// instance what it lists (issue 20): the OpenAI runs' model is the
		// simulators' base model (no client string becomes a label), the
		// invoke runs name none.
		if md := s.Labels["model"]; s.Labels["endpoint"] != ep || (md != sim.DefaultBaseModel && md != "") || s.Labels["instance"] == "" || s.Labels["decision"] == "" {
			t.Fatalf("series labels %v", s.Labels)
		}
	}
}
