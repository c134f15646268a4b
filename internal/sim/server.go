package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Options configures a Server. Every zero value means the documented
// default, so Options{} is a valid single-instance 8B simulator.
type Options struct {
	// ID names the instance in the X-Instance-Id response header.
	// Zero: "sim".
	ID string
	// BaseModel is the id of the served base model. Zero: "llama-3.1-8b".
	BaseModel string
	// Adapters are the LoRA adapter ids served on top of BaseModel; a
	// request naming one gets its own cache (the adapter is in the block
	// hash, as in vLLM). Change them later with SetAdapters, or over HTTP
	// with vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter.
	Adapters []string
	// MaxLoras caps the loaded adapters, as vLLM's --max-cpu-loras does: a
	// load beyond it evicts the least recently used adapter without
	// requests in flight. Zero: no cap.
	MaxLoras int
	// AdapterLoadTime is the simulated duration of a load. Zero:
	// DefaultAdapterLoadTime.
	AdapterLoadTime time.Duration
	// Profile is the name of a built-in Profile. Zero: "h200-llama8b".
	Profile string
	// KVCapacityTokens is the KV cache size. Zero: the profile's.
	KVCapacityTokens int
	// MaxRunningSeqs caps the running batch. Zero: the profile's (256).
	MaxRunningSeqs int
	// TokenBudget is the tokens one step may carry (chunked prefill).
	// Zero: the profile's (8192).
	TokenBudget int
	// TimeScale runs the simulation that many times faster than real time:
	// a step of simulated duration d sleeps d/TimeScale. Reported times
	// (metrics) are simulated. Zero: 1 (real time).
	TimeScale float64
	// DefaultMaxTokens is the output length of a request without
	// max_tokens. Zero: 16 (vLLM's completions default).
	DefaultMaxTokens int
	// Logger receives per-request debug lines. Nil: discard.
	Logger *slog.Logger
}

// Defaults of Options's zero values.
const (
	DefaultID        = "sim"
	DefaultBaseModel = "llama-3.1-8b"
	DefaultProfile   = ProfileH200Llama8B
	defaultMaxTokens = 16
	maxBodyBytes     = 64 << 20
)

