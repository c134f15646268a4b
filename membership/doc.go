// Package membership keeps the fleet in etcd: leased instance and router
// registrations, list-then-watch into immutable fleet snapshots, and the
// per-endpoint routing config, adapter catalogue and placement keys.
//
// The etcd layout (v1) under the root prefix (Layout, --etcd-prefix), every
// key there is (parseKey ignores any other):
//
//	<prefix>/endpoints/<endpoint>/instances/<instance-id>   lease-bound fleet.Instance JSON; the instance's agent (register)
//	<prefix>/endpoints/<endpoint>/config                     fleet.RoutingConfig JSON, no lease; config set, admin SetRoutingConfig
//	<prefix>/endpoints/<endpoint>/adapters/<name>            fleet.Adapter JSON, no lease: the catalogue; adapter add/remove
//	<prefix>/endpoints/<endpoint>/placement/<name>           Placement JSON, no lease: the adapter's set size; agents (SetPlacement)
//	<prefix>/endpoints/<endpoint>/stale/<instance-id>        StaleMark JSON under its own short lease; routers (MarkStale), the agent deletes it
//	<prefix>/endpoints/<endpoint>/popularity/<replica-id>    fleet.Popularity JSON under the replica's lease; routers (PutPopularity), merged into snapshots
//	<prefix>/routers/<replica-id>                            lease-bound RouterInfo JSON; each router replica (serve)
//
// Endpoint, instance, replica and adapter names are fleet.ValidateName's:
// one key segment each.
//
// A router replica (prefixrouter serve):
//
//	cli, err := membership.NewClient(membership.ClientOptions{Endpoints: eps})
//	opts := membership.Options{Layout: membership.Layout{Prefix: prefix}, Metrics: membership.NewMetrics(reg)}
//	w := membership.StartWatcher(cli, membership.WatcherOptions{Options: opts}, router.Update)
//	defer w.Close()
//	r, err := membership.RegisterRouter(ctx, cli, replicaID, membership.RouterInfo{Addr: addr, Version: v}, opts)
//	defer r.Close(shutdownCtx)
//	// readiness (router.Readiness) reads w.SnapshotAge() to say how stale the snapshot is.
//
// A model-server instance (prefixrouter register; see package agent):
//
//	reg, err := membership.RegisterInstance(ctx, cli, endpoint, fleet.Instance{ID: id, Addr: addr}, opts)
//	reg.SetAdapters(ctx, []string{"lora-a"}) // in place, same lease
//	reg.SetDraining(ctx, true)               // routers stop sending new requests
//	reg.Close(ctx)                           // revoke: the record disappears at once
//
// The routing config (prefixrouter config set/get):
//
//	err := membership.PutConfig(ctx, cli, layout, endpoint, cfg) // errors.Is(err, fleet.ErrInvalidConfig) → exit 2
//	cfg, set, err := membership.GetConfig(ctx, cli, layout, endpoint)
//
// Registrations hold their key under a lease (DefaultTTL 5 s) and always
// drain the keepalive channel; when the lease is lost (it expired while etcd
// was unreachable, or someone revoked it) they grant a new one and put the
// latest record again, retrying with jittered backoff; keepalives
// unanswered for half a TTL are opened on a new stream as well (an etcd
// member that went silent holds the old one). The watcher lists the
// prefix at revision R (in pages of 1,000 keys, all at R), watches from R+1
// (WithRequireLeader, progress notifications), lists again on
// ErrCompacted or a closed watch, and reopens a watch that heard nothing
// for three progress intervals on a new stream, from where it was. One goroutine owns the state and publishes
// a full snapshot after each list and each watch response that carried
// events. Records that do not parse or validate are skipped and counted; an
// invalid config keeps the endpoint's previous valid one. While etcd is
// unreachable nothing is published: the last snapshot stays (static
// stability) and SnapshotAge grows.
//
// StartEmbedded runs a single etcd member in the process (the demo, a single
// box, tests); StartEmbeddedCluster runs several, each of which a test can
// stop, kill, restart or silence (docs/operations.md, "Losing etcd members").
package membership
