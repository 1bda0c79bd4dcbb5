package benchkit

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"
)

// DefaultDevenvDir is scripts/devenv's state directory when
// SHARDVISOR_DEVENV_DIR does not name another.
const DefaultDevenvDir = "/tmp/shardvisor-devenv"

// EnvOr is the environment variable k, or def when it is empty.
func EnvOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// EnvInt is the environment variable k as an integer, or def when it is
// not one.
func EnvInt(k string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(k)); err == nil {
		return n
	}
	return def
}

// EnvDuration is the environment variable k as a duration, or def when it
// is not one.
func EnvDuration(k string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(k)); err == nil {
		return d
	}
	return def
}

// Fatalf prints "name: message" on stderr and exits with code (2: usage,
// 1: a failed run).
func Fatalf(code int, name, format string, args ...any) {
	fmt.Fprintf(os.Stderr, name+": "+format+"\n", args...)
	os.Exit(code)
}

// DevFlags are the flags of a benchmark that runs in databases of its own
// on scripts/devenv's servers (internal/clustertest's Dev).
type DevFlags struct {
	ZK, Dir, PGHost *string
	Keep, NoLock    *bool
	TLS             *bool
	PGPortBase      *int
}

// NewDevFlags defines them on the command line; zk is the default
// ZooKeeper connect string, unless SHARDVISOR_ZK_PORT_BASE names the
// ensemble's ports (as scripts/devenv reads it).
func NewDevFlags(zk string) DevFlags {
	if b := EnvInt("SHARDVISOR_ZK_PORT_BASE", 0); b > 0 {
		zk = fmt.Sprintf("127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", b, b+1, b+2)
	}
	return DevFlags{
		ZK:     flag.String("zk", zk, "ZooKeeper connect string"),
		Keep:   flag.Bool("keep", false, "keep the databases and the ZooKeeper tree (printed at the end)"),
		NoLock: flag.Bool("no-lock", false, "do not take the test environment's shared lock"),
		Dir:    flag.String("devenv-dir", EnvOr("SHARDVISOR_DEVENV_DIR", DefaultDevenvDir), "scripts/devenv state directory (password file, lock)"),
		PGHost: flag.String("pg-host", "127.0.0.1", "PostgreSQL host"),
		TLS: flag.Bool("tls", os.Getenv("SHARDVISOR_DEVENV_TLS") == "1", "the environment takes ZooKeeper clients over TLS only: dial it with the certificates in --devenv-dir/tls, "+
			"as the admin (the router as the web head) (env SHARDVISOR_DEVENV_TLS=1)"),
		PGPortBase: flag.Int("pg-port-base", EnvInt("SHARDVISOR_PG_PORT_BASE", 25432), "port of the first PostgreSQL node; node i listens on base+i-1"),
	}
}
