package extproc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/extproc"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/lora"
	"github.com/prefixrouter/prefixrouter/router"
)

// This file backs docs/envoy.md's parity claim (issue 18): the HTTP data
// plane, the ext_proc endpoint picker over real gRPC and Explain run one
// routing sequence, so every request below gets the same instance, or the
// same error class, from all three.

// parityBackend answers like a SageMaker container: its id, the session
// header it received, whether the body carried a cache salt; a new
// session for NEW_SESSION.
func parityBackend(t *testing.T, id string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		sid := r.Header.Get("X-Amzn-Sagemaker-Session-Id")
		if sid == router.NewSession {
			w.Header().Set(router.HeaderNewSessionID, "sess-"+id+"; Expires=2030-01-01T00:00:00Z")
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "session": sid, "salted": bytes.Contains(body, []byte(`"cache_salt"`))})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// outcome is what a front end made of a request: the instance, or the
// error class (one of the router's sentinels); plus what the instance
// would receive (the session id, a salted body).
type outcome struct {
	instance string
	class    error
	session  string
	salted   bool
}

func (o outcome) String() string {
	if o.class != nil {
		return fmt.Sprintf("error class %q", o.class)
	}
	return fmt.Sprintf("instance %s (session %q, salted %v)", o.instance, o.session, o.salted)
}

// classOf maps the short code every router-made error carries
// (X-Prefixrouter-Error) to its class.
func classOf(code string) error {
	switch code {
	case "endpoint_not_found":
		return router.ErrUnknownEndpoint
	case "model_not_found":
		return lora.ErrUnknownModel
	case "model_not_ready":
		return lora.ErrModelNotReady
	case "no_instance_available", "fleet_not_loaded":
		return fleet.ErrNoInstance
	}
	return router.ErrInvalidRequest
}

// classes are the sentinels an Explain error is sorted by, most specific
// first.
var classes = []error{router.ErrUnknownEndpoint, lora.ErrUnknownModel, lora.ErrModelNotReady, fleet.ErrNoInstance, router.ErrInvalidRequest}

type parityRow struct {
	name   string
	path   string
	header map[string]string
	body   []byte
	subset []string // ext_proc and Explain only: the HTTP data plane has no subset hint
	// chunks, when set, is the size of the chunks ext_proc sends the body
	// in, declaring its length (the HTTP data plane gets it declared too).
	chunks int
	// head: the key is on the body's head, ext_proc picks before the
	// body's end (the chunks after the pick are passed on one by one).
	head bool
	// load, when set, runs while the request is in flight (it publishes
	// a snapshot in which a catalogued adapter is loaded).
	load func()
	// in lists the instances the request may go to (every ext_proc
	// candidate too); class is the error class instead.
	in    []string
	class error
	// session: the instance receives its own session id; salted: the
	// body it receives carries a cache salt (front ends that send).
	session, salted bool
}

// check tests one front end's outcome against the row.
func (row parityRow) check(t *testing.T, front string, o outcome) {
	t.Helper()
	if row.class != nil {
		if !errors.Is(o.class, row.class) {
			t.Fatalf("%s: got %v, want error class %q", front, o, row.class)
		}
		return
	}
	if o.class != nil || !slices.Contains(row.in, o.instance) {
		t.Fatalf("%s: got %v, want an instance of %v", front, o, row.in)
	}
	if row.session && o.session != "sess-"+o.instance {
		t.Fatalf("%s: the instance would receive session id %q, want its own", front, o.session)
	}
	if row.salted && front != "explain" && !o.salted {
		t.Fatalf("%s: the body the instance would receive has no cache_salt", front)
	}
}

