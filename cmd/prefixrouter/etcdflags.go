package main

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/membership"
)

// etcdFlags are the flags of every command that talks to etcd.
type etcdFlags struct {
	endpoints []string
	prefix    string
	cacert    string
	cert      string
	key       string
	username  string
	password  string
	dial      time.Duration
}

func (e *etcdFlags) register(fs *pflag.FlagSet) {
	fs.StringSliceVar(&e.endpoints, "etcd-endpoints", []string{membership.DefaultClientURL}, "etcd client URLs, comma-separated")
	fs.StringVar(&e.prefix, "etcd-prefix", membership.DefaultPrefix, "root of prefixrouter's keys in etcd")
	fs.StringVar(&e.cacert, "etcd-cacert", "", "PEM file of the CA that signed etcd's server certificates (enables TLS)")
	fs.StringVar(&e.cert, "etcd-cert", "", "PEM client certificate for etcd's --client-cert-auth")
	fs.StringVar(&e.key, "etcd-key", "", "PEM key of --etcd-cert")
	fs.StringVar(&e.username, "etcd-username", "", "etcd auth user")
	fs.StringVar(&e.password, "etcd-password", "", "etcd auth password (prefer $PREFIXROUTER_ETCD_PASSWORD to a flag)")
	fs.DurationVar(&e.dial, "etcd-dial-timeout", membership.DefaultDialTimeout, "timeout for connecting to etcd")
}

func (e *etcdFlags) clientConfig() membership.ClientConfig {
	return membership.ClientConfig{
		Endpoints: e.endpoints, CACert: e.cacert, Cert: e.cert, Key: e.key,
		Username: e.username, Password: e.password, DialTimeout: e.dial,
	}
}

func (e *etcdFlags) layout() membership.Layout { return membership.Layout{Prefix: e.prefix} }

// client validates the flags (a usage error, exit 2) and connects.
func (e *etcdFlags) client() (*clientv3.Client, error) {
	cfg := e.clientConfig()
	if err := cfg.Validate(); err != nil {
		return nil, usageErr("%w", err)
	}
	cli, err := membership.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd %v: %w", e.endpoints, err)
	}
	return cli, nil
}
