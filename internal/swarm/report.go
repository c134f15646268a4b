package swarm

import (
	"fmt"
	"io"
	"math"
	"slices"
	"time"
)

// Report is what a run measured.
type Report struct {
	Options Options
	// LoadBefore and LoadAfter are the machine's load averages (1, 5, 15
	// minutes) at the start and the end: other processes share the CPU.
	LoadBefore, LoadAfter string
	// RegisterTime is how long the initial instances took to register.
	RegisterTime time.Duration
	// HeapPerInstance and HeapPerReplica are the Go heap in use that one
	// registration (its share of a client, its goroutines, its lease) and
	// one replica (watcher, client, state and snapshot) added, measured
	// after a GC; an embedded etcd's memory is in HeapPerInstance.
	HeapPerInstance, HeapPerReplica float64
	// FirstAgreed is the time from starting the replicas until every one
	// published a snapshot listing every instance.
	FirstAgreed time.Duration
	// Quiet and Churn are etcd's rates without churn and during it;
	// QuietCPU is the cores this process used without churn; EtcdMemory
	// is etcd's resident memory (the whole process's when embedded).
	Quiet, Churn EtcdRates
	QuietCPU     float64
	EtcdMemory   float64
	ChurnTime    time.Duration
	// ChurnCPU is the CPU time this process used during the churn: the
	// replicas' watch decoding and builds, their GC, the simulated
	// agents' keepalives and the harness's checks. Unlike the delays it
	// hardly depends on what else runs on the machine.
	ChurnCPU time.Duration
	// Events are the churn's events by kind; each holds every replica's
	// delay (start of the event → the replica's snapshot shows it).
	Events map[string][]Event
	// Missed counts events some replica had not seen after the wait;
	// Agreed counts, of Checks (one after each event), those where every
	// replica listed exactly the live instances.
	Missed, Agreed, Checks int
	// BuildAtList is the snapshot builds of the first lists; BuildPerChange
	// those of the churn (one per watch response, per replica).
	BuildAtList, BuildPerChange Histogram
	Pick                        PickCost
}

// Event is one churn event: the instance, how long its registration call
// took (RegisterInstance for a join, Close, which revokes, for a leave; 0
// for a crash) and every replica's delay, sorted.
type Event struct {
	ID     string
	Call   time.Duration
	Delays []time.Duration
}

func (r *Report) add(kind string, e Event) {
	if r.Events == nil {
		r.Events = map[string][]Event{}
	}
	r.Events[kind] = append(r.Events[kind], e)
}

// Propagation summarizes one kind's delays over every event and replica:
// the quantiles and the largest, and the mean over events of the last
// replica's delay.
type Propagation struct {
	Samples       int
	P50, P99, Max time.Duration
	MeanLast      time.Duration
	// MaxCall is the longest registration call among the events.
	MaxCall time.Duration
	// P99AfterCall is the 99th percentile of the delays less their event's
	// call: from etcd's answer to each replica's snapshot, the watch's
	// fan-out and the replicas' builds without etcd's own commit.
	P99AfterCall time.Duration
}

// Propagation returns the summary of kind's events.
func (r *Report) Propagation(kind string) Propagation {
	var all, after []time.Duration
	var lastSum time.Duration
	evs := r.Events[kind]
	var maxCall time.Duration
	for _, e := range evs {
		maxCall = max(maxCall, e.Call)
		all = append(all, e.Delays...)
		for _, d := range e.Delays {
			after = append(after, max(0, d-e.Call))
		}
		if n := len(e.Delays); n > 0 {
			lastSum += e.Delays[n-1]
		}
	}
	if len(all) == 0 {
		return Propagation{}
	}
	slices.Sort(all)
	slices.Sort(after)
	q := func(ds []time.Duration, p float64) time.Duration { return ds[min(len(ds)-1, int(p*float64(len(ds))))] }
	return Propagation{Samples: len(all), P50: q(all, 0.5), P99: q(all, 0.99), Max: all[len(all)-1], MeanLast: lastSum / time.Duration(len(evs)),
		MaxCall: maxCall, P99AfterCall: q(after, 0.99)}
}

