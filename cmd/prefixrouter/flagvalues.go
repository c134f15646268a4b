package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/router"
)

// Flag values that check their input as it is parsed, so that a bad value is
// a flag error (exit 2) naming the flag.

// strategyValue binds --strategy to a fleet.Strategy, case-insensitively.
type strategyValue fleet.Strategy

func (s *strategyValue) String() string { return string(*s) }
func (s *strategyValue) Type() string   { return "strategy" }
func (s *strategyValue) Set(v string) error {
	st := fleet.Strategy(strings.ToUpper(strings.TrimSpace(v)))
	if !st.Valid() {
		return fmt.Errorf("RoutingStrategy %q is not one of PREFIX_AWARE, LEAST_OUTSTANDING_REQUESTS, RANDOM", v)
	}
	*s = strategyValue(st)
	return nil
}

// rangeValue binds an int flag that must lie in [min, max]; name is the
// setting's name in messages.
type rangeValue struct {
	name     string
	p        *int
	min, max int
}

func (r rangeValue) String() string { return strconv.Itoa(*r.p) }
func (r rangeValue) Type() string   { return "int" }
func (r rangeValue) Set(v string) error {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return err
	}
	if n < r.min || n > r.max {
		return fmt.Errorf("%s %d is outside %d..%d", r.name, n, r.min, r.max)
	}
	*r.p = n
	return nil
}

// staticValue binds --static-instances (id=url,...) to a fleet.
type staticValue []fleet.Instance

func (s *staticValue) Type() string { return "id=url,..." }
func (s *staticValue) String() string {
	parts := make([]string, len(*s))
	for i, in := range *s {
		parts[i] = in.ID + "=" + in.Addr
	}
	return strings.Join(parts, ",")
}
func (s *staticValue) Set(v string) error {
	insts, err := fleet.ParseStaticInstances(v)
	if err != nil {
		return err
	}
	*s = insts
	return nil
}

// fileValue binds a flag that names a file: the file is read and parsed
// as the flag is parsed, so that a bad file is a usage error at once, and
// only what parse makes of it is kept in *dst.
type fileValue[T any] struct {
	path  string
	dst   *T
	parse func(path string, data []byte) (T, error)
}

func (v *fileValue[T]) Type() string   { return "file" }
func (v *fileValue[T]) String() string { return v.path }
func (v *fileValue[T]) Set(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	parsed, err := v.parse(path, data)
	if err != nil {
		return err
	}
	v.path, *v.dst = path, parsed
	return nil
}

// apiKeysFile binds --api-keys-file: only the keys' digests are kept.
func apiKeysFile(keys *[]string) *fileValue[[]string] {
	return &fileValue[[]string]{dst: keys, parse: func(_ string, data []byte) ([]string, error) {
		return router.ParseAPIKeys(data)
	}}
}

// sessionKeyFile binds --session-key-file: the file's content, a final line
// break dropped, is the key.
func sessionKeyFile(key *[]byte) *fileValue[[]byte] {
	return &fileValue[[]byte]{dst: key, parse: func(path string, data []byte) ([]byte, error) {
		data = bytes.TrimRight(data, "\r\n")
		if len(data) < router.MinSessionKeyBytes {
			return nil, fmt.Errorf("%s holds %d bytes, want at least %d (e.g. openssl rand -base64 48)", path, len(data), router.MinSessionKeyBytes)
		}
		return data, nil
	}}
}

