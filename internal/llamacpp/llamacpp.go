// Package llamacpp starts llama.cpp's llama-server on loopback, serving a
// tiny model with random weights that it generates itself (nothing is
// downloaded), for the tests and benchmarks that need a real inference
// engine rather than the simulator: its HTTP behaviour, prefix cache,
// /metrics and timings are llama.cpp's own.
//
// The engine comes from the environment, so that CI points it at the kit
// in ../shared/engines and a user at their own build:
//
//	PREFIXROUTER_LLAMA_SERVER  the llama-server binary (required)
//	PREFIXROUTER_LLAMA_VOCAB   a vocabulary GGUF whose tokenizer the model
//	                           copies (default: ggml-vocab-llama-spm.gguf
//	                           beside the binary)
//	PREFIXROUTER_LLAMA_MODEL   a model to serve instead of a generated one
//
// A lib/ directory beside the binary (the kit's shared libraries) is put
// first on the servers' LD_LIBRARY_PATH.
//
//	kit, err := llamacpp.FromEnv()          // ErrNoEngine: skip
//	model, err := kit.ModelIn(dir, gguf.Llama{})
//	f, err := llamacpp.Start(ctx, llamacpp.Options{Kit: kit, Model: model, Instances: 3})
//	defer f.Close()
package llamacpp

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/gguf"
	"github.com/prefixrouter/prefixrouter/internal/subprocess"
	"github.com/prefixrouter/prefixrouter/probe"
)

// Environment variables naming the engine.
const (
	EnvServer = "PREFIXROUTER_LLAMA_SERVER"
	EnvVocab  = "PREFIXROUTER_LLAMA_VOCAB"
	EnvModel  = "PREFIXROUTER_LLAMA_MODEL"
)

// DefaultVocab is the vocabulary file the kit ships beside llama-server.
const DefaultVocab = "ggml-vocab-llama-spm.gguf"

// ErrNoEngine is returned by FromEnv when PREFIXROUTER_LLAMA_SERVER is not
// set: no engine to test against.
var ErrNoEngine = fmt.Errorf("llamacpp: %s is not set (the path of a llama.cpp llama-server binary; .ci/run unpacks one from ../shared/engines/llamacpp-kit.tar.xz)", EnvServer)

// Kit is where the engine and what it serves are.
type Kit struct {
	Server string // the llama-server binary
	LibDir string // put first on LD_LIBRARY_PATH; "" for none
	Vocab  string // the vocabulary a generated model copies
	Model  string // a model to serve as is; "" to generate one
}

// FromEnv returns the kit the environment names, checked to exist.
func FromEnv() (Kit, error) {
	server := os.Getenv(EnvServer)
	if server == "" {
		return Kit{}, ErrNoEngine
	}
	k := Kit{Server: server, Vocab: os.Getenv(EnvVocab), Model: os.Getenv(EnvModel)}
	dir := filepath.Dir(server)
	if k.Vocab == "" {
		k.Vocab = filepath.Join(dir, DefaultVocab)
	}
	if fi, err := os.Stat(filepath.Join(dir, "lib")); err == nil && fi.IsDir() {
		k.LibDir = filepath.Join(dir, "lib")
	}
	if fi, err := os.Stat(server); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return Kit{}, fmt.Errorf("llamacpp: %s=%s: not an executable file", EnvServer, server)
	}
	need := k.Model
	if need == "" {
		need = k.Vocab
	}
	if _, err := os.Stat(need); err != nil {
		return Kit{}, fmt.Errorf("llamacpp: %w (set %s to a vocabulary GGUF, or %s to a model)", err, EnvVocab, EnvModel)
	}
	return k, nil
}

// ModelIn returns the model to serve: Kit.Model when set, else a model of
// the given shape with random weights, written to dir from Kit.Vocab.
func (k Kit) ModelIn(dir string, shape gguf.Llama) (string, error) {
	if k.Model != "" {
		return k.Model, nil
	}
	vocab, err := gguf.ReadFile(k.Vocab)
	if err != nil {
		return "", fmt.Errorf("llamacpp: vocabulary: %w", err)
	}
	path := filepath.Join(dir, "tiny-random-llama.gguf")
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	werr := gguf.WriteRandomLlama(f, vocab, shape)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return "", fmt.Errorf("llamacpp: writing the model: %w", werr)
	}
	return path, nil
}

