package devenv

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The defaults of the environment variables, and what the environment is
// made of.
const (
	DefaultDir        = "/tmp/shardvisor-devenv"
	DefaultZKPortBase = 21811
	DefaultPGPortBase = 25432
	DefaultPGNodes    = 3
	DefaultTimeout    = 120 * time.Second
	// ZKServers is the size of the ensemble.
	ZKServers = 3
	// PatroniNamespace is the namespace of every group (scope pgI).
	PatroniNamespace = "/service/"
	// MaxMembers bounds a group: member ports step by 100.
	MaxMembers = 9

	pgBin        = "/usr/lib/postgresql/15/bin"
	patroniBin   = "/usr/bin/patroni"
	pgbouncerBin = "/usr/sbin/pgbouncer"
	pgUser       = "postgres"
)

// zkJars is ZooKeeper's classpath as Debian's zookeeper package installs it.
var zkJars = []string{"/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar"}

var zkNettyJars = []string{"/usr/share/java/netty-codec.jar", "/usr/share/java/netty-resolver.jar"}

// Config says where an environment lives: its state directory, its ports,
// and what `up` creates. The zero values of the optional fields mean the
// defaults of the matching environment variables (FromEnv).
type Config struct {
	// Dir is the state directory (SHARDVISOR_DEVENV_DIR): absolute, and
	// traversable by the postgres user.
	Dir string
	// ZKPortBase: server i (1..3) listens on BASE+i-1 for clients,
	// BASE+1070+i-1 for quorum, BASE+2070+i-1 for election.
	ZKPortBase int
	// PGPortBase: node i listens on BASE+i-1, its PgBouncer on
	// BASE+2000+i-1; member m of group i on BASE+(i-1)+100*(m-1), its
	// Patroni REST API on BASE+1000+(i-1)+100*(m-1), its PgBouncer on
	// BASE+2000+(i-1)+100*(m-1).
	PGPortBase int
	// PGNodes is how many nodes `up` ensures; 0: 3, or more if more node
	// directories exist.
	PGNodes int
	// HA is the number of members `up` gives a new node (1: plain); 0:
	// unset, existing nodes keep their kind and new ones are plain.
	HA int
	// HANodes are the node numbers HA applies to; nil: all.
	HANodes []int
	// TLS (SHARDVISOR_DEVENV_TLS=1): the ensemble takes clients over TLS
	// only, each identified by its certificate (tls.go). False, the zero
	// value and FromEnv's default, is the plain mode the tests and benches
	// run in (their clients dial plain); the devenv command's default is
	// TLS. Up restarts servers running in the other mode (mode.go).
	TLS bool
	// ZKFullJIT (SHARDVISOR_DEVENV_ZK_FULL_JIT=1) runs ZooKeeper's JVM with
	// C2, as production does. The default, C1 alone, starts faster (the
	// tests' and the demo's restarts: the demo took 1.14x as long over TLS
	// with C2, 1.05x with C1), but C1 has no intrinsics for AES and GHASH,
	// so each TLS record is encrypted in plain Java: the moves' flip took
	// 6.0 ms at p50 over TLS against 2.4 ms plain; with C2, 3.7-4.2 against
	// 4.0-4.3. Benchmarks of steady-state latency set it.
	ZKFullJIT bool
	// Hosts places each server on a host of its own (placement.go); nil:
	// all on this host, on 127.0.0.1. Its Patroni members then reach
	// ZooKeeper directly (partitions are the placement's packet filters,
	// not zklink's forwarders). Not an environment variable: a test that
	// makes the hosts sets it.
	Hosts Placement
	// Timeout bounds the waits for health.
	Timeout time.Duration
	// Log receives the progress lines ("devenv: zk1: started ..."); nil
	// discards them.
	Log io.Writer
}