func TestFrontEndsAgree(t *testing.T) {
	ids := []string{"i0", "i1", "i2", "i3", "i4", "i5"}
	var insts []fleet.Instance
	for i, id := range ids {
		in := fleet.Instance{ID: id, Addr: parityBackend(t, id), Labels: map[string]string{router.VariantLabel: "A"}}
		if i >= 3 {
			in.Labels[router.VariantLabel] = "B"
		}
		switch id {
		case "i0", "i1":
			in.Adapters = []string{"lora-x"}
		case "i3", "i4":
			in.Adapters = []string{"ic-1"} // an inference component's instances
		}
		insts = append(insts, in)
	}
	cfg := fleet.RoutingConfig{
		RoutingStrategy:          fleet.PrefixAware,
		PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: fleet.MinPrefixLength, ConcurrencyThreshold: 8},
		TenantCacheSalt:          true,
		ProductionVariants:       []fleet.ProductionVariant{{VariantName: "A", InitialVariantWeight: 1}, {VariantName: "B", InitialVariantWeight: 1}},
	}
	catalogue := []fleet.Adapter{{Name: "lora-y", Source: "s3://a/y"}, {Name: "lora-late", Source: "s3://a/late"}}
	snapshot := func(late bool) *fleet.Snapshot {
		in := slices.Clone(insts)
		if late {
			in[5].Adapters = []string{"lora-late"}
		}
		return fleet.NewSnapshot([]fleet.Endpoint{{Name: endpoint, Config: cfg, Instances: in, Adapters: catalogue}}, 0, 1, time.Now())
	}
	c := startClusterWith(t, insts, router.Options{DefaultEndpoint: endpoint, AdapterWait: time.Second, MaxBodyBytes: 64 << 10}, extproc.Options{MaxCandidates: 6})
	c.router.Update(snapshot(false))

	// A session opened over HTTP on one instance.
	sessionID, sessionOn := c.openSession(t)

	prompt := func(seed string) []byte { return []byte(strings.Repeat(seed+" shared system prompt. ", 80)) }
	chat := func(extra map[string]any, text string) []byte {
		m := map[string]any{"messages": []map[string]string{{"role": "user", "content": text}}}
		for k, v := range extra {
			m[k] = v
		}
		b, _ := json.Marshal(m)
		return b
	}
	// A prompt whose weighted variant is not the session's: the weights
	// split new traffic, a session stays on its instance whatever its key.
	sessionVariant := "A"
	if sessionOn >= "i3" {
		sessionVariant = "B"
	}
	var otherVariant []byte
	for i := 0; otherVariant == nil && i < 200; i++ {
		p := prompt(fmt.Sprintf("session-%d", i))
		if ex, err := c.router.Explain(context.Background(), router.PickRequest{Path: "/invocations", Body: p}); err == nil && ex.Variant != sessionVariant {
			otherVariant = p
		}
	}
	if otherVariant == nil {
		t.Fatal("no prompt of 200 weighted to the other variant")
	}
	sessionSet := []string{sessionOn}
	var sessionClass error
	if sessionOn != "i3" && sessionOn != "i4" {
		sessionSet, sessionClass = nil, router.ErrInvalidRequest
	}
	rows := []parityRow{
		{name: "invoke prompt", path: "/invocations", body: prompt("alpha"), in: ids},
		{name: "invoke tenant", path: "/invocations", header: map[string]string{"X-Amzn-SageMaker-Prefix-Aware-Id": "tenant-1"}, body: prompt("alpha"), in: ids},
		{name: "invoke bad tenant", path: "/invocations", header: map[string]string{"X-Amzn-SageMaker-Prefix-Aware-Id": strings.Repeat("t", 65)}, body: prompt("a"), class: router.ErrInvalidRequest},
		{name: "session", path: "/invocations", header: map[string]string{"X-Amzn-SageMaker-Session-Id": sessionID}, body: prompt("beta"), in: []string{sessionOn}, session: true},
		{name: "session, key weighted to another variant", path: "/invocations", header: map[string]string{"X-Amzn-SageMaker-Session-Id": sessionID}, body: otherVariant, in: []string{sessionOn}, session: true},
		{name: "session not issued", path: "/invocations", header: map[string]string{"X-Amzn-SageMaker-Session-Id": "not-a-session"}, body: prompt("beta"), class: router.ErrInvalidRequest},
		{name: "session and inference component", path: "/invocations", header: map[string]string{"X-Amzn-SageMaker-Session-Id": sessionID, "X-Amzn-SageMaker-Inference-Component": "ic-1"}, body: prompt("beta"),
			in: sessionSet, class: sessionClass, session: sessionClass == nil},
		{name: "variant A", path: "/invocations", header: map[string]string{"X-Amzn-SageMaker-Target-Variant": "A"}, body: prompt("gamma"), in: []string{"i0", "i1", "i2"}},
		{name: "variant B", path: "/invocations", header: map[string]string{"X-Amzn-SageMaker-Target-Variant": "B"}, body: prompt("gamma"), in: []string{"i3", "i4", "i5"}},
		{name: "unknown variant", path: "/invocations", header: map[string]string{"X-Amzn-SageMaker-Target-Variant": "C"}, body: prompt("gamma"), class: lora.ErrUnknownModel},
		{name: "inference component", path: "/invocations", header: map[string]string{"X-Amzn-SageMaker-Inference-Component": "ic-1"}, body: prompt("delta"), in: []string{"i3", "i4"}},
		{name: "inference component in variant", path: "/invocations", header: map[string]string{"X-Amzn-SageMaker-Inference-Component": "ic-1", "X-Amzn-SageMaker-Target-Variant": "B"}, body: prompt("delta"), in: []string{"i3", "i4"}},
		{name: "adapter loaded", path: "/v1/chat/completions", body: chat(map[string]any{"model": "lora-x"}, "hello there"), in: []string{"i0", "i1"}},
		{name: "adapter in the wrong variant", path: "/invocations", header: map[string]string{"X-Amzn-SageMaker-Target-Model": "lora-x", "X-Amzn-SageMaker-Target-Variant": "B"}, body: prompt("e"), class: lora.ErrUnknownModel},
		{name: "adapter catalogued, never loaded", path: "/v1/chat/completions", body: chat(map[string]any{"model": "lora-y"}, "hi"), class: lora.ErrModelNotReady},
		{name: "adapter catalogued, loaded during the wait", path: "/v1/chat/completions", body: chat(map[string]any{"model": "lora-late"}, "hi"),
			load: func() {
				// Publish once the request waits: it must be served
				// by the wait, not find the adapter loaded.
				for deadline := time.Now().Add(5 * time.Second); c.router.AdapterWaiting() == 0; time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						t.Error("no request waited for the adapter")
						break
					}
				}
				c.router.Update(snapshot(true))
			}, in: []string{"i5"}},
		// No instance declares its base model (labels.model): a name that is
		// no adapter is the base model, served by the whole fleet.
		{name: "model that is no adapter", path: "/v1/chat/completions", body: chat(map[string]any{"model": "llama"}, "hi"), in: ids},
		{name: "tenant with salt", path: "/v1/chat/completions", body: chat(map[string]any{"prompt_cache_key": "tenant-1"}, "salted prompt"), in: ids, salted: true},
		{name: "subset hint", path: "/invocations", body: prompt("zeta"), subset: []string{c.addrs["i2"], c.addrs["i4"]}, in: []string{"i2", "i4"}},
		{name: "empty subset", path: "/invocations", body: prompt("zeta"), subset: []string{}, class: fleet.ErrNoInstance},
		// Bodies that stream (issue 19): both front ends decide an OpenAI
		// key on a head that holds it, and hold the body whole only when
		// it does not; a salted body streams with its salt put in at the
		// end.
		{name: "tenant with salt, body in chunks, key on its head", path: "/v1/chat/completions", chunks: 4 << 10,
			body: longChat(`"prompt_cache_key":"tenant-1","model":"llama",`, ""), in: ids, salted: true, head: true},
		{name: "model after the messages, body in chunks", path: "/v1/chat/completions", chunks: 4 << 10,
			body: longChat("", `,"model":"lora-x"`), in: []string{"i0", "i1"}},
		{name: "oversized body in chunks", path: "/v1/chat/completions", chunks: 16 << 10,
			body: longChat("", strings.Repeat(" ", 30<<10)+`,"model":"lora-x"`), class: router.ErrInvalidRequest},
		{name: "oversized body", path: "/invocations", body: bytes.Repeat([]byte("x"), 65<<10), class: router.ErrInvalidRequest},
		{name: "malformed JSON", path: "/v1/chat/completions", body: []byte(`{"messages": [`), class: router.ErrInvalidRequest},
		{name: "unknown endpoint", path: "/endpoints/nope/invocations", body: prompt("eta"), class: router.ErrUnknownEndpoint},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			var got []outcome
			fronts := []struct {
				name string
				do   func() outcome
			}{
				{"http", func() outcome { return c.parityHTTP(t, row) }},
				{"ext_proc", func() outcome { return c.parityExtProc(t, row) }},
				{"explain", func() outcome { return c.parityExplain(t, row) }},
			}
			for _, f := range fronts {
				if f.name == "http" && row.subset != nil {
					continue // no subset hint on the HTTP data plane
				}
				if row.load != nil {
					c.router.Update(snapshot(false))
				}
				o := withLoad(row.load, f.do)
				row.check(t, f.name, o)
				got = append(got, o)
				t.Logf("%s: %v", f.name, o)
			}
			for _, o := range got[1:] {
				if o.instance != got[0].instance || !sameClass(o.class, got[0].class) {
					t.Fatalf("front ends disagree: %v", got)
				}
			}
		})
	}
}

