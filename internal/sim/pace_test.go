package sim

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkPace measures how closely a client timing in wall time ×
// TimeScale sees the simulated time (issue 22): four streamed requests of
// 1,500 output tokens at once against one server at TimeScale 12, and the
// ratio of the client's wall × 12 to the mean simulated E2E the server's
// metrics record. 1 is exact; every late timer wake-up used to add to it.
//
//	go test -run '^$' -bench BenchmarkPace -benchtime 3x ./internal/sim
func BenchmarkPace(b *testing.B) {
	const scale, n = 12, 4
	for range b.N {
		s, err := New(Options{Profile: ProfileH200Llama8BRoofline, TimeScale: scale})
		if err != nil {
			b.Fatal(err)
		}
		hs := httptest.NewServer(s)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range n {
			wg.Go(func() {
				body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":1500,"ignore_eos":true,"messages":[{"role":"user","content":"%d %s"}]}`,
					DefaultBaseModel, i, strings.Repeat("word ", 2000))
				resp, err := http.Post(hs.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			})
		}
		wg.Wait()
		client := time.Since(start).Seconds() * scale
		mfs, err := s.m.reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		var sum float64
		var count uint64
		for _, mf := range mfs {
			if mf.GetName() == "vllm:e2e_request_latency_seconds" {
				h := mf.GetMetric()[0].GetHistogram()
				sum, count = h.GetSampleSum(), h.GetSampleCount()
			}
		}
		hs.Close()
		s.Close()
		if count != n {
			b.Fatalf("%d requests finished, want %d", count, n)
		}
		b.ReportMetric(client/(sum/n), "client/sim")
	}
}
