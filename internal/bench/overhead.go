package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Overhead is the latency a router adds to a request, measured from the
// outside: the same kind of tiny request (a few prompt tokens, one output
// token, distinct text each time so no cache is involved) sent straight to
// the instances and through the router, alternately, one at a time, on an
// idle fleet. Figures are wall-clock milliseconds (not scaled by a time
// scale): the router's own cost does not run faster with the simulator.
type Overhead struct {
	Label    string    `json:"label"`
	Requests int       `json:"requests"`
	Direct   Quantiles `json:"direct_ms"`
	Routed   Quantiles `json:"routed_ms"`
	// AddedP50Ms and AddedP90Ms are Routed minus Direct at those quantiles.
	AddedP50Ms float64 `json:"added_p50_ms"`
	AddedP90Ms float64 `json:"added_p90_ms"`
}

// MeasureOverhead sends n tiny chat requests through the routers and n
// straight to the instances (both lists of base URLs, used round-robin),
// alternating, and returns the latency the routers add. model may be empty.
func MeasureOverhead(ctx context.Context, client *http.Client, routers, instances []string, n int, model, label string) (Overhead, error) {
	if len(routers) == 0 || len(instances) == 0 || n < 1 {
		return Overhead{}, errors.New("bench: overhead needs routers, instances and n ≥ 1")
	}
	if client == nil {
		client = http.DefaultClient
	}
	direct := make([]float64, 0, n)
	routed := make([]float64, 0, n)
	for i := 0; i < n; i++ {
		body, err := overheadBody(model, fmt.Sprintf("overhead probe %d of %s", i, label))
		if err != nil {
			return Overhead{}, err
		}
		// Alternate which goes first, so drift affects both sides alike.
		order := []bool{true, false}
		if i%2 == 1 {
			order = []bool{false, true}
		}
		for _, viaRouter := range order {
			base := instances[i%len(instances)]
			if viaRouter {
				base = routers[i%len(routers)]
			}
			d, err := timeOne(ctx, client, strings.TrimRight(base, "/")+"/v1/chat/completions", body)
			if err != nil {
				return Overhead{}, err
			}
			if viaRouter {
				routed = append(routed, d)
			} else {
				direct = append(direct, d)
			}
		}
	}
	o := Overhead{Label: label, Requests: n, Direct: quantiles(direct), Routed: quantiles(routed)}
	o.AddedP50Ms = o.Routed.P50 - o.Direct.P50
	o.AddedP90Ms = o.Routed.P90 - o.Direct.P90
	return o, nil
}

func overheadBody(model, text string) ([]byte, error) {
	req := map[string]any{
		"messages":   []map[string]string{{"role": "user", "content": text}},
		"max_tokens": 1,
	}
	if model != "" {
		req["model"] = model
	}
	return json.Marshal(req)
}

// timeOne returns the milliseconds from sending the request to reading the
// whole response.
func timeOne(ctx context.Context, client *http.Client, url string, body []byte) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("bench: overhead probe %s: %w", url, err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	elapsed := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("bench: overhead probe %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("bench: overhead probe %s: status %d", url, resp.StatusCode)
	}
	return float64(elapsed) / float64(time.Millisecond), nil
}
