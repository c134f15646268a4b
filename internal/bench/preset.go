package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
)

// Kind is the shape of a workload.
type Kind string

// The workload shapes.
const (
	// KindSharedPrefix: a shared document (system message) followed by a
	// fresh question (user message) in every request.
	KindSharedPrefix Kind = "shared-prefix"
	// KindGroups: SGLang's generated-shared-prefix shape, a fixed set of
	// (group prompt, question) pairs sent in a shuffled order.
	KindGroups Kind = "groups"
	// KindSessions: multi-turn sessions; every turn re-sends the whole
	// history.
	KindSessions Kind = "sessions"
	// KindShort: short prompts of varied length with little sharing.
	KindShort Kind = "short"
)

// IntRange is an inclusive range drawn uniformly. Min == Max is a constant.
type IntRange struct {
	Min int `json:"min"`
	Max int `json:"max"`
}

func (r IntRange) draw(rng *rand.Rand) int {
	if r.Max <= r.Min {
		return r.Min
	}
	return r.Min + rng.IntN(r.Max-r.Min+1)
}

func (r IntRange) mean() float64 { return float64(r.Min+r.Max) / 2 }

// LengthDist is a log-normal length distribution given by its median and
// mean (the two figures published traces report), clipped to [Min, Max].
// Mean <= Median means the constant Median.
type LengthDist struct {
	Median float64 `json:"median"`
	Mean   float64 `json:"mean"`
	Min    int     `json:"min"`
	Max    int     `json:"max"`
}

func (d LengthDist) draw(rng *rand.Rand) int {
	v := d.Median
	if d.Mean > d.Median {
		sigma := math.Sqrt(2 * math.Log(d.Mean/d.Median))
		v = math.Exp(math.Log(d.Median) + sigma*rng.NormFloat64())
	}
	n := int(math.Round(v))
	if d.Min > 0 && n < d.Min {
		n = d.Min
	}
	if d.Max > 0 && n > d.Max {
		n = d.Max
	}
	return n
}

// azureConv is the output length distribution of the Azure LLM inference
// trace 2023, conversation service: median 129, mean 211 tokens.
// Source: Patel et al., "Splitwise" (ISCA 2024), Azure public dataset
// AzurePublicDataset/AzureLLMInferenceDataset2023.md.
var azureConv = LengthDist{Median: 129, Mean: 211, Min: 1, Max: 2048}

// Preset is a documented workload: its parameters, where they come from,
// and the working set they put in play. Zero fields are unused by the Kind.
type Preset struct {
	Name        string `json:"name"`
	Kind        Kind   `json:"kind"`
	Description string `json:"description"`
	Source      string `json:"source"`

	// Documents is the number of distinct shared prefixes (documents,
	// system prompts, groups); DocumentTokens the length of each.
	Documents      int `json:"documents,omitempty"`
	DocumentTokens int `json:"document_tokens,omitempty"`
	// Zipf is the popularity exponent over documents (rank k has weight
	// 1/k^Zipf); 0 means equal popularity.
	Zipf float64 `json:"zipf,omitempty"`
	// QuestionTokens is the length of the unshared part after the document.
	QuestionTokens IntRange `json:"question_tokens"`
	// QuestionsPerDocument (KindGroups) is the fixed number of questions
	// per group; the stream is a shuffled pass over all pairs, repeated.
	QuestionsPerDocument int `json:"questions_per_document,omitempty"`
	// Output is the max_tokens distribution (sent with ignore_eos, so the
	// server generates exactly that many).
	Output LengthDist `json:"output"`

	// Sessions (KindSessions) is the number of concurrently open sessions;
	// each request continues one of them, picked at random, and a finished
	// session is replaced by a new one.
	Sessions int `json:"sessions,omitempty"`
	// Turns is the number of user turns of a session.
	Turns IntRange `json:"turns"`
	// TurnTokens is the length of one user turn (or tool output).
	TurnTokens IntRange `json:"turn_tokens"`
	// SystemTokens is a system prompt shared by all sessions (0: none).
	SystemTokens int `json:"system_tokens,omitempty"`

	// PromptTokens (KindShort) is the user prompt length.
	PromptTokens LengthDist `json:"prompt_tokens"`
	// SharedShare (KindShort) is the share of requests that start with one
	// of the Documents shared system prompts.
	SharedShare float64 `json:"shared_share,omitempty"`
}