// Options configures Start. Zero values mean the defaults.
type Options struct {
	Kit   Kit
	Model string // the GGUF to serve (Kit.ModelIn)
	// Instances is the number of servers (default 1); their ids are
	// "llama-0", "llama-1", ...
	Instances int
	// Threads per server (-t, default 1: the sizing that works on 2 cores).
	Threads int
	// Slots per server (-np, default 2). The slots share one KV cache of
	// Context tokens; each holds one cached prompt.
	Slots int
	// Context is the KV cache of one server in tokens (-c, default 4096).
	Context int
	// Alias is the model name the servers answer with (default "tiny").
	Alias string
	// StartTimeout bounds each server's start (default 60 s).
	StartTimeout time.Duration
}

func (o Options) withDefaults() Options {
	o.Instances = cmp.Or(max(o.Instances, 0), 1)
	o.Threads = cmp.Or(max(o.Threads, 0), 1)
	o.Slots = cmp.Or(max(o.Slots, 0), 2)
	o.Context = cmp.Or(max(o.Context, 0), 4096)
	o.Alias = cmp.Or(o.Alias, "tiny")
	o.StartTimeout = cmp.Or(max(o.StartTimeout, 0), 60*time.Second)
	return o
}

// Server is one running llama-server.
type Server struct {
	ID  string
	URL string // http://127.0.0.1:PORT

	opts Options // Start's, for Restart
	proc *subprocess.Process
	out  *output
}

// Fleet is the servers Start started.
type Fleet struct {
	servers []*Server
}

// Servers returns the servers in id order.
func (f *Fleet) Servers() []*Server { return f.servers }

// Start starts the servers, each on a port of the kernel's choosing, and
// returns once every one answers /health with 200. On failure it stops
// those it started and the error quotes the failing server's last lines of
// output.
func Start(ctx context.Context, opts Options) (*Fleet, error) {
	opts = opts.withDefaults()
	if opts.Model == "" {
		return nil, errors.New("llamacpp: no model to serve")
	}
	f := &Fleet{}
	for i := range opts.Instances {
		s, err := start(ctx, opts, fmt.Sprintf("llama-%d", i))
		if err != nil {
			f.Close()
			return nil, err
		}
		f.servers = append(f.servers, s)
	}
	return f, nil
}

// Close stops every server (SIGTERM, then SIGKILL after 10 s) and waits for
// them.
func (f *Fleet) Close() {
	for _, s := range f.servers {
		s.stop()
	}
}

// listening is the line llama-server logs once its model is loaded and its
// slots are ready (tools/server/server.cpp, "starting the main loop"). The
// character after the port ends it: a write may stop in its middle.
var listening = regexp.MustCompile(`server is listening on (http://[0-9.]+:[0-9]+)[^0-9]`)

func start(ctx context.Context, opts Options, id string) (*Server, error) {
	s := &Server{ID: id, opts: opts}
	if err := s.run(ctx, "0"); err != nil {
		return nil, err
	}
	return s, nil
}