// withDefaults validates c and fills its zero values; p is the profile.
func (c Options) withDefaults() (Options, Profile, error) {
	if c.ID == "" {
		c.ID = DefaultID
	}
	if c.BaseModel == "" {
		c.BaseModel = DefaultBaseModel
	}
	if c.Profile == "" {
		c.Profile = DefaultProfile
	}
	p, err := LookupProfile(c.Profile)
	if err != nil {
		return c, p, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	switch {
	case c.KVCapacityTokens < 0, c.MaxRunningSeqs < 0, c.TokenBudget < 0, c.DefaultMaxTokens < 0, c.MaxLoras < 0, c.AdapterLoadTime < 0:
		return c, p, fmt.Errorf("%w: negative size", ErrInvalidOptions)
	case c.TimeScale < 0 || math.IsNaN(c.TimeScale) || math.IsInf(c.TimeScale, 0):
		return c, p, fmt.Errorf("%w: time scale %v", ErrInvalidOptions, c.TimeScale)
	case c.KVCapacityTokens > 0 && c.KVCapacityTokens < BlockTokens:
		return c, p, fmt.Errorf("%w: KV capacity %d is less than one block", ErrInvalidOptions, c.KVCapacityTokens)
	}
	for _, a := range c.Adapters {
		if a == "" || a == c.BaseModel {
			return c, p, fmt.Errorf("%w: adapter id %q", ErrInvalidOptions, a)
		}
	}
	if c.KVCapacityTokens == 0 {
		c.KVCapacityTokens = p.KVCapacityTokens
	}
	if c.MaxRunningSeqs == 0 {
		c.MaxRunningSeqs = p.MaxRunningSeqs
	}
	if c.TokenBudget == 0 {
		c.TokenBudget = p.TokenBudget
	}
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.AdapterLoadTime == 0 {
		c.AdapterLoadTime = DefaultAdapterLoadTime
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = defaultMaxTokens
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Adapters = slices.Clone(c.Adapters)
	return c, p, nil
}

// Server is one simulated model-server instance: an http.Handler in front
// of an engine goroutine that owns the cache and the batch.
type Server struct {
	cfg     Options
	prof    Profile
	blocks  int
	m       *metrics
	mux     *http.ServeMux
	created int64
	// adapters is the loaded adapter set.
	adapters *adapters
	reqs     atomic.Uint64
	sessions sync.Map // open stateful sessions' ids

	in        chan engineMsg
	quit      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

var _ http.Handler = (*Server)(nil)

// New starts a simulator; Close stops it.
func New(cfg Options) (*Server, error) {
	cfg, p, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, prof: p, blocks: cfg.KVCapacityTokens / BlockTokens,
		m:       newMetrics(cfg.BaseModel, cfg.KVCapacityTokens),
		created: time.Now().Unix(),
		in:      make(chan engineMsg),
		quit:    make(chan struct{}),
	}
	s.adapters = newAdapters(cfg.Adapters, cfg.MaxLoras)
	s.m.reg.MustRegister(newLoRAInfo(s.adapters))
	eng := newEngine(&s.prof, cfg.KVCapacityTokens, cfg.MaxRunningSeqs, cfg.TokenBudget, s.m)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		eng.run(s.in, s.quit, cfg.TimeScale)
	}()

	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, kindChat) })
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, kindCompletion) })
	mux.HandleFunc("POST /invocations", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, kindAuto) })
	ok := func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }
	mux.HandleFunc("GET /ping", ok)
	mux.HandleFunc("GET /health", ok)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("POST /reset_prefix_cache", s.resetPrefixCache)
	mux.HandleFunc("POST /v1/load_lora_adapter", s.loadAdapter)
	mux.HandleFunc("POST /v1/unload_lora_adapter", s.unloadAdapter)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}))
	s.mux = mux
	cfg.Logger.Info("sim: started", "id", cfg.ID, "model", cfg.BaseModel, "profile", p.Name,
		"kv_capacity_tokens", cfg.KVCapacityTokens, "time_scale", cfg.TimeScale)
	return s, nil
}

// ServeHTTP serves the inference, health, model-list and metrics paths.
// Every response carries X-Instance-Id.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Instance-Id", s.cfg.ID)
	// A SageMaker container may answer custom attributes; the simulator
	// echoes the request's, so that tests see them pass both ways.
	if ca := r.Header.Get(headerCustomAttributes); ca != "" {
		w.Header().Set(headerCustomAttributes, ca)
	}
	s.mux.ServeHTTP(w, r)
}

// SageMaker's headers the simulator honours.
const (
	headerCustomAttributes = "X-Amzn-SageMaker-Custom-Attributes"
	headerSessionID        = "X-Amzn-SageMaker-Session-Id"
	headerNewSessionID     = "X-Amzn-SageMaker-New-Session-Id"
	headerClosedSessionID  = "X-Amzn-SageMaker-Closed-Session-Id"
	sessionTTL             = 20 * time.Minute
)

// session plays a SageMaker container with stateful sessions: the session
// id NEW_SESSION opens one (answered in X-Amzn-SageMaker-New-Session-Id with
// its expiry), a body with "requestType":"CLOSE" closes the one named (in
// X-Amzn-SageMaker-Closed-Session-Id), and an id this server did not issue,
// or closed, is refused with 400. It reports false when it answered.
func (s *Server) session(w http.ResponseWriter, r *http.Request, closing bool) bool {
	sid := r.Header.Get(headerSessionID)
	switch {
	case sid == "":
	case sid == "NEW_SESSION":
		id := fmt.Sprintf("%s-session-%d", s.cfg.ID, s.reqs.Add(1))
		s.sessions.Store(id, true)
		w.Header().Set(headerNewSessionID, id+"; Expires="+time.Now().Add(sessionTTL).UTC().Format(time.RFC3339))
	default:
		if _, ok := s.sessions.Load(sid); !ok {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("session %q is not open on instance %s", sid, s.cfg.ID))
			return false
		}
		if closing {
			s.sessions.Delete(sid)
			w.Header().Set(headerClosedSessionID, sid)
		}
	}
	return true
}

