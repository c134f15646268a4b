package proxybench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// answer is every stand-in backend's reply: a short SageMaker-style JSON
// body, sent at once (zero model time).
var answer = []byte(`[{"generated_text":"ok"}]`)

// backends are the zero-delay stand-ins for model servers, all served by
// this process on loopback. Close stops them and waits.
type backends struct {
	urls    []string
	servers []*http.Server
	wg      sync.WaitGroup
}

func startBackends(n int) (*backends, error) {
	b := &backends{}
	length := strconv.Itoa(len(answer))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read the whole body, as a model server must before it answers.
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header()["Content-Type"] = []string{"application/json"}
		w.Header()["Content-Length"] = []string{length}
		_, _ = w.Write(answer)
	})
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("proxybench: backend listen: %w", err)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
		b.servers = append(b.servers, srv)
		b.urls = append(b.urls, "http://"+ln.Addr().String())
		b.wg.Go(func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				panic(err) // a loopback listener that fails leaves the run meaningless
			}
		})
	}
	return b, nil
}

// Close stops every backend and waits for its serving goroutine.
func (b *backends) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range b.servers {
		if s.Shutdown(ctx) != nil {
			_ = s.Close()
		}
	}
	b.wg.Wait()
}
