package swarm

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/prefixrouter/prefixrouter/membership"
)

// Options configures a run. Zero values mean the defaults in brackets.
type Options struct {
	// Instances registered before the replicas start [1,000].
	Instances int
	// Replicas: membership watchers, each with its own etcd client, as
	// router replicas have [10].
	Replicas int
	// PerClient is how many of the initial instances share one etcd client
	// [100]. Joined instances get a client each, as an agent has, so that
	// a crash can cut one instance's keepalives without the others'.
	PerClient int
	// TTL of every lease [membership.DefaultTTL, 5 s].
	TTL time.Duration
	// Joins, Leaves (graceful: the lease is revoked) and Crashes (the
	// client stops, the lease expires) of the churn [10, 10, 3]. A crash
	// takes down an instance that joined, so Crashes ≤ Joins.
	Joins, Leaves, Crashes int
	// Rate is the most churn events started per second [2]. Each event
	// waits until every replica saw it (or Wait passed) and the replicas'
	// agreement is checked before the next one starts.
	Rate float64
	// Quiet is the window without churn over which the steady etcd load
	// (keepalives, progress requests) is measured [10 s].
	Quiet time.Duration
	// Wait bounds how long one event may take to reach every replica
	// [10 s; a crash gets TTL more].
	Wait time.Duration
	// Registrations is how many instances register at once [64].
	Registrations int
	// StartWave is how many replicas start together; each wave waits until
	// its replicas list every instance before the next starts. Zero (the
	// default) starts all at once, the heaviest moment of a fleet
	// (docs/operations.md). On a shared machine whose other load starves
	// that moment, waves let the churn be measured; the first agreed
	// snapshot then spans the waves.
	StartWave int
	// Etcd is the client URL of an etcd to use (a member started by the
	// caller, e.g. in another process, or a real cluster's member); its
	// counters are scraped from Etcd + "/metrics", which etcd serves on its
	// client URL. Empty means a member embedded in this process, its
	// counters read from Prometheus' default registry.
	Etcd string
	// Dir holds the embedded member's data; empty means a new temporary
	// directory, removed at the end.
	Dir string
	// FastTicks runs the embedded member with 10 ms ticks, so that a lease
	// TTL of 1 s is honoured (tests).
	FastTicks bool
	// Seed picks the instances that leave [1].
	Seed uint64
	// Progress receives one line per phase; nil discards.
	Progress io.Writer
	// Logger receives the registrations' and watchers' log lines (a list
	// that timed out, a lost lease); nil discards.
	Logger *slog.Logger
	// Timeout bounds the whole run [30 min].
	Timeout time.Duration
	// ChurnProfile, if set, receives a CPU profile of the churn phase
	// alone (the joins, leaves and crashes, not the replicas' start).
	ChurnProfile io.Writer
}

// Defaults returns the options a zero Options runs with (Progress and Logger
// discard); the command's flags take their defaults from it.
func Defaults() Options {
	o, _ := Options{}.withDefaults()
	return o
}

func (o Options) withDefaults() (Options, error) {
	def(&o.Instances, 1000)
	def(&o.Replicas, 10)
	def(&o.PerClient, 100)
	def(&o.Registrations, 64)
	if o.Joins == 0 && o.Leaves == 0 && o.Crashes == 0 {
		o.Joins, o.Leaves, o.Crashes = 10, 10, 3
	}
	def(&o.TTL, membership.DefaultTTL)
	def(&o.Rate, 2)
	def(&o.Quiet, 10*time.Second)
	def(&o.Wait, 10*time.Second)
	def(&o.Seed, 1)
	def(&o.Timeout, 30*time.Minute)
	def(&o.Progress, io.Discard)
	def(&o.Logger, slog.New(slog.NewTextHandler(io.Discard, nil)))
	switch {
	case o.Instances < 1 || o.Replicas < 1 || o.PerClient < 1 || o.Registrations < 1:
		return o, errors.New("swarm: instances, replicas, per-client and registrations must be at least 1")
	case o.StartWave < 0:
		return o, errors.New("swarm: start-wave must not be negative")
	case o.Joins < 0 || o.Leaves < 0 || o.Crashes < 0:
		return o, errors.New("swarm: joins, leaves and crashes must not be negative")
	case o.Crashes > o.Joins:
		return o, fmt.Errorf("swarm: %d crashes but %d joins: a crash takes down an instance that joined", o.Crashes, o.Joins)
	case o.Leaves >= o.Instances:
		return o, fmt.Errorf("swarm: %d leaves of %d instances would empty the fleet", o.Leaves, o.Instances)
	case o.TTL < time.Second || o.Rate < 0 || o.Quiet < 0 || o.Wait <= 0 || o.Timeout <= 0:
		return o, errors.New("swarm: ttl must be at least 1s; rate, quiet, wait and timeout positive")
	}
	return o, nil
}

// def sets *v to d when it is the zero value.
func def[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}