// Close stops the engine and waits for it. Requests in flight get 503.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.quit) })
	s.wg.Wait()
}

// SetAdapters replaces the served LoRA adapters. Cached blocks of removed
// adapters stay until evicted, like a vLLM that unloads an adapter.
func (s *Server) SetAdapters(adapters []string) {
	s.adapters.set(adapters)
}

// Adapters returns the loaded adapters, sorted.
func (s *Server) Adapters() []string { return s.adapters.list() }

// ResetPrefixCache drops every cached block that no running request
// holds, so the next requests start cold, and returns how many blocks it
// dropped; it serves POST /reset_prefix_cache. Counters are not reset
// (Prometheus counters only grow). The engine goroutine does it between
// two messages, so it needs no lock. After Close it returns ErrClosed.
func (s *Server) ResetPrefixCache() (int, error) {
	return s.reset(nil)
}

// reset asks the engine to drop the unpinned cache; gone, if non-nil,
// abandons the wait (the client left).
func (s *Server) reset(gone <-chan struct{}) (int, error) {
	reply := make(chan int, 1)
	select {
	case s.in <- engineMsg{reset: reply}:
	case <-s.quit:
		return 0, ErrClosed
	case <-gone:
		return 0, errGone
	}
	// The engine answers while handling the message, before it reads
	// the next one: this receive cannot block past that.
	n := <-reply
	s.cfg.Logger.Info("sim: prefix cache reset", "id", s.cfg.ID, "dropped_blocks", n)
	return n, nil
}

// resetPrefixCache serves vLLM's POST /reset_prefix_cache (a dev-mode
// endpoint in vLLM, VLLM_SERVER_DEV_MODE=1): 200 with an empty body.
func (s *Server) resetPrefixCache(w http.ResponseWriter, r *http.Request) {
	switch _, err := s.reset(r.Context().Done()); {
	case errors.Is(err, ErrClosed):
		writeError(w, http.StatusServiceUnavailable, "the server is shutting down")
	case err == nil:
		w.WriteHeader(http.StatusOK)
	}
}

// ID returns the instance id.
func (s *Server) ID() string { return s.cfg.ID }

// Config returns the configuration with its defaults filled in.
func (s *Server) Options() Options {
	c := s.cfg
	c.Adapters = s.adapters.list()
	return c
}

// Profile returns the cost model in use.
func (s *Server) Profile() Profile { return s.prof }

type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len,omitempty"`
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	base := s.cfg.BaseModel
	list := []modelCard{{ID: base, Object: "model", Created: s.created, OwnedBy: "vllm", Root: base, MaxModelLen: s.cfg.KVCapacityTokens}}
	for _, a := range s.adapters.list() {
		list = append(list, modelCard{ID: a, Object: "model", Created: s.created, OwnedBy: "vllm", Root: a, Parent: &base})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": list})
}

type kind int

const (
	kindAuto kind = iota // /invocations: decided by the body
	kindChat
	kindCompletion
	kindTGI
)

// apiRequest is the union of the request shapes the simulator reads.
type apiRequest struct {
	Model               string          `json:"model"`
	Messages            []apiMessage    `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	Inputs              *string         `json:"inputs"`
	Parameters          *tgiParameters  `json:"parameters"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	CacheSalt string `json:"cache_salt"`
	// RequestType "CLOSE" closes the stateful session the request names.
	RequestType string `json:"requestType"`
}

type tgiParameters struct {
	MaxNewTokens *int `json:"max_new_tokens"`
}

type apiMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// text returns the message content: a string, or the text of its parts.
func (m apiMessage) text() (string, error) {
	if len(m.Content) == 0 || string(m.Content) == "null" {
		return "", nil
	}
	var str string
	if err := json.Unmarshal(m.Content, &str); err == nil {
		return str, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(m.Content, &parts); err != nil {
		return "", errors.New("message content must be a string or a list of parts")
	}
	var out string
	for _, p := range parts {
		if p.Type == "text" {
			out += p.Text
		}
	}
	return out, nil
}

// apiError is an error answered to the client.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, a ...any) *apiError {
	return &apiError{http.StatusBadRequest, fmt.Sprintf(format, a...)}
}

