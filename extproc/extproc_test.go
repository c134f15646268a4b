package extproc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/jonboulle/clockwork"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/prefixrouter/prefixrouter/extproc"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/router"
)

const endpoint = "ep"

// cluster is a fleet of loopback model servers, a router over them (the
// HTTP data plane, served over real HTTP) and an endpoint picker over the
// same router.
type cluster struct {
	router *router.Router
	http   *httptest.Server
	epp    *extproc.Server
	client extprocv3.ExternalProcessorClient
	conn   *grpc.ClientConn
	ids    map[string]string // host:port → instance id
	addrs  map[string]string // instance id → host:port
	token  string            // sent by open when set
}

// fleetOf starts n model servers answering 200 with their id.
func fleetOf(t *testing.T, n int) []fleet.Instance {
	t.Helper()
	var insts []fleet.Instance
	for i := range n {
		id := fmt.Sprintf("i%d", i)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":%q}`, id)
		}))
		t.Cleanup(srv.Close)
		insts = append(insts, fleet.Instance{ID: id, Addr: srv.URL})
	}
	return insts
}

func startCluster(t *testing.T, insts []fleet.Instance, opts extproc.Options) *cluster {
	t.Helper()
	return startClusterWith(t, insts, router.Options{DefaultEndpoint: endpoint}, opts)
}

// startClusterWith is startCluster with the router's options.
func startClusterWith(t *testing.T, insts []fleet.Instance, ro router.Options, opts extproc.Options) *cluster {
	t.Helper()
	r, err := router.New(ro)
	if err != nil {
		t.Fatal(err)
	}
	cfg := fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: fleet.MinPrefixLength, ConcurrencyThreshold: 4}}
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: endpoint, Config: cfg, Instances: insts}}, 0, 1, time.Now()))
	c := &cluster{router: r, http: httptest.NewServer(r), ids: map[string]string{}, addrs: map[string]string{}, token: opts.Token}
	for _, in := range insts {
		u, _ := url.Parse(in.Addr)
		c.ids[u.Host] = in.ID
		c.addrs[in.ID] = u.Host
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts.Picker = r
	if opts.Ready == nil {
		opts.Ready = r.Ready
	}
	if c.epp, err = extproc.Start(ln, opts); err != nil {
		t.Fatal(err)
	}
	if c.conn, err = grpc.NewClient(c.epp.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	c.client = extprocv3.NewExternalProcessorClient(c.conn)
	t.Cleanup(func() {
		_ = c.conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.epp.Close(ctx); err != nil {
			t.Error(err)
		}
		c.http.Close()
		_ = r.Close()
	})
	return c
}

func (c *cluster) inFlight(t *testing.T, addr string) int64 {
	t.Helper()
	st, ok := c.router.Status(endpoint, c.ids[addr])
	if !ok {
		t.Fatalf("no instance at %s", addr)
	}
	return st.InFlight
}

// totalInFlight sums every instance's in-flight count.
func (c *cluster) totalInFlight(t *testing.T) int64 {
	t.Helper()
	var n int64
	for addr := range c.ids {
		n += c.inFlight(t, addr)
	}
	return n
}

// envoy drives one ext_proc stream as Envoy's filter does with
// request_body_mode and response_body_mode FULL_DUPLEX_STREAMED.
type envoy struct {
	t      *testing.T
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
}

func (c *cluster) open(t *testing.T) *envoy {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if c.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.token)
	}
	s, err := c.client.Process(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	e := &envoy{t: t, stream: s, cancel: cancel}
	t.Cleanup(cancel)
	return e
}

func (e *envoy) send(r *extprocv3.ProcessingRequest) {
	e.t.Helper()
	// io.EOF: the server ended the stream (it refused the peer before
	// reading this message); the next Recv carries its status, which the
	// caller checks.
	if err := e.stream.Send(r); err != nil && !errors.Is(err, io.EOF) {
		e.t.Fatalf("send: %v", err)
	}
}

