package proxybench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRunWithBaselines runs a whole (tiny) proxybench: rawfloor as the
// proxy and two copies of it as baselines, which get names of their own.
// Every request must go through, and each proxy's CPU must be read.
func TestRunWithBaselines(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary and runs proxies")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "rawfloor")
	build := exec.Command("go", "build", "-o", bin, "./rawfloor")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	other := filepath.Join(dir, "floor2")
	if err := os.Link(bin, other); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := Run(ctx, Options{
		Prefixrouter: bin, Baselines: []string{bin, other}, HAProxy: "none",
		Sizes: []int{16 << 10}, Clients: []int{2}, Rounds: 1,
		Duration: 200 * time.Millisecond, Warmup: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"direct", "baseline:rawfloor", "baseline:floor2", "prefixrouter"}
	if !slices.Equal(rep.Targets, want) {
		t.Fatalf("targets %v, want %v", rep.Targets, want)
	}
	if !strings.Contains(rep.Skipped, "none") {
		t.Errorf("skipped %q: want the reason HAProxy is left out", rep.Skipped)
	}
	for _, row := range rep.Rows(rep.Cells[0]) {
		if row.Requests == 0 || row.Errors != 0 {
			t.Errorf("%s: %d requests, %d errors (%v)", row.Target, row.Requests, row.Errors, row.FirstError)
		}
		if row.Target != "direct" && row.CPUPer1000 <= 0 {
			t.Errorf("%s: no CPU read", row.Target)
		}
	}
	var out bytes.Buffer
	if err := rep.WriteMarkdown(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "baseline:floor2") {
		t.Errorf("table without the second baseline:\n%s", out.String())
	}
}