// FromEnv reads the environment variables scripts/devenv has always read.
func FromEnv() (Config, error) {
	c := Config{Dir: os.Getenv("SHARDVISOR_DEVENV_DIR"), Log: os.Stderr}
	var err error
	if c.ZKPortBase, err = envInt("SHARDVISOR_ZK_PORT_BASE"); err != nil {
		return c, err
	}
	if c.PGPortBase, err = envInt("SHARDVISOR_PG_PORT_BASE"); err != nil {
		return c, err
	}
	if c.PGNodes, err = ParseNodes(os.Getenv("SHARDVISOR_PG_NODES")); err != nil {
		return c, err
	}
	if c.HA, err = ParseHA(os.Getenv("SHARDVISOR_PG_HA")); err != nil {
		return c, err
	}
	if c.HANodes, err = ParseHANodes(os.Getenv("SHARDVISOR_PG_HA_NODES")); err != nil {
		return c, err
	}
	if c.TLS, err = envBool("SHARDVISOR_DEVENV_TLS"); err != nil {
		return c, err
	}
	if c.ZKFullJIT, err = envBool("SHARDVISOR_DEVENV_ZK_FULL_JIT"); err != nil {
		return c, err
	}
	secs, err := envInt("SHARDVISOR_DEVENV_TIMEOUT")
	if err != nil {
		return c, err
	}
	c.Timeout = time.Duration(secs) * time.Second
	return c, nil
}

// envBool reads a 1/0 variable ("" is false).
func envBool(name string) (bool, error) {
	switch v := os.Getenv(name); v {
	case "", "0", "false":
		return false, nil
	case "1", "true":
		return true, nil
	default:
		return false, fmt.Errorf("%s must be 1 or 0, not %q", name, v)
	}
}

func envInt(name string) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s must be a positive integer, got '%s'", name, v)
	}
	return n, nil
}

// ParseNodes parses SHARDVISOR_PG_NODES ("" is 0: the default).
func ParseNodes(v string) (int, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || strings.HasPrefix(v, "0") || strings.HasPrefix(v, "+") {
		return 0, fmt.Errorf("SHARDVISOR_PG_NODES must be a positive integer, got '%s'", v)
	}
	return n, nil
}

// ParseHA parses SHARDVISOR_PG_HA ("" is 0: unset).
func ParseHA(v string) (int, error) {
	if v == "" {
		return 0, nil
	}
	if len(v) != 1 || v[0] < '1' || v[0] > '9' {
		return 0, fmt.Errorf("SHARDVISOR_PG_HA must be a number of members 1..%d, got '%s'", MaxMembers, v)
	}
	return int(v[0] - '0'), nil
}

// ParseHANodes parses SHARDVISOR_PG_HA_NODES, a comma list of node numbers.
func ParseHANodes(v string) ([]int, error) {
	if v == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || strings.HasPrefix(f, "0") || strings.HasPrefix(f, "+") {
			return nil, fmt.Errorf("SHARDVISOR_PG_HA_NODES must be a comma list of node numbers (e.g. 4,5), got '%s'", v)
		}
		out = append(out, n)
	}
	return out, nil
}

