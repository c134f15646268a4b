package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sagemakerruntime"
	smtypes "github.com/aws/aws-sdk-go-v2/service/sagemakerruntime/types"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/sim"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// This file is issue 8's acceptance with the official clients: AWS's
// SageMaker Runtime SDK and OpenAI's Go SDK, pointed at a replica started
// as `serve` starts one (replica.Start), over real HTTP to modelsim
// instances.

// simFleet is n simulated model servers on loopback HTTP.
type simFleet struct {
	sims  []*sim.Server
	srvs  []*httptest.Server
	insts []fleet.Instance
}

func startSims(t testing.TB, n int, cfg sim.Options) *simFleet {
	t.Helper()
	f := &simFleet{}
	for i := range n {
		c := cfg
		c.ID = "sim-" + string(rune('a'+i))
		if c.TimeScale == 0 {
			c.TimeScale = 1000 // tests wait for no simulated GPU
		}
		s, err := sim.New(c)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(s)
		t.Cleanup(func() { srv.Close(); s.Close() })
		f.sims = append(f.sims, s)
		f.srvs = append(f.srvs, srv)
		f.insts = append(f.insts, fleet.Instance{ID: c.ID, Addr: srv.URL})
	}
	return f
}

// startStatic starts a replica over a static fleet, as
// `serve --static-instances` does, with edit applied to its options.
func startStatic(t testing.TB, insts []fleet.Instance, edit func(*replica.Options)) *replica.Replica {
	t.Helper()
	o := replica.Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Logger: quiet,
		Router: router.Options{DefaultEndpoint: ep},
		Static: insts,
	}
	if edit != nil {
		edit(&o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := replica.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rep.Close(context.Background()) })
	return rep
}

// recorder is an HTTP client transport that keeps the router's response
// headers by request, so tests can see which instance answered behind an
// SDK that hides them.
type recorder struct {
	tr *http.Transport
	mu sync.Mutex
	h  []http.Header // guarded by mu
}

func newRecorder(t testing.TB) *recorder {
	r := &recorder{tr: &http.Transport{}}
	t.Cleanup(r.tr.CloseIdleConnections)
	return r
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.tr.RoundTrip(req)
	if err == nil {
		r.mu.Lock()
		r.h = append(r.h, resp.Header.Clone())
		r.mu.Unlock()
	}
	return resp, err
}

// last returns the headers of the last response.
func (r *recorder) last() http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.h) == 0 {
		return http.Header{}
	}
	return r.h[len(r.h)-1]
}

func (r *recorder) client() *http.Client { return &http.Client{Transport: r} }

// newSageMaker is the AWS SDK client pointed at base with static
// credentials and no retries (each call is one request).
func newSageMaker(base string, hc *http.Client) *sagemakerruntime.Client {
	return sagemakerruntime.New(sagemakerruntime.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(base),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "AKIDTEST", SecretAccessKey: "secret", Source: "test"}, nil
		}),
		HTTPClient:       hc,
		RetryMaxAttempts: 1,
	})
}

// tgiBody is a TGI-shaped request: its streamed answer carries no request
// id or timestamp, so two calls give identical bytes.
func tgiBody(prompt string, tokens int, stream bool) []byte {
	s := ""
	if stream {
		s = `,"stream":true`
	}
	return []byte(`{"inputs":"` + prompt + `","parameters":{"max_new_tokens":` + itoa(tokens) + `}` + s + `}`)
}

