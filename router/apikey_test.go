package router

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

const testKey = "sk-test-0123456789abcdef"

func TestParseAPIKeys(t *testing.T) {
	sum := sha256.Sum256([]byte("another-key-0123456789"))
	digest := "sha256:" + hex.EncodeToString(sum[:])
	keys, err := ParseAPIKeys([]byte("# keys of team a\n\n  " + testKey + "  \n" + digest + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	k := newAPIKeys(keys)
	for _, tc := range []struct {
		key  string
		want bool
	}{{testKey, true}, {"another-key-0123456789", true}, {testKey + "x", false}, {testKey[:len(testKey)-1], false}, {"", false}, {digest, false}} {
		if got := k.allows(tc.key); got != tc.want {
			t.Errorf("allows(%q) = %v, want %v", tc.key, got, tc.want)
		}
	}
	for _, e := range keys {
		if strings.Contains(e, testKey) {
			t.Fatal("the parsed entries keep a key in clear")
		}
	}
	for _, bad := range []string{
		"", "# only a comment\n", "short-key\n", "a key with spaces in it\n", "key-with-a-control-\x01-character\n",
		"sha256:abc\n", "sha256:" + strings.Repeat("zz", 32) + "\n", "sha256:" + strings.Repeat("ab", 33) + "\n",
	} {
		_, err := ParseAPIKeys([]byte(bad))
		if !errors.Is(err, fleet.ErrInvalid) {
			t.Errorf("%q: err %v, want ErrInvalid", bad, err)
		}
		if err != nil && len(bad) > 8 && strings.Contains(err.Error(), strings.TrimSpace(bad)) {
			t.Errorf("the error quotes the key: %v", err)
		}
	}
}

// TestAPIKeys: with keys on, every data-plane path asks for one (401 in
// the API's error shape without), the probes do not, and the key goes
// neither upstream nor into the logs, at any log level.
func TestAPIKeys(t *testing.T) {
	var mu sync.Mutex
	var seen []http.Header
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
	}))
	defer up.Close()
	keys, err := ParseAPIKeys([]byte(testKey))
	if err != nil {
		t.Fatal(err)
	}
	var logs testsupport.LogBuffer
	r, err := New(Options{DefaultEndpoint: "ep", APIKeys: keys, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Instances: []fleet.Instance{{ID: "a", Addr: up.URL}}}}, 0, 1, time.Now()))
	srv := httptest.NewServer(r)
	defer srv.Close()

	chat := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	tests := []struct {
		name, method, path, body string
		header                   map[string]string
		want                     int
		errType                  string // X-Amzn-ErrorType of a 401 on invoke paths; "" on OpenAI ones
	}{
		{"chat with the key", "POST", "/v1/chat/completions", chat, map[string]string{"Authorization": "Bearer " + testKey}, 200, ""},
		{"chat with a lowercase scheme", "POST", "/v1/chat/completions", chat, map[string]string{"Authorization": "bearer " + testKey}, 200, ""},
		{"chat without a key", "POST", "/v1/chat/completions", chat, nil, 401, ""},
		{"chat with a wrong key", "POST", "/v1/chat/completions", chat, map[string]string{"Authorization": "Bearer " + testKey + "x"}, 401, ""},
		{"chat with basic auth", "POST", "/v1/chat/completions", chat, map[string]string{"Authorization": "Basic " + testKey}, 401, ""},
		{"models without a key", "GET", "/v1/models", "", nil, 401, ""},
		{"models with the key", "GET", "/v1/models", "", map[string]string{"Authorization": "Bearer " + testKey}, 200, ""},
		{"scoped chat without a key", "POST", "/endpoints/ep/openai/v1/chat/completions", chat, nil, 401, ""},
		{"invoke with the key header beside SigV4", "POST", "/invocations", "x", map[string]string{HeaderAPIKey: testKey, "Authorization": "AWS4-HMAC-SHA256 Credential=AKID/20261201/us-east-1/sagemaker/aws4_request, SignedHeaders=host, Signature=00"}, 200, ""},
		{"invoke with a bearer key", "POST", "/endpoints/ep/invocations", "x", map[string]string{"Authorization": "Bearer " + testKey}, 200, ""},
		{"invoke with SigV4 only", "POST", "/invocations", "x", map[string]string{"Authorization": "AWS4-HMAC-SHA256 Credential=AKID/20261201/us-east-1/sagemaker/aws4_request, SignedHeaders=host, Signature=00"}, 401, errUnrecognizedClient},
		{"invoke with a wrong key header", "POST", "/endpoints/ep/invocations", "x", map[string]string{HeaderAPIKey: "sk-wrong-0123456789abcdef"}, 401, errUnrecognizedClient},
		{"response stream without a key", "POST", "/endpoints/ep/invocations-response-stream", "x", nil, 401, errUnrecognizedClient},
		{"unknown path without a key", "GET", "/admin", "", nil, 401, ""},
		{"ping without a key", "GET", "/ping", "", nil, 200, ""},
		{"healthz without a key", "GET", "/healthz", "", nil, 200, ""},
		{"readyz without a key", "GET", "/readyz", "", nil, 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, srv.URL+tt.path, strings.NewReader(tt.body))
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.want, body)
			}
			if tt.want != 401 {
				return
			}
			if resp.Header.Get("WWW-Authenticate") == "" {
				t.Error("a 401 without WWW-Authenticate")
			}
			if got := resp.Header.Get(HeaderErrorType); got != tt.errType {
				t.Errorf("X-Amzn-ErrorType %q, want %q", got, tt.errType)
			}
			if tt.errType != "" {
				var e sageMakerError
				if json.Unmarshal(body, &e) != nil || e.ErrorCode != errUnrecognizedClient || !strings.Contains(e.Message, HeaderAPIKey) {
					t.Errorf("SageMaker error body %s", body)
				}
			} else {
				var e openAIError
				if json.Unmarshal(body, &e) != nil || e.Error.Code != codeInvalidAPIKey || e.Error.Type != "invalid_request_error" {
					t.Errorf("OpenAI error body %s", body)
				}
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) == 0 {
		t.Fatal("no request reached the instance")
	}
	for _, h := range seen {
		if h.Get("Authorization") != "" || h.Get(HeaderAPIKey) != "" {
			t.Fatalf("the instance received the client's credentials: %v", h)
		}
		for _, vs := range h {
			for _, v := range vs {
				if strings.Contains(v, testKey) {
					t.Fatalf("the key went upstream in %v", h)
				}
			}
		}
	}
	if strings.Contains(logs.String(), testKey) || strings.Contains(logs.String(), testKey[3:]) {
		t.Fatalf("the key is in the logs:\n%s", logs.String())
	}
}

// TestNoAPIKeysForwardsAuthorization: with keys off (the default) the
// router neither asks for a key nor touches Authorization, as before.
func TestNoAPIKeysForwardsAuthorization(t *testing.T) {
	got := make(chan string, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
	}))
	defer up.Close()
	r, err := New(Options{DefaultEndpoint: "ep", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: "ep", Instances: []fleet.Instance{{ID: "a", Addr: up.URL}}}}, 0, 1, time.Now()))
	srv := httptest.NewServer(r)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/invocations", strings.NewReader("x"))
	req.Header.Set("Authorization", "Bearer upstream-token")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || <-got != "Bearer upstream-token" {
		t.Fatalf("status %d; Authorization not forwarded with keys off", resp.StatusCode)
	}
}
