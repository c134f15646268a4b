package replica

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/router"
)

// TestPprofOnlyWithTheFlag starts a replica without and with Options.Pprof:
// the admin listener answers 404 for /debug/pprof/ without it, and with it
// serves the index and a heap profile.
func TestPprofOnlyWithTheFlag(t *testing.T) {
	get := func(t *testing.T, url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	for _, on := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		rep, err := Start(ctx, Options{
			Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Logger: quiet,
			Static: backends(t, 1), Router: router.Options{DefaultEndpoint: "chat"},
			Pprof: on,
		})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		base := "http://" + rep.AdminAddr()
		code, body := get(t, base+"/debug/pprof/")
		heap, _ := get(t, base+"/debug/pprof/heap?debug=1")
		rep.Close(context.Background())
		cancel()
		switch {
		case !on && (code != http.StatusNotFound || heap != http.StatusNotFound):
			t.Errorf("without Pprof: /debug/pprof/ = %d, heap = %d, want 404 and 404", code, heap)
		case on && (code != http.StatusOK || !strings.Contains(body, "goroutine") || heap != http.StatusOK):
			t.Errorf("with Pprof: /debug/pprof/ = %d (%.60q), heap = %d, want 200 listing profiles and 200", code, body, heap)
		}
	}
}
