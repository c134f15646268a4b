package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Headers the router and the model servers answer with.
const (
	HeaderInstance       = "X-Prefixrouter-Instance"
	HeaderDecision       = "X-Prefixrouter-Decision"
	HeaderServerInstance = "X-Instance-Id"
	HeaderPrefixAwareID  = "X-Amzn-SageMaker-Prefix-Aware-Id"
	HeaderTargetModel    = "X-Amzn-SageMaker-Target-Model"
)

// Error kinds of a failed request.
const (
	ErrKindTimeout   = "timeout"
	ErrKindCanceled  = "canceled"
	ErrKindConnect   = "connect"
	ErrKindTransport = "transport"
	ErrKindStream    = "stream_error"
	ErrKindTruncated = "stream_truncated"
	ErrKindNoContent = "no_content"
	ErrKindBadBody   = "bad_response"
)

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// chatBody is the OpenAI chat completion request, with vLLM's ignore_eos.
type chatBody struct {
	Model          string         `json:"model,omitempty"`
	Messages       []chatMessage  `json:"messages"`
	Stream         bool           `json:"stream"`
	StreamOptions  *streamOptions `json:"stream_options,omitempty"`
	MaxTokens      int            `json:"max_tokens"`
	IgnoreEOS      bool           `json:"ignore_eos"`
	PromptCacheKey string         `json:"prompt_cache_key,omitempty"`
	CacheSalt      string         `json:"cache_salt,omitempty"`
}

// Body returns the JSON body of r: an OpenAI streaming chat completion
// asking for the usage chunk. model is the base model's name (omitted when
// empty); an adapter replaces it. The tenant goes out as prompt_cache_key
// (the router's tenant id) and as vLLM's cache_salt in both API modes, so
// the model server keeps tenants' caches apart, which is what the oracle
// assumes (a router with --tenant-cache-salt replaces the salt with its own
// per-tenant one, which keeps them apart too); the invoke mode adds the
// SageMaker header for the router.
func (r Request) Body(model string) ([]byte, error) { return r.body(model, true) }

