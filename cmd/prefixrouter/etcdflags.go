package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/membership"
)

// etcdFlags are the etcd settings of the one-shot commands (register, config).
type etcdFlags struct {
	cfg    membership.ClientOptions
	layout membership.Layout
}

func (e *etcdFlags) register(fs *pflag.FlagSet) { bindEtcd(fs, &e.cfg, &e.layout) }

// client validates the flags (a usage error, exit 2) and connects.
func (e *etcdFlags) client() (*clientv3.Client, error) {
	if err := e.cfg.Validate(); err != nil {
		return nil, usageErr("%w", err)
	}
	cli, err := membership.NewClient(e.cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd %v: %w", e.cfg.Endpoints, err)
	}
	return cli, nil
}

// endpointCmd is a one-shot command on one endpoint's keys in etcd (config,
// adapter): it carries the etcd flags and --endpoint, and etcd runs one
// bounded call against them.
type endpointCmd struct {
	*cobra.Command
	ef       etcdFlags
	endpoint string
}

func newEndpointCmd(use, short, endpointUsage string) *endpointCmd {
	c := &endpointCmd{Command: &cobra.Command{Use: use, Short: short, Args: cobra.NoArgs}}
	c.ef.register(c.Flags())
	c.Flags().StringVar(&c.endpoint, "endpoint", "default", endpointUsage)
	return c
}

// etcd validates the endpoint name, connects and runs call under the dial
// timeout.
func (c *endpointCmd) etcd(cmd *cobra.Command, call func(context.Context, *clientv3.Client) error) error {
	if err := fleet.ValidateName("endpoint name", c.endpoint); err != nil {
		return usageErr("--endpoint: %w", err)
	}
	cli, err := c.ef.client()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := contextTimeout(cmd, c.ef.cfg.DialTimeout)
	defer cancel()
	return call(ctx, cli)
}
