// The integration tests use the package's public API only. They are an
// external test package so that they can open sessions with zktest, which
// imports zksession; the dot import lets them read as if inside the package
// (the import-cycle case of Go's code review comments on dot imports).
package zksession_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/internal/faultproxy"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/testkit"
	"github.com/shardvisor/shardvisor/internal/zktest"
	. "github.com/shardvisor/shardvisor/zksession"
)

// testLogger is silent unless SHARDVISOR_TEST_LOG is set, because session
// goroutines may still log while a test is being torn down.
func testLogger() *zap.Logger {
	if os.Getenv("SHARDVISOR_TEST_LOG") != "" {
		l, _ := zap.NewDevelopment()
		return l
	}
	return zap.NewNop()
}

// openT opens a session with the test logger and waits for it to connect.
func openT(t *testing.T, cfg Config) *Session {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	return zktest.Session(t, cfg)
}

// chrooted gives the test a session rooted at its own ZooKeeper path.
func chrooted(t *testing.T) (*testenv.ZK, string) {
	z := testenv.StartZK(t)
	return z, z.ConnectString + z.Root
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// partitionable gives the test its own chrooted path, an observer session
// that reaches ZooKeeper directly, and a fault proxy in front of one server
// (closed when the test ends): viaProxy is the chrooted connect string
// through it, for the session that the test partitions.
func partitionable(t *testing.T) (ctx context.Context, proxy *faultproxy.Proxy, observer *Session, viaProxy string) {
	t.Helper()
	z, _ := chrooted(t)
	ctx = ctxT(t)
	proxy, err := faultproxy.New(z.Servers[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	observer = openT(t, Config{Connect: z.ConnectString + z.Root})
	return ctx, proxy, observer, proxy.Addr() + z.Root
}

// twoSessions opens two sessions, as two processes would, on the test's
// own chrooted path.
func twoSessions(t *testing.T) (ctx context.Context, a, b *Session) {
	t.Helper()
	_, connect := chrooted(t)
	return ctxT(t), openT(t, Config{Connect: connect}), openT(t, Config{Connect: connect})
}

func TestIntegrationCRUDCASAndChroot(t *testing.T) {
	z, connect := chrooted(t)
	ctx := ctxT(t)
	s := openT(t, Config{Connect: connect})

	if err := s.CreateAll(ctx, "/a/b"); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateAll(ctx, "/a/b"); err != nil {
		t.Fatalf("CreateAll must be idempotent: %v", err)
	}
	if err := s.Create(ctx, "/a/b/n", []byte("one")); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(ctx, "/a/b/n", nil); !errors.Is(err, ErrNodeExists) {
		t.Fatalf("second create: %v, want ErrNodeExists", err)
	}
	data, st, err := s.Get(ctx, "/a/b/n")
	if err != nil || string(data) != "one" || st.Version != 0 {
		t.Fatalf("get = %q %+v %v", data, st, err)
	}

	// The chroot is really a prefix on the server.
	plain := openT(t, Config{Connect: z.ConnectString})
	if err := plain.Sync(ctx, z.Root+"/a/b/n"); err != nil {
		t.Fatal(err)
	}
	if data, _, err := plain.Get(ctx, z.Root+"/a/b/n"); err != nil || string(data) != "one" {
		t.Fatalf("node not at chroot+path on the server: %q %v", data, err)
	}

	// Compare-and-swap: the stale version loses and says so.
	if st, err = s.Set(ctx, "/a/b/n", []byte("two"), 0); err != nil || st.Version != 1 {
		t.Fatalf("set v0: %+v %v", st, err)
	}
	_, err = s.Set(ctx, "/a/b/n", []byte("lost"), 0)
	if !errors.Is(err, ErrBadVersion) || !strings.Contains(err.Error(), "/a/b/n") {
		t.Fatalf("stale set: %v, want ErrBadVersion naming the path", err)
	}

	// Multi is all or nothing, and names the operation that failed.
	_, err = s.Multi(ctx, CheckOp("/a/b/n", 1), CreateOp("/a/b/new", nil, nil), SetOp("/a/b/missing", nil, AnyVersion))
	if !errors.Is(err, ErrNoNode) || !strings.Contains(err.Error(), "/a/b/missing") {
		t.Fatalf("multi with a missing node: %v", err)
	}
	if ok, _, _ := s.Exists(ctx, "/a/b/new"); ok {
		t.Fatal("a failed multi applied its create")
	}
	_, err = s.Multi(ctx, CheckOp("/a/b/n", 0), CreateOp("/a/b/new", nil, nil))
	if !errors.Is(err, ErrBadVersion) || !strings.Contains(err.Error(), "multi check /a/b/n") {
		t.Fatalf("multi with a stale check: %v", err)
	}
	stats, err := s.Multi(ctx, CheckOp("/a/b/n", 1), SetOp("/a/b/n", []byte("three"), 1), CreateOp("/a/b/new", []byte("x"), nil))
	if err != nil || len(stats) != 3 || stats[1].Version != 2 {
		t.Fatalf("good multi: %+v %v", stats, err)
	}
	kids, _, err := s.Children(ctx, "/a/b")
	if err != nil || len(kids) != 2 {
		t.Fatalf("children = %v %v", kids, err)
	}

	if err := s.Delete(ctx, "/a/b/n", 0); !errors.Is(err, ErrBadVersion) {
		t.Fatalf("delete stale: %v", err)
	}
	if err := s.Delete(ctx, "/a/b", AnyVersion); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("delete non-empty: %v", err)
	}
	if err := s.DeleteAll(ctx, "/a"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(ctx, "/a/b/n"); !errors.Is(err, ErrNoNode) {
		t.Fatalf("after DeleteAll: %v", err)
	}
	if _, _, err := s.Get(ctx, "relative"); err == nil || !strings.Contains(err.Error(), "must start with /") {
		t.Fatalf("relative path: %v", err)
	}
}

// Config.Dial opens every connection, so a caller sees all the session's
// bytes; the session still works (and still learns its timeout) through
// the wrapped connection.
func TestIntegrationDialHook(t *testing.T) {
	_, connect := chrooted(t)
	ctx := ctxT(t)
	var dials, read atomic.Int64
	s := openT(t, Config{Connect: connect, SessionTimeout: 6 * time.Second, Dial: func(network, addr string, timeout time.Duration) (net.Conn, error) {
		dials.Add(1)
		return testkit.CountingDial(&read)(network, addr, timeout)
	}})
	if err := s.Create(ctx, "/big", make([]byte, 100_000)); err != nil {
		t.Fatal(err)
	}
	before := read.Load()
	if data, _, err := s.Get(ctx, "/big"); err != nil || len(data) != 100_000 {
		t.Fatalf("get: %d bytes, %v", len(data), err)
	}
	if got := read.Load() - before; dials.Load() == 0 || got < 100_000 {
		t.Fatalf("%d dials, %d bytes read for a 100,000-byte node", dials.Load(), got)
	}
	if s.SessionTimeout() != 6*time.Second {
		t.Fatalf("negotiated timeout %s not seen through the wrapped connection", s.SessionTimeout())
	}
}

// writeCounter counts the requests a session sends (one write each).
type writeCounter struct {
	net.Conn
	n *atomic.Int64
}

func (c writeCounter) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}

// An idle session asks the server once per heartbeat interval (1/6 of the
// session timeout), not back to back: a fleet of idle processes must not
// load the ensemble. A slow machine only sends fewer.
func TestIntegrationHeartbeatPace(t *testing.T) {
	_, connect := chrooted(t)
	var writes atomic.Int64
	s := openT(t, Config{Connect: connect, SessionTimeout: 1200 * time.Millisecond, Dial: func(network, addr string, timeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		return writeCounter{c, &writes}, nil
	}})
	interval := s.SessionTimeout() / 6
	before := writes.Load()
	const idle = 2 * time.Second
	time.Sleep(idle) // deliberate: the session idles, its writes counted below
	// Heartbeats, plus the library's own pings (every third of the
	// timeout), plus slack.
	if n, most := writes.Load()-before, int64(idle/interval+idle/(s.SessionTimeout()/3)+5); n > most {
		t.Fatalf("an idle session sent %d requests in %s, want at most %d (heartbeat every %s)", n, idle, most, interval)
	}
}

func TestIntegrationTooLarge(t *testing.T) {
	_, connect := chrooted(t)
	ctx := ctxT(t)
	s := openT(t, Config{Connect: connect})
	if err := s.Create(ctx, "/big", []byte("small")); err != nil {
		t.Fatal(err)
	}
	huge := make([]byte, 1<<20+1)
	_, err := s.Set(ctx, "/big", huge, AnyVersion)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "1048577 bytes") || !strings.Contains(err.Error(), "/big") {
		t.Fatalf("oversized set: %v", err)
	}
	if err := s.Create(ctx, "/big2", huge); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized create: %v", err)
	}
	if _, err := s.Multi(ctx, SetOp("/big", huge[:MaxDataSize/2], AnyVersion), SetOp("/big", huge[:MaxDataSize/2+100], AnyVersion)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized multi: %v", err)
	}
	// The refusal lost nothing and the session is unharmed; the largest
	// allowed payload really fits in the server's limit.
	if data, _, err := s.Get(ctx, "/big"); err != nil || string(data) != "small" {
		t.Fatalf("after refusal: %q %v", data, err)
	}
	if _, err := s.Set(ctx, "/big", huge[:MaxDataSize], AnyVersion); err != nil {
		t.Fatalf("MaxDataSize payload: %v", err)
	}
	if st := s.State(); st != StateConnected {
		t.Fatalf("state %s after large writes", st)
	}
}

