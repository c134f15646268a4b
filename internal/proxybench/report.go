package proxybench

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Report holds every run's samples, grouped by cell.
type Report struct {
	Options        Options
	Targets        []string // in the order of the table
	HAProxyVersion string
	Skipped        string // why a target is missing, "" if none is
	Cells          []Cell
	// LoadBefore and LoadAfter are /proc/loadavg's 1, 5 and 15 minute
	// averages at the start and the end (the machine is shared).
	LoadBefore, LoadAfter string
}

// Cell is one body size and client count.
type Cell struct {
	Size, Clients int
	Samples       map[string][]sample // by target, one per round
}

// Row is a cell's figures for one target: medians over rounds. Added
// latencies are the median over rounds of the target's percentile minus
// direct's in the same round.
type Row struct {
	Target             string
	Rate               float64 // requests per second
	P50, P99           time.Duration
	AddedP50, AddedP99 time.Duration
	CPUPer1000         float64 // CPU seconds of the proxy process per 1,000 requests; 0 for direct
	Errors, Requests   int
	FirstError         error
}

// Rows computes a cell's rows in the report's target order.
func (r *Report) Rows(c Cell) []Row {
	direct := c.Samples["direct"]
	var rows []Row
	for _, name := range r.Targets {
		ss := c.Samples[name]
		if len(ss) == 0 {
			continue
		}
		row := Row{Target: name}
		var rate, p50, p99, add50, add99, cpu []float64
		for i, s := range ss {
			rate = append(rate, s.rate())
			p50 = append(p50, float64(s.p50))
			p99 = append(p99, float64(s.p99))
			if i < len(direct) {
				add50 = append(add50, float64(s.p50-direct[i].p50))
				add99 = append(add99, float64(s.p99-direct[i].p99))
			}
			if s.requests > 0 {
				cpu = append(cpu, s.cpu.Seconds()*1000/float64(s.requests))
			}
			row.Errors += s.errors
			row.Requests += s.requests
			if row.FirstError == nil {
				row.FirstError = s.firstErr
			}
		}
		row.Rate = median(rate)
		row.P50, row.P99 = time.Duration(median(p50)), time.Duration(median(p99))
		row.AddedP50, row.AddedP99 = time.Duration(median(add50)), time.Duration(median(add99))
		row.CPUPer1000 = median(cpu)
		rows = append(rows, row)
	}
	return rows
}

// WriteMarkdown prints the table and how it was made.
func (r *Report) WriteMarkdown(w io.Writer) error {
	o := r.Options
	var b strings.Builder
	fmt.Fprintf(&b, "Proxy benchmark: %d stand-in backends (zero delay), %d distinct SageMaker invoke bodies, closed-loop clients; %d rounds of %v (after %v warm-up) per target and cell, targets alternating; medians over rounds.\n",
		o.Backends, o.Documents, o.Rounds, o.Duration, o.Warmup)
	if r.HAProxyVersion != "" {
		fmt.Fprintf(&b, "HAProxy: %s.\n", r.HAProxyVersion)
	}
	if r.Skipped != "" {
		fmt.Fprintf(&b, "Note: %s.\n", r.Skipped)
	}
	fmt.Fprintf(&b, "Load average (1, 5, 15 min): %s before, %s after.\n\n", r.LoadBefore, r.LoadAfter)
	b.WriteString("| body | clients | target | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | proxy CPU s / 1k req | errors |\n")
	b.WriteString("|---|--:|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, c := range r.Cells {
		for _, row := range r.Rows(c) {
			added50, added99, cpu := "—", "—", "—"
			if row.Target != "direct" {
				added50, added99 = fmt.Sprintf("%+.2f", ms(row.AddedP50)), fmt.Sprintf("%+.2f", ms(row.AddedP99))
				cpu = fmt.Sprintf("%.3f", row.CPUPer1000)
			}
			fmt.Fprintf(&b, "| %s | %d | %s | %.0f | %.2f | %.2f | %s | %s | %s | %d |\n",
				sizeName(c.Size), c.Clients, row.Target, row.Rate, ms(row.P50), ms(row.P99), added50, added99, cpu, row.Errors)
		}
	}
	for _, c := range r.Cells {
		for _, row := range r.Rows(c) {
			if row.FirstError != nil {
				fmt.Fprintf(&b, "\n%s, %d clients, %s: %d of %d requests failed; first: %v", sizeName(c.Size), c.Clients, row.Target, row.Errors, row.Errors+row.Requests, row.FirstError)
			}
		}
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// Failed reports whether any request of the run failed.
func (r *Report) Failed() bool {
	for _, c := range r.Cells {
		for _, ss := range c.Samples {
			for _, s := range ss {
				if s.errors > 0 {
					return true
				}
			}
		}
	}
	return false
}

func sizeName(n int) string {
	if n%1024 == 0 {
		return fmt.Sprintf("%dKiB", n/1024)
	}
	return fmt.Sprintf("%dB", n)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}