// WorkingSetTokens is the number of distinct prefix tokens the preset keeps
// in play: what a cache must hold for every reusable prefix to hit. For
// sessions it is the open sessions' average final history (mean outputs,
// before clipping, so approximate). Multiply by the number of tenants when
// tenants are salted apart (see StreamOptions.Tenants).
func (p Preset) WorkingSetTokens() int64 {
	switch p.Kind {
	case KindSharedPrefix, KindGroups, KindShort:
		return int64(p.Documents) * int64(p.DocumentTokens)
	case KindSessions:
		out := p.Output.Mean
		if out < p.Output.Median {
			out = p.Output.Median
		}
		turns := p.Turns.mean()
		hist := turns*p.TurnTokens.mean() + (turns-1)*out
		return int64(p.SystemTokens) + int64(math.Round(float64(p.Sessions)*hist))
	}
	return 0
}

// Validate reports parameters a Stream cannot use.
func (p Preset) Validate() error {
	switch p.Kind {
	case KindSharedPrefix, KindGroups:
		if p.Documents <= 0 || p.DocumentTokens <= 0 {
			return fmt.Errorf("bench: preset %q: documents and document tokens must be > 0", p.Name)
		}
		if p.Kind == KindGroups && p.QuestionsPerDocument <= 0 {
			return fmt.Errorf("bench: preset %q: questions per document must be > 0", p.Name)
		}
	case KindSessions:
		if p.Sessions <= 0 || p.Turns.Min <= 0 || p.Turns.Max < p.Turns.Min {
			return fmt.Errorf("bench: preset %q: sessions and turns must be > 0", p.Name)
		}
	case KindShort:
		if p.PromptTokens.Median <= 0 {
			return fmt.Errorf("bench: preset %q: prompt tokens must be > 0", p.Name)
		}
	default:
		return fmt.Errorf("bench: preset %q: unknown kind %q", p.Name, p.Kind)
	}
	if p.Zipf < 0 || p.SharedShare < 0 || p.SharedShare > 1 {
		return fmt.Errorf("bench: preset %q: zipf and shared share out of range", p.Name)
	}
	return nil
}

// shared8k is shared-8k or one of its variants: docs documents of 8,000
// tokens drawn with popularity Zipf(zipf) (0: equal), each followed by a
// 50-300-token question, outputs from the Azure conversation trace.
func shared8k(name string, docs int, zipf float64, description, source string) Preset {
	return Preset{
		Name: name, Kind: KindSharedPrefix, Description: description, Source: source,
		Documents: docs, DocumentTokens: 8000, Zipf: zipf,
		QuestionTokens: IntRange{50, 300}, Output: azureConv,
	}
}