// run starts the process on port ("0": the kernel's choice) and returns
// once it answers /health with 200.
func (s *Server) run(ctx context.Context, port string) error {
	opts, id := s.opts, s.ID
	args := []string{
		"-m", opts.Model, "--host", "127.0.0.1", "--port", port,
		"-t", strconv.Itoa(opts.Threads), "-np", strconv.Itoa(opts.Slots), "-c", strconv.Itoa(opts.Context),
		"--metrics", "--alias", opts.Alias, "--no-webui",
	}
	cmd := exec.Command(opts.Kit.Server, args...)
	cmd.Env = os.Environ()
	if opts.Kit.LibDir != "" {
		lib := opts.Kit.LibDir
		if prev := os.Getenv("LD_LIBRARY_PATH"); prev != "" {
			lib += string(os.PathListSeparator) + prev
		}
		cmd.Env = append(cmd.Env, "LD_LIBRARY_PATH="+lib)
	}
	setParentDeathSignal(cmd)
	s.out = newOutput()
	cmd.Stdout, cmd.Stderr = s.out, s.out
	var err error
	if s.proc, err = subprocess.Start(cmd); err != nil {
		return fmt.Errorf("llamacpp: starting %s: %w", id, err)
	}
	// Wait for the line that names the address, then poll /health.
	timer := time.NewTimer(opts.StartTimeout)
	defer timer.Stop()
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	for {
		var poll <-chan time.Time
		if s.URL != "" {
			if healthy(hc, s.URL) {
				return nil
			}
			poll = time.After(50 * time.Millisecond)
		}
		select {
		case s.URL = <-s.out.url:
		case <-poll:
		case <-s.proc.Exited():
			return fmt.Errorf("llamacpp: %s exited at start (%v); its output ends:\n%s", id, s.proc.Err(), s.out.tail())
		case <-timer.C:
			s.stop()
			return fmt.Errorf("llamacpp: %s not ready within %v; its output ends:\n%s", id, opts.StartTimeout, s.out.tail())
		case <-ctx.Done():
			s.stop()
			return ctx.Err()
		}
	}
}

func healthy(hc *http.Client, base string) bool {
	resp, err := hc.Get(base + "/health")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// stop ends the process and waits for it.
func (s *Server) stop() { s.proc.Stop(10 * time.Second) }

// Signal sends sig to the server's process: the fault tests' SIGKILL (a
// crash), SIGSTOP (a hung engine) and SIGCONT. Close still stops a
// stopped server (subprocess.Stop continues it first).
func (s *Server) Signal(sig os.Signal) error { return s.proc.Signal(sig) }

// Exited is closed once the process has exited (after a SIGKILL, say).
func (s *Server) Exited() <-chan struct{} { return s.proc.Exited() }

// Restart starts the server again on the port it listened on, after its
// process exited (a test killed it), and returns once it answers /health
// with 200: a restarted engine with the same address and a cold cache.
// It must not run concurrently with the server's other methods.
func (s *Server) Restart(ctx context.Context) error {
	select {
	case <-s.proc.Exited():
	default:
		return fmt.Errorf("llamacpp: %s is still running", s.ID)
	}
	u, err := url.Parse(s.URL)
	if err != nil {
		return err
	}
	want := s.URL
	if err := s.run(ctx, u.Port()); err != nil {
		return err
	}
	if s.URL != want {
		s.stop()
		return fmt.Errorf("llamacpp: %s restarted on %s, not %s", s.ID, s.URL, want)
	}
	return nil
}

// Output returns the server's last lines of output (for a failing test's
// log).
func (s *Server) Output() string { return s.out.tail() }

// PromptProcessed is the prompt tokens the server has evaluated since it
// started (probe.LlamaCppPromptTokens on /metrics): tokens its prefix
// cache served are not counted.
func (s *Server) PromptProcessed(ctx context.Context, hc *http.Client) (float64, error) {
	m, err := probe.Scrape(ctx, hc, s.URL+"/metrics")
	if err != nil {
		return 0, err
	}
	return m.Sum(probe.LlamaCppPromptTokens)
}

// output keeps the last lines a server wrote and sends the address it
// listens on, once, to url. exec.Cmd calls Write from one goroutine at a
// time (Stdout and Stderr are the same writer).
type output struct {
	mu   sync.Mutex // guards buf, sent; tail reads from other goroutines
	buf  []byte
	sent bool
	url  chan string
}

const maxOutput = 8 << 10

func newOutput() *output { return &output{url: make(chan string, 1)} }

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf = append(o.buf, p...)
	if !o.sent {
		if m := listening.FindSubmatch(o.buf); m != nil {
			o.sent = true
			o.url <- string(m[1])
		}
	}
	if len(o.buf) > maxOutput {
		cut := len(o.buf) - maxOutput/2
		if i := bytes.IndexByte(o.buf[cut:], '\n'); i >= 0 {
			cut += i + 1
		}
		o.buf = append(o.buf[:0], o.buf[cut:]...)
	}
	return len(p), nil
}

func (o *output) tail() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.TrimSpace(string(o.buf))
}
