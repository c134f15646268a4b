package e2e

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sagemakerruntime"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/prefixrouter/prefixrouter/internal/sim"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// TestAPIKeysWithSDKs: with data-plane API keys on, the official clients
// work the documented way. OpenAI's SDK sends its api_key as
// "Authorization: Bearer"; AWS's SDK signs Authorization with SigV4, so the
// key goes in X-Prefixrouter-Api-Key, added by a smithy middleware
// (smithyhttp.AddHeaderValue). Without the key each SDK raises its typed
// 401.
func TestAPIKeysWithSDKs(t *testing.T) {
	const key = "sk-e2e-0123456789abcdef"
	keys, err := router.ParseAPIKeys([]byte(key + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	f := startSims(t, 2, sim.Options{})
	rep := startStatic(t, f.insts, func(o *replica.Options) { o.Router.APIKeys = keys })
	hc := newRecorder(t).client()
	ctx := t.Context()

	// OpenAI's SDK: the key is its api_key.
	model := sim.DefaultBaseModel
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}
	oa := openai.NewClient(option.WithBaseURL(rep.URL()+"/v1/"), option.WithAPIKey(key), option.WithHTTPClient(hc), option.WithMaxRetries(0))
	if chat, err := oa.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs, MaxTokens: openai.Int(3)}); err != nil || len(chat.Choices) != 1 {
		t.Fatalf("OpenAI SDK with the key: %+v, %v", chat, err)
	}
	if _, err := oa.Models.List(ctx); err != nil {
		t.Fatalf("OpenAI SDK models with the key: %v", err)
	}
	bad := openai.NewClient(option.WithBaseURL(rep.URL()+"/v1/"), option.WithAPIKey("sk-wrong-0123456789abcdef"), option.WithHTTPClient(hc), option.WithMaxRetries(0))
	var oe *openai.Error
	_, err = bad.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs, MaxTokens: openai.Int(3)})
	if !errors.As(err, &oe) || oe.StatusCode != http.StatusUnauthorized || oe.Code != "invalid_api_key" {
		t.Fatalf("OpenAI SDK with a wrong key: %T %v, want *openai.Error 401 invalid_api_key", err, err)
	}

	// AWS's SDK: SigV4 owns Authorization; the key rides in its own header.
	withKey := sagemakerruntime.WithAPIOptions(smithyhttp.AddHeaderValue(router.HeaderAPIKey, key))
	sm := newSageMaker(rep.URL(), hc)
	body := tgiBody(strings.Repeat("a shared system prompt ", 10), 3, false)
	out, err := sm.InvokeEndpoint(ctx, &sagemakerruntime.InvokeEndpointInput{EndpointName: aws.String(ep), Body: body, ContentType: aws.String("application/json")}, withKey)
	if err != nil || !strings.Contains(string(out.Body), "generated_text") {
		t.Fatalf("SageMaker SDK with the key header: %v", err)
	}
	stream, err := sm.InvokeEndpointWithResponseStream(ctx, &sagemakerruntime.InvokeEndpointWithResponseStreamInput{EndpointName: aws.String(ep), Body: tgiBody("hello", 3, true), ContentType: aws.String("application/json")}, withKey)
	if err != nil {
		t.Fatalf("SageMaker SDK stream with the key header: %v", err)
	}
	if got, parts, err := readStream(stream, nil); err != nil || parts == 0 || len(got) == 0 {
		t.Fatalf("SageMaker SDK stream with the key header: %d parts, %v", parts, err)
	}
	_, err = sm.InvokeEndpoint(ctx, &sagemakerruntime.InvokeEndpointInput{EndpointName: aws.String(ep), Body: body})
	var ae smithy.APIError
	var re *awshttp.ResponseError
	if !errors.As(err, &ae) || ae.ErrorCode() != "UnrecognizedClientException" || !errors.As(err, &re) || re.HTTPStatusCode() != http.StatusUnauthorized {
		t.Fatalf("SageMaker SDK without the key: %T %v, want UnrecognizedClientException 401", err, err)
	}
}
