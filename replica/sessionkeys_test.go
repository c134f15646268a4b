package replica_test

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/router"
)

// TestSessionKeyFromEtcd: replicas without --session-key-file share the
// endpoint's session key through etcd (the first one creates it), so a
// session opened through one is honoured by the other; a key written over
// it (rotation) is taken up by every replica, and ids sealed with the old
// one are then refused.
func TestSessionKeyFromEtcd(t *testing.T) {
	ctx := testsupport.Context(t, 60*time.Second)
	f, err := localfleet.Start(ctx, localfleet.Options{Endpoint: "chat", FastEtcd: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get(router.HeaderSessionID) == router.NewSession {
			w.Header().Set(router.HeaderNewSessionID, "sess-1; Expires=2030-01-01T00:00:00Z")
		}
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer srv.Close()
	if _, err := f.Register(ctx, fleet.Instance{ID: "s-0", Addr: srv.URL}, 0); err != nil {
		t.Fatal(err)
	}
	a, err := f.AddReplica(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.AddReplica(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.WaitFor(ctx, f.HasInstances("s-0")); err != nil {
		t.Fatal(err)
	}
	l := membership.Layout{}
	resp, err := f.Client().Get(ctx, l.SessionKeyKey("chat"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the endpoint's session key in etcd: %v, %d keys", err, len(resp.Kvs))
	}
	if _, err := membership.ParseSessionKey(resp.Kvs[0].Value); err != nil {
		t.Fatal(err)
	}
	invoke := func(url, sid string) (int, http.Header) {
		req, _ := http.NewRequest(http.MethodPost, url+"/invocations", strings.NewReader(`{"inputs":"x"}`))
		req.Header.Set(router.HeaderSessionID, sid)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode, res.Header
	}
	code, h := invoke(a.URL(), router.NewSession)
	id, _, _ := strings.Cut(h.Get(router.HeaderNewSessionID), ";")
	if code != 200 || id == "" {
		t.Fatalf("opening a session through replica a: %d, id %q", code, id)
	}
	if code, h := invoke(b.URL(), id); code != 200 || h.Get(router.HeaderDecision) != router.DecisionSession {
		t.Fatalf("the session through replica b: %d (%s), want 200 by the session", code, h.Get(router.HeaderDecision))
	}
	// Rotation: a new key in etcd; both replicas take it up and refuse
	// the old id.
	if _, err := f.Client().Put(ctx, l.SessionKeyKey("chat"), base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("r"), 32))); err != nil {
		t.Fatal(err)
	}
	for _, rep := range []string{a.URL(), b.URL()} {
		testsupport.Eventually(t, 10*time.Second, fmt.Sprintf("replica %s refuses the old id", rep), func() bool {
			code, _ := invoke(rep, id)
			return code == http.StatusBadRequest
		})
	}
	// An invalid key written behind the routers' back is ignored and
	// counted; each falls back to its own random key, never to the first
	// key again.
	if _, err := f.Client().Put(ctx, l.SessionKeyKey("chat"), "short"); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 10*time.Second, "the invalid key counted", func() bool {
		return testsupport.Sum(t, a.Registry(), "prefixrouter_membership_invalid_records_total", map[string]string{"kind": "session-key"}) >= 1 &&
			testsupport.Sum(t, b.Registry(), "prefixrouter_membership_invalid_records_total", map[string]string{"kind": "session-key"}) >= 1
	})
	for _, rep := range []string{a.URL(), b.URL()} {
		if code, _ := invoke(rep, id); code != http.StatusBadRequest {
			t.Fatalf("replica %s with an invalid key in etcd: the first key's id answered %d, want 400", rep, code)
		}
	}
}
