package sim_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prefixrouter/prefixrouter/internal/sim"
)

// Two requests sharing a long system prompt: the second one hits the
// prefix cache.
func ExampleNew() {
	srv, err := sim.New(sim.Options{ID: "sim-0", TimeScale: 100})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	hs := httptest.NewServer(srv)
	defer hs.Close()

	system := strings.Repeat("You are a helpful assistant. ", 200)
	for _, q := range []string{"Hi!", "Hello?"} {
		body := fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"max_tokens":4}`, system, q)
		resp, err := http.Post(hs.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			panic(err)
		}
		var r struct {
			Usage struct {
				PromptTokens        int `json:"prompt_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		fmt.Println(resp.Header.Get("X-Instance-Id"), r.Usage.PromptTokens, r.Usage.PromptTokensDetails.CachedTokens)
	}
	// Output:
	// sim-0 1460 0
	// sim-0 1461 1440
}
