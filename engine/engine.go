// Package engine describes the model servers prefixrouter fronts (vLLM,
// SGLang, llama.cpp's llama-server, TGI): one immutable Profile per
// engine, naming what each exposes for load, cached prompt tokens and LoRA
// adapters, and which of its error statuses prove an engine
// failure. docs/engines.md cites the engine versions each profile was
// checked against.
//
// An instance record names its engine (fleet.Instance.Engine, detected by
// the agent with Detect or forced with `register --engine`); Lookup turns
// the name into its Profile. A record without one (older agents, static
// fleets) gets Generic, which accepts the names of every known engine.
package engine

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Names of the engines as instance records spell them.
const (
	VLLM     = "vllm"
	SGLang   = "sglang"
	LlamaCpp = "llamacpp"
	TGI      = "tgi"
)

// MaxNameLength bounds an engine name in a record (it becomes a log field
// and is compared, never hashed or used as a metric label).
const MaxNameLength = 32

// Selector is how a request names the LoRA adapter it wants.
type Selector int

const (
	// ByModel: the OpenAI "model" field names the adapter (vLLM); the
	// router sends the request as the client wrote it.
	ByModel Selector = iota
	// ByLoRAPath: the top-level "lora_path" field names the adapter
	// (SGLang, which serves the base model for a "model" it does not
	// parse as "base:adapter").
	ByLoRAPath
	// ByIndex: the top-level "lora" field lists the adapters to apply by
	// their index in the server's --lora list, [{"id":N,"scale":S}], and
	// every adapter left out runs at scale 0 (llama.cpp's llama-server,
	// which ignores "model").
	ByIndex
)

// Cached is a set of places where an answer (the JSON of a completion or
// the last SSE chunk of a stream) reports how many of its prompt tokens the
// prefix cache served.
type Cached int

const (
	// CachedUsage: OpenAI's usage.prompt_tokens_details.cached_tokens.
	CachedUsage Cached = 1 << iota
	// CachedTimings: llama.cpp's "timings" object: cache_n where present,
	// else usage.prompt_tokens minus prompt_n (the prompt tokens it
	// evaluated). Read only when the answer has no CachedUsage.
	CachedTimings
)

// Listing is where a server lists the adapters it has loaded.
type Listing int

const (
	// ListNone: the server does not list its adapters.
	ListNone Listing = iota
	// ListModels: /v1/models lists each adapter with "parent" set to the
	// base model (vLLM, SGLang).
	ListModels
	// ListIndexed: GET /lora-adapters lists [{"id","path","scale"}] in
	// index order (llama.cpp); an adapter's name is its file name without
	// the directory and the .gguf extension (AdapterName).
	ListIndexed
)

// Adapters is how one engine lists, loads, unloads and selects LoRA
// adapters.
type Adapters struct {
	List Listing
	// ListPath is the GET that lists them ("" with ListNone).
	ListPath string
	// LoadPath and UnloadPath are the POSTs that load
	// {"lora_name","lora_path"} and unload {"lora_name"} an adapter at run
	// time; both empty when the engine loads adapters only at start.
	LoadPath, UnloadPath string
	Select               Selector
}

// Server500 is what an HTTP 500 from an engine proves, for its breaker.
type Server500 int

const (
	// Unclear500: the engine may answer 500 to a request it cannot take
	// or fail with one; a 500 counts only when 500s repeat across
	// different requests (overload's rule). Generic's, and the zero value.
	Unclear500 Server500 = iota
	// Fault500: a 500 means the engine failed (vLLM, SGLang, TGI).
	Fault500
	// Client500: a 500 is the engine's answer to a request it could not
	// take, never its own failure, which shows otherwise: llama-server
	// answers 500 to every request its chat and completion paths cannot
	// parse or fit ("Only one completion choice is allowed", "input is
	// larger than the max context size"), while it fails by crashing (a
	// reset, then refused connections), hanging (timeouts) or loading
	// (503). Such 500s never count against a breaker, however many prompts
	// get one: a client with many prompts must not eject the instance
	// (issue 20, docs/operations.md).
	Client500
)

// RuntimeLoading reports whether adapters can be loaded and unloaded while
// the server runs.
func (a Adapters) RuntimeLoading() bool { return a.LoadPath != "" && a.UnloadPath != "" }

