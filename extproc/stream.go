package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/prefixrouter/prefixrouter/router"
)

// Names of GIE's endpoint-picker protocol v1
// (gateway-api-inference-extension docs/proposals/004-endpoint-picker-protocol).
const (
	// HeaderDestination carries the picked endpoints, host:port, primary
	// first, comma-separated; the same value goes into the dynamic metadata
	// namespace MetadataNamespace.
	HeaderDestination = "x-gateway-destination-endpoint"
	// MetadataNamespace is the dynamic metadata namespace of the answer and
	// of the served-endpoint report.
	MetadataNamespace = "envoy.lb"
	// KeyServed is the key, in MetadataNamespace of the request's metadata
	// context, under which the proxy reports the endpoint that served.
	KeyServed = "x-gateway-destination-endpoint-served"
	// SubsetNamespace and KeySubset carry the proxy's subset hint: the
	// endpoints the pick must choose from.
	SubsetNamespace = "envoy.lb.subset_hint"
	KeySubset       = "x-gateway-destination-endpoint-subset"
	// HeaderPrimary carries the primary endpoint alone, for proxies that
	// read one address from a header (Envoy's ORIGINAL_DST cluster with
	// use_http_header parses exactly one host:port).
	HeaderPrimary = "x-prefixrouter-primary-endpoint"
)

// stream is one HTTP request's ext_proc stream. Envoy drives it (with
// request_body_mode FULL_DUPLEX_STREAMED): request headers, body chunks and
// optional trailers, then the response's. The request headers are held
// until the routing key is known; then come the headers answer (the pick)
// and the body received so far, and later chunks are passed straight on.
// Every field belongs to the goroutine running Process.
type stream struct {
	s      *Server
	srv    extprocv3.ExternalProcessor_ProcessServer
	path   string
	header http.Header
	subset []string // nil: no hint
	// held is the request body held before the pick, in the router's
	// bounded buffers (issue 19); nil before the first chunk and after
	// the pick.
	held   *router.HeldBody
	picked *router.Picked
	// sent is the pick whose Rest rewrites the chunks after it (a salted
	// body's end); it outlives picked, which the response releases.
	sent   *router.Picked
	span   trace.Span // nil unless tracing
	status int        // response status; 0 until the response headers

	// trusted: the peer is authenticated, so its response status and
	// served-endpoint report count (extproc.go).
	trusted     bool
	headersSeen bool // the request headers arrived
	bodySeen    bool // a request body chunk arrived before the pick
	answered    bool // request headers answered (picked or rejected)
	// respBodyStreamed: Envoy announced (protocol_config, first message) a
	// response body mode other than FULL_DUPLEX_STREAMED, in which it
	// forwards the chunks itself. Unannounced means FULL_DUPLEX_STREAMED,
	// the mode GIE requires, in which the processor returns every chunk.
	respBodyStreamed bool
}

