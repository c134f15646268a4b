package replica

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/router"
)

// TestPopularityStatic: a replica of a static fleet publishes its popular
// prefixes into its own snapshot every interval: a prompt every request
// repeats becomes hot there, and requests held on it then spread.
func TestPopularityStatic(t *testing.T) {
	rep, err := Start(context.Background(), Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Static: backends(t, 3), Logger: quiet,
		Router: router.Options{DefaultEndpoint: "chat"}, PopularityInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rep.Close(context.Background()) })
	body := fmt.Sprintf(`{"inputs":%q}`, strings.Repeat("one prompt for all. ", 300))
	client := &http.Client{Timeout: 10 * time.Second}
	for range 200 {
		resp, err := client.Post(rep.URL()+"/invocations", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	testsupport.Eventually(t, 10*time.Second, "the prompt hot in the replica's snapshot", func() bool {
		for _, k := range rep.Router().Snapshot().Endpoint("chat").Popular {
			if k.K == 3 {
				return true
			}
		}
		return false
	})
	ex, err := rep.Router().Explain(context.Background(), router.PickRequest{Path: "/invocations", Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	if ex.HotReplicas != 3 {
		t.Fatalf("explained with k = %d, want 3", ex.HotReplicas)
	}
}

// TestPopularityChanged: a view is written again only when it moved
// enough to matter.
func TestPopularityChanged(t *testing.T) {
	base := fleet.Popularity{Rate: 10, Keys: []fleet.PopularKey{{Key: 1, Share: 0.4, K: 3}, {Key: 2, Share: 0.02, K: 1}}}
	with := func(f func(*fleet.Popularity)) fleet.Popularity {
		p := base
		p.Keys = append([]fleet.PopularKey(nil), base.Keys...)
		f(&p)
		return p
	}
	for _, tc := range []struct {
		name string
		p    fleet.Popularity
		want bool
	}{
		{"same", with(func(*fleet.Popularity) {}), false},
		{"share drift under a tenth", with(func(p *fleet.Popularity) { p.Keys[0].Share = 0.43 }), false},
		{"small share drift under half a point", with(func(p *fleet.Popularity) { p.Keys[1].Share = 0.024 }), false},
		{"share moved", with(func(p *fleet.Popularity) { p.Keys[0].Share = 0.3 }), true},
		{"k moved", with(func(p *fleet.Popularity) { p.Keys[0].K = 4 }), true},
		{"key gone", with(func(p *fleet.Popularity) { p.Keys = p.Keys[:1] }), true},
		{"key replaced", with(func(p *fleet.Popularity) { p.Keys[1].Key = 3 }), true},
		{"rate drift", with(func(p *fleet.Popularity) { p.Rate = 12 }), false},
		{"rate moved", with(func(p *fleet.Popularity) { p.Rate = 20 }), true},
	} {
		if got := popularityChanged(base, tc.p); got != tc.want {
			t.Errorf("%s: changed = %v, want %v", tc.name, got, tc.want)
		}
	}
}
