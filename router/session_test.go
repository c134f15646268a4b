package router

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
)

func TestSessionIDSealed(t *testing.T) {
	key := bytes.Repeat([]byte("k"), MinSessionKeyBytes)
	k := newSessionKeys(key, nil)
	for _, inst := range []string{"i-a", "vllm.0:8000", "x", strings.Repeat("long-instance-id", 8)} {
		id := k.seal("ep", inst, "s.1; odd")
		if id != k.seal("ep", inst, "s.1; odd") {
			t.Fatalf("sealing %q twice gave two ids: the closing answer must give the client its id back", inst)
		}
		if len(inst) > 2 && (strings.Contains(id, inst) || strings.Contains(id, sessionEncoding.EncodeToString([]byte(inst)))) {
			t.Fatalf("id %q shows instance %q", id, inst)
		}
		gotInst, sid, ok := k.open("ep", id)
		if !ok || gotInst != inst || sid != "s.1; odd" {
			t.Fatalf("%q -> %q -> %q %q %v", inst, id, gotInst, sid, ok)
		}
		if _, _, ok := k.open("other-ep", id); ok {
			t.Fatalf("an id of endpoint ep opened on another endpoint")
		}
		if _, _, ok := newSessionKeys(bytes.Repeat([]byte("o"), MinSessionKeyBytes), nil).open("ep", id); ok {
			t.Fatalf("an id opened under another key")
		}
		enc, rest, _ := strings.Cut(id, ".")
		raw, _ := sessionEncoding.DecodeString(enc)
		for i := range raw {
			tampered := bytes.Clone(raw)
			tampered[i] ^= 1
			if _, _, ok := k.open("ep", sessionEncoding.EncodeToString(tampered)+"."+rest); ok {
				t.Fatalf("a tampered id (byte %d) opened", i)
			}
		}
		if _, _, ok := k.open("ep", enc+".another-container-id"); ok {
			t.Fatalf("an id opened with another container id")
		}
	}
	for _, bad := range []string{"", "abc", ".s", "!!.s", "aQ.", "aS1h.s1", base64.RawURLEncoding.EncodeToString([]byte("i-a")) + ".s1"} {
		if _, _, ok := k.open("ep", bad); ok {
			t.Fatalf("%q opened", bad)
		}
	}
	// An endpoint's own key wins over the fixed one.
	per := newSessionKeys(key, func(ep string) []byte {
		if ep == "own" {
			return bytes.Repeat([]byte("e"), MinSessionKeyBytes)
		}
		return nil
	})
	if id := per.seal("own", "i-a", "s"); func() bool { _, _, ok := k.open("own", id); return ok }() {
		t.Fatal("an endpoint with its own key sealed with the fixed one")
	}
	if _, _, ok := per.open("ep", k.seal("ep", "i-a", "s")); !ok {
		t.Fatal("an endpoint without its own key does not use the fixed one")
	}
}

// sessionFleet is one endpoint of three instances behind a real HTTP
// server: i-a and i-b hold adapter lora-x, i-c does not; i-b is in variant
// green. Each answers a NEW_SESSION request with a session of its own.
type sessionFleet struct {
	t   *testing.T
	srv *httptest.Server
}

func newSessionFleet(t *testing.T, opts Options) *sessionFleet {
	t.Helper()
	ep := fleet.Endpoint{Name: "ep"}
	for _, id := range []string{"i-a", "i-b", "i-c"} {
		b := newBackend(t, id)
		b.handler = func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			if r.Header.Get(HeaderSessionID) == NewSession {
				w.Header().Set(HeaderNewSessionID, "sess-"+id+"; Expires=2030-01-01T00:00:00Z")
			}
			fmt.Fprintf(w, `{"id":%q,"session":%q}`, id, r.Header.Get(HeaderSessionID))
		}
		in := fleet.Instance{ID: id, Addr: b.srv.URL}
		if id != "i-c" {
			in.Adapters = []string{"lora-x"}
		}
		if id == "i-b" {
			in.Labels = map[string]string{VariantLabel: "green"}
		}
		ep.Instances = append(ep.Instances, in)
	}
	opts.DefaultEndpoint = "ep"
	opts.Logger = slog.New(slog.DiscardHandler)
	r, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{ep}, 0, 1, time.Now()))
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return &sessionFleet{t: t, srv: srv}
}

