package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/shardvisor/shardvisor/internal/devenv"
)

// TestRootParent is the ZooKeeper path under which every ZK.Root is created.
const TestRootParent = "/shardvisor-test"

// DefaultSessionTimeout is the session timeout of connections made by ZK.Dial.
const DefaultSessionTimeout = 4 * time.Second

// ZK is a ZooKeeper ensemble for one test. Server indexes are 0-based
// positions in Servers (server i is "zk<i+1>" in scripts/devenv).
type ZK struct {
	Servers       []string // "127.0.0.1:21811", ...
	ConnectString string   // Servers joined with ","
	// Root is a fresh path for this test, e.g.
	// "/shardvisor-test/testfoo_bar-1a2b3c4d". It exists (empty) when StartZK
	// returns and is deleted recursively when the test ends.
	Root string
	// SuperAuth is "super:<password>" of the ZooKeeper superuser, for
	// conn.AddAuth("digest", []byte(SuperAuth)): a session so authenticated
	// passes every ACL check. testenv's cleanup uses it to delete Root
	// whatever ACLs the test set. Empty if unknown (external servers without
	// SHARDVISOR_TEST_ZK_SUPERAUTH).
	SuperAuth string

	st      *testState
	managed bool
}

// StartZK returns the ZooKeeper ensemble, starting it if needed, with a fresh
// Root for the test. It skips the test under -short and fails it if the
// ensemble cannot be had.
func StartZK(t testing.TB) *ZK {
	t.Helper()
	skipIfShort(t)
	st := stateFor(t)
	if err := acquireShared(st); err != nil {
		fatalf(t, "lock: %v", err)
	}
	z := &ZK{st: st}
	if ext := externalZK(); len(ext) > 0 {
		z.Servers = ext
		z.SuperAuth = os.Getenv("SHARDVISOR_TEST_ZK_SUPERAUTH")
	} else {
		z.managed = true
		if err := ensureUp(pgNodesWanted()); err != nil {
			fatalf(t, "starting servers: %v", err)
		}
		for i := 0; i < zkServers; i++ {
			z.Servers = append(z.Servers, net.JoinHostPort("127.0.0.1", strconv.Itoa(zkPortBase()+i)))
		}
		if b, err := os.ReadFile(filepath.Join(StateDir(), "zk", "superpass")); err == nil {
			if pw := strings.TrimSpace(string(b)); pw != "" {
				z.SuperAuth = "super:" + pw
			}
		}
	}
	z.ConnectString = strings.Join(z.Servers, ",")
	z.Root = path.Join(TestRootParent, sanitize(t.Name(), 60)+"-"+randomHex(4))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := z.connect(ctx, 10*time.Second)
	if err != nil {
		fatalf(t, "connecting to ZooKeeper %s: %v", z.ConnectString, err)
	}
	defer conn.Close()
	for _, p := range []string{TestRootParent, z.Root} {
		if _, err := conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			fatalf(t, "creating %s: %v", p, err)
		}
	}
	root := z.Root
	st.addCleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := z.connect(ctx, 10*time.Second)
		if err != nil {
			t.Errorf("testenv: cleanup of %s: %v", root, err)
			return
		}
		defer conn.Close()
		if z.SuperAuth != "" {
			if err := conn.AddAuth("digest", []byte(z.SuperAuth)); err != nil {
				t.Errorf("testenv: cleanup of %s: authenticating as ZooKeeper superuser: %v", root, err)
				return
			}
		}
		if err := deleteRecursive(conn, root); err != nil {
			t.Errorf("testenv: cleanup of %s: %v", root, err)
		}
	})
	return z
}

type nopLogger struct{}

func (nopLogger) Printf(string, ...any) {}

