package router

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

// TestModelsCachedAndBounded reproduces issue 19's /v1/models probe: 40
// concurrent calls while one instance listed 8 MiB of models took +2,378
// MiB, every call asking every instance with no cache and no size bound.
// Now the 40 calls share one query per instance, an instance's list longer
// than 1 MiB is left out, and the calls allocate a small multiple of that
// (TotalAlloc, all goroutines).
func TestModelsCachedAndBounded(t *testing.T) {
	var asked atomic.Int64
	release := make(chan struct{})
	// 8 MiB of adapter names, as in the issue.
	var big strings.Builder
	big.WriteString(`{"object":"list","data":[{"id":"base","parent":null}`)
	for i := 0; big.Len() < 8<<20; i++ {
		fmt.Fprintf(&big, `,{"id":"adapter-%07d","parent":"base"}`, i)
	}
	big.WriteString(`]}`)
	huge := newBackend(t, "huge")
	huge.handler = func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		<-release
		_, _ = io.WriteString(w, big.String())
	}
	small := newBackend(t, "small")
	small.handler = func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		_, _ = io.WriteString(w, `{"data":[{"id":"base"},{"id":"lora-s","parent":"base"}]}`)
	}
	r, err := New(Options{DefaultEndpoint: "ep", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Instances: []fleet.Instance{
		{ID: "huge", Addr: huge.srv.URL, Adapters: []string{"lora-rec"}},
		{ID: "small", Addr: small.srv.URL},
	}}}, 0, 1, time.Now()))
	srv := httptest.NewServer(r)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	get := func() ([]string, error) {
		resp, err := client.Get(srv.URL + "/v1/models")
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		var list modelList
		if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
			return nil, err
		}
		var ids []string
		for _, m := range list.Data {
			ids = append(ids, m.ID)
		}
		return ids, nil
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const calls = 40
	var wg sync.WaitGroup
	answers := make(chan []string, calls)
	for range calls {
		wg.Go(func() {
			ids, err := get()
			if err != nil {
				t.Error(err)
			}
			answers <- ids
		})
	}
	// Every call is in: the first asks the instances, the others wait for
	// its answer.
	testsupport.Eventually(t, 5*time.Second, "the instances asked", func() bool { return asked.Load() >= 2 })
	close(release)
	wg.Wait()
	runtime.ReadMemStats(&after)
	close(answers)
	for ids := range answers {
		if got := strings.Join(ids, ","); got != "base,lora-rec,lora-s" {
			t.Fatalf("models %q: want the records' and the small instance's, without the 8 MiB list", got)
		}
	}
	if n := asked.Load(); n != 2 {
		t.Fatalf("%d calls asked the instances %d times, want once each", calls, n)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d calls allocated %d KiB", calls, alloc>>10)
	if alloc > 16<<20 {
		t.Fatalf("%d calls allocated %d MiB, want < 16", calls, alloc>>20)
	}
	// Within the TTL no instance is asked again; a new snapshot asks again.
	if _, err := get(); err != nil {
		t.Fatal(err)
	}
	if n := asked.Load(); n != 2 {
		t.Fatalf("a call within the TTL asked the instances (%d queries)", n)
	}
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Instances: []fleet.Instance{{ID: "small", Addr: small.srv.URL}}}}, 0, 1, time.Now()))
	if ids, err := get(); err != nil || strings.Join(ids, ",") != "base,lora-s" {
		t.Fatalf("after a new snapshot: %v %v", ids, err)
	}
}
