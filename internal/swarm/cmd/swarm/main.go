// Command swarm runs the membership scale harness (package swarm) and
// prints its report: make swarm, or
//
//	go run ./internal/swarm/cmd/swarm -instances 10000 -replicas 100
//
// etcd runs in a child process of its own (this command, -serve-etcd), as
// it runs apart from agents and routers in production, unless -etcd names a
// member to use or -etcd-in-process embeds it.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/swarm"
	"github.com/prefixrouter/prefixrouter/membership"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	o := swarm.Defaults()
	bindOptions(flag.CommandLine, &o)
	inProcess := flag.Bool("etcd-in-process", false, "embed etcd in this process instead of a child process")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the harness to this file")
	churnprofile := flag.String("churn-cpuprofile", "", "write a CPU profile of the churn phase alone to this file")
	serveEtcd := flag.String("serve-etcd", "", "internal: serve an embedded etcd with this data directory, print its URL, stop at end of stdin")
	flag.Parse()
	if *serveEtcd != "" {
		return serve(*serveEtcd)
	}
	o.Progress = os.Stderr
	o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if o.Etcd == "" && !*inProcess {
		url, done, err := child(o.Dir)
		if err != nil {
			return err
		}
		defer done()
		o.Etcd, o.Dir = url, ""
	}
	if *churnprofile != "" {
		if *cpuprofile != "" {
			return errors.New("swarm: -cpuprofile and -churn-cpuprofile exclude each other (one CPU profile at a time)")
		}
		f, err := os.Create(*churnprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		o.ChurnProfile = f
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	rep, err := swarm.Run(ctx, o)
	if rep != nil {
		rep.Write(os.Stdout)
	}
	return err
}

// flagOf is one flag bound to an Options field, defaulting to the field's
// value (swarm.Defaults).
type flagOf[T any] struct {
	v           *T
	name, usage string
}

func bind[T any](define func(*T, string, T, string), flags ...flagOf[T]) {
	for _, f := range flags {
		define(f.v, f.name, *f.v, f.usage)
	}
}

// bindOptions binds the harness's settings, by type.
func bindOptions(fs *flag.FlagSet, o *swarm.Options) {
	bind(fs.IntVar,
		flagOf[int]{&o.Instances, "instances", "instances registered before the replicas start (N)"},
		flagOf[int]{&o.Replicas, "replicas", "router replicas' membership watchers (R)"},
		flagOf[int]{&o.PerClient, "per-client", "initial instances sharing one etcd client"},
		flagOf[int]{&o.Registrations, "registrations", "instances registering at once"},
		flagOf[int]{&o.StartWave, "start-wave", "replicas started together, each wave after the last agrees (0: all at once)"},
		flagOf[int]{&o.Joins, "joins", "churn: instances that join (joins, leaves and crashes all 0: the defaults)"},
		flagOf[int]{&o.Leaves, "leaves", "churn: instances that leave gracefully"},
		flagOf[int]{&o.Crashes, "crashes", "churn: joined instances that crash (lease expires)"})
	bind(fs.Float64Var, flagOf[float64]{&o.Rate, "rate", "churn: most events started per second"})
	bind(fs.DurationVar,
		flagOf[time.Duration]{&o.TTL, "ttl", "lease TTL"},
		flagOf[time.Duration]{&o.Quiet, "quiet", "window without churn for the steady etcd load"},
		flagOf[time.Duration]{&o.Wait, "wait", "longest wait for one event to reach every replica (crashes add the TTL)"},
		flagOf[time.Duration]{&o.Timeout, "timeout", "bound of the whole run"})
	bind(fs.StringVar,
		flagOf[string]{&o.Etcd, "etcd", "client URL of an etcd member to use (its /metrics is scraped)"},
		flagOf[string]{&o.Dir, "dir", "etcd data directory (default: a new temporary one)"})
}

// child starts this command with -serve-etcd and returns the member's
// client URL and a function that stops it and waits for it.
func child(dir string) (url string, done func(), err error) {
	if dir == "" {
		if dir, err = os.MkdirTemp("", "swarm-etcd-"); err != nil {
			return "", nil, err
		}
	}
	cmd := exec.Command(os.Args[0], "-serve-etcd", dir)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return "", nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	done = func() {
		in.Close() // the child stops at the end of its stdin
		_ = cmd.Wait()
		_ = os.RemoveAll(dir)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		done()
		return "", nil, fmt.Errorf("swarm: the etcd child printed no URL: %w", err)
	}
	return strings.TrimSpace(line), done, nil
}

// serve runs the child: an embedded member on a free loopback port.
func serve(dir string) error {
	e, err := membership.StartEmbedded(dir, "http://127.0.0.1:0")
	if err != nil {
		return err
	}
	defer e.Close()
	fmt.Println(e.ClientURL())
	// Until the parent closes stdin (or dies), bounded by a day.
	read := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, os.Stdin); read <- err }()
	select {
	case err := <-read:
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
	case <-time.After(24 * time.Hour):
	}
	return nil
}