func (e *envoy) recv() *extprocv3.ProcessingResponse {
	e.t.Helper()
	r, err := e.stream.Recv()
	if err != nil {
		e.t.Fatalf("recv: %v", err)
	}
	return r
}

// headers sends the request headers (not ending the stream), with the
// subset hint when subset is non-nil.
func (e *envoy) headers(path string, h map[string]string, subset []string, eos bool) {
	e.t.Helper()
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")},
		{Key: ":path", RawValue: []byte(path)},
		{Key: ":authority", RawValue: []byte("gateway")},
		{Key: "content-type", RawValue: []byte("application/json")},
	}}
	for k, v := range h {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	req := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: eos}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		},
	}
	if subset != nil {
		vals := make([]any, len(subset))
		for i, s := range subset {
			vals[i] = s
		}
		ns, err := structpb.NewStruct(map[string]any{extproc.KeySubset: vals})
		if err != nil {
			e.t.Fatal(err)
		}
		req.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{extproc.SubsetNamespace: ns}}
	}
	e.send(req)
}

func (e *envoy) body(b []byte, eos bool) {
	e.t.Helper()
	e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}})
}

func (e *envoy) trailers() {
	e.t.Helper()
	e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}})
}

// pickAnswer checks the headers answer of a pick and returns the
// destination list.
func (e *envoy) pickAnswer() []string {
	e.t.Helper()
	r := e.recv()
	hr := r.GetRequestHeaders()
	if hr == nil {
		e.t.Fatalf("want a request headers answer, got %v", r)
	}
	if !hr.GetResponse().GetClearRouteCache() {
		e.t.Error("the answer does not clear the route cache")
	}
	var header, primary string
	for _, h := range hr.GetResponse().GetHeaderMutation().GetSetHeaders() {
		switch h.GetHeader().GetKey() {
		case extproc.HeaderDestination:
			header = string(h.GetHeader().GetRawValue())
		case extproc.HeaderPrimary:
			primary = string(h.GetHeader().GetRawValue())
		}
		if h.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
			e.t.Errorf("header %s is appended, not overwritten", h.GetHeader().GetKey())
		}
	}
	md := r.GetDynamicMetadata().GetFields()[extproc.MetadataNamespace].GetStructValue().GetFields()[extproc.HeaderDestination].GetStringValue()
	if header == "" || md != header {
		e.t.Fatalf("header %q and dynamic metadata %q must carry the same destination", header, md)
	}
	dest := strings.Split(header, ",")
	if primary != dest[0] {
		e.t.Errorf("primary header %q, want the first destination %q", primary, dest[0])
	}
	return dest
}

// bodyAnswer reads a streamed request body answer.
func (e *envoy) bodyAnswer() (body []byte, eos bool) {
	e.t.Helper()
	r := e.recv()
	sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if sr == nil {
		e.t.Fatalf("want a streamed request body answer, got %v", r)
	}
	return sr.GetBody(), sr.GetEndOfStream()
}

// respond plays the upstream's response through the stream: headers with
// the served-endpoint report, then one body chunk ending the stream.
func (e *envoy) respond(served string, status int) {
	e.t.Helper()
	req := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: fmt.Appendf(nil, "%d", status)}}},
	}}}
	if served != "" {
		ns, _ := structpb.NewStruct(map[string]any{extproc.KeyServed: served})
		req.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{extproc.MetadataNamespace: ns}}
	}
	e.send(req)
	if r := e.recv(); r.GetResponseHeaders() == nil {
		e.t.Fatalf("want a response headers answer, got %v", r)
	}
}

func (e *envoy) respondEnd() {
	e.t.Helper()
	e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(`{}`), EndOfStream: true}}})
	sr := e.recv().GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if sr == nil || string(sr.GetBody()) != `{}` || !sr.GetEndOfStream() {
		e.t.Fatalf("response body not passed on: %v", sr)
	}
}

