package localfleet

import (
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
)

// Stub returns the simplest model server an agent accepts, for
// Config.Backend: /health and /ping answer 200; /metrics reports the
// requests in flight as vLLM's vllm:num_requests_running (and 0 waiting),
// so that a stopping agent drains as soon as none runs; every other request
// is read and answered 200 with {"id":"<id>"}.
func Stub(id string) http.Handler {
	var inFlight atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health", "/ping":
			_, _ = io.WriteString(w, "ok\n")
			return
		case "/metrics":
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running %d\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n", inFlight.Load())
			return
		}
		inFlight.Add(1)
		defer inFlight.Add(-1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, "{\"id\":%q}\n", id)
	})
}
