package replica_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/engine"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// fakeLlamaServer answers /v1/models, /lora-adapters and chat completions
// with what llama-server c392e50 answered when captured
// (engine/testdata/llamacpp-c392e50), its Server header included, and
// keeps the last chat body it received.
func fakeLlamaServer(t *testing.T) (*httptest.Server, func() []byte) {
	t.Helper()
	read := func(f string) []byte { return testsupport.EngineTestdata(t, "llamacpp-c392e50/"+f) }
	models, adapters, chat := read("models.json"), read("lora-adapters.json"), read("chat-warm.json")
	var (
		mu   sync.Mutex
		last []byte
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Server", "llama.cpp")
		switch r.URL.Path {
		case "/v1/models":
			w.Write(models)
		case "/lora-adapters":
			w.Write(adapters)
		case "/v1/chat/completions":
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			last = b
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.Write(chat)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, func() []byte {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
}

// TestStaticFleetEngines: `serve --static-instances` in front of
// llama-server (issue 20). The replica asks each instance what it is: the
// engine (llamacpp, from owned_by and the Server header), the model it
// lists ("tiny"), and the adapters it loaded at start with their
// positions. Then the token metrics name the model instead of "unlisted",
// count the cached tokens llama-server reports in its timings (656 of
// 657), and a request naming an adapter reaches llama-server with it
// selected by position; a declared adapter it did not load is not routed
// to it.
func TestStaticFleetEngines(t *testing.T) {
	srv, last := fakeLlamaServer(t)
	insts, err := fleet.ParseStaticInstances("llama=" + srv.URL + ";adapters=sql-lora+not-loaded")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := replica.Start(ctx, replica.Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0",
		Router: router.Options{DefaultEndpoint: "ep"}, Static: insts, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close(context.Background())
	var in fleet.Instance
	testsupport.Eventually(t, 10*time.Second, "the static instance probed", func() bool {
		in = rep.Router().Snapshot().Endpoint("ep").Instances[0]
		return in.Engine == engine.LlamaCpp
	})
	if want := map[string]int{"sql-lora": 0, "chat-lora": 1}; !maps.Equal(in.AdapterIndex, want) ||
		!slices.Equal(in.Adapters, []string{"chat-lora", "sql-lora"}) || !slices.Equal(in.Listed, []string{"tiny", "chat-lora", "sql-lora"}) {
		t.Fatalf("probed record %+v", in)
	}

	post := func(model string) {
		t.Helper()
		body := `{"model":"` + model + `","messages":[{"role":"user","content":"hello"}]}`
		resp, err := http.Post(rep.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", model, resp.StatusCode, b)
		}
	}
	post("tiny")
	var sent struct {
		Lora *[]map[string]any `json:"lora"`
	}
	if err := json.Unmarshal(last(), &sent); err != nil || sent.Lora == nil || len(*sent.Lora) != 0 {
		t.Fatalf("base-model request reached llama-server as %s", last())
	}
	reg := rep.Registry()
	labels := map[string]string{"model": "tiny", "instance": "llama"}
	testsupport.Eventually(t, 10*time.Second, "tokens counted under the listed model", func() bool {
		return testsupport.Sum(t, reg, "prefixrouter_prompt_tokens_total", labels) == 657
	})
	if got := testsupport.Sum(t, reg, "prefixrouter_cached_prompt_tokens_total", labels); got != 656 {
		t.Fatalf("cached prompt tokens %v, want 656", got)
	}
	if got := testsupport.Sum(t, reg, "prefixrouter_prompt_tokens_total", map[string]string{"model": "unlisted"}); got != 0 {
		t.Fatalf("%v tokens labelled unlisted", got)
	}

	post("chat-lora")
	if !strings.HasPrefix(string(last()), `{"lora":[{"id":1,"scale":1}],"model":"chat-lora"`) {
		t.Fatalf("adapter request reached llama-server as %s", last())
	}
	testsupport.Eventually(t, 10*time.Second, "the adapter's tokens counted under its name", func() bool {
		return testsupport.Sum(t, reg, "prefixrouter_cached_prompt_tokens_total", map[string]string{"model": "chat-lora"}) == 656
	})
}