// writeError answers vLLM's OpenAI error shape.
func writeError(w http.ResponseWriter, status int, msg string) {
	typ := map[int]string{400: "BadRequestError", 404: "NotFoundError", 413: "BadRequestError", 503: "ServiceUnavailableError"}[status]
	if typ == "" {
		typ = "InternalServerError"
	}
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": status}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// job is one parsed inference request.
type job struct {
	kind    kind
	model   string
	adapter string
	salt    string
	// closeSession: the body asks to close its stateful session.
	closeSession bool
	prompts      []string
	max          int
	stream       bool
	usage        bool // stream_options.include_usage
	seqs         []*seq
	notify       chan struct{}
	id           string
	received     time.Time
}

// parse reads the request. Once it has acquired an adapter it returns the
// job even with an error, so that the caller releases it.
func (s *Server) parse(r *http.Request, k kind) (*job, *apiError) {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, &apiError{http.StatusRequestEntityTooLarge, "request body too large"}
		}
		return nil, badRequest("reading the body: %v", err)
	}
	var req apiRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, badRequest("malformed JSON body: %v", err)
	}
	if k == kindAuto {
		switch {
		case req.Messages != nil:
			k = kindChat
		case req.Prompt != nil:
			k = kindCompletion
		case req.Inputs != nil:
			k = kindTGI
		default:
			return nil, badRequest("the body needs messages, prompt or inputs")
		}
	}
	j := &job{kind: k, model: req.Model, stream: req.Stream, notify: make(chan struct{}, 1), received: time.Now()}
	j.usage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	switch {
	case j.model == "" || j.model == s.cfg.BaseModel:
		j.model = s.cfg.BaseModel
	case s.adapters.acquire(j.model):
		j.adapter = j.model // released by generate
	default:
		return nil, &apiError{http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", req.Model)}
	}
	// cache_salt is vLLM's, and only it salts, as in vLLM: OpenAI's
	// prompt_cache_key is a routing hint, so two tenants on one instance
	// share blocks unless the router salts (--tenant-cache-salt).
	j.salt = req.CacheSalt
	j.closeSession = req.RequestType == "CLOSE"
	switch k {
	case kindChat:
		if len(req.Messages) == 0 {
			return j, badRequest("messages must not be empty")
		}
		msgs := make([]Message, len(req.Messages))
		for i, m := range req.Messages {
			t, err := m.text()
			if err != nil {
				return j, badRequest("messages[%d]: %v", i, err)
			}
			msgs[i] = Message{Role: m.Role, Content: t}
		}
		j.prompts = []string{RenderChat(msgs)}
	case kindCompletion:
		var one string
		if err := json.Unmarshal(req.Prompt, &one); err == nil {
			j.prompts = []string{one}
		} else if err := json.Unmarshal(req.Prompt, &j.prompts); err != nil || len(j.prompts) == 0 {
			return j, badRequest("prompt must be a string or a non-empty list of strings")
		}
	case kindTGI:
		j.prompts = []string{*req.Inputs}
	}
	j.max = s.cfg.DefaultMaxTokens
	switch {
	case req.MaxCompletionTokens != nil:
		j.max = *req.MaxCompletionTokens
	case req.MaxTokens != nil:
		j.max = *req.MaxTokens
	case req.Parameters != nil && req.Parameters.MaxNewTokens != nil:
		j.max = *req.Parameters.MaxNewTokens
	}
	if j.max < 1 {
		return j, badRequest("max_tokens must be at least 1, got %d", j.max)
	}
	for _, p := range j.prompts {
		sq := newSeq(j.adapter, j.salt, p, j.max, j.notify)
		if blocksFor(sq.prompt, j.max) > s.blocks {
			return j, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion).",
				s.blocks*BlockTokens, sq.prompt+j.max, sq.prompt, j.max)
		}
		j.seqs = append(j.seqs, sq)
	}
	j.id = fmt.Sprintf("%s-%s-%d", map[kind]string{kindChat: "chatcmpl", kindCompletion: "cmpl", kindTGI: "tgi"}[k], s.cfg.ID, s.reqs.Add(1))
	return j, nil
}