// Profile is what prefixrouter needs to know of one engine. Profiles are
// values: Lookup returns a copy, and the slices in it must not be
// modified.
type Profile struct {
	// Name is the engine's name in records; "" for Generic.
	Name string
	// Running, Waiting and KVCacheUsage are Prometheus gauge families on
	// /metrics: requests being processed, requests queued, and the share
	// (0..1) of the KV cache in use. Each lists alternative names, newest
	// first; the first one the server exports is read. The load is the sum
	// of every series of Running and Waiting (one series per data-parallel
	// rank or engine core).
	Running, Waiting, KVCacheUsage []string
	// Cached says where an answer reports the prompt tokens its prefix
	// cache served (router/usage.go reads them).
	Cached   Cached
	Adapters Adapters
	// Server500 is what an HTTP 500 from this engine proves (the other
	// 5xx follow it but 502-504; see ServerErrorIsEngineFault).
	Server500 Server500

	// Detection: the prefix of its metric names, the owned_by of its
	// /v1/models entries, its Server header ("" when it has none).
	metricPrefix, ownedBy, server string
}

// vllmAdapters is vLLM's adapter API: listed in /v1/models, loaded and
// unloaded at run time, selected by "model". Generic assumes it too.
var vllmAdapters = Adapters{List: ListModels, ListPath: "/v1/models",
	LoadPath: "/v1/load_lora_adapter", UnloadPath: "/v1/unload_lora_adapter", Select: ByModel}

// The profiles. docs/engines.md cites the source of every name.
var (
	vllm = Profile{
		Name:         VLLM,
		Running:      []string{"vllm:num_requests_running"},
		Waiting:      []string{"vllm:num_requests_waiting"},
		KVCacheUsage: []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
		Cached:       CachedUsage, // with --enable-prompt-tokens-details
		Adapters:     vllmAdapters,
		Server500:    Fault500,
		metricPrefix: "vllm:", ownedBy: "vllm",
	}
	sglang = Profile{
		Name:         SGLang,
		Running:      []string{"sglang:num_running_reqs"},
		Waiting:      []string{"sglang:num_queue_reqs"},
		KVCacheUsage: []string{"sglang:token_usage"},
		Cached:       CachedUsage, // with --enable-cache-report
		Adapters: Adapters{List: ListModels, ListPath: "/v1/models",
			LoadPath: "/load_lora_adapter", UnloadPath: "/unload_lora_adapter", Select: ByLoRAPath},
		Server500:    Fault500,
		metricPrefix: "sglang:", ownedBy: "sglang",
	}
	llamaCpp = Profile{
		Name:         LlamaCpp,
		Running:      []string{"llamacpp:requests_processing"},
		Waiting:      []string{"llamacpp:requests_deferred"},
		KVCacheUsage: []string{"llamacpp:kv_cache_usage_ratio"},
		Cached:       CachedUsage | CachedTimings, // later builds fill OpenAI's field too
		Adapters:     Adapters{List: ListIndexed, ListPath: "/lora-adapters", Select: ByIndex},
		Server500:    Client500, // examples/server/server.cpp at c392e50 (docs/engines.md)
		metricPrefix: "llamacpp:", ownedBy: "llamacpp", server: "llama.cpp",
	}
	tgi = Profile{
		Name:         TGI,
		Running:      []string{"tgi_batch_current_size"},
		Waiting:      []string{"tgi_queue_size"},
		Cached:       CachedUsage, // TGI reports none; OpenAI's field if it ever does
		Adapters:     Adapters{List: ListNone, Select: ByModel},
		Server500:    Fault500,
		metricPrefix: "tgi_",
	}
	// known lists the engine profiles in detection order.
	known = []Profile{vllm, sglang, llamaCpp, tgi}
)

// Generic is the profile of an instance whose engine is unknown (a record
// without "engine", a name this build does not know, a static fleet): it
// reads the load from whichever known engine's metrics the server exports,
// lists adapters the vLLM way, sends requests as written, and does not take
// a 500 alone as an engine failure: a client can provoke one from some
// engines, so the breaker counts an unknown engine's 500s only when they
// repeat across different requests (overload's rule, docs/operations.md).
var Generic = Profile{
	Name:     "",
	Cached:   CachedUsage | CachedTimings,
	Adapters: vllmAdapters,
}

// Profiles returns the known engines' profiles (Generic excluded), in
// detection order.
func Profiles() []Profile { return slices.Clone(known) }

// Lookup returns the profile of the named engine, Generic for "" or a name
// this build does not know (ok false then, unless name is "").
func Lookup(name string) (p Profile, ok bool) {
	if name == "" {
		return Generic, true
	}
	for _, p := range known {
		if p.Name == name {
			return p, true
		}
	}
	return Generic, false
}