func chatBody(tenant, text string) []byte {
	b, _ := json.Marshal(map[string]any{
		"model":    "",
		"messages": []map[string]string{{"role": "user", "content": text}},
	})
	if tenant != "" {
		b, _ = json.Marshal(map[string]any{
			"prompt_cache_key": tenant,
			"messages":         []map[string]string{{"role": "user", "content": text}},
		})
	}
	return b
}

// viaHTTP sends the request through the HTTP data plane and returns the
// address of the instance that answered.
func (c *cluster) viaHTTP(t *testing.T, path string, h map[string]string, body []byte) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.http.URL+path, bytes.NewReader(body))
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTP data plane answered %d", resp.StatusCode)
	}
	return c.addrs[resp.Header.Get(router.HeaderInstance)]
}

// TestConformanceOpenAI drives a chat request as Envoy does: headers, body
// chunks, trailers. The pick needs the whole JSON body (model and
// prompt_cache_key may come last), so it comes with the trailers; it
// matches the HTTP data plane's, and the slot is held until the response
// ends.
func TestConformanceOpenAI(t *testing.T) {
	c := startCluster(t, fleetOf(t, 5), extproc.Options{})
	for i := range 8 {
		body := chatBody(fmt.Sprintf("tenant-%d", i), strings.Repeat(fmt.Sprintf("conversation %d ", i), 50))
		want := c.viaHTTP(t, "/v1/chat/completions", nil, body)
		// The HTTP data plane releases its slot just after the client has
		// the response.
		testsupport.Eventually(t, 5*time.Second, "the HTTP request's slot released", func() bool { return c.totalInFlight(t) == 0 })

		e := c.open(t)
		e.headers("/v1/chat/completions?x=1", nil, nil, false)
		third := len(body) / 3
		e.body(body[:third], false)
		e.body(body[third:2*third], false)
		e.body(body[2*third:], false)
		e.trailers()
		dest := e.pickAnswer()
		if dest[0] != want {
			t.Fatalf("request %d: ext_proc primary %s, HTTP data plane chose %s", i, dest[0], want)
		}
		if got, eos := e.bodyAnswer(); !bytes.Equal(got, body) || eos {
			t.Fatalf("body passed on: %d bytes eos=%v, want the %d bytes received, eos false (trailers follow)", len(got), eos, len(body))
		}
		if r := e.recv(); r.GetRequestTrailers() == nil {
			t.Fatalf("want a trailers answer, got %v", r)
		}
		if n := c.inFlight(t, dest[0]); n != 1 {
			t.Fatalf("in flight on the primary during the response: %d, want 1", n)
		}
		e.respond(dest[0], 200)
		e.respondEnd()
		if n := c.totalInFlight(t); n != 0 {
			t.Fatalf("in flight after the response ended: %d, want 0", n)
		}
		if err := e.stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if _, err := e.stream.Recv(); err != io.EOF {
			t.Fatalf("stream end: %v, want EOF", err)
		}
	}
}

// TestConformanceInvokePicksOnPrefix: on an invoke path the pick comes as
// soon as PrefixLength bytes are in, before the rest of the body is sent;
// later chunks are passed on as they come.
func TestConformanceInvokePicksOnPrefix(t *testing.T) {
	c := startCluster(t, fleetOf(t, 5), extproc.Options{MaxCandidates: 3})
	body := bytes.Repeat([]byte("0123456789abcdef"), fleet.MinPrefixLength/16*3)
	h := map[string]string{"x-amzn-sagemaker-prefix-aware-id": "tenant-a"}
	want := c.viaHTTP(t, "/endpoints/ep/invocations", h, body)

	e := c.open(t)
	e.headers("/endpoints/ep/invocations", h, nil, false)
	half := fleet.MinPrefixLength / 2
	e.body(body[:half], false)
	e.body(body[half:fleet.MinPrefixLength+10], false)
	// The pick must come now: the test sends nothing more until it has it.
	dest := e.pickAnswer()
	if dest[0] != want {
		t.Fatalf("ext_proc primary %s, HTTP data plane chose %s", dest[0], want)
	}
	if len(dest) != 3 {
		t.Fatalf("destinations %v, want 3 (MaxCandidates)", dest)
	}
	if got, eos := e.bodyAnswer(); !bytes.Equal(got, body[:fleet.MinPrefixLength+10]) || eos {
		t.Fatalf("held body passed on: %d bytes eos=%v", len(got), eos)
	}
	e.body(body[fleet.MinPrefixLength+10:], true)
	if got, eos := e.bodyAnswer(); !bytes.Equal(got, body[fleet.MinPrefixLength+10:]) || !eos {
		t.Fatalf("last chunk passed on: %d bytes eos=%v", len(got), eos)
	}
	e.respond(dest[0], 200)
	e.respondEnd()
	if n := c.totalInFlight(t); n != 0 {
		t.Fatalf("in flight after the response: %d", n)
	}
}