func (f *sessionFleet) invoke(hdr map[string]string) (status int, body string, h http.Header) {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/invocations", strings.NewReader(`{"inputs":"x"}`))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// open opens a session with the given extra headers and returns its id and
// the instance that holds it.
func (f *sessionFleet) open(hdr map[string]string) (id, instance string) {
	f.t.Helper()
	h := map[string]string{"X-Amzn-SageMaker-Session-Id": NewSession}
	for k, v := range hdr {
		h[k] = v
	}
	code, body, resp := f.invoke(h)
	id, _, _ = strings.Cut(resp.Get(HeaderNewSessionID), ";")
	if code != 200 || id == "" {
		f.t.Fatalf("opening a session: %d %s, id %q", code, body, id)
	}
	return id, resp.Get(HeaderInstance)
}

// TestForgedSessionIDsRefused reproduces issue 19's session probes: a
// made-up id naming instance i-c routed to i-c although i-c is outside the
// adapter's set; with --hide-instance-id, made-up ids answered 200 for
// existing instances and 400 for absent ones, so instance ids could be
// enumerated. Now a made-up or tampered id is SageMaker's ValidationError,
// the same for present and absent instances, and a genuine id is refused
// for a model or a variant its instance does not serve.
func TestForgedSessionIDsRefused(t *testing.T) {
	key := bytes.Repeat([]byte("s"), MinSessionKeyBytes)
	for _, hide := range []bool{false, true} {
		f := newSessionFleet(t, Options{SessionKey: key, HideInstanceID: hide})
		// The old format: base64url(instance) "." container id.
		forged := func(inst string) string { return base64.RawURLEncoding.EncodeToString([]byte(inst)) + ".sess-x" }
		var answers []string
		for _, inst := range []string{"i-a", "i-c", "no-such-instance"} {
			code, body, h := f.invoke(map[string]string{"X-Amzn-SageMaker-Session-Id": forged(inst), HeaderTargetModel: "lora-x"})
			if code != http.StatusBadRequest || h.Get(HeaderErrorType) != errValidation {
				t.Fatalf("hide %v: forged id for %s: %d %s %s, want 400 ValidationError", hide, inst, code, h.Get(HeaderErrorType), body)
			}
			answers = append(answers, fmt.Sprint(code, body))
		}
		if answers[0] != answers[1] || answers[1] != answers[2] {
			t.Fatalf("hide %v: forged ids for present and absent instances answer differently: %q", hide, answers)
		}
		id, home := f.open(map[string]string{HeaderTargetModel: "lora-x"})
		if !hide && home != "i-a" && home != "i-b" {
			t.Fatalf("a lora-x session opened on %s", home)
		}
		enc, rest, _ := strings.Cut(id, ".")
		raw, _ := sessionEncoding.DecodeString(enc)
		raw[len(raw)-1] ^= 0x20
		if code, _, h := f.invoke(map[string]string{"X-Amzn-SageMaker-Session-Id": sessionEncoding.EncodeToString(raw) + "." + rest}); code != 400 || h.Get(HeaderErrorType) != errValidation {
			t.Fatalf("hide %v: tampered id: %d, want 400 ValidationError", hide, code)
		}
		// The genuine id keeps its instance and sends the container its
		// own id.
		for range 5 {
			code, body, h := f.invoke(map[string]string{"X-Amzn-SageMaker-Session-Id": id, HeaderTargetModel: "lora-x"})
			if code != 200 || h.Get(HeaderDecision) != DecisionSession || !strings.Contains(body, `"session":"sess-`) {
				t.Fatalf("hide %v: session request: %d %s %s", hide, code, h.Get(HeaderDecision), body)
			}
			if !hide && h.Get(HeaderInstance) != home {
				t.Fatalf("session of %s served by %s", home, h.Get(HeaderInstance))
			}
		}
	}
	f := newSessionFleet(t, Options{SessionKey: key})
	// A genuine session of i-c (no adapter) used for lora-x, which i-c
	// does not hold: refused, not routed to i-c.
	var cid string
	for i := 0; cid == "" && i < 200; i++ {
		code, _, h := f.invoke(map[string]string{"X-Amzn-SageMaker-Session-Id": NewSession, HeaderTenant: fmt.Sprint("t", i)})
		if code == 200 && h.Get(HeaderInstance) == "i-c" {
			cid, _, _ = strings.Cut(h.Get(HeaderNewSessionID), ";")
		}
	}
	if cid == "" {
		t.Fatal("no session opened on i-c in 200 tries")
	}
	if code, body, h := f.invoke(map[string]string{"X-Amzn-SageMaker-Session-Id": cid, HeaderTargetModel: "lora-x"}); code != 400 || h.Get(HeaderErrorType) != errValidation || h.Get(HeaderInstance) != "" {
		t.Fatalf("i-c's session for lora-x: %d %s (from %q), want 400 ValidationError", code, body, h.Get(HeaderInstance))
	}
	// ... and for variant green, which i-c is not in.
	if code, _, h := f.invoke(map[string]string{"X-Amzn-SageMaker-Session-Id": cid, HeaderTargetVariant: "green"}); code != 400 || h.Get(HeaderErrorType) != errValidation {
		t.Fatalf("i-c's session for variant green: %d, want 400 ValidationError", code)
	}
	if code, _, h := f.invoke(map[string]string{"X-Amzn-SageMaker-Session-Id": cid}); code != 200 || h.Get(HeaderInstance) != "i-c" {
		t.Fatalf("i-c's session without model or variant: %d from %s", code, h.Get(HeaderInstance))
	}
	// Another replica with the same key honours the session; one with
	// another key refuses it.
	same := newSessionFleet(t, Options{SessionKey: key})
	if code, _, _ := same.invoke(map[string]string{"X-Amzn-SageMaker-Session-Id": cid}); code != 200 {
		t.Fatalf("a replica with the same key: %d", code)
	}
	other := newSessionFleet(t, Options{SessionKey: bytes.Repeat([]byte("o"), MinSessionKeyBytes)})
	if code, _, _ := other.invoke(map[string]string{"X-Amzn-SageMaker-Session-Id": cid}); code != 400 {
		t.Fatalf("a replica with another key: %d, want 400", code)
	}
}
