package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/membership"
)

func newAdapterCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "adapter",
		Short: "Manage an endpoint's LoRA adapter catalogue in etcd (agents load what is catalogued)",
		Long: `adapter add, remove and list edit <prefix>/endpoints/<endpoint>/adapters/<name>. The
agents beside the model servers place every catalogued adapter on the first k instances of
its rendezvous order that have a free adapter slot (k between --min-replicas and
--max-replicas, grown under sustained load), load it there with POST /v1/load_lora_adapter
and unload it elsewhere. See docs/adapters.md.`,
	}
	c.AddCommand(newAdapterAddCmd(), newAdapterRemoveCmd(), newAdapterListCmd())
	return c
}

func newAdapterAddCmd() *cobra.Command {
	c := newEndpointCmd("add", "Add an adapter to the catalogue, or change its source or replica range", "endpoint whose catalogue to change")
	var a fleet.Adapter
	f := c.Flags()
	f.StringVar(&a.Name, "name", "", "adapter name: what requests name as model (required)")
	f.StringVar(&a.Source, "source", "", "what the model server loads it from (vLLM's lora_path) (required)")
	f.IntVar(&a.MinReplicas, "min-replicas", fleet.DefaultMinReplicas, "instances that hold the adapter when it is cold")
	f.IntVar(&a.MaxReplicas, "max-replicas", fleet.DefaultMaxReplicas, "instances it may grow to under sustained load")
	c.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := a.Validate(); err != nil {
			return usageErr("%w", err)
		}
		return c.etcd(cmd, func(ctx context.Context, cli *clientv3.Client) error {
			if err := membership.PutAdapter(ctx, cli, c.ef.layout, c.endpoint, a); err != nil {
				return fmt.Errorf("adapter add: %w", err)
			}
			return printJSON(cmd.OutOrStdout(), adapterJSON(a))
		})
	}
	return c.Command
}

func newAdapterRemoveCmd() *cobra.Command {
	c := newEndpointCmd("remove", "Remove an adapter from the catalogue (agents unload it)", "endpoint whose catalogue to change")
	name := c.Flags().String("name", "", "adapter name (required)")
	c.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := (fleet.Adapter{Name: *name, Source: "-"}).Validate(); err != nil {
			return usageErr("--name: %w", err)
		}
		return c.etcd(cmd, func(ctx context.Context, cli *clientv3.Client) error {
			if err := membership.DeleteAdapter(ctx, cli, c.ef.layout, c.endpoint, *name); err != nil {
				return fmt.Errorf("adapter remove: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %s\n", *name)
			return nil
		})
	}
	return c.Command
}

func newAdapterListCmd() *cobra.Command {
	c := newEndpointCmd("list", "Print the catalogue with each adapter's current target size", "endpoint whose catalogue to print")
	asJSON := c.Flags().Bool("json", false, "print JSON instead of a table")
	c.RunE = func(cmd *cobra.Command, _ []string) error {
		return c.etcd(cmd, func(ctx context.Context, cli *clientv3.Client) error {
			ads, err := membership.ListAdapters(ctx, cli, c.ef.layout, c.endpoint)
			if err != nil {
				return fmt.Errorf("adapter list: %w", err)
			}
			if *asJSON {
				out := make([]adapterOut, len(ads))
				for i, a := range ads {
					out[i] = adapterJSON(a)
				}
				return printJSON(cmd.OutOrStdout(), out)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSOURCE\tMIN\tMAX\tTARGET")
			for _, a := range ads {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\n", a.Name, a.Source, a.Min(), a.Max(), a.Target())
			}
			return tw.Flush()
		})
	}
	return c.Command
}

// adapterOut is the JSON the adapter commands print.
type adapterOut struct {
	Name        string `json:"name"`
	Source      string `json:"source"`
	MinReplicas int    `json:"minReplicas"`
	MaxReplicas int    `json:"maxReplicas"`
	Replicas    int    `json:"replicas"`
}

func adapterJSON(a fleet.Adapter) adapterOut {
	return adapterOut{Name: a.Name, Source: a.Source, MinReplicas: a.Min(), MaxReplicas: a.Max(), Replicas: a.Target()}
}