// run serves messages until the stream ends. A cancelled stream (Envoy's
// request gone) or a clean end returns nil; finish releases the slot.
func (st *stream) run() error {
	for {
		req, err := st.srv.Recv()
		if err != nil {
			if err == io.EOF || status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
		if pc := req.GetProtocolConfig(); pc != nil {
			st.respBodyStreamed = pc.GetResponseBodyMode() != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		}
		done, err := st.handle(req)
		if err != nil || done {
			return err
		}
	}
}

// handle answers one message; done is true when the stream has nothing more
// to do (an immediate response was sent).
func (st *stream) handle(req *extprocv3.ProcessingRequest) (done bool, err error) {
	switch m := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		st.headersSeen = true
		st.requestHeaders(req, m.RequestHeaders)
		if m.RequestHeaders.GetEndOfStream() {
			return st.tryPick(true, false)
		}
		return false, nil
	case *extprocv3.ProcessingRequest_RequestBody:
		if !st.headersSeen {
			// Issue 19: such a stream was picked as an invoke request on
			// the default endpoint. Envoy always sends headers first.
			return true, status.Error(codes.InvalidArgument, "extproc: a request body before the request headers")
		}
		return st.requestBody(m.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if !st.headersSeen {
			return true, status.Error(codes.InvalidArgument, "extproc: request trailers before the request headers")
		}
		if !st.answered {
			// The body ended with trailers: it is complete now.
			if done, err := st.tryPick(true, false); done || err != nil {
				return done, err
			}
		} else if err := st.sendRest(nil, true, false); err != nil {
			return true, err
		}
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return false, st.responseHeaders(req, m.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return false, st.responseBody(m.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.release()
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return false, nil
}

// requestHeaders records the path, the headers and the subset hint.
func (st *stream) requestHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) {
	for _, hv := range h.GetHeaders().GetHeaders() {
		k, v := hv.GetKey(), headerValue(hv)
		switch {
		case k == ":path":
			st.path, _, _ = strings.Cut(v, "?")
		case strings.HasPrefix(k, ":"):
		default:
			st.header.Add(k, v)
		}
	}
	st.subset = subsetHint(req.GetMetadataContext())
}

func headerValue(hv *corev3.HeaderValue) string {
	if raw := hv.GetRawValue(); len(raw) > 0 {
		return string(raw)
	}
	return hv.GetValue()
}

// subsetHint reads GIE's subset hint: a list of host:port strings (or one
// comma-separated string). nil means no hint; an empty list means nothing is
// eligible.
func subsetHint(md *corev3.Metadata) []string {
	ns := md.GetFilterMetadata()[SubsetNamespace]
	v, ok := ns.GetFields()[KeySubset]
	if !ok {
		return nil
	}
	out := []string{}
	add := func(s string) {
		for _, e := range strings.Split(s, ",") {
			if e = strings.TrimSpace(e); e != "" {
				out = append(out, e)
			}
		}
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		add(k.StringValue)
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			add(e.GetStringValue())
		}
	}
	return out
}

// requestBody holds chunks until the pick, then passes them on.
func (st *stream) requestBody(b *extprocv3.HttpBody) (bool, error) {
	if st.answered {
		return false, st.sendRest(b.GetBody(), b.GetEndOfStream(), b.GetEndOfStream())
	}
	// The router bounds the held body: past its MaxBodyBytes, Pick answers
	// 413 whatever the key needs; past its body buffer, 503.
	st.bodySeen = true
	if st.held == nil {
		declared := int64(-1)
		if n, err := strconv.ParseInt(st.header.Get("Content-Length"), 10, 64); err == nil && n >= 0 {
			declared = n
		}
		st.held = st.s.opts.Picker.HoldBody(st.srv.Context(), st.path, declared)
	}
	if err := st.held.Append(b.GetBody()); err != nil {
		st.answered = true
		st.trace(nil, err)
		return true, st.reject(err)
	}
	return st.tryPick(b.GetEndOfStream(), b.GetEndOfStream())
}

// sendRest passes on a chunk that arrived after the pick, as the pick
// rewrites it (a salted body's end); end says the body ends with it (eos:
// and the stream, not trailers).
func (st *stream) sendRest(chunk []byte, end, eos bool) error {
	if st.sent == nil {
		if !end || len(chunk) > 0 || eos {
			return st.sendBody(chunk, eos)
		}
		return nil
	}
	out, err := st.sent.Rest(chunk, end)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if len(out) == 0 && !eos {
		return nil
	}
	return st.sendBody(out, eos)
}

// tryPick asks the router; when the key is known it answers the held
// headers and the body so far. complete says the body is whole; eos that the
// last chunk ended the stream (not trailers).
func (st *stream) tryPick(complete, eos bool) (bool, error) {
	p, err := st.s.opts.Picker.Pick(router.PickRequest{
		Path: st.path, Header: st.header, Held: st.held, Complete: complete,
		Subset: st.subset, MaxCandidates: st.s.opts.MaxCandidates,
		Context: st.srv.Context(), // ends an adapter wait when Envoy gives up
	})
	if errors.Is(err, router.ErrNeedBody) {
		return false, nil
	}
	st.answered = true
	st.trace(p, err)
	if err != nil {
		return true, st.reject(err)
	}
	st.picked = p
	dest := strings.Join(p.Candidates, ",")
	mutation := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
		setHeader(HeaderDestination, dest),
		setHeader(HeaderPrimary, p.Candidates[0]),
	}}
	for k, vs := range p.SetHeaders {
		for _, v := range vs {
			mutation.SetHeaders = append(mutation.SetHeaders, setHeader(strings.ToLower(k), v))
		}
	}
	if p.Body != nil {
		// The router salted the body (or will at its end): its length
		// changes, so the proxy sends it chunked.
		mutation.RemoveHeaders = append(mutation.RemoveHeaders, "content-length")
	}
	headers := &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{
				// The route may depend on the destination header.
				ClearRouteCache: true,
				HeaderMutation:  mutation,
			},
		}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				HeaderDestination: structpb.NewStringValue(dest),
			}}),
		}},
	}
	if err := st.send(headers); err != nil {
		return true, err
	}
	if !st.bodySeen {
		return false, nil
	}
	body := st.held.Bytes()
	if p.Body != nil {
		body = p.Body
	}
	if !complete {
		st.sent = p // the chunks to come go through p.Rest
	}
	// In messages of at most maxBodyMessage: gRPC copies each message
	// whole, and a held body may be MaxBodyBytes long.
	for len(body) > maxBodyMessage && err == nil {
		err = st.sendBody(body[:maxBodyMessage], false)
		body = body[maxBodyMessage:]
	}
	if err == nil {
		err = st.sendBody(body, eos)
	}
	// Sent (gRPC has encoded the messages) or failed: the buffers go back.
	st.held.Release()
	st.held = nil
	return false, err
}