// TestSubsetHint: the pick chooses only from the proxy's subset; an empty
// subset, or one naming no instance, gets an immediate 503.
func TestSubsetHint(t *testing.T) {
	c := startCluster(t, fleetOf(t, 5), extproc.Options{})
	body := chatBody("t", strings.Repeat("subset ", 40))
	for addr := range c.ids {
		e := c.open(t)
		e.headers("/v1/chat/completions", nil, []string{addr}, false)
		e.body(body, true)
		dest := e.pickAnswer()
		if len(dest) != 1 || dest[0] != addr {
			t.Fatalf("subset [%s]: picked %v", addr, dest)
		}
		e.bodyAnswer()
		e.cancel()
	}
	for _, subset := range [][]string{{}, {"192.0.2.1:8000"}} {
		e := c.open(t)
		e.headers("/v1/chat/completions", nil, subset, false)
		e.body(body, true)
		ir := e.recv().GetImmediateResponse()
		if ir.GetStatus().GetCode() != http.StatusServiceUnavailable {
			t.Fatalf("subset %v: want an immediate 503, got %v", subset, ir)
		}
		var oe struct {
			Error struct{ Code string } `json:"error"`
		}
		if err := json.Unmarshal(ir.GetBody(), &oe); err != nil || oe.Error.Code != "no_instance_available" {
			t.Fatalf("subset %v: body %s is not the OpenAI error of the HTTP data plane", subset, ir.GetBody())
		}
		if _, err := e.stream.Recv(); err != io.EOF {
			t.Fatalf("after an immediate response the stream must end: %v", err)
		}
	}
	testsupport.Eventually(t, 5*time.Second, "every slot released", func() bool { return c.totalInFlight(t) == 0 })
}

// TestReleaseOnCancel: a stream cancelled after the pick (Envoy's request
// reset) releases its slot.
func TestReleaseOnCancel(t *testing.T) {
	c := startCluster(t, fleetOf(t, 3), extproc.Options{})
	e := c.open(t)
	e.headers("/v1/chat/completions", nil, nil, false)
	e.body(chatBody("", "cancel me"), true)
	dest := e.pickAnswer()
	e.bodyAnswer()
	if n := c.inFlight(t, dest[0]); n != 1 {
		t.Fatalf("in flight after the pick: %d, want 1", n)
	}
	e.cancel()
	testsupport.Eventually(t, 5*time.Second, "the slot released on cancel", func() bool { return c.inFlight(t, dest[0]) == 0 })
}

// TestServedElsewhere: when the proxy reports that a fallback served, the
// slot moves there and is released at the end.
func TestServedElsewhere(t *testing.T) {
	c := startCluster(t, fleetOf(t, 4), extproc.Options{Token: "envoy-token"})
	e := c.open(t)
	e.headers("/invocations", nil, nil, true) // no body: headers end the stream
	dest := e.pickAnswer()
	if len(dest) < 2 {
		t.Fatalf("want fallbacks, got %v", dest)
	}
	e.respond(dest[1], 200)
	if a, b := c.inFlight(t, dest[0]), c.inFlight(t, dest[1]); a != 0 || b != 1 {
		t.Fatalf("after the served report: primary %d, fallback %d in flight; want 0 and 1", a, b)
	}
	e.respondEnd()
	if n := c.totalInFlight(t); n != 0 {
		t.Fatalf("in flight after the response: %d", n)
	}
}

