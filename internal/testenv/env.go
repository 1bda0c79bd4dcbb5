package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/devenv"
)

// ErrNotManaged is returned by the server control methods when the servers
// were given by SHARDVISOR_TEST_ZK / SHARDVISOR_TEST_PG rather than started
// by internal/devenv (scripts/devenv).
var ErrNotManaged = errors.New("testenv: servers are not managed by scripts/devenv (given by environment)")

// ErrNotExclusive is returned by the server control methods when the test
// did not call Exclusive.
var ErrNotExclusive = errors.New("testenv: stopping or killing servers requires testenv.Exclusive(t)")

const (
	defaultZKPortBase = 21811
	defaultPGPortBase = 25432
	defaultPGNodes    = 3
	zkServers         = 3
)

// StateDir is the scripts/devenv state directory.
func StateDir() string {
	if d := os.Getenv("SHARDVISOR_DEVENV_DIR"); d != "" {
		if abs, err := filepath.Abs(d); err == nil {
			return abs
		}
		return d
	}
	return "/tmp/shardvisor-devenv"
}

func envInt(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return n
		}
	}
	return def
}

func zkPortBase() int    { return envInt("SHARDVISOR_ZK_PORT_BASE", defaultZKPortBase) }
func pgPortBase() int    { return envInt("SHARDVISOR_PG_PORT_BASE", defaultPGPortBase) }
func pgNodesWanted() int { return envInt("SHARDVISOR_PG_NODES", defaultPGNodes) }

func externalZK() []string { return splitList(os.Getenv("SHARDVISOR_TEST_ZK")) }
func externalPG() []string { return splitList(os.Getenv("SHARDVISOR_TEST_PG")) }

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// skipIfShort skips integration tests under `go test -short`.
func skipIfShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: skipped with -short")
	}
}

// fatalf fails the test; the message says how to get servers.
func fatalf(t testing.TB, format string, args ...any) {
	t.Helper()
	hint := "run `scripts/devenv --plain up` (the tests dial plain) and `scripts/devenv status` to investigate, or use `go test -short` to skip integration tests"
	if os.Getenv("CI") == "true" {
		hint = "CI=true: integration servers are required"
	}
	t.Fatalf("testenv: "+format+"\n(%s)", append(args, hint)...)
}

// randomHex returns n random bytes as hex.
func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// sanitize makes a test name usable as a ZooKeeper node or SQL identifier
// part: lower-case letters, digits and '_', at most max bytes.
func sanitize(name string, max int) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
		if b.Len() >= max {
			break
		}
	}
	s := strings.Trim(b.String(), "_")
	if s == "" {
		s = "test"
	}
	return s
}

// ---------------------------------------------------------------- devenv

// devenvDo runs f on the managed environment, in this process
// (internal/devenv), configured from the variables scripts/devenv reads
// and changed by mod; an error carries devenv's progress lines. Its mode
// is plain unless SHARDVISOR_DEVENV_TLS=1 (FromEnv): the tests' clients
// dial plain, so an up here restarts a TLS environment plain.
func devenvDo(what string, mod func(*devenv.Config), f func(*devenv.Env) error) error {
	c, err := devenv.FromEnv()
	if err != nil {
		return err
	}
	var log strings.Builder
	c.Log = &log
	if mod != nil {
		mod(&c)
	}
	if err := f(devenv.New(c)); err != nil {
		return fmt.Errorf("devenv %s: %w\n%s", what, err, strings.TrimRight(log.String(), "\n"))
	}
	return nil
}

// ---------------------------------------------------------------- ensuring servers

var (
	upMu      sync.Mutex
	upFailed  error // a failed `up` is not retried in this process
	upPGNodes int   // the largest node count `up` has ensured in this process
)

// quickHealthy reports whether the managed environment looks healthy:
// every ZooKeeper server serving with exactly one leader, and the first
// pgNodes PostgreSQL ports and their PgBouncers' accepting TCP
// connections (an environment an older devenv started has no poolers:
// up starts them), and pgBackRest's configuration written (nor has it
// archiving: up restarts its servers with it).
func quickHealthy(pgNodes int) bool {
	if _, err := os.Stat(filepath.Join(StateDir(), "backup", "pgbackrest.conf")); err != nil {
		return false
	}
	leaders := 0
	for i := 0; i < zkServers; i++ {
		mode, err := zkMode(net.JoinHostPort("127.0.0.1", strconv.Itoa(zkPortBase()+i)))
		if err != nil {
			return false
		}
		switch mode {
		case "leader":
			leaders++
		case "follower":
		default:
			return false
		}
	}
	if leaders != 1 {
		return false
	}
	for i := 0; i < pgNodes; i++ {
		if !listening(pgPortBase()+i) || !listening(poolPort(pgPortBase()+i)) {
			return false
		}
	}
	return true
}

