// Command swarm runs the membership scale harness (package swarm) and
// prints its report: make swarm, or
//
//	go run ./internal/swarm/cmd/swarm -instances 10000 -replicas 100
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/prefixrouter/prefixrouter/internal/swarm"
)

func main() {
	var o swarm.Options
	flag.IntVar(&o.Instances, "instances", 1000, "instances registered before the replicas start (N)")
	flag.IntVar(&o.Replicas, "replicas", 10, "router replicas' membership watchers (R)")
	flag.IntVar(&o.PerClient, "per-client", 100, "initial instances sharing one etcd client")
	flag.DurationVar(&o.TTL, "ttl", 0, "lease TTL (default 5s)")
	flag.IntVar(&o.Joins, "joins", 10, "churn: instances that join")
	flag.IntVar(&o.Leaves, "leaves", 10, "churn: instances that leave gracefully")
	flag.IntVar(&o.Crashes, "crashes", 3, "churn: joined instances that crash (lease expires)")
	flag.Float64Var(&o.Rate, "rate", 2, "churn: most events started per second")
	flag.DurationVar(&o.Quiet, "quiet", 0, "window without churn for the steady etcd load (default 10s)")
	flag.DurationVar(&o.Wait, "wait", 0, "longest wait for one event to reach every replica (default 10s; crashes add the TTL)")
	flag.IntVar(&o.Registrations, "registrations", 64, "instances registering at once")
	flag.StringVar(&o.Dir, "dir", "", "etcd data directory (default: a new temporary one)")
	flag.DurationVar(&o.Timeout, "timeout", 0, "bound of the whole run (default 30m)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	o.Progress = os.Stderr
	o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := swarm.Run(ctx, o)
	if rep != nil {
		rep.Write(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		stop()
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}
