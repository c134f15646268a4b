package membership

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// EmbeddedCluster is an etcd cluster of one or more embedded members in this
// process, every one on loopback with its own data directory: the in-process
// stand-in for the 3-member cluster production runs (docs/operations.md). Tests
// stop, kill and restart single members under a live fleet with it.
//
// With more than one member, clients and peers reach each member through
// loopback bridges (etcd's integration package does the same), whose
// addresses the member advertises and keeps across restarts. Kill drops the
// member's connections at once, as the death of its process would: an
// embedded member stopped in process would otherwise hold its clients'
// streams open, answering nothing, for etcd's request timeout (5 s). A
// cluster of one member is exactly StartEmbedded's, without bridges.
type EmbeddedCluster struct {
	// By member; nil for a single member. A bridge's address never
	// changes; its target follows the member's restarts.
	clients, peers []*bridge

	mu      sync.Mutex // guards members
	members []*Embedded
}

// clusterMember is what makes an embedded member one of an EmbeddedCluster:
// the URLs of its bridges, which it advertises.
type clusterMember struct {
	name, initialCluster, token string
	peerURL, clientURL          url.URL
}

// StartEmbeddedCluster starts an n-member etcd cluster with the data of
// member i in dir/member-i (with n == 1, the single member's data is dir
// itself, as StartEmbedded's), on free loopback ports, and returns once
// every member serves requests.
func StartEmbeddedCluster(dir string, n int, opts ...EmbeddedOption) (*EmbeddedCluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("membership: an etcd cluster of %d members: want at least 1", n)
	}
	if n == 1 {
		e, err := StartEmbedded(dir, "http://127.0.0.1:0", opts...)
		if err != nil {
			return nil, err
		}
		return &EmbeddedCluster{members: []*Embedded{e}}, nil
	}
	var o embeddedOptions
	for _, opt := range opts {
		opt(&o)
	}
	c := &EmbeddedCluster{members: make([]*Embedded, n), clients: make([]*bridge, n), peers: make([]*bridge, n)}
	fail := func(err error) (*EmbeddedCluster, error) {
		c.Close()
		return nil, err
	}
	// Every member must know every peer URL before any starts: the
	// bridges' addresses.
	var initial []string
	for i := range n {
		var err error
		if c.peers[i], err = startBridge(); err != nil {
			return fail(err)
		}
		if c.clients[i], err = startBridge(); err != nil {
			return fail(err)
		}
		initial = append(initial, fmt.Sprintf("member-%d=http://%s", i, c.peers[i].addr()))
	}
	scheme := "http"
	if o.tls != nil {
		scheme = "https"
	}
	for i := range n {
		mo := o
		mo.member = &clusterMember{
			name: fmt.Sprintf("member-%d", i), initialCluster: strings.Join(initial, ","), token: "prefixrouter-embedded",
			peerURL:   url.URL{Scheme: "http", Host: c.peers[i].addr()},
			clientURL: url.URL{Scheme: scheme, Host: c.clients[i].addr()},
		}
		e, err := launchEmbedded(filepath.Join(dir, mo.member.name), scheme+"://127.0.0.1:0", mo)
		if err != nil {
			return fail(err)
		}
		c.members[i] = e
		c.connect(i, e)
	}
	for _, e := range c.members {
		if err := e.waitReady(); err != nil {
			return fail(err)
		}
	}
	return c, nil
}

// connect points member i's bridges at e.
func (c *EmbeddedCluster) connect(i int, e *Embedded) {
	u, _ := url.Parse(e.clientURL) // launchEmbedded built it
	c.clients[i].resume(u.Host)
	c.peers[i].resume(e.peerAddr)
}

// Size is the number of members, running or not.
func (c *EmbeddedCluster) Size() int { return len(c.members) }

// Member returns member i as it runs now (a new value after Restart).
func (c *EmbeddedCluster) Member(i int) *Embedded {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i]
}

// Endpoints are the client URLs of every member, running or not, in member
// order: what an operator gives --etcd-endpoints.
func (c *EmbeddedCluster) Endpoints() []string {
	if c.clients == nil {
		return c.Member(0).Endpoints()
	}
	out := make([]string, len(c.clients))
	for i := range c.clients {
		u := c.Member(i).opts.member.clientURL
		out[i] = u.String()
	}
	return out
}