// TestRejections: the answers the HTTP data plane gives before a pick come
// back as immediate responses with the same status and body.
func TestRejections(t *testing.T) {
	insts := fleetOf(t, 2)
	for i := range insts {
		insts[i].Labels = map[string]string{"model": "base"} // models are declared: others are unknown
	}
	c := startCluster(t, insts, extproc.Options{})
	for _, tc := range []struct {
		path string
		body string
		want int
	}{
		{"/v1/chat/completions", `{"messages":[`, http.StatusBadRequest},
		{"/v1/chat/completions", `{"model":"nope","messages":[]}`, http.StatusNotFound},
		{"/endpoints/other/invocations", `x`, http.StatusBadRequest}, // SageMaker's ValidationError
	} {
		e := c.open(t)
		e.headers(tc.path, nil, nil, false)
		e.body([]byte(tc.body), true)
		ir := e.recv().GetImmediateResponse()
		if int(ir.GetStatus().GetCode()) != tc.want {
			t.Errorf("%s %s: status %v, want %d", tc.path, tc.body, ir.GetStatus(), tc.want)
		}
		req, _ := http.NewRequest(http.MethodPost, c.http.URL+tc.path, strings.NewReader(tc.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		httpBody, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want || !bytes.Equal(httpBody, ir.GetBody()) {
			t.Errorf("%s: HTTP answered %d %s, ext_proc %s", tc.path, resp.StatusCode, httpBody, ir.GetBody())
		}
	}
}

// TestReplicasAgree: two replicas, each with its own router over the same
// fleet, answer every request with the same destinations.
func TestReplicasAgree(t *testing.T) {
	insts := fleetOf(t, 6)
	a := startCluster(t, insts, extproc.Options{})
	b := startCluster(t, insts, extproc.Options{})
	for i := range 30 {
		body := chatBody(fmt.Sprintf("t%d", i%4), fmt.Sprintf("prompt number %d %s", i, strings.Repeat("x", i)))
		var got [2][]string
		for j, c := range []*cluster{a, b} {
			e := c.open(t)
			e.headers("/v1/chat/completions", nil, nil, false)
			e.body(body, true)
			got[j] = e.pickAnswer()
			e.bodyAnswer()
			e.respond("", 200)
			e.respondEnd()
		}
		if strings.Join(got[0], ",") != strings.Join(got[1], ",") {
			t.Fatalf("request %d: replica A %v, replica B %v", i, got[0], got[1])
		}
	}
}

// TestHealth: liveness serves at once; readiness and the ext_proc service
// follow the router's readiness, refreshed on the clock.
func TestHealth(t *testing.T) {
	clock := clockwork.NewFakeClock()
	notReady := errors.New("not yet")
	ready := make(chan error, 1)
	ready <- notReady
	last := notReady
	c := startCluster(t, fleetOf(t, 1), extproc.Options{Clock: clock, ReadyInterval: time.Second, Ready: func() error {
		select {
		case last = <-ready:
		default:
		}
		return last
	}})
	hc := healthpb.NewHealthClient(c.conn)
	check := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("check %q: %v", svc, err)
		}
		return r.GetStatus()
	}
	if got := check(extproc.HealthLiveness); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("liveness %v", got)
	}
	for _, svc := range []string{extproc.HealthReadiness, extproc.HealthExtProc} {
		if got := check(svc); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("%s before ready: %v", svc, got)
		}
	}
	ready <- nil
	testsupport.Eventually(t, 5*time.Second, "readiness", func() bool {
		clock.Advance(time.Second)
		return check(extproc.HealthReadiness) == healthpb.HealthCheckResponse_SERVING &&
			check(extproc.HealthExtProc) == healthpb.HealthCheckResponse_SERVING
	})
}

