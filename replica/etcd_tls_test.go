package replica

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/router"
)

// TestEmbeddedEtcdMTLS: serve's --embedded-etcd with TLS and client
// certificate auth. The replica (through its own client certificate) and an
// agent with a certificate work; an agent or a replica with a certificate of
// another CA fails at start with a message that says so.
// waitRouted waits until rep's snapshot holds the one instance registered
// for "chat" and checks that an invocation reaches it.
func waitRouted(t *testing.T, rep *Replica) {
	t.Helper()
	testsupport.Eventually(t, 10*time.Second, "instance routed", func() bool {
		s := rep.Router().Snapshot().Endpoint("chat")
		return s != nil && len(s.Instances) == 1
	})
	if code := post(t, rep.URL()); code != 200 {
		t.Fatalf("invocation: %d", code)
	}
}

func TestEmbeddedEtcdMTLS(t *testing.T) {
	pki, other := testsupport.NewPKI(t), testsupport.NewPKI(t)
	ctx := testsupport.Context(t, 60*time.Second)
	rep, err := Start(ctx, Options{
		ID: "r-1", Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Logger: quiet,
		Router:                router.Options{DefaultEndpoint: "chat"},
		EmbeddedEtcdDir:       t.TempDir(),
		EmbeddedEtcdClientURL: "https://127.0.0.1:0",
		EmbeddedEtcdTLS:       EmbeddedEtcdTLS{Cert: pki.ServerCert, Key: pki.ServerKey, ClientCA: pki.CACert},
		Etcd:                  membership.ClientOptions{CACert: pki.CACert, Cert: pki.ClientCert, Key: pki.ClientKey},
		Membership:            membership.Options{Logger: quiet},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close(context.Background())
	url := rep.opts.Etcd.Endpoints[0]
	if !strings.HasPrefix(url, "https://") {
		t.Fatalf("embedded etcd URL %q is not https", url)
	}
	agentCli, err := membership.NewClient(membership.ClientOptions{Endpoints: []string{url}, CACert: pki.CACert, Cert: pki.ClientCert, Key: pki.ClientKey})
	if err != nil {
		t.Fatal(err)
	}
	defer agentCli.Close()
	reg, err := membership.RegisterInstance(ctx, agentCli, "chat", backends(t, 1)[0], membership.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(context.Background())
	waitRouted(t, rep)

	// Wrong credentials: a certificate of another CA.
	bad, err := membership.NewClient(membership.ClientOptions{Endpoints: []string{url}, CACert: pki.CACert, Cert: other.ClientCert, Key: other.ClientKey, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = membership.RegisterInstance(rctx, bad, "chat", fleet.Instance{ID: "intruder", Addr: "http://127.0.0.1:1"}, membership.Options{Logger: quiet})
	cancel()
	if err == nil {
		t.Fatal("an agent with a foreign certificate registered")
	}
	_, err = Start(ctx, Options{
		ID: "r-2", Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Logger: quiet,
		Router: router.Options{DefaultEndpoint: "chat"},
		Etcd:   membership.ClientOptions{Endpoints: []string{url}, CACert: pki.CACert, Cert: other.ClientCert, Key: other.ClientKey, DialTimeout: 2 * time.Second},
	})
	if err == nil || !strings.Contains(err.Error(), "refused this replica's credentials") {
		t.Fatalf("replica with a foreign certificate: Start = %v, want a credentials error", err)
	}
	t.Logf("wrong certificate: %v", err)
}

// TestEtcdRolesWithAuth runs etcd with client TLS and auth (RBAC) in the
// roles docs/security.md prescribes: a router reads everything and writes
// only its routers/ key; an agent writes only its own instance key. Both
// work; an agent cannot write another instance's key; a wrong password
// fails the replica's start with a clear message.
func TestEtcdRolesWithAuth(t *testing.T) {
	pki := testsupport.NewPKI(t)
	ctx := testsupport.Context(t, 60*time.Second)
	e, err := membership.StartEmbedded(t.TempDir(), "https://127.0.0.1:0", membership.WithFastTicks(), membership.WithClientTLS(pki.ServerCert, pki.ServerKey, pki.CACert, true))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	tlsOpts := func(user, pass string) membership.ClientOptions {
		return membership.ClientOptions{Endpoints: e.Endpoints(), CACert: pki.CACert, Cert: pki.ClientCert, Key: pki.ClientKey, Username: user, Password: pass, DialTimeout: 5 * time.Second}
	}
	root, err := membership.NewClient(tlsOpts("", ""))
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	l := membership.Layout{}
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	end := clientv3.GetPrefixRangeEnd
	must(root.UserAdd(ctx, "root", "rootpw"))
	must(root.UserGrantRole(ctx, "root", "root"))
	must(root.RoleAdd(ctx, "router"))
	must(root.RoleGrantPermission(ctx, "router", l.Root(), end(l.Root()), clientv3.PermissionType(clientv3.PermRead)))
	must(root.RoleGrantPermission(ctx, "router", l.RouterKey("r-1"), "", clientv3.PermissionType(clientv3.PermReadWrite)))
	must(root.UserAdd(ctx, "router-r-1", "routerpw"))
	must(root.UserGrantRole(ctx, "router-r-1", "router"))
	must(root.RoleAdd(ctx, "agent-vllm-0"))
	must(root.RoleGrantPermission(ctx, "agent-vllm-0", l.InstanceKey("chat", "vllm-0"), "", clientv3.PermissionType(clientv3.PermReadWrite)))
	must(root.UserAdd(ctx, "agent-vllm-0", "agentpw"))
	must(root.UserGrantRole(ctx, "agent-vllm-0", "agent-vllm-0"))
	must(root.AuthEnable(ctx))

	rep, err := Start(ctx, Options{
		ID: "r-1", Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Logger: quiet,
		Router: router.Options{DefaultEndpoint: "chat"}, Etcd: tlsOpts("router-r-1", "routerpw"),
		Membership: membership.Options{Logger: quiet},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close(context.Background())
	agent, err := membership.NewClient(tlsOpts("agent-vllm-0", "agentpw"))
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	in := backends(t, 1)[0]
	in.ID = "vllm-0"
	reg, err := membership.RegisterInstance(ctx, agent, "chat", in, membership.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(context.Background())
	waitRouted(t, rep)
	if _, err := agent.Put(ctx, l.InstanceKey("chat", "vllm-1"), `{"addr":"http://127.0.0.1:1"}`); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("agent writing another instance's key = %v, want permission denied", err)
	}
	_, err = Start(ctx, Options{
		ID: "r-2", Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Logger: quiet,
		Router: router.Options{DefaultEndpoint: "chat"}, Etcd: tlsOpts("router-r-1", "wrong"),
	})
	if err == nil || !strings.Contains(err.Error(), "authentication failed") {
		t.Fatalf("replica with a wrong password: Start = %v, want an authentication error", err)
	}
	t.Logf("wrong password: %v", err)
}