// withLoad runs do while load (if any) publishes a snapshot, and waits for
// both: the request either waits for the snapshot or finds it.
func withLoad(load func(), do func() outcome) outcome {
	if load == nil {
		return do()
	}
	var wg sync.WaitGroup
	wg.Go(load)
	o := do()
	wg.Wait()
	return o
}

func sameClass(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	return errors.Is(a, b) || errors.Is(b, a)
}

// openSession opens a stateful session over HTTP and returns the client's
// session id and the instance that holds it.
func (c *cluster) openSession(t *testing.T) (id, instance string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.http.URL+"/invocations", strings.NewReader("open"))
	req.Header.Set("X-Amzn-SageMaker-Session-Id", router.NewSession)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	id, _, _ = strings.Cut(resp.Header.Get(router.HeaderNewSessionID), ";")
	if resp.StatusCode != http.StatusOK || id == "" {
		t.Fatalf("opening a session: %d, session id %q", resp.StatusCode, id)
	}
	return strings.TrimSpace(id), resp.Header.Get(router.HeaderInstance)
}

func (c *cluster) parityHTTP(t *testing.T, row parityRow) outcome {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.http.URL+row.path, bytes.NewReader(row.body))
	for k, v := range row.header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if code := resp.Header.Get(router.HeaderError); code != "" {
		return outcome{class: classOf(code)}
	}
	var b struct {
		ID      string `json:"id"`
		Session string `json:"session"`
		Salted  bool   `json:"salted"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&b); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTP: status %d, body error %v", resp.StatusCode, err)
	}
	if b.ID != resp.Header.Get(router.HeaderInstance) {
		t.Fatalf("HTTP: %s answered, header says %s", b.ID, resp.Header.Get(router.HeaderInstance))
	}
	return outcome{instance: b.ID, session: b.Session, salted: b.Salted}
}

func (c *cluster) parityExtProc(t *testing.T, row parityRow) outcome {
	t.Helper()
	e := c.open(t)
	h := map[string]string{}
	for k, v := range row.header {
		h[strings.ToLower(k)] = v
	}
	if row.chunks == 0 {
		e.headers(row.path, h, row.subset, false)
		e.body(row.body, true)
	} else {
		h["content-length"] = fmt.Sprint(len(row.body))
		e.headers(row.path, h, row.subset, false)
		for i := 0; i < len(row.body); i += row.chunks {
			end := min(i+row.chunks, len(row.body))
			e.body(row.body[i:end], end == len(row.body))
		}
	}
	r := e.recv()
	if ir := r.GetImmediateResponse(); ir != nil {
		for _, hv := range ir.GetHeaders().GetSetHeaders() {
			if strings.EqualFold(hv.GetHeader().GetKey(), router.HeaderError) {
				return outcome{class: classOf(string(hv.GetHeader().GetRawValue()))}
			}
		}
		t.Fatalf("ext_proc: immediate response %d without %s", ir.GetStatus().GetCode(), router.HeaderError)
	}
	hr := r.GetRequestHeaders()
	if hr == nil {
		t.Fatalf("ext_proc: want a pick, got %v", r)
	}
	var o outcome
	var dest []string
	for _, hv := range hr.GetResponse().GetHeaderMutation().GetSetHeaders() {
		switch k, v := hv.GetHeader().GetKey(), string(hv.GetHeader().GetRawValue()); k {
		case extproc.HeaderDestination:
			dest = strings.Split(v, ",")
		case "x-amzn-sagemaker-session-id":
			o.session = v
		}
	}
	if len(dest) == 0 {
		t.Fatal("ext_proc: no destination")
	}
	o.instance = c.ids[dest[0]]
	// The whole candidate list stays where the request may go.
	for _, d := range dest {
		if !slices.Contains(row.in, c.ids[d]) {
			t.Fatalf("ext_proc: candidate %s (%s) of %v is outside %v", d, c.ids[d], dest, row.in)
		}
	}
	// What the instance would receive: every chunk passed on.
	var body []byte
	answers := 0
	for eos := false; !eos; answers++ {
		var b []byte
		b, eos = e.bodyAnswer()
		body = append(body, b...)
	}
	if row.head && answers < 2 {
		t.Fatalf("ext_proc: the body was passed on in %d message: the pick waited for its end", answers)
	}
	if strings.HasSuffix(row.path, "completions") && !json.Valid(body) {
		t.Fatalf("ext_proc: the body passed on is not JSON: %.200s", body)
	}
	if !bytes.Equal(body, row.body) {
		var m map[string]json.RawMessage
		_ = json.Unmarshal(body, &m)
		o.salted = len(m["cache_salt"]) > 0 && bytes.HasSuffix(bytes.TrimSpace(body), []byte(`"}`))
	}
	return o
}

