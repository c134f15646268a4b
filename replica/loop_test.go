package replica_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// TestRecordsAtOwnListenersRefused reproduces issue 19's loop: a record
// pointing at the replica's own data port (inside the default allow list)
// turned 30 requests into 180 router requests. Records at the data and admin
// ports, in the spellings 127.0.0.1 and localhost, must be ignored and
// counted, and 30 requests must stay 30.
func TestRecordsAtOwnListenersRefused(t *testing.T) {
	f, rep, _ := startFleet(t, 1)
	loops := map[string]string{
		"loop-data":  "http://" + rep.Addr(),
		"loop-name":  "http://localhost:" + portOf(rep.Addr()),
		"loop-admin": "http://127.0.0.1:" + portOf(rep.AdminAddr()),
	}
	refusedAndNoLoop(t, f, rep, loops)
}

// portOf is the port of a host:port address.
func portOf(hostPort string) string { return hostPort[strings.LastIndex(hostPort, ":")+1:] }

// refusedAndNoLoop writes records for chat's instances, waits until each
// is counted as an invalid upstream, and checks that 30 requests reach
// instance i-0 and the router 30 times.
func refusedAndNoLoop(t *testing.T, f *localfleet.Fleet, rep *replica.Replica, records map[string]string) {
	t.Helper()
	ctx := testsupport.Context(t, 30*time.Second)
	l := membership.Layout{}
	for id, addr := range records {
		if _, err := f.Client().Put(ctx, l.InstanceKey("chat", id), `{"id":"`+id+`","addr":"`+addr+`"}`); err != nil {
			t.Fatal(err)
		}
	}
	testsupport.Eventually(t, 5*time.Second, "the records counted as invalid upstreams", func() bool {
		return testsupport.Sum(t, rep.Registry(), "prefixrouter_membership_invalid_records_total", map[string]string{"kind": "upstream"}) == float64(len(records))
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

// TestRecordsNamingOwnListenersRefused: a record whose host name resolves
// to the replica's own data or admin port looped as its IP literal did
// (issue 19: only literals and localhost were refused), and a name that
// resolves to a metadata address reached it. Names are resolved when the
// record is accepted (the resolver here answers loopback and metadata
// addresses for made-up names; nothing is looked up on the network): such
// records are ignored and counted, the others kept, and 30 requests stay 30.
func TestRecordsNamingOwnListenersRefused(t *testing.T) {
	names := map[string][]netip.Addr{
		"router.internal": {netip.MustParseAddr("127.0.0.1")},
		"admin.internal":  {netip.MustParseAddr("::ffff:127.0.0.1")},
		"meta.internal":   {netip.MustParseAddr("fd00:ec2::254")},
		"link.internal":   {netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("169.254.169.254")},
	}
	f, rep, _ := startFleetWith(t, 1, func(o *replica.Options) {
		o.AllowedUpstreams = append(slices.Clone(fleet.DefaultUpstreams), ".internal")
		o.Resolver = func(_ context.Context, host string) ([]netip.Addr, error) {
			if as, ok := names[host]; ok {
				return slices.Clone(as), nil
			}
			return nil, errors.New("no such host")
		}
	})
	refused := map[string]string{
		"loop-data":  "http://router.internal:" + portOf(rep.Addr()),
		"loop-admin": "http://admin.internal:" + portOf(rep.AdminAddr()),
		"metadata":   "http://meta.internal/",
		"link-local": "http://link.internal:8000",
	}
	refusedAndNoLoop(t, f, rep, refused)
}