// Running reports whether member i runs (it was not stopped or killed
// since it last started).
func (c *EmbeddedCluster) Running(i int) bool { return !c.Member(i).closing.Load() }

// Leader returns the index of the running member that is the leader by its
// own account, or -1 while no running member is.
func (c *EmbeddedCluster) Leader() int {
	for i := range c.members {
		e := c.Member(i)
		if !e.closing.Load() && e.etcd.Server.Leader() == e.etcd.Server.MemberID() {
			return i
		}
	}
	return -1
}

// Stop stops member i gracefully, as etcd does on SIGTERM: it finishes its
// clients' requests (streams get etcd's request timeout to end), hands its
// leadership to a peer if it leads, and exits. It waits until the member has
// stopped. Stopping a stopped member does nothing.
func (c *EmbeddedCluster) Stop(i int) error {
	err := c.Member(i).Close()
	c.cut(i)
	return err
}

// Kill stops member i as kill -9 would: its raft node halts at once (no
// leadership hand-over; its peers elect a new leader after an election
// timeout) and its client and peer connections drop. It waits until the
// member has stopped.
func (c *EmbeddedCluster) Kill(i int) error {
	e := c.Member(i)
	if e.closing.Load() {
		return nil
	}
	e.etcd.Server.HardStop()
	c.cut(i)
	return e.Close()
}

// Partition cuts member i off from its clients without stopping it: their
// connections stay open but carry nothing (new ones too), as when a
// firewall drops the packets between the routers' hosts and the member's,
// or the member's process hangs without its kernel closing its sockets.
// The member stays in the cluster, its peers see it (a leader stays leader).
// Clients notice only through their own timeouts. Heal ends it. A
// single-member cluster cannot be partitioned.
func (c *EmbeddedCluster) Partition(i int) {
	if c.clients != nil {
		c.clients[i].freeze()
	}
}

// Delay holds every chunk member i sends to its clients for d before
// passing it on, as a slow link or an overloaded member would (requests
// reach it at once); 0 ends it. A single-member cluster has no bridge to
// delay.
func (c *EmbeddedCluster) Delay(i int, d time.Duration) {
	if c.clients != nil {
		c.clients[i].lag.Store(int64(d))
	}
}

// Heal ends Partition: what was held is delivered.
func (c *EmbeddedCluster) Heal(i int) {
	if c.clients != nil {
		c.clients[i].thawOut()
	}
}

func (c *EmbeddedCluster) cut(i int) {
	if c.clients != nil {
		c.clients[i].cut()
		c.peers[i].cut()
	}
}