// longChat is a chat body of about 40 KiB: before, its other members
// ahead of the messages (a first message longer than the prefix, then a
// long one); after, those behind them.
func longChat(before, after string) []byte {
	return []byte(`{` + before + `"messages":[{"role":"system","content":"` + strings.Repeat("be brief. ", 2*fleet.MinPrefixLength/10) + `"},{"role":"user","content":"` +
		strings.Repeat("long prompt ", 40<<10/12) + `"}]` + after + `}`)
}

func (c *cluster) parityExplain(t *testing.T, row parityRow) outcome {
	t.Helper()
	h := http.Header{}
	for k, v := range row.header {
		h.Set(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ex, err := c.router.Explain(ctx, router.PickRequest{Path: row.path, Header: h, Body: row.body, Subset: row.subset})
	if err != nil {
		for _, cl := range classes {
			if errors.Is(err, cl) {
				return outcome{class: cl}
			}
		}
		t.Fatalf("Explain: unclassified error %v", err)
	}
	o := outcome{instance: ex.Instance}
	if ex.Decision == router.DecisionSession {
		o.session = "sess-" + ex.Instance // what the instance receives with that decision
	}
	for _, cand := range ex.Candidates {
		if !slices.Contains(row.in, cand) {
			t.Fatalf("explain: candidate %s of %v is outside %v", cand, ex.Candidates, row.in)
		}
	}
	return o
}
