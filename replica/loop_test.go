package replica_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/router"
)

// TestRecordsAtOwnListenersRefused reproduces issue 19's loop: a record
// pointing at the replica's own data port (inside the default allow list)
// turned 30 requests into 180 router requests. Records at the data and admin
// ports, in the spellings 127.0.0.1 and localhost, must be ignored and
// counted, and 30 requests must stay 30.
func TestRecordsAtOwnListenersRefused(t *testing.T) {
	ctx := testsupport.Context(t, 30*time.Second)
	f, rep, _ := startFleet(t, 1)
	port := func(hostPort string) string { return hostPort[strings.LastIndex(hostPort, ":")+1:] }
	loops := map[string]string{
		"loop-data":  "http://" + rep.Addr(),
		"loop-name":  "http://localhost:" + port(rep.Addr()),
		"loop-admin": "http://127.0.0.1:" + port(rep.AdminAddr()),
	}
	l := membership.Layout{}
	for id, addr := range loops {
		if _, err := f.Client().Put(ctx, l.InstanceKey("chat", id), `{"id":"`+id+`","addr":"`+addr+`"}`); err != nil {
			t.Fatal(err)
		}
	}
	testsupport.Eventually(t, 5*time.Second, "loop records counted as invalid upstreams", func() bool {
		return testsupport.Sum(t, rep.Registry(), "prefixrouter_membership_invalid_records_total", map[string]string{"kind": "upstream"}) == float64(len(loops))
	})
	before := testsupport.Sum(t, rep.Registry(), "prefixrouter_requests_total", nil)
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	for i := range 30 {
		resp, err := hc.Post(rep.URL()+"/invocations", "application/json", strings.NewReader(`{"inputs":"loop `+string(rune('a'+i%26))+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get(router.HeaderInstance) != "i-0" {
			t.Fatalf("request %d: status %d from %q", i, resp.StatusCode, resp.Header.Get(router.HeaderInstance))
		}
	}
	if got := testsupport.Sum(t, rep.Registry(), "prefixrouter_requests_total", nil) - before; got != 30 {
		t.Fatalf("the router served %v requests for 30 sent: records loop back to it", got)
	}
}
