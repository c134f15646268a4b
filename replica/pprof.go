package replica

import (
	"net/http"
	"net/http/pprof"
)

// handlePprof serves Go's profiles under /debug/pprof/ (Options.Pprof):
// `go tool pprof http://ADMIN/debug/pprof/profile?seconds=20` for CPU,
// `.../debug/pprof/allocs` for allocations. The handlers go on the admin
// mux only; the import's registration on http.DefaultServeMux is never
// served.
func handlePprof(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", pprof.Index) // heap, allocs, goroutine … by name
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("POST /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}
