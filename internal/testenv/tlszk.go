package testenv

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/internal/pki"
)

// TLSZK is a throwaway ZooKeeper ensemble of its own in the dev
// environment's TLS mode (TLS clients only, x509 identities), for tests of
// ACLs by certificate: the shared ensemble the rest of the suite uses is
// plain. It is stopped, by pid, when the test ends. Its servers listen on
// SHARDVISOR_TLSZK_PORT_BASE (default 9811) and the two next ports;
// tests that start one wait for each other.
type TLSZK struct {
	Servers       []string
	ConnectString string
	e             *devenv.Env
}

const defaultTLSZKPortBase = 9811

// StartTLSZK starts a TLS ensemble (two of its three servers, a quorum)
// for the test (about 5 s). It skips the
// test under -short.
func StartTLSZK(t testing.TB) *TLSZK {
	t.Helper()
	skipIfShort(t)
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "shardvisor-tlszk-test.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() })
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "shardvisor-tlszk-")
	if err != nil {
		t.Fatal(err)
	}
	base := envInt("SHARDVISOR_TLSZK_PORT_BASE", defaultTLSZKPortBase)
	var log bytes.Buffer
	e := devenv.New(devenv.Config{Dir: dir, ZKPortBase: base, PGPortBase: base + 5000, TLS: true, Timeout: 2 * time.Minute, Log: &log})
	t.Cleanup(func() {
		if err := e.Down(); err != nil {
			t.Errorf("testenv: stopping the TLS ensemble: %v", err)
		}
		switch {
		case e.AnythingRunning():
			t.Errorf("testenv: the TLS ensemble in %s still runs", dir)
		case t.Failed():
			t.Logf("the TLS ensemble's files are kept in %s", dir)
		default:
			os.RemoveAll(dir)
		}
		if t.Failed() {
			t.Logf("the TLS ensemble's log:\n%s", log.String())
		}
	})
	z := &TLSZK{e: e}
	// Two of the three servers: a quorum, with TLS between them, for one
	// JVM less (each costs several CPU-seconds to start, and three
	// packages start this ensemble).
	for i := 1; i <= devenv.ZKServers-1; i++ {
		if err := e.ZKStart(i); err != nil {
			t.Fatalf("testenv: starting TLS zk%d: %v\n%s", i, err, log.String())
		}
		z.Servers = append(z.Servers, net.JoinHostPort("127.0.0.1", strconv.Itoa(e.ZKPort(i))))
	}
	z.ConnectString = strings.Join(z.Servers, ",")
	return z
}

// Identity issues (once per ensemble) a certificate of the ensemble's CA
// for host in role: CN=host,OU=role,O=shardvisor.
func (z *TLSZK) Identity(t testing.TB, role, host string) pki.Files {
	t.Helper()
	f, err := z.e.IssueIdentity(role+"-"+host, pki.Identity{Role: role, Host: host})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Superuser is the environment's own client, ZooKeeper's x509 superuser
// (passes every ACL check), for cleanup and fixtures.
func (z *TLSZK) Superuser() pki.Files { return z.e.TLSFiles("devenv") }

// Conn is a raw go-zookeeper connection with f's certificate (as zkCli.sh
// with that certificate would be), connected, closed when the test ends.
func (z *TLSZK) Conn(t testing.TB, f pki.Files) *zk.Conn {
	t.Helper()
	tc, err := f.Config()
	if err != nil {
		t.Fatal(err)
	}
	return RawConn(t, z.Servers, pki.Dialer(tc))
}

// RawConn is a go-zookeeper connection to servers through dial (nil:
// plain TCP), with its session established (within 20 s), closed when the
// test ends: a client as zkCli.sh would be, for attacks.
func RawConn(t testing.TB, servers []string, dial zk.Dialer) *zk.Conn {
	t.Helper()
	if dial == nil {
		dial = net.DialTimeout
	}
	conn, events, err := zk.Connect(servers, 4*time.Second, zk.WithLogInfo(false), zk.WithDialer(dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	deadline := time.After(20 * time.Second)
	for conn.State() != zk.StateHasSession {
		select {
		case <-events:
		case <-deadline:
			t.Fatal("testenv: a ZooKeeper connection got no session in 20 s")
		}
	}
	return conn
}
