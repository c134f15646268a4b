package replica

import (
	"cmp"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// routingFlag is one `serve` setting that a routing config carries.
type routingFlag struct {
	flag  string
	value func(c fleet.Resolved, firstByte time.Duration) string
}

// routingFlags are the `serve` settings an endpoint's stored routing config
// replaces, each with how to read its effective value from a config.
// firstByte is the replica's --upstream-first-byte-timeout, which applies
// wherever a config sets no FirstByteTimeoutInMilliseconds.
var routingFlags = []routingFlag{
	{"strategy", func(c fleet.Resolved, _ time.Duration) string { return string(c.Strategy) }},
	{"prefix-length", func(c fleet.Resolved, _ time.Duration) string { return strconv.Itoa(c.PrefixLength) }},
	{"concurrency-threshold", func(c fleet.Resolved, _ time.Duration) string { return strconv.Itoa(c.ConcurrencyThreshold) }},
	{"hot-key-replication", func(c fleet.Resolved, _ time.Duration) string { return strconv.FormatBool(c.HotKeyReplication) }},
	{"tenant-cache-salt", func(c fleet.Resolved, _ time.Duration) string { return strconv.FormatBool(c.TenantCacheSalt) }},
	{"upstream-first-byte-timeout", func(c fleet.Resolved, d time.Duration) string { return cmp.Or(c.FirstByteTimeout, d).String() }},
}

// RoutingFlagNames are the flags Options.RoutingFlags may name.
func RoutingFlagNames() []string {
	out := make([]string, len(routingFlags))
	for i, f := range routingFlags {
		out[i] = f.flag
	}
	return out
}

// validRoutingFlag reports whether name is one of routingFlags.
func validRoutingFlag(name string) bool {
	return slices.ContainsFunc(routingFlags, func(f routingFlag) bool { return f.flag == name })
}

// overrides lists the operator's routing settings that cfg, an endpoint's
// resolved routing config, replaces. A setting is the operator's when it is
// named in RoutingFlags or differs from the built-in default. An endpoint
// without a stored config runs Routing itself, so it has none.
func (o Options) overrides(cfg fleet.Resolved) []fleet.Override {
	// Validate checked Routing; the zero config resolves to the defaults.
	mine, _ := o.Routing.Resolve()
	builtIn, _ := fleet.RoutingConfig{}.Resolve()
	var out []fleet.Override
	for _, f := range routingFlags {
		given := f.value(mine, o.Router.FirstByteTimeout)
		if !slices.Contains(o.RoutingFlags, f.flag) && given == f.value(builtIn, 0) {
			continue
		}
		if stored := f.value(cfg, o.Router.FirstByteTimeout); stored != given {
			out = append(out, fleet.Override{Flag: f.flag, Given: given, Stored: stored})
		}
	}
	return out
}

// overrideLog logs, for the first snapshot and then whenever an endpoint's
// routing config changes, the operator's settings that the endpoint's stored
// config replaces, and when it stops replacing them. Owner: the watcher's
// goroutine (it runs in the snapshot callback).
type overrideLog struct {
	opts Options
	log  *slog.Logger
	last map[string]fleet.Resolved
}

func newOverrideLog(opts Options, log *slog.Logger) *overrideLog {
	return &overrideLog{opts: opts, log: log, last: map[string]fleet.Resolved{}}
}

func (l *overrideLog) snapshot(s *fleet.Snapshot) {
	for name, ep := range s.Endpoints {
		prev, seen := l.last[name]
		if seen && reflect.DeepEqual(prev, ep.Resolved) {
			continue
		}
		l.last[name] = ep.Resolved
		if ov := l.opts.overrides(ep.Resolved); len(ov) > 0 {
			l.log.Warn("the endpoint's stored routing config ('config set') replaces settings given to this replica", "endpoint", name, "overridden", formatOverrides(ov))
		} else if seen && len(l.opts.overrides(prev)) > 0 {
			l.log.Info("the endpoint's routing config no longer replaces settings given to this replica", "endpoint", name)
		}
	}
	for name := range l.last {
		if s.Endpoint(name) == nil {
			delete(l.last, name)
		}
	}
}

// formatOverrides reads "--hot-key-replication=true (stored: false), ...".
func formatOverrides(ov []fleet.Override) string {
	parts := make([]string, len(ov))
	for i, o := range ov {
		parts[i] = fmt.Sprintf("--%s=%s (stored: %s)", o.Flag, o.Given, o.Stored)
	}
	return strings.Join(parts, ", ")
}
