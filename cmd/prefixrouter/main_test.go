package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/membership/etcdtest"
	"github.com/prefixrouter/prefixrouter/replica"
)

// runCLI runs the command line in process and returns its outputs and exit code.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code = run(ctx, args, &out, &errb)
	return out.String(), errb.String(), code
}

func TestEnvName(t *testing.T) {
	if got := envName("etcd-endpoints"); got != "PREFIXROUTER_ETCD_ENDPOINTS" {
		t.Fatalf("envName = %q", got)
	}
}

func TestHelpListsEnvironment(t *testing.T) {
	out, _, code := runCLI(t, "serve", "--help")
	if code != 0 {
		t.Fatalf("serve --help exited %d", code)
	}
	for _, want := range []string{"--static-instances", "$PREFIXROUTER_STATIC_INSTANCES", "--embedded-etcd", "--concurrency-threshold", "--pprof", "$PREFIXROUTER_PPROF"} {
		if !strings.Contains(out, want) {
			t.Errorf("serve --help lacks %q", want)
		}
	}
	for _, sub := range []string{"register", "config", "modelsim", "bench", "demo", "chaos"} {
		if _, _, code := runCLI(t, sub, "--help"); code != 0 {
			t.Errorf("%s --help exited %d", sub, code)
		}
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"serve", "--no-such-flag"}, "unknown flag"},
		{"unknown command", []string{"frobnicate"}, "unknown command"},
		{"prefix length out of range", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--prefix-length", "100"}, "PrefixLength 100"},
		{"threshold out of range", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--concurrency-threshold", "2000"}, "ConcurrencyThreshold 2000"},
		{"bad strategy", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--strategy", "ROUND_ROBIN"}, "RoutingStrategy"},
		{"bad static fleet", []string{"serve", "--static-instances", "nourl"}, "--static-instances"},
		{"static with etcd", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--etcd-endpoints", "http://127.0.0.1:1"}, "excludes"},
		{"negative health check interval", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--health-check-interval", "-1s"}, "--health-check-interval"},
		{"negative health check timeout", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--health-check-timeout", "-1s"}, "--health-check-timeout"},
		{"relative health check path", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--health-check-path", "health"}, "--health-check-path"},
		{"api keys file missing", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--api-keys-file", "/nonexistent/keys"}, "--api-keys-file"},
		{"api keys file empty", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--api-keys-file", os.DevNull}, "lists no key"},
		{"unknown threshold share", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--threshold-share", "even"}, "--threshold-share"},
		{"negative rate interval", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--rate-interval", "-1s"}, "--rate-interval"},
		{"session key file missing", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--session-key-file", "/nonexistent/key"}, "--session-key-file"},
		{"session key too short", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--session-key-file", shortKeyFile(t)}, "want at least 32"},
		{"header count negative", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--max-header-count", "-1"}, "--max-header-count"},
		{"negative upstream idle timeout", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--upstream-idle-timeout", "-1s"}, "--upstream-idle-timeout"},
		{"gc percent below -1", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--gc-percent", "-2"}, "--gc-percent"},
		{"max ejection percent over 100", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--max-ejection-percent", "101"}, "--max-ejection-percent) 101 is outside 1..100"},
		{"max ejection percent negative", []string{"serve", "--static-instances", "a=http://127.0.0.1:1", "--max-ejection-percent", "-1"}, "--max-ejection-percent) -1"},
		{"register without id", []string{"register", "--addr", "http://127.0.0.1:1"}, "--id and --addr are required"},
		{"register unknown engine", []string{"register", "--id", "a", "--addr", "http://127.0.0.1:1", "--engine", "vllm2"}, "unknown engine \"vllm2\" (want one of vllm, sglang, llamacpp, tgi"},
		{"bench without target", []string{"bench"}, "--target"},
		{"unknown preset", []string{"bench", "--target", "http://127.0.0.1:1", "--preset", "nope"}, "nope"},
		{"config set bad json", []string{"config", "set", "--routing-config", "{bad"}, "--routing-config"},
		{"config set first-byte timeout zero", []string{"config", "set", "--first-byte-timeout", "0s"}, "--first-byte-timeout"},
		{"config set first-byte timeout negative", []string{"config", "set", "--first-byte-timeout", "-1s"}, "--first-byte-timeout"},
		{"config set first-byte timeout sub-millisecond", []string{"config", "set", "--first-byte-timeout", "1500us"}, "--first-byte-timeout"},
		{"config set first-byte timeout beyond an hour", []string{"config", "set", "--first-byte-timeout", "2h"}, "FirstByteTimeoutInMilliseconds 7200000"},
		{"config set first-byte timeout zero in JSON", []string{"config", "set", "--routing-config", `{"RoutingStrategy":"RANDOM","FirstByteTimeoutInMilliseconds":0}`}, "FirstByteTimeoutInMilliseconds 0"},
		{"config set first-byte timeout with JSON", []string{"config", "set", "--routing-config", `{"RoutingStrategy":"RANDOM"}`, "--first-byte-timeout", "1s"}, "excludes --first-byte-timeout"},
		{"adapter add without name", []string{"adapter", "add", "--source", "s"}, "adapter name"},
		{"adapter add without source", []string{"adapter", "add", "--name", "a"}, "source"},
		{"adapter add min above max", []string{"adapter", "add", "--name", "a", "--source", "s", "--min-replicas", "4", "--max-replicas", "2"}, "below minReplicas"},
		{"adapter add negative", []string{"adapter", "add", "--name", "a", "--source", "s", "--min-replicas", "-1"}, "replicas"},
		{"adapter remove bad name", []string{"adapter", "remove", "--name", "a/b"}, "--name"},
		{"adapter list bad endpoint", []string{"adapter", "list", "--endpoint", "a b"}, "--endpoint"},
		{"demo unknown workload", []string{"demo", "--workload", "nope"}, "nope"},
		{"demo unknown capacity mode", []string{"demo", "--capacity", "maybe"}, "maybe"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, stderr, code := runCLI(t, tt.args...)
			if code != 2 || !strings.Contains(stderr, tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit 2 mentioning %q", code, stderr, tt.want)
			}
		})
	}
}

func TestEnvironmentSetsFlags(t *testing.T) {
	t.Setenv("PREFIXROUTER_PREFIX_LENGTH", "100")
	_, stderr, code := runCLI(t, "serve", "--static-instances", "a=http://127.0.0.1:1")
	if code != 2 || !strings.Contains(stderr, "PrefixLength 100") {
		t.Fatalf("env PREFIXROUTER_PREFIX_LENGTH=100 not applied: exit %d, %q", code, stderr)
	}
	t.Setenv("PREFIXROUTER_CONCURRENCY_THRESHOLD", "many")
	_, stderr, code = runCLI(t, "serve", "--static-instances", "a=http://127.0.0.1:1")
	if code != 2 || !strings.Contains(stderr, "PREFIXROUTER_CONCURRENCY_THRESHOLD") {
		t.Fatalf("a malformed environment value must name the variable: exit %d, %q", code, stderr)
	}
}

func TestConfigSetGetAgainstEtcd(t *testing.T) {
	e := etcdtest.Start(t)
	url := e.ClientURL()
	_, stderr, code := runCLI(t, "config", "get", "--etcd-endpoints", url, "--endpoint", "chat")
	if code != 0 || !strings.Contains(stderr, "no config set") {
		t.Fatalf("config get on an empty etcd: exit %d, %q", code, stderr)
	}
	out, stderr, code := runCLI(t, "config", "set", "--etcd-endpoints", url, "--endpoint", "chat",
		"--strategy", "least_outstanding_requests", "--prefix-length", "2048", "--concurrency-threshold", "4", "--first-byte-timeout", "250ms",
		"--hot-key-replication", "--tenant-cache-salt", "--production-variants", "blue=4,green=0.5")
	if code != 0 {
		t.Fatalf("config set: exit %d, %q", code, stderr)
	}
	want := fleet.RoutingConfig{
		RoutingStrategy:                fleet.LeastOutstanding,
		PrefixAwareRoutingConfig:       &fleet.PrefixAwareConfig{PrefixLength: 2048, ConcurrencyThreshold: 4, HotKeyReplication: true},
		TenantCacheSalt:                true,
		ProductionVariants:             []fleet.ProductionVariant{{VariantName: "blue", InitialVariantWeight: 4}, {VariantName: "green", InitialVariantWeight: 0.5}},
		FirstByteTimeoutInMilliseconds: 250,
	}
	var set fleet.RoutingConfig
	if err := json.Unmarshal([]byte(out), &set); err != nil || !reflect.DeepEqual(set, want) {
		t.Fatalf("config set printed %q (%v), want %+v", out, err, want)
	}
	// An invalid value is refused with exit 2 and nothing is written.
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--routing-config", `{"RoutingStrategy":"PREFIX_AWARE","PrefixAwareRoutingConfig":{"PrefixLength":70000}}`}, "PrefixLength 70000"},
		{[]string{"--production-variants", "blue=-1"}, `InitialVariantWeight -1 of "blue"`},
		{[]string{"--production-variants", "blue"}, `--production-variants "blue": want NAME=WEIGHT`},
		{[]string{"--routing-config", `{}`, "--tenant-cache-salt"}, "--routing-config excludes --tenant-cache-salt"},
	} {
		_, stderr, code = runCLI(t, append([]string{"config", "set", "--etcd-endpoints", url, "--endpoint", "chat"}, tc.args...)...)
		if code != 2 || !strings.Contains(stderr, tc.msg) {
			t.Fatalf("config set %q: exit %d, %q; want exit 2 with %q", tc.args, code, stderr, tc.msg)
		}
	}
	out, _, code = runCLI(t, "config", "get", "--etcd-endpoints", url, "--endpoint", "chat")
	var got fleet.RoutingConfig
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("config get: exit %d, %q", code, out)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("config get = %+v, want the last valid config %+v", got, want)
	}
}

func TestServeEtcdDown(t *testing.T) {
	start := time.Now()
	_, stderr, code := runCLI(t, "serve", "--etcd-endpoints", "http://127.0.0.1:1", "--startup-timeout", "1s",
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	if code != 1 || !strings.Contains(stderr, "is etcd reachable") || time.Since(start) > 20*time.Second {
		t.Fatalf("serve with etcd down: exit %d after %v, %q", code, time.Since(start), stderr)
	}
}

func TestConfigGetEtcdDown(t *testing.T) {
	_, stderr, code := runCLI(t, "config", "get", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-dial-timeout", "300ms")
	if code != 1 || !strings.Contains(stderr, "config get") {
		t.Fatalf("etcd down: exit %d, %q; want exit 1 with a clear error", code, stderr)
	}
}

func TestAdapterAddRemoveListAgainstEtcd(t *testing.T) {
	e := etcdtest.Start(t)
	url := e.ClientURL()
	out, stderr, code := runCLI(t, "adapter", "add", "--etcd-endpoints", url, "--endpoint", "chat",
		"--name", "sql-lora", "--source", "/models/sql", "--min-replicas", "2", "--max-replicas", "4")
	if code != 0 || !strings.Contains(out, `"minReplicas": 2`) {
		t.Fatalf("adapter add: exit %d, %q %q", code, out, stderr)
	}
	if _, stderr, code = runCLI(t, "adapter", "add", "--etcd-endpoints", url, "--endpoint", "chat", "--name", "chat-lora", "--source", "hf://org/chat"); code != 0 {
		t.Fatalf("adapter add: exit %d, %q", code, stderr)
	}
	out, _, code = runCLI(t, "adapter", "list", "--etcd-endpoints", url, "--endpoint", "chat", "--json")
	var list []struct {
		Name                     string
		MinReplicas, MaxReplicas int
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 2 || list[0].Name != "chat-lora" || list[0].MaxReplicas != fleet.DefaultMaxReplicas || list[1].MinReplicas != 2 || list[1].MaxReplicas != 4 {
		t.Fatalf("adapter list --json: exit %d, %q", code, out)
	}
	out, _, code = runCLI(t, "adapter", "list", "--etcd-endpoints", url, "--endpoint", "chat")
	if code != 0 || !strings.Contains(out, "sql-lora") || !strings.Contains(out, "TARGET") {
		t.Fatalf("adapter list: exit %d, %q", code, out)
	}
	if _, stderr, code = runCLI(t, "adapter", "remove", "--etcd-endpoints", url, "--endpoint", "chat", "--name", "sql-lora"); code != 0 {
		t.Fatalf("adapter remove: exit %d, %q", code, stderr)
	}
	if _, stderr, code = runCLI(t, "adapter", "remove", "--etcd-endpoints", url, "--endpoint", "chat", "--name", "sql-lora"); code != 1 || !strings.Contains(stderr, "not in the catalogue") {
		t.Fatalf("adapter remove of a missing adapter: exit %d, %q", code, stderr)
	}
	out, _, _ = runCLI(t, "adapter", "list", "--etcd-endpoints", url, "--endpoint", "chat", "--json")
	if strings.Contains(out, "sql-lora") || !strings.Contains(out, "chat-lora") {
		t.Fatalf("after remove: %q", out)
	}
}

// shortKeyFile is a session key file of 31 bytes and a line break.
func shortKeyFile(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "session.key")
	if err := os.WriteFile(p, []byte(strings.Repeat("k", 31)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestServeHasEveryRoutingFlag: serve reports a routing setting a stored
// config overrides by its flag's name (replica.RoutingFlagNames), so each
// name must be a flag of serve's.
func TestServeHasEveryRoutingFlag(t *testing.T) {
	fs := newServeCmd().Flags()
	for _, name := range replica.RoutingFlagNames() {
		if fs.Lookup(name) == nil {
			t.Errorf("serve has no --%s", name)
		}
	}
}

// TestRegisterHotWindowStillParses: --hot-window, renamed
// --saturation-window (issue 18), still sets the same value.
func TestRegisterHotWindowStillParses(t *testing.T) {
	for _, name := range []string{"saturation-window", "hot-window"} {
		fs := newRegisterCmd().Flags()
		if err := fs.Parse([]string{"--" + name, "7s"}); err != nil {
			t.Fatal(err)
		}
		if got := fs.Lookup("saturation-window").Value.String(); got != "7s" {
			t.Errorf("--%s 7s: --saturation-window reads %s", name, got)
		}
	}
}

// TestBenchCapacity runs `bench --capacity-p90` against a loopback server
// that answers at once: every step holds, up to the cap.
func TestBenchCapacity(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	out := filepath.Join(t.TempDir(), "capacity.json")
	stdout, stderr, code := runCLI(t, "bench", "--target", srv.URL, "--preset", "sharegpt-like", "--rate", "20", "--requests", "10", "--warmup", "0",
		"--capacity-p90", "1m", "--capacity-max-rate", "30", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "at least 30 req/s (the search's cap)") {
		t.Fatalf("stdout:\n%s", stdout)
	}
	b, err := os.ReadFile(out)
	if err != nil || !strings.Contains(string(b), `"steps"`) {
		t.Fatalf("JSON report: %v\n%s", err, b)
	}
	// --rate 0: a closed loop from --concurrency up, to its cap.
	stdout, stderr, code = runCLI(t, "bench", "--target", srv.URL, "--preset", "sharegpt-like", "--rate", "0", "--concurrency", "2", "--requests", "10", "--warmup", "0",
		"--capacity-p90", "1m", "--capacity-max-concurrency", "3")
	if code != 0 || !strings.Contains(stdout, "at least 3 in flight (the search's cap)") {
		t.Fatalf("closed loop: exit %d: %s\n%s", code, stderr, stdout)
	}
	if _, stderr, code = runCLI(t, "bench", "--target", srv.URL, "--rate", "0", "--capacity-p90", "1m"); code == 0 || !strings.Contains(stderr, "--concurrency") {
		t.Fatalf("a closed loop without --concurrency: exit %d: %s", code, stderr)
	}
}