// TestTracing: with a tracer provider, each pick is a span in the trace
// Envoy forwards, with the router's attributes, ended with the response.
func TestTracing(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	c := startCluster(t, fleetOf(t, 3), extproc.Options{TracerProvider: tp})
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	e := c.open(t)
	e.headers("/invocations", map[string]string{"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"}, nil, true)
	dest := e.pickAnswer()
	if len(exp.GetSpans()) != 0 {
		t.Fatal("the span ended before the response")
	}
	e.respond(dest[0], 200)
	e.respondEnd()
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	s := spans[0]
	if s.SpanContext.TraceID().String() != traceID {
		t.Errorf("trace %s, want Envoy's %s", s.SpanContext.TraceID(), traceID)
	}
	got := map[string]string{}
	for _, kv := range s.Attributes {
		got[string(kv.Key)] = kv.Value.Emit()
	}
	want := map[attribute.Key]string{router.AttrEndpoint: endpoint, router.AttrDecision: router.DecisionAffinity, router.AttrInstance: c.ids[dest[0]], router.AttrStrategy: "PREFIX_AWARE"}
	for k, v := range want {
		if got[string(k)] != v {
			t.Errorf("attribute %s = %q, want %q (all %v)", k, got[string(k)], v, got)
		}
	}
	if got["http.response.status_code"] != "200" {
		t.Errorf("status attribute %q", got["http.response.status_code"])
	}
}

// TestBodyLimit: the body held before the pick is bounded by the router's
// MaxBodyBytes: past it, an immediate 413 ends the stream.
func TestBodyLimit(t *testing.T) {
	c := startCluster(t, fleetOf(t, 1), extproc.Options{})
	e := c.open(t)
	e.headers("/v1/chat/completions", nil, nil, false)
	chunk := bytes.Repeat([]byte(" "), 1<<20)
	for range router.DefaultMaxBodyBytes>>20 + 1 {
		e.body(chunk, false)
	}
	if ir := e.recv().GetImmediateResponse(); ir.GetStatus().GetCode() != http.StatusRequestEntityTooLarge {
		t.Fatalf("want an immediate 413, got %v", ir.GetStatus())
	}
}

// TestDeclaredBodyOverLimit: a body declared (content-length) over the
// router's MaxBodyBytes gets its 413 on its first chunk, from the declared
// length, as on the HTTP data plane; it was held until its bytes crossed
// the limit.
func TestDeclaredBodyOverLimit(t *testing.T) {
	c := startCluster(t, fleetOf(t, 1), extproc.Options{})
	for _, path := range []string{"/v1/chat/completions", "/invocations"} {
		e := c.open(t)
		e.headers(path, map[string]string{"content-length": fmt.Sprint(router.DefaultMaxBodyBytes + 1)}, nil, false)
		e.body([]byte(`{"messages":[`), false)
		if ir := e.recv().GetImmediateResponse(); ir.GetStatus().GetCode() != http.StatusRequestEntityTooLarge {
			t.Fatalf("%s: want an immediate 413, got %v", path, ir.GetStatus())
		}
	}
}