// generate serves one inference request of kind k.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, k kind) {
	j, aerr := s.parse(r, k)
	if j != nil && j.adapter != "" {
		defer s.adapters.release(j.adapter)
	}
	if aerr != nil {
		writeError(w, aerr.status, aerr.msg)
		return
	}
	if !s.session(w, r, j.closeSession) {
		return
	}
	select {
	case s.in <- engineMsg{seqs: j.seqs}:
	case <-s.quit:
		writeError(w, http.StatusServiceUnavailable, "the server is shutting down")
		return
	case <-r.Context().Done():
		return
	}
	var err error
	if j.stream {
		err = s.stream(w, r, j)
	} else {
		err = s.wait(r, j)
		if err == nil {
			s.respond(w, j)
		}
	}
	switch {
	case errors.Is(err, errClosed) && !j.stream:
		writeError(w, http.StatusServiceUnavailable, "the server is shutting down")
	case errors.Is(err, errGone):
		// The client left: abort so the request leaves the batch and
		// frees its blocks.
		select {
		case s.in <- engineMsg{seqs: j.seqs, abort: true}:
		case <-s.quit:
		}
	}
	s.cfg.Logger.Debug("sim: request", "id", j.id, "model", j.model, "prompt_tokens", j.promptTokens(),
		"cached_tokens", j.cachedTokens(), "completion_tokens", j.completionTokens(), "err", err)
}

var (
	errClosed = ErrClosed
	errGone   = errors.New("sim: client gone")
)

// next waits for progress on any of j's seqs.
func (s *Server) next(r *http.Request, j *job) error {
	select {
	case <-j.notify:
		return nil
	case <-s.quit:
		return errClosed
	case <-r.Context().Done():
		return errGone
	}
}

func (j *job) finished() bool {
	for _, sq := range j.seqs {
		if int(sq.generated.Load()) < sq.maxTokens {
			return false
		}
	}
	return true
}

func (j *job) promptTokens() (n int) {
	for _, sq := range j.seqs {
		n += sq.prompt
	}
	return n
}

func (j *job) cachedTokens() (n int) {
	for _, sq := range j.seqs {
		n += int(sq.cached.Load())
	}
	return n
}

func (j *job) completionTokens() (n int) {
	for _, sq := range j.seqs {
		n += int(sq.generated.Load())
	}
	return n
}

func (s *Server) wait(r *http.Request, j *job) error {
	for !j.finished() {
		if err := s.next(r, j); err != nil {
			return err
		}
	}
	return nil
}

// vocabulary of the generated filler: 4-character tokens, so generated
// text re-counts to the same number of tokens.
var vocabulary = []string{" the", " and", " for", " you", " are", " was", " not", " but", " all", " can", " one", " new"}

func tokenText(i int) string { return vocabulary[i%len(vocabulary)] }

