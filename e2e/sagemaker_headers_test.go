package e2e

import (
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sagemakerruntime"
	smtypes "github.com/aws/aws-sdk-go-v2/service/sagemakerruntime/types"

	"github.com/prefixrouter/prefixrouter/internal/sim"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// TestSageMakerSDKHeaders: custom attributes pass both ways; an inference
// component routes within its instances as an adapter does; a target
// variant within its variant; every answer names the variant.
func TestSageMakerSDKHeaders(t *testing.T) {
	f := startSims(t, 3, sim.Options{})
	insts := f.insts
	// Two instances host inference component ic-llama, one ic-other, which
	// is also the canary variant.
	insts[0].Labels = map[string]string{"model": "ic-llama"}
	insts[1].Labels = map[string]string{"model": "ic-llama"}
	insts[2].Labels = map[string]string{"model": "ic-other", router.VariantLabel: "canary"}
	rep := startStatic(t, insts, nil)
	rec := newRecorder(t)
	sm := newSageMaker(rep.URL(), rec.client())
	ctx := t.Context()

	out, err := sm.InvokeEndpoint(ctx, &sagemakerruntime.InvokeEndpointInput{EndpointName: aws.String(ep), Body: tgiBody("attrs", 1, false),
		InferenceComponentName: aws.String("ic-llama"), CustomAttributes: aws.String("trace=abc,tenant=x")})
	if err != nil || aws.ToString(out.CustomAttributes) != "trace=abc,tenant=x" {
		t.Fatalf("custom attributes: %q, %v", aws.ToString(out.CustomAttributes), err)
	}
	for i := range 30 {
		body := tgiBody("prompt number "+itoa(i)+" "+strings.Repeat("x", i), 1, false)
		for ic, allowed := range map[string]string{"ic-llama": "sim-a sim-b", "ic-other": "sim-c"} {
			out, err := sm.InvokeEndpoint(ctx, &sagemakerruntime.InvokeEndpointInput{EndpointName: aws.String(ep), Body: body, InferenceComponentName: aws.String(ic)})
			if err != nil {
				t.Fatal(err)
			}
			got := rec.last().Get(router.HeaderInstance)
			if !strings.Contains(allowed, got) {
				t.Fatalf("component %s answered by %s, want one of %s", ic, got, allowed)
			}
			want := router.DefaultVariant
			if got == "sim-c" {
				want = "canary"
			}
			if aws.ToString(out.InvokedProductionVariant) != want {
				t.Fatalf("instance %s: InvokedProductionVariant %q, want %q", got, aws.ToString(out.InvokedProductionVariant), want)
			}
		}
		out, err := sm.InvokeEndpoint(ctx, &sagemakerruntime.InvokeEndpointInput{EndpointName: aws.String(ep), Body: body, TargetVariant: aws.String("canary")})
		if err != nil || rec.last().Get(router.HeaderInstance) != "sim-c" || aws.ToString(out.InvokedProductionVariant) != "canary" {
			t.Fatalf("target variant canary: %s %q, %v", rec.last().Get(router.HeaderInstance), aws.ToString(out.InvokedProductionVariant), err)
		}
	}
	var ve *smtypes.ValidationError
	for _, in := range []*sagemakerruntime.InvokeEndpointInput{
		{EndpointName: aws.String(ep), Body: tgiBody("x", 1, false), InferenceComponentName: aws.String("ic-nope")},
		{EndpointName: aws.String(ep), Body: tgiBody("x", 1, false), TargetVariant: aws.String("no-such-variant")},
	} {
		if _, err := sm.InvokeEndpoint(ctx, in); !errors.As(err, &ve) {
			t.Fatalf("%v / %v: %T %v, want *types.ValidationError", aws.ToString(in.InferenceComponentName), aws.ToString(in.TargetVariant), err, err)
		}
	}
}

// TestSageMakerSDKSessions: a session opened through one replica stays on
// its instance through every replica, closes as SageMaker's do, and an id
// the router did not issue is a ValidationError.
func TestSageMakerSDKSessions(t *testing.T) {
	f := startSims(t, 3, sim.Options{})
	// Both replicas have the endpoint's session key (--session-key-file).
	key := func(o *replica.Options) { o.Router.SessionKey = []byte("0123456789abcdef0123456789abcdef") }
	reps := []string{startStatic(t, f.insts, key).URL(), startStatic(t, f.insts, key).URL()}
	rec := newRecorder(t)
	clients := []*sagemakerruntime.Client{newSageMaker(reps[0], rec.client()), newSageMaker(reps[1], rec.client())}
	ctx := t.Context()

	out, err := clients[0].InvokeEndpoint(ctx, &sagemakerruntime.InvokeEndpointInput{EndpointName: aws.String(ep), Body: tgiBody("open", 1, false), SessionId: aws.String(router.NewSession)})
	if err != nil {
		t.Fatal(err)
	}
	sid, expires, _ := strings.Cut(aws.ToString(out.NewSessionId), ";")
	home := rec.last().Get(router.HeaderInstance)
	if sid == "" || !strings.Contains(expires, "Expires=") || home == "" {
		t.Fatalf("NewSessionId %q from %q", aws.ToString(out.NewSessionId), home)
	}
	for i := range 12 {
		body := tgiBody("turn "+itoa(i)+strings.Repeat(" different text", i), 1, false)
		if _, err := clients[i%2].InvokeEndpoint(ctx, &sagemakerruntime.InvokeEndpointInput{EndpointName: aws.String(ep), Body: body, SessionId: aws.String(sid)}); err != nil {
			t.Fatalf("turn %d through replica %d: %v", i, i%2, err)
		}
		if got := rec.last(); got.Get(router.HeaderInstance) != home || got.Get(router.HeaderDecision) != router.DecisionSession {
			t.Fatalf("turn %d through replica %d: instance %s (%s), want the session's %s", i, i%2, got.Get(router.HeaderInstance), got.Get(router.HeaderDecision), home)
		}
	}
	out, err = clients[1].InvokeEndpoint(ctx, &sagemakerruntime.InvokeEndpointInput{EndpointName: aws.String(ep),
		Body: []byte(`{"inputs":"bye","requestType":"CLOSE","parameters":{"max_new_tokens":1}}`), SessionId: aws.String(sid)})
	if err != nil || aws.ToString(out.ClosedSessionId) != sid {
		t.Fatalf("close: ClosedSessionId %q, want %q; %v", aws.ToString(out.ClosedSessionId), sid, err)
	}
	// The container refuses a closed session: its 400 reaches the client
	// as ModelError.
	var me *smtypes.ModelError
	if _, err := clients[0].InvokeEndpoint(ctx, &sagemakerruntime.InvokeEndpointInput{EndpointName: aws.String(ep), Body: tgiBody("again", 1, false), SessionId: aws.String(sid)}); !errors.As(err, &me) || aws.ToInt32(me.OriginalStatusCode) != 400 {
		t.Fatalf("closed session: %T %v, want *types.ModelError 400", err, err)
	}
	var ve *smtypes.ValidationError
	for _, bad := range []string{"not-a-session", "bm8tc3VjaC1pbnN0YW5jZQ.s1"} { // the second names instance "no-such-instance"
		if _, err := clients[0].InvokeEndpoint(ctx, &sagemakerruntime.InvokeEndpointInput{EndpointName: aws.String(ep), Body: tgiBody("x", 1, false), SessionId: aws.String(bad)}); !errors.As(err, &ve) {
			t.Fatalf("session id %q: %T %v, want *types.ValidationError", bad, err, err)
		}
	}
}