// Restart starts the given stopped members again on their data
// directories, all at once (a member is ready only once a quorum runs), and
// returns when each serves requests. Running members are left alone.
func (c *EmbeddedCluster) Restart(members ...int) error {
	var started []int
	var errs []error
	for _, i := range members {
		old := c.Member(i)
		if !old.closing.Load() {
			continue
		}
		listen := old.clientURL
		if c.clients != nil {
			// Behind a bridge the member's own port may change.
			u, _ := url.Parse(old.clientURL)
			u.Host = "127.0.0.1:0"
			listen = u.String()
		}
		n, err := launchEmbedded(old.dir, listen, old.opts)
		if err != nil {
			errs = append(errs, fmt.Errorf("member %d: %w", i, err))
			continue
		}
		c.mu.Lock()
		c.members[i] = n
		c.mu.Unlock()
		if c.clients != nil {
			c.connect(i, n)
		}
		started = append(started, i)
	}
	for _, i := range started {
		if err := c.Member(i).waitReady(); err != nil {
			errs = append(errs, fmt.Errorf("member %d: %w", i, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("membership: restart embedded etcd: %w", err)
	}
	return nil
}

// All returns the indices of every member, for Restart.
func (c *EmbeddedCluster) All() []int {
	out := make([]int, len(c.members))
	for i := range out {
		out[i] = i
	}
	return out
}

// Close stops every member and waits for them. It is safe to call more
// than once.
func (c *EmbeddedCluster) Close() error {
	for _, b := range c.clients {
		if b != nil {
			b.cut() // clients go first: no member waits for their streams
		}
	}
	// One at a time: a member that leads hands its leadership to a peer
	// still running (quick), where one stopping too would make it wait out
	// etcd's request timeout.
	for i := range c.members {
		if e := c.Member(i); e != nil {
			_ = e.Close()
		}
	}
	// Then the peer connections etcd leaves behind (its peer server waits
	// a second for them, then lets them run out their read timeout).
	for _, bs := range [][]*bridge{c.clients, c.peers} {
		for _, b := range bs {
			if b != nil {
				b.close()
			}
		}
	}
	return nil
}

// bridge forwards TCP connections from a fixed loopback port to a member's
// client or peer port. While cut (and until its first target) it drops every
// connection it holds and closes new ones as soon as they are accepted, as
// a dead process's port would refuse them.
type bridge struct {
	ln net.Listener

	mu     sync.Mutex // guards target, conns, down and thaw
	target string     // host:port of the member
	conns  map[net.Conn]struct{}
	down   bool
	// thaw is non-nil while the bridge is frozen: connections stay open
	// but carry nothing until it is closed (by thawOut or cut).
	thaw chan struct{}
	// lag delays what the member sends back (Delay), in nanoseconds.
	lag atomic.Int64

	wg sync.WaitGroup
}

func startBridge() (*bridge, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("membership: bridge: %w", err)
	}
	b := &bridge{ln: ln, conns: map[net.Conn]struct{}{}, down: true}
	b.wg.Go(b.serve)
	return b, nil
}

func (b *bridge) addr() string { return b.ln.Addr().String() }

func (b *bridge) serve() {
	for {
		in, err := b.ln.Accept()
		if err != nil {
			return // closed
		}
		target := b.track(in)
		if target == "" {
			_ = in.Close()
			continue
		}
		b.wg.Go(func() { b.forward(in, target) })
	}
}

// track adds conn to the connections cut drops and returns the target,
// or "" when the bridge is cut.
func (b *bridge) track(conn net.Conn) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down {
		return ""
	}
	b.conns[conn] = struct{}{}
	return b.target
}

func (b *bridge) untrack(conn net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.conns, conn)
}

func (b *bridge) forward(in net.Conn, target string) {
	defer b.untrack(in)
	defer in.Close()
	b.waitThaw()
	out, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	if b.track(out) == "" {
		_ = out.Close()
		return
	}
	defer b.untrack(out)
	defer out.Close()
	done := make(chan struct{}, 2)
	go func() { b.pipe(out, in, false); done <- struct{}{} }()
	go func() { b.pipe(in, out, true); done <- struct{}{} }()
	<-done
	<-done
}

// pipe copies src to dst, holding what it reads while the bridge is frozen,
// and for the bridge's lag when lagged (the member's side). Either side
// ending ends the pair, as one TCP connection would.
func (b *bridge) pipe(dst, src net.Conn, lagged bool) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			b.waitThaw()
			if d := time.Duration(b.lag.Load()); lagged && d > 0 {
				time.Sleep(d)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// waitThaw returns once the bridge is not frozen.
func (b *bridge) waitThaw() {
	b.mu.Lock()
	ch := b.thaw
	b.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// freeze holds every byte until thawOut: connections stay open, as when a
// firewall drops the packets or the peer's host hangs.
func (b *bridge) freeze() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.thaw == nil {
		b.thaw = make(chan struct{})
	}
}

// thawOut delivers what was held and forwards again.
func (b *bridge) thawOut() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.thaw != nil {
		close(b.thaw)
		b.thaw = nil
	}
}

// cut drops every connection and refuses new ones until resume.
func (b *bridge) cut() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.down = true
	for conn := range b.conns {
		_ = conn.Close()
	}
	clear(b.conns)
	if b.thaw != nil {
		close(b.thaw) // the held bytes go nowhere now
		b.thaw = nil
	}
}

// resume forwards new connections to target.
func (b *bridge) resume(target string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.target, b.down = target, false
}

func (b *bridge) close() {
	_ = b.ln.Close()
	b.cut()
	b.wg.Wait()
}
