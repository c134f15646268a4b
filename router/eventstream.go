package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
)

// This file frames …/invocations-response-stream answers as SageMaker
// Runtime's InvokeEndpointWithResponseStream does: the body is
// application/vnd.amazon.eventstream, each chunk of the model server's
// answer one PayloadPart event (its bytes the raw payload), and a failure
// after the first byte one exception message ending the stream:
// ModelStreamError (ErrorCode StreamBroken, or ModelInvocationTimeExceeded)
// when the instance broke off, InternalStreamFailure when the router did.
// AWS SDKs decode these into types.ResponseStreamMemberPayloadPart and
// *types.ModelStreamError / *types.InternalStreamFailure.

// ContentTypeEventStream is the content type of an event-stream response.
const ContentTypeEventStream = "application/vnd.amazon.eventstream"

// HeaderSageMakerContentType carries the model server's own content type on
// a streamed answer (SageMaker's X-Amzn-SageMaker-Content-Type).
const HeaderSageMakerContentType = "X-Amzn-Sagemaker-Content-Type"

// payloadPartHeaders are the headers of every PayloadPart message; read-only.
var payloadPartHeaders = eventstream.Headers{
	{Name: ":message-type", Value: eventstream.StringValue("event")},
	{Name: ":event-type", Value: eventstream.StringValue("PayloadPart")},
	{Name: ":content-type", Value: eventstream.StringValue("application/octet-stream")},
}

// maxFrameOverhead bounds a PayloadPart frame's bytes beyond its payload:
// prelude (12), headers (about 90) and message CRC (4).
const maxFrameOverhead = 128

// Error codes of ModelStreamError (SageMaker's documented values).
const (
	streamBroken   = "StreamBroken"
	streamTimedOut = "ModelInvocationTimeExceeded"
)

// eventBody turns the upstream body into event-stream frames as the reverse
// proxy reads it: each Read returns one PayloadPart made of what one read
// of the upstream returned, so frames flush as the chunks arrive (no
// buffering beyond one chunk). An upstream error ends the stream with an
// exception message and a clean EOF, so the client gets a well-formed
// stream that says why it ended.
type eventBody struct {
	up      io.ReadCloser
	enc     *eventstream.Encoder
	frame   bytes.Buffer // encoded frame not yet returned
	scratch []byte
	done    bool
	// routerErr, when set, reports whether an upstream read error is the
	// router's doing (InternalStreamFailure) rather than the instance's.
	routerErr func(error) bool
}

func newEventBody(up io.ReadCloser, routerErr func(error) bool) *eventBody {
	return &eventBody{up: up, enc: eventstream.NewEncoder(), routerErr: routerErr}
}

func (b *eventBody) Read(p []byte) (int, error) {
	for b.frame.Len() == 0 {
		if b.done {
			return 0, io.EOF
		}
		if err := b.fill(len(p)); err != nil {
			return 0, err
		}
	}
	return b.frame.Read(p)
}

// fill reads one upstream chunk and encodes it (or the stream's end) into
// b.frame. want is the caller's buffer size, which bounds the payload so a
// frame usually fits one Read.
func (b *eventBody) fill(want int) error {
	n := max(want-maxFrameOverhead, 1024)
	if cap(b.scratch) < n {
		b.scratch = make([]byte, n)
	}
	k, err := b.up.Read(b.scratch[:n])
	if k > 0 {
		if eerr := b.enc.Encode(&b.frame, eventstream.Message{Headers: payloadPartHeaders, Payload: b.scratch[:k]}); eerr != nil {
			b.frame.Reset()
			b.fail("InternalStreamFailure", "", "router: encoding an event: "+eerr.Error())
			return nil
		}
	}
	switch {
	case err == io.EOF:
		b.done = true
	case err != nil:
		// A frame already encoded goes out first; the exception follows.
		if b.routerErr != nil && b.routerErr(err) {
			b.fail("InternalStreamFailure", "", "the router failed while streaming: "+publicError(err))
		} else {
			code := streamBroken
			if errors.Is(err, context.DeadlineExceeded) {
				code = streamTimedOut
			}
			b.fail("ModelStreamError", code, "the model server broke off the response stream: "+publicError(err))
		}
	}
	return nil
}

// fail appends an exception message of type typ and ends the stream.
func (b *eventBody) fail(typ, code, msg string) {
	b.done = true
	payload, _ := json.Marshal(struct {
		Message   string `json:"Message"`
		ErrorCode string `json:"ErrorCode,omitempty"`
	}{msg, code})
	_ = b.enc.Encode(&b.frame, eventstream.Message{
		Headers: eventstream.Headers{
			{Name: ":message-type", Value: eventstream.StringValue("exception")},
			{Name: ":exception-type", Value: eventstream.StringValue(typ)},
			{Name: ":content-type", Value: eventstream.StringValue("application/json")},
		},
		Payload: payload,
	})
}

func (b *eventBody) Close() error { return b.up.Close() }
