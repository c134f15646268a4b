package router

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// DefaultStaleAfter is the snapshot age past which readiness reports the
// snapshot as stale when Options.StaleAfter is zero: several etcd progress
// notifications (membership.ProgressInterval) have been missed by then.
const DefaultStaleAfter = 30 * time.Second

// Readiness is whether the replica can route, with the facts behind the
// verdict. It is the one readiness definition: the data-plane /readyz, the
// admin port's /readyz and the gRPC health service all read it.
//
// The rule: ready when the replica is not shutting down (Drain), a fleet
// snapshot is loaded and it has at least one instance that is not draining
// (a fleet of only draining instances can serve nothing new). The snapshot's age does not change the verdict —
// static stability: a replica routing on its last good snapshot while etcd
// is away beats no replica — it only adds the stale note.
type Readiness struct {
	// Err is nil when ready, otherwise why not.
	Err error
	// ShuttingDown is true once Drain was called.
	ShuttingDown bool
	// Loaded is false before the first snapshot; the fields below are then
	// zero.
	Loaded bool
	// Revision, Replicas and Instances (draining ones included) describe
	// the snapshot; Draining counts its draining instances.
	Revision            int64
	Replicas, Instances int
	Draining            int
	// Static is true for a fixed fleet (no etcd): Age and Stale do not
	// apply.
	Static bool
	// Age is the time since the replica last heard from etcd (not since the
	// fleet last changed); Stale is Age > Options.StaleAfter.
	Age   time.Duration
	Stale bool
}

// ErrShuttingDown is Readiness's Err once Drain was called.
var ErrShuttingDown = errors.New("router: shutting down")

// Drain marks the replica as shutting down: from now on readiness fails
// (/readyz answers 503, gRPC health NOT_SERVING) while requests are still
// routed, so that load balancers probing /readyz stop sending before the
// listener closes (issue 12: the listener closed while /readyz said ready).
// It cannot be undone.
func (r *Router) Drain() { r.shuttingDown.Store(true) }

// Readiness evaluates readiness now.
func (r *Router) Readiness() Readiness {
	v := r.view.Load()
	if v == nil {
		return Readiness{Err: errors.New("router: no fleet snapshot loaded"), ShuttingDown: r.shuttingDown.Load()}
	}
	rd := Readiness{Loaded: true, Revision: v.snap.Revision, Replicas: v.snap.Replicas, Instances: v.snap.InstanceCount(), Draining: v.draining}
	if !v.ready {
		rd.Err = errors.New("router: the fleet has no instance that is not draining")
	}
	if r.shuttingDown.Load() {
		rd.ShuttingDown = true
		rd.Err = ErrShuttingDown
	}
	if r.opts.SnapshotAge == nil {
		rd.Static = true
	} else {
		rd.Age = r.opts.SnapshotAge()
		rd.Stale = rd.Age > r.opts.StaleAfter
	}
	return rd
}

// Ready is Readiness().Err: nil when the router can route.
func (r *Router) Ready() error { return r.Readiness().Err }

// String describes the snapshot behind the verdict, e.g.
// "revision=12 instances=3 replicas=2 snapshot_age=1.2s fresh" or
// "static fleet instances=3"; empty before the first snapshot.
func (rd Readiness) String() string {
	if !rd.Loaded {
		return ""
	}
	drain := ""
	if rd.Draining > 0 {
		drain = fmt.Sprintf(" draining=%d", rd.Draining)
	}
	if rd.Static {
		return fmt.Sprintf("static fleet instances=%d%s", rd.Instances, drain)
	}
	note := "fresh"
	if rd.Stale {
		note = "stale (etcd unreachable? routing on the last good snapshot)"
	}
	return fmt.Sprintf("revision=%d instances=%d%s replicas=%d snapshot_age=%s %s", rd.Revision, rd.Instances, drain, rd.Replicas, rd.Age.Round(time.Millisecond), note)
}

// ServeReadyz answers a readiness probe: 200 "ok <details>" when ready, 503
// "not ready: <why>; <details>" otherwise (details as Readiness.String). The
// data plane's /readyz and the admin port's /readyz are this handler.
func (r *Router) ServeReadyz(w http.ResponseWriter, _ *http.Request) {
	rd := r.Readiness()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if rd.Err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		msg := "not ready: " + rd.Err.Error()
		if s := rd.String(); s != "" {
			msg += "; " + s
		}
		_, _ = io.WriteString(w, msg+"\n")
		return
	}
	_, _ = io.WriteString(w, "ok "+rd.String()+"\n")
}
