package llamacpp

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/gguf"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

// TestFromEnv: an unset variable is ErrNoEngine (tests skip on it); a path
// that is not an executable, or a missing vocabulary, is an error naming
// what to set; the kit's layout (lib/, the vocabulary beside the binary)
// is found.
func TestFromEnv(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "llama-server")
	write := func(path string, mode os.FileMode) {
		if err := os.WriteFile(path, []byte("x"), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(EnvServer, "")
	t.Setenv(EnvVocab, "")
	t.Setenv(EnvModel, "")
	if _, err := FromEnv(); !errors.Is(err, ErrNoEngine) {
		t.Fatalf("unset: %v, want ErrNoEngine", err)
	}
	t.Setenv(EnvServer, bin)
	if _, err := FromEnv(); err == nil || !strings.Contains(err.Error(), "not an executable") {
		t.Fatalf("missing binary: %v", err)
	}
	write(bin, 0o644)
	if _, err := FromEnv(); err == nil || !strings.Contains(err.Error(), "not an executable") {
		t.Fatalf("binary without the x bit: %v", err)
	}
	write(bin, 0o755)
	if _, err := FromEnv(); err == nil || !strings.Contains(err.Error(), EnvVocab) {
		t.Fatalf("no vocabulary: %v, want it to name %s", err, EnvVocab)
	}
	write(filepath.Join(dir, DefaultVocab), 0o644)
	if err := os.Mkdir(filepath.Join(dir, "lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	k, err := FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if k.Vocab != filepath.Join(dir, DefaultVocab) || k.LibDir != filepath.Join(dir, "lib") || k.Model != "" {
		t.Fatalf("kit %+v", k)
	}
	t.Setenv(EnvModel, filepath.Join(dir, "mine.gguf"))
	if _, err := FromEnv(); err == nil {
		t.Fatal("a model that does not exist: no error")
	}
}

// TestOutputFindsTheAddressAndKeepsTheTail: the listening line is found
// when it arrives in pieces; the kept output stays bounded and ends with
// the last line.
func TestOutputFindsTheAddressAndKeepsTheTail(t *testing.T) {
	o := newOutput()
	for _, p := range []string{"main: loading\nmain: server is listen", "ing on http://127.0.0.1:40", "123 - starting the main loop\n"} {
		_, _ = o.Write([]byte(p))
	}
	select {
	case u := <-o.url:
		if u != "http://127.0.0.1:40123" {
			t.Fatalf("url %q", u)
		}
	default:
		t.Fatal("no url")
	}
	for i := range 2000 {
		_, _ = o.Write([]byte("line " + strings.Repeat("x", i%50) + "\n"))
	}
	_, _ = o.Write([]byte("the last line\n"))
	if tail := o.tail(); len(tail) > maxOutput || !strings.HasSuffix(tail, "the last line") {
		t.Fatalf("tail of %d bytes ending %q", len(tail), tail[max(0, len(tail)-20):])
	}
}

// TestStartServesAndStops runs the real engine when the environment names
// one: a generated model loads, /health and /metrics answer, Close ends
// the process.
func TestStartServesAndStops(t *testing.T) {
	kit, err := FromEnv()
	if errors.Is(err, ErrNoEngine) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	model, err := kit.ModelIn(t.TempDir(), gguf.Llama{Layers: 2})
	if err != nil {
		t.Fatal(err)
	}
	f, err := Start(testsupport.Context(t, 2*time.Minute), Options{Kit: kit, Model: model, Instances: 1})
	if err != nil {
		t.Fatal(err)
	}
	s := f.Servers()[0]
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	if n, err := s.PromptProcessed(t.Context(), hc); err != nil || n != 0 {
		t.Fatalf("prompt tokens before any request: %v, %v", n, err)
	}
	// Killed, it restarts on its port; a running one does not; a stopped
	// (SIGSTOP) one still closes.
	if err := s.Restart(t.Context()); err == nil {
		t.Fatal("Restart of a running server: no error")
	}
	url := s.URL
	if err := s.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-s.Exited()
	if err := s.Restart(t.Context()); err != nil || s.URL != url || !healthy(hc, s.URL) {
		t.Fatalf("restart: %v, at %s (was %s)", err, s.URL, url)
	}
	if err := s.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	f.Close()
	select {
	case <-s.proc.Exited():
	default:
		t.Fatal("the server still runs after Close")
	}
	if _, err := hc.Get(s.URL + "/health"); err == nil {
		t.Fatal("the server still answers after Close")
	}
}
