package bench

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestMeasureOverhead puts a proxy that adds a known delay in front of a
// real simulator: the measured added latency must show that delay, and the
// report must carry it.
func TestMeasureOverhead(t *testing.T) {
	inst := newSim(t, "sim-0", 100_000)
	u, _ := url.Parse(inst.URL)
	const delay = 5 * time.Millisecond
	rp := httputil.NewSingleHostReverseProxy(u)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(delay) // the latency under measurement, not a wait for an event
		rp.ServeHTTP(w, r)
	}))
	defer proxy.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o, err := MeasureOverhead(ctx, nil, []string{proxy.URL}, []string{inst.URL}, 30, "", "PREFIX_AWARE")
	if err != nil {
		t.Fatal(err)
	}
	if o.Requests != 30 || o.Direct.N != 30 || o.Routed.N != 30 {
		t.Fatalf("samples: %+v", o)
	}
	if o.AddedP50Ms < float64(delay)/float64(time.Millisecond)*0.8 || o.AddedP50Ms > 100 {
		t.Fatalf("added p50 = %.2f ms, want about %v", o.AddedP50Ms, delay)
	}
	cmp := &Comparison{Overheads: []Overhead{o}}
	var md, html bytes.Buffer
	if err := cmp.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if err := cmp.WriteHTML(&html); err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{md.String(), html.String()} {
		if !strings.Contains(out, "Router overhead") || !strings.Contains(out, "PREFIX_AWARE") {
			t.Fatalf("report lacks the overhead table:\n%s", out)
		}
	}
}

func TestMeasureOverheadErrors(t *testing.T) {
	ctx := context.Background()
	if _, err := MeasureOverhead(ctx, nil, nil, []string{"http://127.0.0.1:1"}, 1, "", "x"); err == nil {
		t.Fatal("no routers: want an error")
	}
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no", http.StatusServiceUnavailable)
	}))
	defer bad.Close()
	if _, err := MeasureOverhead(ctx, nil, []string{bad.URL}, []string{bad.URL}, 1, "", "x"); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("a failing probe must fail the measurement: %v", err)
	}
}