// ValidateName checks a name a record or a flag gives: "" or 1..MaxNameLength
// of [a-z0-9._-]. A valid name need not be known (Lookup gives Generic):
// a newer agent's record stays readable by an older router.
func ValidateName(name string) error {
	if len(name) > MaxNameLength {
		return fmt.Errorf("engine: name %q is longer than %d characters", name, MaxNameLength)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("engine: name %q must be lowercase letters, digits, '.', '_' or '-'", name)
		}
	}
	return nil
}

// ServerErrorIsEngineFault reports whether an upstream answer with this
// status proves the instance failed, for the circuit breaker: 502, 503
// and 504 do (the engine or something in front of it could not serve), a
// status below 500 and 501 never do (the request's fault, or a feature the
// engine lacks), and 500 and the other 5xx do when Server500 is Fault500. An
// engine that answers 500 to malformed requests (llama-server) leaves that
// judgement to the caller: a 500 that repeats across different requests is
// the engine's, one that follows a request is the request's.
func (p Profile) ServerErrorIsEngineFault(status int) bool {
	switch {
	case status < 500 || status > 599 || status == 501:
		return false
	case status == 502 || status == 503 || status == 504:
		return true
	}
	return p.Server500 == Fault500
}

// LoadMetrics returns the alternative names of the running and waiting
// gauges to read, in order: the profile's own, or for Generic those of
// every known engine (a server exports one engine's).
func (p Profile) LoadMetrics() (running, waiting [][]string) {
	if p.Name != "" || len(p.Running) > 0 {
		return [][]string{p.Running}, [][]string{p.Waiting}
	}
	for _, k := range known {
		running = append(running, k.Running)
		waiting = append(waiting, k.Waiting)
	}
	return running, waiting
}

// CacheUsageMetrics returns the alternative names of the KV cache usage
// gauge: the profile's own, or for Generic those of every known engine.
func (p Profile) CacheUsageMetrics() []string {
	if p.Name != "" || len(p.KVCacheUsage) > 0 {
		return p.KVCacheUsage
	}
	var out []string
	for _, k := range known {
		out = append(out, k.KVCacheUsage...)
	}
	return out
}

// RequestField returns the top-level JSON member, `"name":value`, that
// makes this engine serve adapter (or the base model when adapter is
// ""), or nil when the request needs none: the "model" field already
// says it (ByModel), or no adapter is asked of an engine that then serves
// the base model anyway. index is the adapter's position in the server's
// list (ByIndex only); loaded says whether the server has any adapter
// loaded, which llama-server applies to every request that names none, so
// that a base-model request must switch them off.
func (p Profile) RequestField(adapter string, index int, loaded bool) []byte {
	switch p.Adapters.Select {
	case ByLoRAPath:
		if adapter == "" {
			return nil
		}
		name, _ := json.Marshal(adapter) // a string: cannot fail
		return append([]byte(`"lora_path":`), name...)
	case ByIndex:
		if adapter == "" {
			if !loaded {
				return nil
			}
			return []byte(`"lora":[]`)
		}
		b := append([]byte(`"lora":[{"id":`), strconv.Itoa(index)...)
		return append(b, `,"scale":1}]`...)
	}
	return nil
}

// Evidence is what a server shows of itself, for Detect.
type Evidence struct {
	// Metrics are the metric family names its /metrics exports (vLLM
	// exports them always; SGLang with --enable-metrics, llama-server with
	// --metrics).
	Metrics []string
	// OwnedBy are the owned_by values of its /v1/models entries.
	OwnedBy []string
	// Server is the Server header of its answers.
	Server string
}

// Detect names the engine e shows: the first known engine one of whose
// metric families e lists, else whose owned_by it lists, else whose
// Server header it carries. ok is false, and p Generic, when nothing
// matches.
func Detect(e Evidence) (p Profile, ok bool) {
	for _, k := range known {
		for _, m := range e.Metrics {
			if strings.HasPrefix(m, k.metricPrefix) {
				return k, true
			}
		}
	}
	for _, k := range known {
		if k.ownedBy != "" && slices.Contains(e.OwnedBy, k.ownedBy) {
			return k, true
		}
	}
	for _, k := range known {
		if k.server != "" && strings.EqualFold(strings.TrimSpace(e.Server), k.server) {
			return k, true
		}
	}
	return Generic, false
}

// AdapterName is the name under which an adapter that llama-server lists
// by file path is registered and requested: the file name without its
// directory and its .gguf extension ("/models/sql-lora.gguf" → "sql-lora").
func AdapterName(path string) string {
	if i := strings.LastIndexAny(path, `/\`); i >= 0 {
		path = path[i+1:]
	}
	return strings.TrimSuffix(path, ".gguf")
}