// Write prints the report as Markdown tables.
func (r *Report) Write(w io.Writer) {
	o := r.Options
	ms := func(d time.Duration) string {
		if d == math.MaxInt64 { // beyond the histogram's last bucket
			return "> 1.6 s"
		}
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	}
	where := "embedded in the harness's process"
	if o.Etcd != "" {
		where = "at " + o.Etcd + ", its own process"
	}
	fmt.Fprintf(w, "## swarm: N=%d instances, R=%d replicas, TTL %v, %d per client; etcd %s\n\n", o.Instances, o.Replicas, o.TTL, o.PerClient, where)
	fmt.Fprintf(w, "Load average before %s, after %s (2 cores, shared).\n\n", r.LoadBefore, r.LoadAfter)
	fmt.Fprintf(w, "| figure | value |\n|---|---|\n")
	fmt.Fprintf(w, "| registration of %d instances | %v (%.0f/s) |\n", o.Instances, r.RegisterTime.Round(time.Millisecond), float64(o.Instances)/r.RegisterTime.Seconds())
	fmt.Fprintf(w, "| first agreed snapshot (replicas started → all list all) | %s |\n", ms(r.FirstAgreed))
	heap := "registration"
	if o.Etcd == "" {
		heap += " + embedded etcd"
	}
	fmt.Fprintf(w, "| heap per instance (%s) | %.1f KiB |\n", heap, r.HeapPerInstance/1024)
	fmt.Fprintf(w, "| heap per replica (watcher, client, snapshot) | %.2f MiB |\n", r.HeapPerReplica/(1<<20))
	fmt.Fprintf(w, "| snapshot build at first list: mean, p99 ≤ | %s, %s (%d builds) |\n", ms(r.BuildAtList.Mean()), ms(r.BuildAtList.Quantile(0.99)), r.BuildAtList.Count)
	fmt.Fprintf(w, "| snapshot build per change: mean, p99 ≤ | %s, %s (%d builds) |\n", ms(r.BuildPerChange.Mean()), ms(r.BuildPerChange.Quantile(0.99)), r.BuildPerChange.Count)
	fmt.Fprintf(w, "| harness process CPU without churn | %.2f cores |\n", r.QuietCPU)
	if n := r.Checks; n > 0 {
		// Beyond the quiet load (the agents' keepalives, the watchers'
		// progress requests), which runs on during the churn's waits.
		extra := r.ChurnCPU.Seconds() - r.QuietCPU*r.ChurnTime.Seconds()
		fmt.Fprintf(w, "| harness process CPU during churn: cores, per event beyond the quiet load | %.2f, %.1f ms |\n", r.ChurnCPU.Seconds()/r.ChurnTime.Seconds(), extra*1e3/float64(n))
	}
	fmt.Fprintf(w, "| etcd resident memory | %.0f MiB |\n", r.EtcdMemory/(1<<20))
	fmt.Fprintf(w, "| pick at N=%d: base set + ring build, Candidates(key, 4) | %s, %d ns |\n", r.Pick.Instances, ms(r.Pick.Build), r.Pick.Candidates4.Nanoseconds())
	fmt.Fprintf(w, "| agreement after each change | %d of %d checks (%d events missed the wait) |\n\n", r.Agreed, r.Checks, r.Missed)

	fmt.Fprintf(w, "Propagation: from the call (register, Close, the client's end) to each replica's snapshot.\n\n")
	fmt.Fprintf(w, "| propagation to every replica | events | samples | p50 | p99 | max | mean of the last replica | longest call | p99 after the call |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, kind := range []string{Join, Leave, Crash} {
		p := r.Propagation(kind)
		fmt.Fprintf(w, "| %s | %d | %d | %s | %s | %s | %s | %s | %s |\n", kind, len(r.Events[kind]), p.Samples, ms(p.P50), ms(p.P99), ms(p.Max), ms(p.MeanLast), ms(p.MaxCall), ms(p.P99AfterCall))
	}
	fmt.Fprintf(w, "\n| etcd per second | without churn (%v) | during churn (%v) |\n|---|---|---|\n", o.Quiet, r.ChurnTime.Round(time.Second))
	for _, row := range []struct {
		name string
		a, b float64
	}{
		{"gRPC messages received (all)", r.Quiet.Requests, r.Churn.Requests},
		{"lease keepalives received", r.Quiet.KeepAlives, r.Churn.KeepAlives},
		{"leases renewed", r.Quiet.Renewed, r.Churn.Renewed},
		{"txn (registration puts)", r.Quiet.Txns, r.Churn.Txns},
		{"lease grants", r.Quiet.Grants, r.Churn.Grants},
		{"lease revokes", r.Quiet.Revokes, r.Churn.Revokes},
		{"ranges and lease lookups", r.Quiet.Ranges, r.Churn.Ranges},
		{"watch requests received (creates, progress)", r.Quiet.WatchRequests, r.Churn.WatchRequests},
		{"watch responses sent", r.Quiet.WatchResponses, r.Churn.WatchResponses},
		{"watch events sent", r.Quiet.Events, r.Churn.Events},
		{"etcd process CPU (cores)", r.Quiet.CPU, r.Churn.CPU},
	} {
		fmt.Fprintf(w, "| %s | %.2f | %.2f |\n", row.name, row.a, row.b)
	}
}