// connect opens a session and waits until it is established.
func (z *ZK) connect(ctx context.Context, sessionTimeout time.Duration) (*zk.Conn, error) {
	conn, _, err := zk.Connect(z.Servers, sessionTimeout, zk.WithLogger(nopLogger{}))
	if err != nil {
		return nil, err
	}
	for conn.State() != zk.StateHasSession {
		select {
		case <-ctx.Done():
			conn.Close()
			return nil, fmt.Errorf("no ZooKeeper session: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return conn, nil
}

// Dial opens a ZooKeeper session (DefaultSessionTimeout, logging discarded)
// that is closed when the test ends. The test fails if no session is
// established within 30s.
func (z *ZK) Dial(t testing.TB) *zk.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := z.connect(ctx, DefaultSessionTimeout)
	if err != nil {
		t.Fatalf("testenv: ZooKeeper dial: %v", err)
	}
	t.Cleanup(conn.Close)
	return conn
}

// Path joins elements onto Root.
func (z *ZK) Path(elem ...string) string {
	return path.Join(append([]string{z.Root}, elem...)...)
}

func deleteRecursive(conn *zk.Conn, p string) error {
	children, _, err := conn.Children(p)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, c := range children {
		if err := deleteRecursive(conn, path.Join(p, c)); err != nil {
			return err
		}
	}
	err = conn.Delete(p, -1)
	if errors.Is(err, zk.ErrNotEmpty) { // a child appeared meanwhile
		return deleteRecursive(conn, p)
	}
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	return err
}

// zkMode returns the server's Mode from `srvr` ("leader", "follower", ...),
// or "not-serving" when it answers but has no quorum.
func zkMode(addr string) (string, error) { return devenv.ZKModeAt(addr, 2*time.Second) }

// FourLetterWord sends a four-letter command (srvr, mntr, stat, conf, ruok,
// cons, wchs are enabled) to server i and returns the reply.
func (z *ZK) FourLetterWord(i int, cmd string) (string, error) {
	if i < 0 || i >= len(z.Servers) {
		return "", fmt.Errorf("testenv: no ZooKeeper server %d", i)
	}
	return devenv.FourLetterWord(z.Servers[i], cmd, 2*time.Second)
}

// Mode returns server i's role: "leader", "follower", "not-serving" (up but
// without quorum), or an error if it does not answer.
func (z *ZK) Mode(i int) (string, error) {
	if i < 0 || i >= len(z.Servers) {
		return "", fmt.Errorf("testenv: no ZooKeeper server %d", i)
	}
	return zkMode(z.Servers[i])
}

// Leader returns the index of the leader. It is an error if there is no
// leader or more than one server claims to be it.
func (z *ZK) Leader() (int, error) {
	leader := -1
	for i := range z.Servers {
		m, err := z.Mode(i)
		if err != nil || m != "leader" {
			continue
		}
		if leader >= 0 {
			return -1, fmt.Errorf("testenv: servers %d and %d both claim to be leader", leader, i)
		}
		leader = i
	}
	if leader < 0 {
		return -1, errors.New("testenv: no ZooKeeper leader")
	}
	return leader, nil
}

// Follower returns the index of some server that is a follower.
func (z *ZK) Follower() (int, error) {
	for i := range z.Servers {
		if m, err := z.Mode(i); err == nil && m == "follower" {
			return i, nil
		}
	}
	return -1, errors.New("testenv: no ZooKeeper follower")
}

// WaitHealthy waits until every server serves (leader or follower) and
// exactly one is leader.
func (z *ZK) WaitHealthy(ctx context.Context) error {
	var last string
	for {
		leaders, serving := 0, 0
		var states []string
		for i := range z.Servers {
			m, err := z.Mode(i)
			if err != nil {
				m = "down"
			}
			states = append(states, m)
			switch m {
			case "leader":
				leaders++
				serving++
			case "follower":
				serving++
			}
		}
		if serving == len(z.Servers) && leaders == 1 {
			return nil
		}
		last = strings.Join(states, ",")
		select {
		case <-ctx.Done():
			return fmt.Errorf("testenv: ZooKeeper not healthy (modes %s): %w", last, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (z *ZK) control(i int) error {
	if !z.managed {
		return ErrNotManaged
	}
	if !z.st.isExclusive() {
		return ErrNotExclusive
	}
	if i < 0 || i >= len(z.Servers) {
		return fmt.Errorf("testenv: no ZooKeeper server %d", i)
	}
	return nil
}

// Kill kills server i with SIGKILL and waits until the process is gone.
// Requires Exclusive.
func (z *ZK) Kill(i int) error {
	if err := z.control(i); err != nil {
		return err
	}
	dir := filepath.Join(StateDir(), "zk", "zk"+strconv.Itoa(i+1))
	b, err := os.ReadFile(filepath.Join(dir, "zk.pid"))
	if err != nil {
		return fmt.Errorf("testenv: zk%d is not running (no pid file): %w", i+1, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("testenv: zk%d pid file: %w", i+1, err)
	}
	if !devenv.Alive(pid, "QuorumPeerMain "+filepath.Join(dir, "zoo.cfg")) {
		return fmt.Errorf("testenv: zk%d (pid %d) is not running", i+1, pid)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("testenv: kill zk%d (pid %d): %w", i+1, pid, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for devenv.Alive(pid, "") {
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: zk%d (pid %d) still alive 10s after SIGKILL", i+1, pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// zkPID is the pid of managed server i, checked to be its JVM.
func (z *ZK) zkPID(i int) (int, error) {
	dir := filepath.Join(StateDir(), "zk", "zk"+strconv.Itoa(i+1))
	b, err := os.ReadFile(filepath.Join(dir, "zk.pid"))
	if err != nil {
		return 0, fmt.Errorf("testenv: zk%d is not running (no pid file): %w", i+1, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("testenv: zk%d pid file: %w", i+1, err)
	}
	if !devenv.Alive(pid, "QuorumPeerMain "+filepath.Join(dir, "zoo.cfg")) {
		return 0, fmt.Errorf("testenv: zk%d (pid %d) is not running", i+1, pid)
	}
	return pid, nil
}

// Freeze stops server i with SIGSTOP: its process and its sockets stay,
// and it answers nothing (a hung JVM, a paused VM). It is continued
// (SIGCONT) when the test ends, before the environment is restored, or by
// Thaw. Requires Exclusive.
func (z *ZK) Freeze(t testing.TB, i int) {
	t.Helper()
	if err := z.control(i); err != nil {
		t.Fatal(err)
	}
	pid, err := z.zkPID(i)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("testenv: SIGSTOP zk%d (pid %d): %v", i+1, pid, err)
	}
	// The signal is only queued when kill returns; frozen means every
	// thread stopped.
	if !devenv.WaitStopped(pid, 5*time.Second) {
		t.Fatalf("testenv: zk%d (pid %d) not stopped 5 s after SIGSTOP", i+1, pid)
	}
}

// Thaw continues server i after Freeze (SIGCONT). Requires Exclusive.
func (z *ZK) Thaw(i int) error {
	if err := z.control(i); err != nil {
		return err
	}
	pid, err := z.zkPID(i)
	if err != nil {
		return err
	}
	return syscall.Kill(pid, syscall.SIGCONT)
}

// Start starts server i (if it is not running) and waits until it serves as
// follower or leader again when a quorum can exist (another server runs);
// alone it returns once the server listens (StartAll starts every server).
// Requires Exclusive.
func (z *ZK) Start(i int) error {
	if err := z.control(i); err != nil {
		return err
	}
	return devenvDo("zk-start "+strconv.Itoa(i+1), nil, func(e *devenv.Env) error { return e.ZKStart(i + 1) })
}

// StartAll starts every server that is not running, all at once (one
// alone has no quorum and never serves; Start waits for it to serve), and
// waits until the whole environment is healthy. Requires Exclusive.
func (z *ZK) StartAll() error {
	if err := z.control(0); err != nil {
		return err
	}
	return restoreAll()
}
