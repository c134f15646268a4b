package main

import (
	"fmt"

	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"

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