// body is Body, streamed or not (a non-streamed answer carries its usage
// in the one JSON object; its TTFT is its end-to-end time).
func (r Request) body(model string, stream bool) ([]byte, error) {
	b := chatBody{
		Model:          model,
		Stream:         stream,
		MaxTokens:      r.MaxTokens,
		IgnoreEOS:      true,
		PromptCacheKey: r.Tenant,
		CacheSalt:      r.Tenant,
	}
	if stream {
		b.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	if r.Adapter != "" {
		b.Model = r.Adapter
	}
	b.Messages = make([]chatMessage, len(r.Messages))
	for i, m := range r.Messages {
		b.Messages[i] = chatMessage{Role: m.Role, Content: m.Content}
	}
	return json.Marshal(b)
}

// outcome is what one request measured.
type outcome struct {
	sent         time.Time
	ttft, e2e    time.Duration
	errKind      string
	errMsg       string
	instance     string
	decision     string
	promptTokens int
	cachedTokens int
	outputTokens int
	hasUsage     bool
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type chunk struct {
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Message *struct {
			Content string `json:"content"`
		} `json:"message"`
		Text string `json:"text"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
	// Timings is llama.cpp's llama-server's: prompt_n is the prompt
	// tokens it evaluated, cache_n (later builds) those its cache served.
	Timings *timings        `json:"timings"`
	Error   json.RawMessage `json:"error"`
}

type timings struct {
	PromptN *int `json:"prompt_n"`
	CacheN  *int `json:"cache_n"`
}

func (c *chunk) content() string {
	var s strings.Builder
	for _, ch := range c.Choices {
		s.WriteString(ch.Delta.Content)
		s.WriteString(ch.Text)
		if ch.Message != nil {
			s.WriteString(ch.Message.Content)
		}
	}
	return s.String()
}

// takeUsage reads the token counts of an answer: OpenAI's usage, with the
// cached prompt tokens from usage.prompt_tokens_details, or, when an
// engine reports them only in llama.cpp's timings, cache_n or else the
// prompt tokens minus those evaluated (prompt_n).
func (o *outcome) takeUsage(u *usage, t *timings) {
	if u == nil {
		return
	}
	o.hasUsage = true
	o.promptTokens = u.PromptTokens
	o.outputTokens = u.CompletionTokens
	switch {
	case u.PromptTokensDetails != nil:
		o.cachedTokens = u.PromptTokensDetails.CachedTokens
	case t != nil && t.CacheN != nil:
		o.cachedTokens = *t.CacheN
	case t != nil && t.PromptN != nil:
		o.cachedTokens = max(u.PromptTokens-*t.PromptN, 0)
	}
}

// endpointURL is where a request goes for the API mode.
func endpointURL(base, api, endpoint string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return "", fmt.Errorf("bench: bad target URL %q", base)
	}
	var path string
	switch {
	case api == APIInvoke && endpoint != "":
		path = "/endpoints/" + url.PathEscape(endpoint) + "/invocations"
	case api == APIInvoke:
		path = "/invocations"
	case endpoint != "":
		path = "/endpoints/" + url.PathEscape(endpoint) + "/openai/v1/chat/completions"
	default:
		path = "/v1/chat/completions"
	}
	return strings.TrimRight(base, "/") + path, nil
}

// do sends one request and reads its whole response. parent is the run's
// context: its cancellation is "canceled", the per-request deadline
// "timeout".
func do(parent context.Context, hc *http.Client, target, api string, timeout time.Duration, r Request, body []byte) (o outcome) {
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	defer func() {
		if o.errKind != "" && o.errKind != ErrKindCanceled && parent.Err() != nil {
			o.errKind = ErrKindCanceled
		} else if o.errKind != "" && ctx.Err() == context.DeadlineExceeded && parent.Err() == nil {
			o.errKind = ErrKindTimeout
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		o.errKind, o.errMsg = ErrKindTransport, err.Error()
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream, application/json")
	if api == APIInvoke {
		if r.Tenant != "" {
			req.Header.Set(HeaderPrefixAwareID, r.Tenant)
		}
		if r.Adapter != "" {
			req.Header.Set(HeaderTargetModel, r.Adapter)
		}
	}
	o.sent = time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		o.e2e = time.Since(o.sent)
		o.errKind, o.errMsg = classifyTransport(err), err.Error()
		return o
	}
	defer resp.Body.Close()
	o.instance = resp.Header.Get(HeaderInstance)
	if o.instance == "" {
		o.instance = resp.Header.Get(HeaderServerInstance)
	}
	o.decision = resp.Header.Get(HeaderDecision)
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		o.e2e = time.Since(o.sent)
		o.errKind, o.errMsg = fmt.Sprintf("http_%d", resp.StatusCode), strings.TrimSpace(string(msg))
		return o
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	head, _ := br.Peek(5)
	if strings.Contains(resp.Header.Get("Content-Type"), "text/event-stream") || string(head) == "data:" {
		readSSE(br, &o)
	} else {
		readJSON(br, &o)
	}
	o.e2e = time.Since(o.sent)
	if o.errKind == "" && o.ttft == 0 {
		o.errKind, o.errMsg = ErrKindNoContent, "no content token in the response"
	}
	return o
}

func readSSE(br *bufio.Reader, o *outcome) {
	chunks := 0
	for {
		line, err := br.ReadString('\n')
		line = strings.TrimRight(line, "\r\n")
		if data, ok := strings.CutPrefix(line, "data:"); ok {
			data = strings.TrimSpace(data)
			if data == "[DONE]" {
				if o.outputTokens == 0 {
					o.outputTokens = chunks
				}
				return
			}
			var c chunk
			if jerr := json.Unmarshal([]byte(data), &c); jerr != nil {
				o.errKind, o.errMsg = ErrKindBadBody, jerr.Error()
				return
			}
			if len(c.Error) > 0 && string(c.Error) != "null" {
				o.errKind, o.errMsg = ErrKindStream, string(c.Error)
				return
			}
			if c.content() != "" {
				chunks++
				if o.ttft == 0 {
					o.ttft = time.Since(o.sent)
				}
			}
			o.takeUsage(c.Usage, c.Timings)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				o.errKind, o.errMsg = ErrKindTruncated, "stream ended without [DONE]"
			} else {
				o.errKind, o.errMsg = classifyTransport(err), err.Error()
			}
			return
		}
	}
}

// readJSON reads a non-streamed completion: the first token is the whole
// body, so TTFT equals the end-to-end latency.
func readJSON(br *bufio.Reader, o *outcome) {
	var c chunk
	if err := json.NewDecoder(br).Decode(&c); err != nil {
		o.errKind, o.errMsg = classifyTransport(err), err.Error()
		if o.errKind == ErrKindTransport {
			o.errKind = ErrKindBadBody
		}
		return
	}
	if len(c.Error) > 0 && string(c.Error) != "null" {
		o.errKind, o.errMsg = ErrKindStream, string(c.Error)
		return
	}
	if c.content() != "" {
		o.ttft = time.Since(o.sent)
	}
	o.takeUsage(c.Usage, c.Timings)
}

func classifyTransport(err error) string {
	switch {
	case errors.Is(err, context.Canceled):
		return ErrKindCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return ErrKindTimeout
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return ErrKindConnect
	}
	return ErrKindTransport
}