func generatedText(n int) string {
	b := make([]byte, 0, 4*n)
	for i := range n {
		b = append(b, tokenText(i)...)
	}
	return string(b)
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (j *job) usageOf() *usage {
	u := &usage{PromptTokens: j.promptTokens(), CompletionTokens: j.completionTokens()}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	u.PromptTokensDetails.CachedTokens = j.cachedTokens()
	return u
}

func (s *Server) setUsageHeaders(w http.ResponseWriter, j *job) {
	h := w.Header()
	h.Set("X-Prompt-Tokens", strconv.Itoa(j.promptTokens()))
	h.Set("X-Cached-Tokens", strconv.Itoa(j.cachedTokens()))
}

// respond writes the non-streamed response of a finished job.
func (s *Server) respond(w http.ResponseWriter, j *job) {
	s.setUsageHeaders(w, j)
	created := j.received.Unix()
	switch j.kind {
	case kindChat:
		sq := j.seqs[0]
		writeJSON(w, http.StatusOK, map[string]any{
			"id": j.id, "object": "chat.completion", "created": created, "model": j.model,
			"choices": []map[string]any{{"index": 0, "message": map[string]any{"role": "assistant", "content": generatedText(sq.maxTokens)},
				"logprobs": nil, "finish_reason": "length"}},
			"usage": j.usageOf(),
		})
	case kindCompletion:
		choices := make([]map[string]any, len(j.seqs))
		for i, sq := range j.seqs {
			choices[i] = map[string]any{"index": i, "text": generatedText(sq.maxTokens), "logprobs": nil, "finish_reason": "length"}
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"id": j.id, "object": "text_completion", "created": created, "model": j.model, "choices": choices, "usage": j.usageOf(),
		})
	case kindTGI:
		// SageMaker's TGI container answers a list.
		writeJSON(w, http.StatusOK, []map[string]any{{"generated_text": generatedText(j.seqs[0].maxTokens)}})
	}
}

// stream writes SSE: one chunk per generated token as the engine emits
// it, then the usage chunk when asked for, then [DONE] (OpenAI shapes) or
// a final chunk with generated_text (TGI shape). Headers go out with the
// first token, so they can carry the cache hit.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, j *job) error {
	rc := http.NewResponseController(w)
	sent := make([]int, len(j.seqs))
	started := false
	created := j.received.Unix()
	write := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return errGone
		}
		return nil
	}
	for {
		if err := s.next(r, j); err != nil {
			if !started && errors.Is(err, errClosed) {
				writeError(w, http.StatusServiceUnavailable, "the server is shutting down")
			}
			return err
		}
		if !started {
			s.setUsageHeaders(w, j)
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		for i, sq := range j.seqs {
			gen := int(sq.generated.Load())
			for ; sent[i] < gen; sent[i]++ {
				t := sent[i]
				var finish any
				if t == sq.maxTokens-1 {
					finish = "length"
				}
				var chunk any
				switch j.kind {
				case kindChat:
					delta := map[string]any{"content": tokenText(t)}
					if t == 0 {
						delta["role"] = "assistant"
					}
					chunk = map[string]any{"id": j.id, "object": "chat.completion.chunk", "created": created, "model": j.model,
						"choices": []map[string]any{{"index": i, "delta": delta, "logprobs": nil, "finish_reason": finish}}}
				case kindCompletion:
					chunk = map[string]any{"id": j.id, "object": "text_completion", "created": created, "model": j.model,
						"choices": []map[string]any{{"index": i, "text": tokenText(t), "logprobs": nil, "finish_reason": finish}}}
				case kindTGI:
					c := map[string]any{"index": t, "token": map[string]any{"id": t % len(vocabulary), "text": tokenText(t), "logprob": 0, "special": false},
						"generated_text": nil, "details": nil}
					if finish != nil {
						c["generated_text"] = generatedText(sq.maxTokens)
						c["details"] = map[string]any{"finish_reason": "length", "generated_tokens": sq.maxTokens}
					}
					chunk = c
				}
				if err := write(chunk); err != nil {
					return err
				}
			}
		}
		if err := rc.Flush(); err != nil {
			return errGone
		}
		// Done when every token was sent: j.finished() may turn true
		// between the loads above and here, with a token not yet written.
		all := true
		for i, sq := range j.seqs {
			all = all && sent[i] >= sq.maxTokens
		}
		if all {
			break
		}
	}
	if j.kind == kindTGI {
		return nil
	}
	if j.usage {
		obj := map[kind]string{kindChat: "chat.completion.chunk", kindCompletion: "text_completion"}[j.kind]
		if err := write(map[string]any{"id": j.id, "object": obj, "created": created, "model": j.model,
			"choices": []any{}, "usage": j.usageOf()}); err != nil {
			return err
		}
	}
	if _, err := io.WriteString(w, "data: [DONE]\n\n"); err != nil {
		return errGone
	}
	if err := rc.Flush(); err != nil {
		return errGone
	}
	return nil
}