// reject ends the request with a rejection's answer.
func (st *stream) reject(err error) error {
	var rej *router.Rejection
	if errors.As(err, &rej) {
		return st.immediate(rej.Status, rej.Header, rej.Body, err.Error())
	}
	return st.immediate(http.StatusInternalServerError, nil, nil, err.Error())
}

// maxBodyMessage bounds the body chunks the stream sends after the pick.
const maxBodyMessage = 64 << 10

// setHeader overwrites: a client must not choose its own destination by
// sending the header itself.
func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// sendBody passes a request body chunk on (FULL_DUPLEX_STREAMED: the
// processor returns every chunk it wants forwarded).
func (st *stream) sendBody(b []byte, eos bool) error {
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
		Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b, EndOfStream: eos},
		}}},
	}}})
}

// immediate ends the request with a local answer.
func (st *stream) immediate(code int, h http.Header, body []byte, details string) error {
	var set []*corev3.HeaderValueOption
	for k, vs := range h {
		for _, v := range vs {
			set = append(set, setHeader(strings.ToLower(k), v))
		}
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(code)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: set},
		Body:    body,
		Details: "prefixrouter: " + details,
	}}})
}

// responseHeaders learns the status and which endpoint served, and marks
// the response with the router's instance and decision headers, as on the
// HTTP data plane.
func (st *stream) responseHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	upstream := http.Header{}
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch k := hv.GetKey(); {
		case k == ":status":
			st.status, _ = strconv.Atoi(headerValue(hv))
		case !strings.HasPrefix(k, ":"):
			upstream.Add(k, headerValue(hv))
		}
	}
	var set []*corev3.HeaderValueOption
	if p := st.picked; p != nil {
		if v, ok := st.servedFrom(req); ok && st.trusted {
			p.Served(v)
		}
		// The router's response headers, as its HTTP data plane sets
		// them: instance, decision, variant, the client's session ids.
		for k, vs := range p.ResponseHeaders(upstream) {
			for _, v := range vs {
				set = append(set, setHeader(strings.ToLower(k), v))
			}
		}
	}
	if h.GetEndOfStream() {
		st.release()
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set}},
	}}})
}

// servedFrom reads GIE's served-endpoint report from the metadata context.
func (st *stream) servedFrom(req *extprocv3.ProcessingRequest) (string, bool) {
	v, ok := req.GetMetadataContext().GetFilterMetadata()[MetadataNamespace].GetFields()[KeyServed]
	if !ok {
		return "", false
	}
	return v.GetStringValue(), true
}

// responseBody passes response chunks on and releases the slot at the end.
func (st *stream) responseBody(b *extprocv3.HttpBody) error {
	if b.GetEndOfStream() {
		st.release()
	}
	if st.respBodyStreamed {
		// STREAMED or BUFFERED: Envoy forwards the chunk itself.
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}})
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{
		Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b.GetBody(), EndOfStream: b.GetEndOfStream()},
		}}},
	}}})
}

// release ends the pick: the response is over.
func (st *stream) release() {
	if st.picked != nil {
		if st.trusted {
			st.picked.Done(st.status)
		} else {
			st.picked.Release(st.status)
		}
		st.picked = nil
	}
	if st.span != nil {
		if st.status != 0 {
			st.span.SetAttributes(semconv.HTTPResponseStatusCode(st.status))
		}
		st.span.End()
		st.span = nil
	}
}

// trace starts the request's span when tracing is on, as a child of the
// trace Envoy forwards in traceparent. A rejection's span ends at once.
func (st *stream) trace(p *router.Picked, err error) {
	if st.s.tracer == nil {
		return
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(st.header))
	_, span := st.s.tracer.Start(ctx, "prefixrouter.pick", trace.WithSpanKind(trace.SpanKindServer))
	if err != nil {
		span.SetAttributes(router.AttrDecision.String("none"))
		span.SetStatus(otelcodes.Error, err.Error())
		span.End()
		return
	}
	span.SetAttributes(
		router.AttrEndpoint.String(p.Endpoint), router.AttrStrategy.String(p.Strategy),
		router.AttrDecision.String(p.Decision), router.AttrInstance.String(p.Instance),
	)
	if p.Spill != "" {
		span.SetAttributes(router.AttrSpill.String(p.Spill))
	}
	st.span = span
}

// finish runs when Process returns: a pick still held means the response
// never ended on this stream (cancelled, or Envoy does not send the response
// body), so the slot is released with the status seen, if any.
func (st *stream) finish() {
	st.release()
	if st.held != nil {
		st.held.Release()
		st.held = nil
	}
}

func (st *stream) send(r *extprocv3.ProcessingResponse) error {
	if err := st.srv.Send(r); err != nil {
		return fmt.Errorf("extproc: send: %w", err)
	}
	return nil
}