// TestBodyBuffer: the ext_proc picker holds bodies in the router's body
// buffer, as the HTTP data plane does (issue 19: it held every OpenAI body
// whole, outside any bound). With a buffer for one 1 MiB body, a stream
// whose model-last body fills it holds it; a second stream's body past its
// first 64 KiB finds no room and, once the wait runs out, is answered 503
// body_buffer_full, as the HTTP data plane answers; the first is then
// picked at its end.
func TestBodyBuffer(t *testing.T) {
	const limit = 1 << 20
	c := startClusterWith(t, fleetOf(t, 1), router.Options{
		DefaultEndpoint: endpoint, MaxBodyBytes: limit, BodyBufferBytes: limit + 64, BodyBufferWait: time.Millisecond,
	}, extproc.Options{})
	modelLast := func(n int) []byte {
		return []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("w", n) + `"}],"model":"m"}`)
	}
	first := modelLast(900 << 10)
	a := c.open(t)
	a.headers("/v1/chat/completions", map[string]string{"content-length": fmt.Sprint(limit)}, nil, false)
	a.body(first[:len(first)-20], false) // past 64 KiB, model not yet seen: held in the buffer
	testsupport.Eventually(t, 5*time.Second, "the first body held in the buffer", func() bool { return c.router.BodiesHeld() == 1 })
	b := c.open(t)
	b.headers("/v1/chat/completions", map[string]string{"content-length": fmt.Sprint(len(first))}, nil, false)
	b.body(first, true)
	ir := b.recv().GetImmediateResponse()
	if ir.GetStatus().GetCode() != http.StatusServiceUnavailable || !bytes.Contains(ir.GetBody(), []byte("body_buffer_full")) {
		t.Fatalf("a second held body with no room: %v %s, want 503 body_buffer_full", ir.GetStatus(), ir.GetBody())
	}
	a.body(first[len(first)-20:], true)
	a.pickAnswer()
	var got []byte
	for eos := false; !eos; {
		var chunk []byte
		chunk, eos = a.bodyAnswer()
		got = append(got, chunk...)
	}
	if !bytes.Equal(got, first) {
		t.Fatalf("the held body was passed on as %d bytes, want its %d", len(got), len(first))
	}
}

// TestTrailersAfterThePick: a body that ends with trailers after the pick
// was made on its head gets every chunk passed on, then the trailers
// answer; a salted body's end (its salt) goes on before the trailers.
func TestTrailersAfterThePick(t *testing.T) {
	insts := fleetOf(t, 2)
	c := startCluster(t, insts, extproc.Options{})
	cfg := fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware, TenantCacheSalt: true,
		PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: fleet.MinPrefixLength}}
	c.router.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: endpoint, Config: cfg, Instances: insts}}, 0, 1, time.Now()))
	system := `{"role":"system","content":"` + strings.Repeat("be brief. ", fleet.MinPrefixLength/5) + `"}`
	for _, tc := range []struct {
		name, path string
		body       []byte
		salted     bool
	}{
		{"invoke", "/invocations", bytes.Repeat([]byte("i"), 40<<10), false},
		{"salted chat", "/v1/chat/completions", []byte(`{"prompt_cache_key":"t","model":"m","messages":[` + system + `,{"role":"user","content":"` + strings.Repeat("u", 40<<10) + `"}]}`), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := c.open(t)
			e.headers(tc.path, map[string]string{"content-length": fmt.Sprint(len(tc.body))}, nil, false)
			const chunk = 20 << 10
			e.body(tc.body[:chunk], false)
			e.pickAnswer() // on the head
			got, eos := e.bodyAnswer()
			e.body(tc.body[chunk:], false)
			e.trailers()
			for !eos {
				r := e.recv()
				if r.GetRequestTrailers() != nil {
					break
				}
				sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
				if sr == nil {
					t.Fatalf("want a body or trailers answer, got %v", r)
				}
				got, eos = append(got, sr.GetBody()...), sr.GetEndOfStream()
			}
			if eos {
				t.Fatal("a body answer ended the stream: trailers follow")
			}
			want := tc.body
			if tc.salted {
				var m map[string]json.RawMessage
				if err := json.Unmarshal(got, &m); err != nil || len(m["cache_salt"]) == 0 {
					t.Fatalf("the body passed on is not salted JSON: %v", err)
				}
				want = append(tc.body[:len(tc.body)-1:len(tc.body)-1], got[len(tc.body)-1:]...)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("passed on %d bytes, want %d", len(got), len(want))
			}
		})
	}
}