// listening reports whether something accepts TCP connections on port of
// 127.0.0.1.
func listening(port int) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// ensureUp makes sure the managed servers (ZooKeeper and pgNodes PostgreSQL
// nodes) are up, running devenv's up under a cross-process lock if
// they are not. The caller holds the shared or exclusive use lock, so no
// disruptive test is running (or the caller is it).
func ensureUp(pgNodes int) error {
	upMu.Lock()
	defer upMu.Unlock()
	if upFailed != nil {
		return upFailed
	}
	if quickHealthy(pgNodes) {
		upPGNodes = max(upPGNodes, pgNodes)
		return nil
	}
	unlock, err := lockFile(filepath.Join(StateDir(), "testenv-up.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if quickHealthy(pgNodes) { // another process brought them up meanwhile
		upPGNodes = max(upPGNodes, pgNodes)
		return nil
	}
	nodes := func(c *devenv.Config) { c.PGNodes = max(pgNodes, existingPGNodes()) }
	if err := devenvDo("up", nodes, (*devenv.Env).Up); err != nil {
		upFailed = err
		return err
	}
	upPGNodes = max(upPGNodes, pgNodes)
	return nil
}

// existingPGNodes is the highest PostgreSQL node index with a data directory
// or a Patroni group's members file (`up` with that many nodes restarts the
// groups too; StartPGNodes refuses to hand a group out as a plain node).
func existingPGNodes() int {
	n := 0
	entries, _ := os.ReadDir(filepath.Join(StateDir(), "pg"))
	for _, e := range entries {
		i, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "pg"))
		if err != nil || !strings.HasPrefix(e.Name(), "pg") {
			continue
		}
		if _, err := os.Stat(filepath.Join(StateDir(), "pg", e.Name(), "data", "PG_VERSION")); err == nil && i > n {
			n = i
		}
		if _, err := os.Stat(filepath.Join(StateDir(), "pg", e.Name(), "members")); err == nil && i > n {
			n = i
		}
	}
	return n
}

// restoreAll restarts whatever is down (all ZooKeeper servers and every
// existing PostgreSQL node) and waits until everything is healthy.
func restoreAll() error {
	upMu.Lock()
	defer upMu.Unlock()
	n := max(existingPGNodes(), pgNodesWanted(), upPGNodes)
	return devenvDo("up", func(c *devenv.Config) { c.PGNodes = n }, (*devenv.Env).Up)
}

// ---------------------------------------------------------------- helpers

// FaultsEnv is the environment variable that opts in the long fault
// schedules: `make test-faults` sets it to 1.
const FaultsEnv = "SHARDVISOR_FAULTS"

// Faults skips t unless SHARDVISOR_FAULTS=1. A test with a long fault
// schedule (server failovers, ZooKeeper outages, killing a mover in every
// move state, reconnects under -race's limits) calls it first and is named
// TestFaults..., so that `make test-faults` finds it and `make test` leaves
// it out. It also skips under -short.
func Faults(t testing.TB) {
	t.Helper()
	if os.Getenv(FaultsEnv) != "1" {
		t.Skip("a long fault schedule: make test-faults runs it (" + FaultsEnv + "=1)")
	}
	skipIfShort(t)
}

// Long skips t unless SHARDVISOR_FAULTS=1, like Faults, for a long
// scenario without faults that make test's 5-minute budget on 2 cores
// cannot hold (the whole system from init to moves under load, ~180
// CPU-seconds). Such a test is named TestLong... so that `make
// test-faults` finds it.
func Long(t testing.TB) {
	t.Helper()
	if os.Getenv(FaultsEnv) != "1" {
		t.Skip("a long scenario: make test-faults runs it (" + FaultsEnv + "=1)")
	}
	skipIfShort(t)
}

// WaitFor polls cond every 20ms until it returns true, and fails the test
// with msg if that does not happen within timeout.
func WaitFor(t testing.TB, timeout time.Duration, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Receive returns the next value sent on c, and fails the test with msg if
// none comes within timeout.
func Receive[T any](t testing.TB, c <-chan T, timeout time.Duration, msg string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(timeout):
		t.Fatal(msg)
	}
	var zero T
	return zero
}

// FreePort returns a loopback TCP port that is free, for a server a test
// starts (often in another process).
//
// It is taken below the kernel's ephemeral range (ip_local_port_range,
// 32768-60999 by default) and below the devenv's ports (21811 and up): a
// port from the ephemeral range, freed and handed out, could be given
// again by the kernel to the next bind to port 0 (an admin listener, a
// probe socket) or to an outgoing connection before the test binds it,
// and two listeners then met on one port (TestPumaWorker failed so:
// "bind: address already in use"). A lock file per port, held by this
// process until it exits, keeps concurrent test processes from choosing
// the same port.
func FreePort(t testing.TB) int {
	t.Helper()
	const lo, hi = 10000, 21000
	dir := filepath.Join(os.TempDir(), "shardvisor-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatalf("FreePort: %v", err)
	}
	portMu.Lock()
	defer portMu.Unlock()
	for i := 0; i < 1000; i++ {
		var b [2]byte
		_, _ = rand.Read(b[:])
		port := lo + (int(b[0])<<8|int(b[1]))%(hi-lo)
		if portHeld[port] {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			f.Close() // another test process holds it
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			f.Close()
			continue
		}
		ln.Close()
		portHeld[port] = true
		portLocks = append(portLocks, f) // held until the process exits
		return port
	}
	t.Fatalf("FreePort: no free port in %d-%d after 1000 tries", lo, hi)
	return 0
}

var (
	portMu    sync.Mutex
	portHeld  = map[int]bool{}
	portLocks []*os.File
)
