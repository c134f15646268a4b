// Command prefixrouter is a distributed, prefix-aware request router for
// fleets of LLM model servers. One binary, several subcommands; this package
// only wires flags to the library packages.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// usageError is invalid input found by the command line itself (flags,
// arguments); it wraps fleet.ErrInvalid, which every Validate in the tree
// wraps too, so that one errors.Is picks the exit code.
type usageError struct{ err error }

func (e *usageError) Error() string   { return e.err.Error() }
func (e *usageError) Unwrap() []error { return []error{e.err, fleet.ErrInvalid} }

func usageErr(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...)}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the command line and returns the process exit code: 0 on
// success, 2 on invalid input (flags, values, an invalid routing config), 1
// on any other failure.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "prefixrouter:", err)
	if errors.Is(err, fleet.ErrInvalid) {
		return 2
	}
	return 1
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "prefixrouter",
		Short: "Prefix-aware request router for fleets of LLM model servers",
		Long: `prefixrouter sends LLM requests that share a prompt prefix to the same model-server
instance, so that the instance's KV prefix cache stays warm, while circuit breakers and a
per-instance concurrency threshold spread overflow. Instances register in etcd under a lease;
stateless router replicas watch etcd and agree on every choice.

Every flag can also be set through the environment as PREFIXROUTER_<FLAG_NAME>, e.g.
PREFIXROUTER_ETCD_ENDPOINTS=http://10.0.0.1:2379 for --etcd-endpoints. A flag given on the
command line wins over the environment.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return applyEnv(cmd.Flags())
		},
	}
	// With Args set, cobra hands an unknown subcommand to RunE instead of
	// failing with an untyped error.
	root.Args = cobra.ArbitraryArgs
	root.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			msg += fmt.Sprintf("; did you mean %q?", s[0])
		}
		return usageErr("%s (see 'prefixrouter --help')", msg)
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageErr("%w", err) })
	root.AddCommand(commands()...)
	return root
}

// envName maps a flag name to its environment variable: --etcd-endpoints →
// PREFIXROUTER_ETCD_ENDPOINTS.
func envName(flag string) string {
	return "PREFIXROUTER_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// applyEnv sets every flag not given on the command line from its
// environment variable, if present.
func applyEnv(fs *pflag.FlagSet) error {
	var firstErr error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || firstErr != nil {
			return
		}
		v, ok := os.LookupEnv(envName(f.Name))
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			firstErr = usageErr("invalid %s=%q: %w", envName(f.Name), v, err)
		}
	})
	return firstErr
}