// bindRouting binds --strategy, --prefix-length, --concurrency-threshold,
// --hot-key-replication, --fixed-length-keys and --tenant-cache-salt to rc,
// starting from the default routing config. PrefixLength starts unset: its
// default depends on the strategy and the keys (fleet.WithDefaults).
func bindRouting(fs *pflag.FlagSet, rc *fleet.RoutingConfig) {
	*rc = fleet.DefaultRoutingConfig()
	p := rc.PrefixAwareRoutingConfig
	p.PrefixLength = 0
	fs.Var((*strategyValue)(&rc.RoutingStrategy), "strategy", "routing strategy: PREFIX_AWARE, LEAST_OUTSTANDING_REQUESTS or RANDOM")
	fs.Var(rangeValue{"PrefixLength", &p.PrefixLength, fleet.MinPrefixLength, fleet.MaxPrefixLength}, "prefix-length", fmt.Sprintf("prefix that forms the routing key, the deepest the router looks at: bytes of the body on invoke paths, characters of message text on OpenAI paths (%d..%d; 0 means %d for PREFIX_AWARE with adaptive keys, else %d)", fleet.MinPrefixLength, fleet.MaxPrefixLength, fleet.DefaultAdaptivePrefixLength, fleet.DefaultPrefixLength))
	fs.BoolVar(&p.FixedLengthKeys, "fixed-length-keys", false, "PREFIX_AWARE: key every prompt on its first --prefix-length units, SageMaker's exact behaviour, instead of following the prompt's tree (route on the shallowest prefix that is not hot, popular prefixes placed by the replicas' agreed view; docs/balance.md)")
	fs.Var(rangeValue{"ConcurrencyThreshold", &p.ConcurrencyThreshold, fleet.MinConcurrencyThreshold, fleet.MaxConcurrencyThreshold}, "concurrency-threshold", fmt.Sprintf("in-flight requests an instance takes before new ones spill to the next candidate (%d..%d)", fleet.MinConcurrencyThreshold, fleet.MaxConcurrencyThreshold))
	fs.BoolVar(&p.HotKeyReplication, "hot-key-replication", false, "PREFIX_AWARE: give a key that alone needs more than one instance the first k of its ring order and spread it over them by load (popularity-aware replication; see docs/balance.md)")
	fs.BoolVar(&rc.TenantCacheSalt, "tenant-cache-salt", false, "set vLLM's cache_salt on OpenAI requests with a prompt_cache_key to a keyed hash of it, so tenants never share cached KV blocks, even on one instance (TenantCacheSalt in the routing config)")
}

// bindEtcd binds the flags of every command that talks to etcd.
func bindEtcd(fs *pflag.FlagSet, c *membership.ClientOptions, l *membership.Layout) {
	fs.StringSliceVar(&c.Endpoints, "etcd-endpoints", []string{membership.DefaultClientURL}, "etcd client URLs, comma-separated")
	fs.StringVar(&l.Prefix, "etcd-prefix", membership.DefaultPrefix, "root of prefixrouter's keys in etcd")
	fs.StringVar(&c.CACert, "etcd-cacert", "", "PEM file of the CA that signed etcd's server certificates (enables TLS)")
	fs.StringVar(&c.Cert, "etcd-cert", "", "PEM client certificate for etcd's --client-cert-auth")
	fs.StringVar(&c.Key, "etcd-key", "", "PEM key of --etcd-cert")
	fs.StringVar(&c.Username, "etcd-username", "", "etcd auth user")
	fs.StringVar(&c.Password, "etcd-password", "", "etcd auth password (prefer $PREFIXROUTER_ETCD_PASSWORD to a flag)")
	fs.DurationVar(&c.DialTimeout, "etcd-dial-timeout", membership.DefaultDialTimeout, "timeout for connecting to etcd")
}

// bindLogLevel binds --log-level, starting at def; newLogger turns it into a
// logger.
func bindLogLevel(fs *pflag.FlagSet, l *slog.Level, def slog.Level, usage string) {
	*l = def
	fs.TextVar(l, "log-level", l, usage+": debug, info, warn or error")
}

func newLogger(l slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}

// bindSimulatedFleet binds the flags that size an in-process fleet of
// simulated model servers (demo, chaos, matrix); the defaults are the values
// already in the fields.
func bindSimulatedFleet(f *pflag.FlagSet, instances, replicas *int, timeScale *float64) {
	f.IntVar(instances, "instances", *instances, "simulated model servers (at the start)")
	f.IntVar(replicas, "replicas", *replicas, "router replicas")
	f.Float64Var(timeScale, "time-scale", *timeScale, "the simulated servers run this many times faster than real time (figures stay in simulated time)")
}

// verdict is the exit of a command whose report passes or fails as a
// whole: nil when it passed, else an error saying what failed (exit 1).
func verdict(passed bool, failed string) error {
	if !passed {
		return errors.New(failed)
	}
	return nil
}

// writeOut writes a report with write to the file named by an --out flag, or
// to stdout when it is empty; a file that cannot be written is an error.
func writeOut(cmd *cobra.Command, out string, write func(io.Writer) error) error {
	if out == "" {
		return write(cmd.OutOrStdout())
	}
	fh, err := os.Create(out)
	if err != nil {
		return err
	}
	if err := write(fh); err != nil {
		fh.Close()
		return err
	}
	return fh.Close()
}