func itoa(n int) string {
	var b []byte
	if n == 0 {
		return "0"
	}
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

func TestSageMakerSDKInvoke(t *testing.T) {
	f := startSims(t, 3, sim.Options{})
	rep := startStatic(t, f.insts, nil)
	rec := newRecorder(t)
	sm := newSageMaker(rep.URL(), rec.client())
	ctx := t.Context()
	body := tgiBody(strings.Repeat("a shared system prompt ", 20), 4, false)
	for _, tenant := range []*string{nil, aws.String("tenant-1")} {
		out, err := sm.InvokeEndpoint(ctx, &sagemakerruntime.InvokeEndpointInput{
			EndpointName: aws.String(ep), Body: body, ContentType: aws.String("application/json"), PrefixAwareId: tenant,
		})
		if err != nil {
			t.Fatalf("tenant %v: %v", aws.ToString(tenant), err)
		}
		if !bytes.Contains(out.Body, []byte("generated_text")) || aws.ToString(out.ContentType) != "application/json" {
			t.Fatalf("tenant %v: %q %q", aws.ToString(tenant), out.Body, aws.ToString(out.ContentType))
		}
		if rec.last().Get(router.HeaderInstance) == "" {
			t.Fatal("no instance header")
		}
	}
}

func TestSageMakerSDKErrors(t *testing.T) {
	f := startSims(t, 3, sim.Options{})
	rep := startStatic(t, f.insts, nil)
	sm := newSageMaker(rep.URL(), newRecorder(t).client())
	ctx := t.Context()
	body := tgiBody("hello", 2, false)

	var ve *smtypes.ValidationError
	_, err := sm.InvokeEndpoint(ctx, &sagemakerruntime.InvokeEndpointInput{EndpointName: aws.String(ep), Body: body, PrefixAwareId: aws.String(strings.Repeat("x", 65))})
	if !errors.As(err, &ve) || !strings.Contains(aws.ToString(ve.Message), "Prefix-Aware-Id") {
		t.Fatalf("65-character PrefixAwareId: %T %v, want *types.ValidationError", err, err)
	}
	_, err = sm.InvokeEndpoint(ctx, &sagemakerruntime.InvokeEndpointInput{EndpointName: aws.String("no-such-endpoint"), Body: body})
	if !errors.As(err, &ve) || !strings.Contains(aws.ToString(ve.Message), "no-such-endpoint") {
		t.Fatalf("unknown endpoint: %T %v, want *types.ValidationError", err, err)
	}
	_, err = sm.InvokeEndpointWithResponseStream(ctx, &sagemakerruntime.InvokeEndpointWithResponseStreamInput{EndpointName: aws.String("no-such-endpoint"), Body: body})
	if !errors.As(err, &ve) {
		t.Fatalf("unknown endpoint, streamed: %T %v, want *types.ValidationError", err, err)
	}
	// The simulator answers 400 to max_new_tokens 0.
	var me *smtypes.ModelError
	_, err = sm.InvokeEndpoint(ctx, &sagemakerruntime.InvokeEndpointInput{EndpointName: aws.String(ep), Body: tgiBody("hello", 0, false)})
	if !errors.As(err, &me) || aws.ToInt32(me.OriginalStatusCode) != 400 || !strings.Contains(aws.ToString(me.OriginalMessage), "max_tokens") {
		t.Fatalf("upstream 400: %T %v, want *types.ModelError with OriginalStatusCode 400", err, err)
	}
	_, err = sm.InvokeEndpointWithResponseStream(ctx, &sagemakerruntime.InvokeEndpointWithResponseStreamInput{EndpointName: aws.String(ep), Body: tgiBody("hello", 0, true)})
	if !errors.As(err, &me) || aws.ToInt32(me.OriginalStatusCode) != 400 {
		t.Fatalf("upstream 400, streamed: %T %v, want *types.ModelError", err, err)
	}
}

// readStream reads every event of a response stream: the concatenated
// PayloadPart bytes, the number of parts and the stream's error.
func readStream(out *sagemakerruntime.InvokeEndpointWithResponseStreamOutput, onPart func(int)) ([]byte, int, error) {
	st := out.GetStream()
	defer st.Close()
	var got []byte
	parts := 0
	for ev := range st.Events() {
		p, ok := ev.(*smtypes.ResponseStreamMemberPayloadPart)
		if !ok {
			return got, parts, errors.New("an event that is not a PayloadPart")
		}
		got = append(got, p.Value.Bytes...)
		parts++
		if onPart != nil {
			onPart(parts)
		}
	}
	return got, parts, st.Err()
}

func TestSageMakerSDKResponseStream(t *testing.T) {
	// Real time, so that the instance flushes one token per decode step.
	f := startSims(t, 3, sim.Options{TimeScale: 1})
	rep := startStatic(t, f.insts, nil)
	rec := newRecorder(t)
	sm := newSageMaker(rep.URL(), rec.client())
	ctx := t.Context()
	body := tgiBody(strings.Repeat("stream me ", 30), 12, true)

	out, err := sm.InvokeEndpointWithResponseStream(ctx, &sagemakerruntime.InvokeEndpointWithResponseStreamInput{
		EndpointName: aws.String(ep), Body: body, ContentType: aws.String("application/json"), PrefixAwareId: aws.String("t1"),
	})
	if err != nil {
		t.Fatal(err)
	}
	got, parts, err := readStream(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	if aws.ToString(out.ContentType) != "text/event-stream" {
		t.Fatalf("X-Amzn-SageMaker-Content-Type %q", aws.ToString(out.ContentType))
	}
	// The same request straight to the instance that answered.
	id := rec.last().Get(router.HeaderInstance)
	var direct []byte
	for i, in := range f.insts {
		if in.ID == id {
			resp, err := f.srvs[i].Client().Post(in.Addr+"/invocations", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			direct, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
	}
	if len(direct) == 0 || !bytes.Equal(got, direct) {
		t.Fatalf("instance %q: %d parts, %q; direct call %q", id, parts, got, direct)
	}
	if parts < 2 {
		t.Fatalf("%d PayloadPart events: the stream was not passed on chunk by chunk", parts)
	}
	t.Logf("%d PayloadPart events, %d bytes, equal to a direct call's", parts, len(got))
}

func TestSageMakerSDKModelKilledMidStream(t *testing.T) {
	// Real time: the stream lasts long enough to be cut.
	f := startSims(t, 1, sim.Options{TimeScale: 1})
	rep := startStatic(t, f.insts, nil)
	sm := newSageMaker(rep.URL(), newRecorder(t).client())
	out, err := sm.InvokeEndpointWithResponseStream(t.Context(), &sagemakerruntime.InvokeEndpointWithResponseStreamInput{
		EndpointName: aws.String(ep), Body: tgiBody("kill me", 5000, true),
	})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	_, parts, err := readStream(out, func(int) {
		// The model server dies once the first part reached the client.
		once.Do(f.srvs[0].CloseClientConnections)
	})
	var mse *smtypes.ModelStreamError
	if !errors.As(err, &mse) || aws.ToString(mse.ErrorCode_) != "StreamBroken" {
		t.Fatalf("after %d parts: %T %v, want *types.ModelStreamError StreamBroken", parts, err, err)
	}
	t.Logf("after %d parts: %v", parts, err)
}
