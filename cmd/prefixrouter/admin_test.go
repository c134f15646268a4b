package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// TestAdminFleetAgainstReplica runs `prefixrouter admin fleet` against a live
// replica with health checks and load polling on: instance "down" fails its
// health checks and its /metrics, instance "loaded" reports 4 running + 3
// waiting requests on /metrics. Both the table and --json must show "down"
// unhealthy with an unknown load and "loaded" healthy with external load 7.
func TestAdminFleetAgainstReplica(t *testing.T) {
	server := func(healthStatus, running, waiting int) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/health":
				w.WriteHeader(healthStatus)
			case "/metrics":
				if running < 0 {
					w.WriteHeader(http.StatusInternalServerError) // load unknown
					return
				}
				fmt.Fprintf(w, "vllm:num_requests_running %d\nvllm:num_requests_waiting %d\n", running, waiting)
			default:
				_, _ = io.Copy(io.Discard, r.Body)
			}
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	downAddr, loadedAddr := server(http.StatusInternalServerError, -1, 0), server(http.StatusOK, 4, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := replica.Start(ctx, replica.Options{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
		Static: []fleet.Instance{{ID: "down", Addr: downAddr}, {ID: "loaded", Addr: loadedAddr}},
		Router: router.Options{
			DefaultEndpoint:     "chat",
			HealthCheckInterval: 10 * time.Millisecond,
			LoadPollInterval:    10 * time.Millisecond,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close(context.Background())

	type state struct {
		InFlight     string `json:"inFlight"` // int64 is a string in protobuf's JSON
		ExternalLoad string `json:"externalLoad"`
		Breaker      string `json:"breaker"`
		Healthy      bool   `json:"healthy"`
	}
	var got map[string]state
	testsupport.Eventually(t, 10*time.Second, "down marked down and loaded's load polled, seen through admin fleet --json", func() bool {
		out, stderr, code := runCLI(t, "admin", "fleet", "--admin-addr", rep.AdminAddr(), "--endpoint", "chat", "--json")
		if code != 0 {
			t.Fatalf("admin fleet --json exited %d: %s", code, stderr)
		}
		var resp struct {
			Endpoints []struct {
				Name      string `json:"name"`
				Instances []struct {
					ID       string `json:"id"`
					Addr     string `json:"addr"`
					Draining bool   `json:"draining"`
					State    state  `json:"state"`
				} `json:"instances"`
			} `json:"endpoints"`
		}
		if err := json.Unmarshal([]byte(out), &resp); err != nil || len(resp.Endpoints) != 1 {
			t.Fatalf("admin fleet --json: %v\n%s", err, out)
		}
		got = map[string]state{}
		for _, in := range resp.Endpoints[0].Instances {
			got[in.ID] = in.State
		}
		return !got["down"].Healthy && got["loaded"].ExternalLoad == "7"
	})
	if want := (state{InFlight: "0", ExternalLoad: "7", Breaker: "BREAKER_STATE_CLOSED", Healthy: true}); got["loaded"] != want {
		t.Errorf("loaded = %+v, want %+v", got["loaded"], want)
	}
	if want := (state{InFlight: "0", ExternalLoad: "-1", Breaker: "BREAKER_STATE_CLOSED", Healthy: false}); got["down"] != want {
		t.Errorf("down = %+v, want %+v", got["down"], want)
	}

	// The load poll runs every 10 ms with a 10 ms timeout, so one slow scrape
	// on a loaded machine reads as unknown until the next: retry the CLI
	// until both rows show, within a deadline.
	var out string
	rowsOK := func() bool {
		o, stderr, code := runCLI(t, "admin", "fleet", "--admin-addr", rep.AdminAddr())
		if code != 0 {
			t.Fatalf("admin fleet exited %d: %s", code, stderr)
		}
		out = o
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 4 || !strings.HasPrefix(lines[0], "revision=0 replicas=1 snapshot_age=") ||
			strings.Join(strings.Fields(lines[1]), " ") != "ENDPOINT ID ADDR DRAINING HEALTHY IN_FLIGHT EXTERNAL_LOAD BREAKER" {
			t.Fatalf("table:\n%s", out)
		}
		for _, want := range []string{
			"chat down " + downAddr + " false false 0 unknown closed",
			"chat loaded " + loadedAddr + " false true 0 7 closed",
		} {
			found := false
			for _, l := range lines[2:] {
				found = found || strings.Join(strings.Fields(l), " ") == want
			}
			if !found {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(10 * time.Second)
	for !rowsOK() {
		if time.Now().After(deadline) {
			t.Fatalf("admin fleet never showed down (unhealthy, load unknown) and loaded (healthy, load 7):\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// No address is a usage error; an unknown endpoint is the server's
	// NotFound, passed on with exit 1.
	if _, stderr, code := runCLI(t, "admin", "fleet", "--admin-addr", ""); code != 2 || !strings.Contains(stderr, "--admin-addr") {
		t.Errorf("empty --admin-addr: exit %d, stderr %q", code, stderr)
	}
	if _, stderr, code := runCLI(t, "admin", "fleet", "--admin-addr", rep.AdminAddr(), "--endpoint", "nope"); code != 1 || !regexp.MustCompile(`NotFound.*"nope"`).MatchString(stderr) {
		t.Errorf("unknown endpoint: exit %d, stderr %q", code, stderr)
	}
}