// withDefaults fills the zero values.
func (c Config) withDefaults() Config {
	if c.Dir == "" {
		c.Dir = DefaultDir
	}
	if abs, err := filepath.Abs(c.Dir); err == nil {
		c.Dir = abs
	}
	if c.ZKPortBase == 0 {
		c.ZKPortBase = DefaultZKPortBase
	}
	if c.PGPortBase == 0 {
		c.PGPortBase = DefaultPGPortBase
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	return c
}

// Env is one environment: its configuration and the operations on it.
// Its methods may be called from several goroutines and processes: those
// that change state take the environment's lock (lock.go).
type Env struct {
	c     Config
	logMu sync.Mutex // one progress line at a time, from parallel launches
	tlsMu sync.Mutex // one CA, although the servers launch in parallel

	apiOnce sync.Once
	api     *patroniAPI // patroni_api.go
}

// New returns the environment c describes; nothing is started.
func New(c Config) *Env { return &Env{c: c.withDefaults()} }

// Config returns the configuration with its defaults filled in.
func (e *Env) Config() Config { return e.c }

// Dir is the state directory.
func (e *Env) Dir() string { return e.c.Dir }

// logf writes a progress line as scripts/devenv did: "devenv: ...".
func (e *Env) logf(format string, args ...any) {
	e.logMu.Lock()
	defer e.logMu.Unlock()
	fmt.Fprintf(e.c.Log, "devenv: "+format+"\n", args...)
}

// ---------------------------------------------------------------- ZooKeeper

// ZKDir is server i's directory: zoo.cfg, log4j.properties, zk.pid,
// zookeeper.log, zookeeper.out, data/, datalog/.
func (e *Env) ZKDir(i int) string { return filepath.Join(e.c.Dir, "zk", "zk"+strconv.Itoa(i)) }

// ZKPort is server i's client port.
func (e *Env) ZKPort(i int) int         { return e.c.ZKPortBase + i - 1 }
func (e *Env) zkQuorumPort(i int) int   { return e.c.ZKPortBase + 1070 + i - 1 }
func (e *Env) zkElectionPort(i int) int { return e.c.ZKPortBase + 2070 + i - 1 }
func (e *Env) zkLog(i int) string       { return filepath.Join(e.ZKDir(i), "zookeeper.log") }

// SuperFile holds the password of the ZooKeeper superuser:
// addauth digest super:PASSWORD.
func (e *Env) SuperFile() string { return filepath.Join(e.c.Dir, "zk", "superpass") }

// ZKConnect is the ensemble's connect string.
func (e *Env) ZKConnect() string {
	s := make([]string, ZKServers)
	for i := range s {
		s[i] = e.hostPort("zk"+itoa(i+1), e.ZKPort(i+1))
	}
	return strings.Join(s, ",")
}

// ---------------------------------------------------------------- PostgreSQL

// PGDir is node i's directory: data/, postgres.log and its PgBouncer's
// files (pgbouncer.ini, .auth, .log, .pid) for a plain node, members and
// mM/ for a group.
func (e *Env) PGDir(i int) string { return filepath.Join(e.c.Dir, "pg", "pg"+strconv.Itoa(i)) }

// PGPort is plain node i's port (and member 1's of group i).
func (e *Env) PGPort(i int) int    { return e.c.PGPortBase + i - 1 }
func (e *Env) pgLog(i int) string  { return filepath.Join(e.PGDir(i), "postgres.log") }
func (e *Env) pgData(i int) string { return filepath.Join(e.PGDir(i), "data") }

// PasswordFile holds the postgres superuser's password (mode 0644).
func (e *Env) PasswordFile() string { return filepath.Join(e.c.Dir, "pg", "password") }

// PGPassFile is the same password as a libpq/pgx password file (0600).
func (e *Env) PGPassFile() string { return filepath.Join(e.c.Dir, "pg", "pgpass") }

// MemberDir is member m's directory of group i: data/, patroni.yml,
// patroni.log, postgres.log, patroni.pid, pgpass, zkfwdJ.pid, its
// PgBouncer's files; also its unix socket directory.
func (e *Env) MemberDir(i, m int) string {
	return filepath.Join(e.PGDir(i), "m"+strconv.Itoa(m))
}

// MemberPort is member m's PostgreSQL port of group i.
func (e *Env) MemberPort(i, m int) int { return e.c.PGPortBase + i - 1 + 100*(m-1) }

// MemberAPIPort is member m's Patroni REST API port of group i.
func (e *Env) MemberAPIPort(i, m int) int { return e.c.PGPortBase + 1000 + i - 1 + 100*(m-1) }

// PoolPortOffset: a db server's PgBouncer listens this far above the
// server (pgbouncer.go).
const PoolPortOffset = 2000

// PoolPort is plain node i's PgBouncer port (and member 1's of group i).
func (e *Env) PoolPort(i int) int { return e.PGPort(i) + PoolPortOffset }

// MemberPoolPort is the port of member m's PgBouncer in group i, in front
// of that member's own PostgreSQL.
func (e *Env) MemberPoolPort(i, m int) int { return e.MemberPort(i, m) + PoolPortOffset }

// MemberName is member m's Patroni name in group i: "pg4-m1".
func MemberName(i, m int) string { return fmt.Sprintf("pg%d-m%d", i, m) }

// ZKLinkPort is where member m of group i reaches ZooKeeper server j
// through a forwarder of its own (zklink.go).
func (e *Env) ZKLinkPort(i, m, j int) int {
	return e.c.ZKPortBase + 3000 + 10*(i-1) + 3*(m-1) + j - 1
}

func (e *Env) zkLinkPidFile(i, m, j int) string {
	return filepath.Join(e.MemberDir(i, m), "zkfwd"+strconv.Itoa(j)+".pid")
}