// Many writers incrementing one counter by compare-and-swap lose nothing.
func TestIntegrationConcurrentCASNoLostUpdate(t *testing.T) {
	_, connect := chrooted(t)
	ctx := ctxT(t)
	const sessions, perSession, increments = 4, 2, 25
	var ss []*Session
	for range sessions {
		ss = append(ss, openT(t, Config{Connect: connect}))
	}
	if err := ss[0].Create(ctx, "/counter", []byte("0")); err != nil {
		t.Fatal(err)
	}
	// The other sessions may be on followers that have not seen the
	// create yet: ZooKeeper orders reads only within a session, and Sync
	// is how another client catches up.
	for _, s := range ss[1:] {
		if err := s.Sync(ctx, "/counter"); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	var conflicts sync.Map
	errs := make(chan error, sessions*perSession)
	for i, s := range ss {
		for j := range perSession {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range increments {
					for {
						data, st, err := s.Get(ctx, "/counter")
						if err != nil {
							errs <- err
							return
						}
						n, _ := strconv.Atoi(string(data))
						_, err = s.Set(ctx, "/counter", []byte(strconv.Itoa(n+1)), st.Version)
						if err == nil {
							break
						}
						if !errors.Is(err, ErrBadVersion) {
							errs <- err
							return
						}
						conflicts.Store(fmt.Sprint(i, j), true)
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := ss[0].Sync(ctx, "/counter"); err != nil {
		t.Fatal(err)
	}
	data, _, err := ss[0].Get(ctx, "/counter")
	if err != nil || string(data) != strconv.Itoa(sessions*perSession*increments) {
		t.Fatalf("counter = %q (%v), want %d", data, err, sessions*perSession*increments)
	}
}

// next waits for the watch's next Node.
func next(t *testing.T, w *Watch) Node {
	t.Helper()
	return testenv.Receive(t, w.C, 20*time.Second, "no watch delivery within 20s")
}

// until reads the watch until pred holds.
func until(t *testing.T, w *Watch, what string, pred func(Node) bool) Node {
	t.Helper()
	return testkit.Await(t, w.C, 30*time.Second, "the watch to deliver "+what, pred)
}

func TestIntegrationWatch(t *testing.T) {
	ctx, s, writer := twoSessions(t)

	w := s.Watch(ctx, "/w")
	defer w.Stop()
	if n := next(t, w); n.Exists {
		t.Fatalf("first delivery %+v, want a missing node", n)
	}
	if err := writer.Create(ctx, "/w", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if n := next(t, w); !n.Exists || string(n.Data) != "1" {
		t.Fatalf("after create: %+v", n)
	}
	for i := 2; i <= 20; i++ {
		if _, err := writer.Set(ctx, "/w", []byte(strconv.Itoa(i)), AnyVersion); err != nil {
			t.Fatal(err)
		}
	}
	last := until(t, w, "the last of 19 rapid writes", func(n Node) bool { return string(n.Data) == "20" })
	if last.Stat.Version != 19 {
		t.Fatalf("version %d", last.Stat.Version)
	}
	// Nothing more is delivered when nothing changed (dedupe).
	select {
	case n := <-w.C:
		t.Fatalf("spurious delivery %+v", n)
	case <-time.After(300 * time.Millisecond):
	}
	if err := writer.Delete(ctx, "/w", AnyVersion); err != nil {
		t.Fatal(err)
	}
	until(t, w, "the deletion", func(n Node) bool { return !n.Exists })
	if err := writer.Create(ctx, "/w", []byte("again")); err != nil {
		t.Fatal(err)
	}
	until(t, w, "the re-creation", func(n Node) bool { return n.Exists && string(n.Data) == "again" })

	cw := s.WatchChildren(ctx, "/w")
	defer cw.Stop()
	if n := next(t, cw); !n.Exists || len(n.Children) != 0 {
		t.Fatalf("children first delivery %+v", n)
	}
	if err := writer.Create(ctx, "/w/c1", nil); err != nil {
		t.Fatal(err)
	}
	until(t, cw, "child c1", func(n Node) bool { return len(n.Children) == 1 && n.Children[0] == "c1" })
	w.Stop()
	w.Stop() // idempotent
}

// Requests counts what a session sends: one per call, and for a watch one
// per read that arms it (a missing node costs the read and the existence
// watch); a refused write is never sent.
func TestIntegrationRequestsCounted(t *testing.T) {
	ctx, s, writer := twoSessions(t)
	if err := writer.Create(ctx, "/r", []byte("1")); err != nil {
		t.Fatal(err)
	}
	before := s.Requests()
	for range 3 {
		if _, _, err := s.Get(ctx, "/r"); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.Children(ctx, "/r"); err != nil {
		t.Fatal(err)
	}
	w := s.Watch(ctx, "/r")
	next(t, w)
	m := s.Watch(ctx, "/missing")
	next(t, m)
	w.Stop()
	m.Stop()
	after := s.Requests()
	if g, c, wt := after["get"]-before["get"], after["children"]-before["children"], after["watch"]-before["watch"]; g != 3 || c != 1 || wt != 3 {
		t.Fatalf("counted get %d, children %d, watch %d; want 3, 1, 3", g, c, wt)
	}
}

func TestIntegrationEphemeralOwnership(t *testing.T) {
	ctx, a, b := twoSessions(t)

	if _, err := a.CreateEphemeral(ctx, "/members/m1", []byte("a"), nil); !errors.Is(err, ErrNoNode) {
		t.Fatalf("ephemeral without its parent: %v, want ErrNoNode (parents are the caller's)", err)
	}
	if err := a.CreateAll(ctx, "/members"); err != nil {
		t.Fatal(err)
	}
	e, err := a.CreateEphemeral(ctx, "/members/m1", []byte("a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.CreateEphemeral(ctx, "/members/m1", nil, nil); err == nil {
		t.Fatal("registering the same ephemeral twice in one process succeeded")
	}
	_, err = b.CreateEphemeral(ctx, "/members/m1", []byte("b"), nil)
	if !errors.Is(err, ErrOwnedElsewhere) {
		t.Fatalf("second owner: %v, want ErrOwnedElsewhere", err)
	}
	if err := e.Set(ctx, []byte("a2")); err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(ctx, "/members/m1"); err != nil {
		t.Fatal(err)
	}
	data, st, err := b.Get(ctx, "/members/m1")
	if err != nil || string(data) != "a2" || st.EphemeralOwner != a.SessionID() {
		t.Fatalf("member node %q owner %x (a is %x): %v", data, st.EphemeralOwner, a.SessionID(), err)
	}
	a.Close() // ephemerals vanish with the session
	if _, err := b.CreateEphemeral(ctx, "/members/m1", []byte("b"), nil); err != nil {
		t.Fatalf("after the owner closed: %v", err)
	}
	if err := e.Set(ctx, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("set on a closed session: %v", err)
	}
}

func TestIntegrationACL(t *testing.T) {
	_, connect := chrooted(t)
	ctx := ctxT(t)
	admin := Credential{"admin", "admin-pw"}
	reader := Credential{"reader", "reader-pw"}
	as := openT(t, Config{Connect: connect, Auth: []Credential{admin}, ACL: ClusterACL(&admin, &reader)})
	if err := as.Create(ctx, "/c", []byte("secret")); err != nil {
		t.Fatal(err)
	}
	rs := openT(t, Config{Connect: connect, Auth: []Credential{reader}})
	if err := rs.Sync(ctx, "/c"); err != nil {
		t.Fatal(err)
	}
	if data, _, err := rs.Get(ctx, "/c"); err != nil || string(data) != "secret" {
		t.Fatalf("reader get: %q %v", data, err)
	}
	if _, err := rs.Set(ctx, "/c", []byte("x"), AnyVersion); !errors.Is(err, ErrNoAuth) {
		t.Fatalf("reader set: %v, want ErrNoAuth", err)
	}
	if err := rs.Create(ctx, "/c/child", nil); !errors.Is(err, ErrNoAuth) {
		t.Fatalf("reader create: %v, want ErrNoAuth", err)
	}
	anon := openT(t, Config{Connect: connect})
	if _, _, err := anon.Get(ctx, "/c"); !errors.Is(err, ErrNoAuth) {
		t.Fatalf("anonymous get: %v, want ErrNoAuth", err)
	}
	wrong := openT(t, Config{Connect: connect, Auth: []Credential{{"admin", "guess"}}})
	if _, err := wrong.Set(ctx, "/c", nil, AnyVersion); !errors.Is(err, ErrNoAuth) {
		t.Fatalf("wrong password set: %v, want ErrNoAuth", err)
	}
	if _, err := as.Set(ctx, "/c", []byte("new"), AnyVersion); err != nil {
		t.Fatalf("admin set: %v", err)
	}
	// Members may register under a member directory.
	if err := as.CreateWithACL(ctx, "/c/members", nil, MemberACL(&admin, &reader)); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.CreateEphemeral(ctx, "/c/members/r1", nil, MemberACL(&admin, &reader)); err != nil {
		t.Fatalf("reader registering a member: %v", err)
	}

	// GetACL shows the admin every digest hash; a reader sees them hidden
	// (ZooKeeper's fix of CVE-2019-0201), and anonymous nothing.
	if acl, _, err := as.GetACL(ctx, "/c"); err != nil || !sameACL(acl, ClusterACL(&admin, &reader)) {
		t.Fatalf("admin getacl: %v %v", acl, err)
	}
	acl, _, err := rs.GetACL(ctx, "/c")
	if err != nil || len(acl) != 2 || acl[0].ID != "admin:x" || acl[1].ID != "reader:x" {
		t.Fatalf("reader getacl: %v %v", acl, err)
	}
	if _, _, err := anon.GetACL(ctx, "/c"); !errors.Is(err, ErrNoAuth) {
		t.Fatalf("anonymous getacl: %v, want ErrNoAuth", err)
	}
	if err := rs.SetACL(ctx, "/c", zk.WorldACL(zk.PermAll), AnyVersion); !errors.Is(err, ErrNoAuth) {
		t.Fatalf("reader setacl: %v, want ErrNoAuth", err)
	}
	if err := as.SetACL(ctx, "/c", nil, AnyVersion); err == nil {
		t.Fatal("an empty ACL was set")
	}
	if err := as.SetACL(ctx, "/c/members", ClusterACL(&admin, &reader), AnyVersion); err != nil {
		t.Fatalf("admin setacl: %v", err)
	}
	if acl, _, err := as.GetACL(ctx, "/c/members"); err != nil || !sameACL(acl, ClusterACL(&admin, &reader)) {
		t.Fatalf("after setacl: %v %v", acl, err)
	}

	// A node owned by the admin's records identity: the admin's session
	// holds that identity (Open adds it) and may do everything; the reader
	// only what its own entry says.
	rc, err := RecordsCredential(admin.DigestID())
	if err != nil || rc.User != "admin+records" {
		t.Fatalf("records identity %v: %v", rc, err)
	}
	if _, err := RecordsCredential("admin:x"); err == nil {
		t.Fatal("a records identity was derived from a hidden hash")
	}
	owned := append(zk.DigestACL(zk.PermAll, rc.User, rc.Password), zk.DigestACL(zk.PermRead|zk.PermWrite, reader.User, reader.Password)...)
	if err := as.CreateWithACL(ctx, "/c/owned", []byte("v1"), owned); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.Set(ctx, "/c/owned", []byte("v2"), AnyVersion); err != nil {
		t.Fatalf("reader set of its record: %v", err)
	}
	if err := rs.SetACL(ctx, "/c/owned", zk.WorldACL(zk.PermAll), AnyVersion); !errors.Is(err, ErrNoAuth) {
		t.Fatalf("reader setacl of its record: %v, want ErrNoAuth", err)
	}
	if data, _, err := as.Get(ctx, "/c/owned"); err != nil || string(data) != "v2" {
		t.Fatalf("admin read of a reader's record: %q %v", data, err)
	}
	if acl, _, err := as.GetACL(ctx, "/c/owned"); err != nil || !sameACL(acl, owned) {
		t.Fatalf("admin getacl of a reader's record: %v %v", acl, err)
	}
}

func sameACL(a, b []zk.ACL) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// collect gathers state changes in the background.
type collector struct {
	mu  sync.Mutex
	all []StateChange
}

func collect(s *Session) *collector {
	c := &collector{}
	sub := s.Subscribe()
	go func() {
		for ch := range sub.C {
			c.mu.Lock()
			c.all = append(c.all, ch)
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *collector) waitFor(t *testing.T, timeout time.Duration, pred func(StateChange) bool, what string) StateChange {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		for _, ch := range c.all {
			if pred(ch) {
				c.mu.Unlock()
				return ch
			}
		}
		c.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t.Fatalf("no state change %s within %s; saw %+v", what, timeout, c.all)
	return StateChange{}
}

func (c *collector) saw(to State) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.all {
		if ch.To == to {
			return true
		}
	}
	return false
}

// Killing the leader forces every client to reconnect, but within the
// session timeout: the session survives, goes suspended, and comes back.
func TestIntegrationLeaderKillKeepsSession(t *testing.T) {
	skipUnderRace(t)
	z, connect := chrooted(t)
	testenv.Exclusive(t)
	ctx := ctxT(t)
	s := openT(t, Config{Connect: connect, SessionTimeout: 8 * time.Second})
	e, err := s.CreateEphemeral(ctx, "/m", []byte("x"), nil)
	if err != nil {
		t.Fatal(err)
	}
	sid := s.SessionID()
	c := collect(s)
	leader, err := z.Leader()
	if err != nil {
		t.Fatal(err)
	}
	if err := z.Kill(leader); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, 20*time.Second, func(ch StateChange) bool { return ch.To == StateSuspended }, "to suspended")
	back := c.waitFor(t, 30*time.Second, func(ch StateChange) bool { return ch.To == StateConnected }, "back to connected")
	if back.NewSession || s.SessionID() != sid {
		t.Fatalf("session changed across a leader election: %+v (was 0x%x)", back, sid)
	}
	if c.saw(StateLost) {
		t.Fatal("session was declared lost during a leader election")
	}
	_, st, err := s.Get(ctx, e.Path())
	if err != nil || st.EphemeralOwner != sid {
		t.Fatalf("ephemeral after election: owner %x, %v", st.EphemeralOwner, err)
	}
	if _, err := s.Set(ctx, "/m", []byte("y"), AnyVersion); err != nil {
		t.Fatalf("write after election: %v", err)
	}
}

// A client behind a partition goes suspended, then lost before the server
// expires its session; after healing it gets a new session, re-creates its
// ephemeral node and re-reads its watches.
func TestIntegrationPartitionLostAndHeal(t *testing.T) {
	skipUnderRace(t)
	ctx, proxy, observer, viaProxy := partitionable(t)
	if err := observer.Create(ctx, "/cfg", []byte("v1")); err != nil {
		t.Fatal(err)
	}

	const timeout = 4 * time.Second
	s := openT(t, Config{Connect: viaProxy, SessionTimeout: timeout, OpTimeout: 2 * time.Second})
	if got := s.SessionTimeout(); got != timeout {
		t.Fatalf("negotiated session timeout %s, want %s (devenv allows 0.4s-30s)", got, timeout)
	}
	if err := observer.CreateAll(ctx, "/members"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateEphemeral(ctx, "/members/me", []byte("me"), nil); err != nil {
		t.Fatal(err)
	}
	oldSID := s.SessionID()
	w := s.Watch(ctx, "/cfg")
	defer w.Stop()
	if n := next(t, w); string(n.Data) != "v1" {
		t.Fatalf("watch first read %q", n.Data)
	}
	gone := observer.Watch(ctx, "/members/me")
	defer gone.Stop()
	next(t, gone)

	c := collect(s)
	start := time.Now()
	proxy.SetMode(faultproxy.Blackhole)

	c.waitFor(t, 10*time.Second, func(ch StateChange) bool { return ch.To == StateSuspended }, "to suspended")
	if _, err := s.Set(ctx, "/cfg", []byte("from-suspended"), AnyVersion); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("write while suspended: %v, want ErrNotConnected", err)
	}
	lost := c.waitFor(t, 20*time.Second, func(ch StateChange) bool { return ch.To == StateLost }, "to lost")
	t.Logf("lost after %s (session timeout %s, 2/3 = %s): %s", lost.At.Sub(start).Round(time.Millisecond), timeout, timeout*2/3, lost.Reason)

	// Meanwhile the server expires the session and the world moves on.
	if _, err := observer.Set(ctx, "/cfg", []byte("v2"), AnyVersion); err != nil {
		t.Fatal(err)
	}
	expired := until(t, gone, "server-side expiry of the ephemeral", func(n Node) bool { return !n.Exists })
	_ = expired
	expiredAt := time.Now()
	if !lost.At.Before(expiredAt) {
		t.Fatalf("declared lost at %s, after the server had already expired the session (%s)", lost.At, expiredAt)
	}

	proxy.SetMode(faultproxy.Pass)
	back := c.waitFor(t, 30*time.Second, func(ch StateChange) bool { return ch.To == StateConnected && ch.At.After(lost.At) }, "back to connected")
	if !back.NewSession || s.SessionID() == oldSID {
		t.Fatalf("expected a new session after expiry: %+v", back)
	}
	n := until(t, gone, "the ephemeral re-created", func(n Node) bool { return n.Exists })
	if n.Stat.EphemeralOwner != s.SessionID() || string(n.Data) != "me" {
		t.Fatalf("re-created ephemeral owner %x data %q, want %x", n.Stat.EphemeralOwner, n.Data, s.SessionID())
	}
	until(t, w, "the write made during the partition", func(n Node) bool { return string(n.Data) == "v2" })
	if _, err := s.Set(ctx, "/cfg", []byte("v3"), AnyVersion); err != nil {
		t.Fatalf("write after healing: %v", err)
	}
	tin := s.TimeInState()
	if tin[StateLost] <= 0 || tin[StateSuspended] <= 0 || tin[StateConnected] <= 0 {
		t.Fatalf("time in state %v", tin)
	}
}

// proxied puts a fault proxy in front of each of servers, closed when the
// test ends, and returns their addresses and the proxy at an address (a
// session's Server()), failing the test if none is there.
func proxied(t *testing.T, servers []string) (addrs []string, byAddr func(addr string) *faultproxy.Proxy) {
	t.Helper()
	var proxies []*faultproxy.Proxy
	for _, srv := range servers {
		p, err := faultproxy.New(srv)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		proxies = append(proxies, p)
		addrs = append(addrs, p.Addr())
	}
	return addrs, func(a string) *faultproxy.Proxy {
		t.Helper()
		for _, p := range proxies {
			if p.Addr() == a {
				return p
			}
		}
		t.Fatalf("session on %q, none of the proxies %v", a, addrs)
		return nil
	}
}

// The "disconnected from X" reason names the server the session was lost
// on, not the next one the library tries (issue 15).
func TestIntegrationDisconnectNamesTheLostServer(t *testing.T) {
	z, _ := chrooted(t)
	addrs, byAddr := proxied(t, z.Servers[:2])
	s := openT(t, Config{Connect: strings.Join(addrs, ",") + z.Root, SessionTimeout: 4 * time.Second})
	if _, _, err := s.Exists(ctxT(t), "/"); err != nil {
		t.Fatal(err)
	}
	on := s.Server()
	lost := byAddr(on)
	c := collect(s)
	lost.SetMode(faultproxy.Reset)
	ch := c.waitFor(t, 10*time.Second, func(ch StateChange) bool { return ch.To == StateSuspended }, "to suspended")
	if ch.Reason != "disconnected from "+on {
		t.Fatalf("reason %q, want it to name the lost server %s", ch.Reason, on)
	}
	c.waitFor(t, 20*time.Second, func(ch StateChange) bool { return ch.To == StateConnected }, "back on the other server")
}

// A server that stops answering while it keeps the connection open (a
// SIGSTOPped server; here a blackholed proxy) is given up on after a third
// of the session timeout: the session moves to another server with the
// same id and never counts as lost. A new session whose first server is
// such a one gets past it within the handshake bound, not go-zookeeper's
// 10 × 2/3 of the session timeout.
func TestFaultsFrozenServerPartition(t *testing.T) {
	testenv.Faults(t)
	skipUnderRace(t)
	z, _ := chrooted(t)
	addrs, byAddr := proxied(t, z.Servers)
	const timeout = 4 * time.Second
	s := openT(t, Config{Connect: strings.Join(addrs, ",") + z.Root, SessionTimeout: timeout})
	ctx := ctxT(t)
	if _, err := s.CreateEphemeral(ctx, "/me", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	sid, on := s.SessionID(), s.Server()
	c := collect(s)
	start := time.Now()
	byAddr(on).SetMode(faultproxy.Blackhole)
	back := c.waitFor(t, 20*time.Second, func(ch StateChange) bool { return ch.To == StateConnected }, "back on another server")
	t.Logf("moved from frozen %s to %s in %s (session timeout %s)", on, s.Server(), back.At.Sub(start).Round(time.Millisecond), timeout)
	if c.saw(StateLost) || back.NewSession || s.SessionID() != sid || s.Server() == on {
		t.Fatalf("after freezing %s: lost %v, %+v, session 0x%x (was 0x%x), on %s", on, c.saw(StateLost), back, s.SessionID(), sid, s.Server())
	}
	if n := s.ServersAbandoned(); n < 1 {
		t.Fatalf("servers abandoned %d", n)
	}
	if _, st, err := s.Get(ctx, "/me"); err != nil || st.EphemeralOwner != sid {
		t.Fatalf("ephemeral after the move: owner 0x%x, %v", st.EphemeralOwner, err)
	}

	// A new session that must try the frozen server first (the dial hook
	// refuses the others until it has): past it within the bound.
	var triedFrozen atomic.Bool
	frozen := on
	dial := func(network, addr string, d time.Duration) (net.Conn, error) {
		if addr != frozen && !triedFrozen.Load() {
			return nil, errors.New("test: the frozen server first")
		}
		triedFrozen.Store(true)
		return net.DialTimeout(network, addr, d)
	}
	start = time.Now()
	s2, err := Open(Config{Connect: strings.Join(addrs, ",") + z.Root, SessionTimeout: timeout, Dial: dial, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	// go-zookeeper alone would wait 10 × 2/3 × 4 s = 26.7 s for the
	// frozen server's answer.
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := s2.WaitConnected(wctx); err != nil {
		t.Fatalf("new session past a frozen server: %v", err)
	}
	t.Logf("new session connected past the frozen server in %s", time.Since(start).Round(time.Millisecond))
	if !triedFrozen.Load() || s2.ServersAbandoned() != 1 || s2.Server() == frozen {
		t.Fatalf("tried frozen %v, abandoned %d, on %s", triedFrozen.Load(), s2.ServersAbandoned(), s2.Server())
	}
}

// ConnectedFor and SinceOK, which a supervisor's peers answer and read
// after a session loss (supervisor/failstatic.go): the age restarts at a
// reconnect and is 0 while not connected; SinceOK stays under a third of
// the timeout while connected (heartbeats) and grows while cut off.
func TestIntegrationPartitionConnectedForRestartsAtReconnect(t *testing.T) {
	skipUnderRace(t)
	_, proxy, _, viaProxy := partitionable(t)
	const timeout = 3 * time.Second
	s := openT(t, Config{Connect: viaProxy, SessionTimeout: timeout, OpTimeout: 2 * time.Second})
	time.Sleep(timeout) // deliberate: a connected session's age grows, heartbeats keep SinceOK short
	if age, ok := s.ConnectedFor(), s.SinceOK(); age < timeout || ok > timeout*2/3 {
		t.Fatalf("connected: ConnectedFor %s (want ≥ %s), SinceOK %s (want about a heartbeat)", age, timeout, ok)
	}
	c := collect(s)
	proxy.SetMode(faultproxy.Reset)
	c.waitFor(t, 10*time.Second, func(ch StateChange) bool { return ch.To == StateSuspended }, "to suspended")
	cut := time.Now()
	if age := s.ConnectedFor(); age != 0 {
		t.Fatalf("suspended: ConnectedFor %s, want 0", age)
	}
	time.Sleep(500 * time.Millisecond) // deliberate: silence grows
	if ok := s.SinceOK(); ok < 500*time.Millisecond {
		t.Fatalf("cut off for 500ms: SinceOK %s", ok)
	}
	proxy.SetMode(faultproxy.Pass)
	c.waitFor(t, 20*time.Second, func(ch StateChange) bool { return ch.To == StateConnected }, "back to connected")
	if age := s.ConnectedFor(); age <= 0 || age >= time.Since(cut) {
		t.Fatalf("reconnected: ConnectedFor %s, want less than the %s since the cut", age, time.Since(cut))
	}
}