// Presets returns the built-in workloads (docs/workloads.md, WORKLOADS.md).
func Presets() []Preset {
	return []Preset{
		shared8k("shared-8k", 200, 1.0, "Zipf(1) over 200 documents of 8,000 tokens + a 50-300-token question",
			"SageMaker's long-context prefix-aware routing benchmark (8,000-token shared prefixes); outputs: Azure LLM inference trace 2023, conversation (p50 129, mean 211)"),
		shared8k("shared-8k-uniform", 256, 0, "256 documents of 8,000 tokens, equal popularity, same questions and outputs as shared-8k",
			"derived from shared-8k: checks the hashing's balance with no hot document"),
		shared8k("shared-8k-seed", 200, 0.6, "Zipf(0.6) over 200 documents of 8,000 tokens + a 50-300-token question: RANDOM hits 20-30 % (the seed's baseline)",
			"shared-8k with the popularity exponent lowered until RANDOM's modelled hit rate over the demo's fleet (7 instances x 300k KV tokens) sits in the seed's 20-30 % baseline; see docs/workloads.md (BaselineRun)"),
		shared8k("shared-8k-hot", 200, 1.5, "Zipf(1.5) over 200 documents of 8,000 tokens: the top document draws about 40 % of requests",
			"derived from shared-8k: a few very hot prefixes (issue 10's hot-key workload, top keys > 30 % of traffic)"),
		{
			Name: "bot", Kind: KindSharedPrefix,
			Description: "100 bots' system prompts of 3,000 tokens (equal popularity) + a 50-token question",
			Source: "the seed's customer-service example (10-100 system prompts of 3,000 tokens; " +
				"upper end taken); outputs: Azure conversation trace",
			Documents: 100, DocumentTokens: 3000,
			QuestionTokens: IntRange{50, 50}, Output: azureConv,
		},
		{
			Name: "gsp", Kind: KindGroups,
			Description: "64 groups x 16 prompts: 2,048-token group system prompt + 128-token question, 256 output tokens",
			Source:      "SGLang bench_serving --dataset-name generated-shared-prefix defaults",
			Documents:   64, DocumentTokens: 2048, QuestionsPerDocument: 16,
			QuestionTokens: IntRange{128, 128}, Output: LengthDist{Median: 256},
		},
		{
			Name: "chat", Kind: KindSessions,
			Description: "64 open sessions of 3-5 turns re-sending the whole history; user turns 100-1,000 tokens",
			Source: "ShareGPT (3.5 turns a conversation on average); outputs: Azure LLM inference trace 2023, " +
				"conversation (p50 129, mean 211)",
			Sessions: 64, Turns: IntRange{3, 5}, TurnTokens: IntRange{100, 1000}, Output: azureConv,
		},
		{
			Name: "agentic", Kind: KindSessions,
			Description: "8 open agent sessions of 20-40 turns, +500-2,000 tokens a turn, growing to ~80k tokens, after a shared 2,000-token tool prompt",
			Source:      "coding-agent traces as summarised in WORKLOADS.md; outputs: Azure conversation trace",
			Sessions:    8, Turns: IntRange{20, 40}, TurnTokens: IntRange{500, 2000}, SystemTokens: 2000,
			Output: azureConv,
		},
		{
			Name: "agent", Kind: KindSessions,
			Description: "32 open coding-agent sessions after one shared 10 KB tool prompt: a task, then 6-14 turns of tool output (200-1,500 tokens each), re-sending the history",
			Source: "issue 21's agent sessions (a tool prompt longer than the 4,096-unit default PrefixLength); " +
				"coding-agent traces as summarised in WORKLOADS.md; outputs: Azure conversation trace",
			Sessions: 32, Turns: IntRange{7, 15}, TurnTokens: IntRange{200, 1500}, SystemTokens: 2560,
			Output: azureConv,
		},
		{
			Name: "llamacpp-tiny", Kind: KindSharedPrefix,
			Description: "8 documents of 400 tokens (equal popularity) + a 10-30-token question, 16 output tokens: sized for CPU llama-server",
			Source: "issue 20's real-engine run: llama.cpp llama-server with a tiny random-weight model on 2 CPU cores, " +
				"where a cold prefill of about 1,000 tokens takes about 0.3 s and each of a server's slots caches one prompt; " +
				"a document is about 660 of its tokens (docs/benchmarks.md, make bench-llamacpp)",
			Documents: 8, DocumentTokens: 400,
			QuestionTokens: IntRange{10, 30}, Output: LengthDist{Median: 16},
		},
		{
			Name: "sharegpt-like", Kind: KindShort,
			Description: "short varied prompts (log-normal, mean ~1,000 tokens); 10% start with one of 4 shared 100-token system prompts",
			Source: "SageMaker's short-context benchmark (ShareGPT-like, little sharing); " +
				"outputs: Azure conversation trace",
			Documents: 4, DocumentTokens: 100, SharedShare: 0.10,
			PromptTokens: LengthDist{Median: 700, Mean: 1000, Min: 16, Max: 8000},
			Output:       azureConv,
		},
	}
}

// PresetNames lists the built-in presets' names.
func PresetNames() []string {
	ps := Presets()
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	sort.Strings(out)
	return out
}

// LookupPreset returns the built-in preset of that name.
func LookupPreset(name string) (Preset, error) {
	for _, p := range Presets() {
		if p.Name == name {
			return p, nil
		}
	}
	return Preset{}, fmt.Errorf("bench: unknown preset %q (known: %s)", name, strings.Join(PresetNames(), ", "))
}
