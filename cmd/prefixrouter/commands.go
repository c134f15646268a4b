package main

import (
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// commands lists the subcommands of the binary.
func commands() []*cobra.Command {
	cmds := []*cobra.Command{newServeCmd(), newRegisterCmd(), newConfigCmd(), newAdapterCmd(), newAdminCmd(), newModelsimCmd(), newBenchCmd(), newDemoCmd(), newChaosCmd(), newMatrixCmd(), newProxybenchCmd()}
	for _, c := range cmds {
		annotateEnv(c)
	}
	return cmds
}

// annotateEnv appends each flag's environment variable to its help text, so
// that --help shows both spellings.
func annotateEnv(c *cobra.Command) {
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" || strings.Contains(f.Usage, "$PREFIXROUTER_") {
			return
		}
		f.Usage += " ($" + envName(f.Name) + ")"
	})
	for _, sub := range c.Commands() {
		annotateEnv(sub)
	}
}
