package probe

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

func TestParseModels(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		base       string
		adapters   []string
		err        bool
	}{
		{"vllm", `{"object":"list","data":[{"id":"base","object":"model","parent":null},{"id":"lora-b","parent":"base"},{"id":"lora-a","parent":"base"},{"id":"lora-a","parent":"base"}]}`, "base", []string{"lora-a", "lora-b"}, false},
		{"no parent field", `{"data":[{"id":"m"}]}`, "m", nil, false},
		{"first base wins", `{"data":[{"id":"m"},{"id":"n","parent":""},{"id":""}]}`, "m", nil, false},
		{"empty", `{"object":"list","data":[]}`, "", nil, false},
		{"garbage", `<html>`, "", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := ParseModels(strings.NewReader(tc.body))
			if (err != nil) != tc.err {
				t.Fatalf("err = %v", err)
			}
			if m.Base != tc.base || !slices.Equal(m.Adapters, tc.adapters) {
				t.Fatalf("got %+v", m)
			}
		})
	}
}

func TestFetchModels(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(`{"data":[{"id":"base","parent":null},{"id":"lora-a","parent":"base"}]}`))
	}))
	defer srv.Close()
	m, err := FetchModels(context.Background(), srv.Client(), srv.URL+"/v1/models")
	if err != nil || m.Base != "base" || !slices.Equal(m.Adapters, []string{"lora-a"}) {
		t.Fatalf("FetchModels = %+v, %v", m, err)
	}
	if _, err := FetchModels(context.Background(), srv.Client(), srv.URL+"/models"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("404: err = %v", err)
	}
	// The list is 70 bytes: a bound of 70 reads it, 69 refuses it.
	if _, err := FetchModelsUpTo(context.Background(), srv.Client(), srv.URL+"/v1/models", 70); err != nil {
		t.Fatalf("a list at the bound: %v", err)
	}
	if _, err := FetchModelsUpTo(context.Background(), srv.Client(), srv.URL+"/v1/models", 69); err == nil || !strings.Contains(err.Error(), "exceeds 69 bytes") {
		t.Fatalf("a list over the bound: err = %v", err)
	}
}

// FuzzParseModels: an instance's /v1/models answer never panics the agent,
// and the adapters it yields are sorted, distinct and named.
func FuzzParseModels(f *testing.F) {
	for _, s := range []string{
		`{"data":[{"id":"base","parent":null},{"id":"lora-x","parent":"base"}]}`,
		`{"data":[]}`, `{"data":[{"id":""},{"id":"a","parent":""}]}`, `{}`, `[]`, `{"data":[{"id":"x","parent":"b"},{"id":"x","parent":"b"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseModels(bytes.NewReader(data))
		if err != nil {
			return
		}
		for i, a := range m.Adapters {
			if a == "" || (i > 0 && m.Adapters[i-1] >= a) {
				t.Fatalf("adapters %q not sorted, distinct and named", m.Adapters)
			}
		}
	})
}

// TestParseModelsEngines reads each engine's /v1/models from
// engine/testdata: llama-server's captured list (one base model, no
// adapters: it does not list them there), vLLM's and SGLang's built from
// their source (adapters with "parent" set).
func TestParseModelsEngines(t *testing.T) {
	for _, tc := range []struct {
		file, base string
		adapters   []string
		ownedBy    string
	}{
		{"llamacpp-c392e50/models.json", "tiny", nil, "llamacpp"},
		{"vllm-source/models.json", "meta-llama/Llama-3.1-8B-Instruct", []string{"sql-lora"}, "vllm"},
		{"sglang-source/models.json", "Qwen/Qwen2.5-7B-Instruct", []string{"sql-lora"}, "sglang"},
	} {
		b := testsupport.EngineTestdata(t, tc.file)
		m, err := ParseModels(bytes.NewReader(b))
		if err != nil || m.Base != tc.base || !slices.Equal(m.Adapters, tc.adapters) || !slices.Equal(m.OwnedBy, []string{tc.ownedBy}) {
			t.Errorf("%s: %+v, %v", tc.file, m, err)
		}
	}
}

// TestFetchIndexedAdapters serves llama-server's captured /lora-adapters
// (two adapters loaded at start) and the answers it must refuse.
func TestFetchIndexedAdapters(t *testing.T) {
	captured := testsupport.EngineTestdata(t, "llamacpp-c392e50/lora-adapters.json")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/lora-adapters":
			w.Header().Set("Server", "llama.cpp")
			w.Write(captured)
		case "/gap":
			w.Write([]byte(`[{"id":1,"path":"a.gguf","scale":1}]`))
		case "/nopath":
			w.Write([]byte(`[{"id":0,"scale":1}]`))
		case "/object":
			w.Write([]byte(`{"id":0}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	got, err := FetchIndexedAdapters(context.Background(), srv.Client(), srv.URL+"/lora-adapters")
	want := []IndexedAdapter{{0, "models/sql-lora.gguf", 1}, {1, "models/chat-lora.gguf", 1}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("FetchIndexedAdapters = %+v, %v; want %+v", got, err, want)
	}
	for _, path := range []string{"/gap", "/nopath", "/object", "/missing"} {
		if got, err := FetchIndexedAdapters(context.Background(), srv.Client(), srv.URL+path); err == nil {
			t.Errorf("%s: %+v accepted", path, got)
		}
	}
	// FetchModels keeps the Server header, which names llama-server.
	srv2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Server", "llama.cpp")
		w.Write([]byte(`{"data":[{"id":"tiny","owned_by":"llamacpp"}]}`))
	}))
	defer srv2.Close()
	if m, err := FetchModels(context.Background(), srv2.Client(), srv2.URL); err != nil || m.Server != "llama.cpp" || m.Base != "tiny" {
		t.Fatalf("FetchModels = %+v, %v", m, err)
	}
}
