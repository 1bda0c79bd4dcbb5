// Package zktest opens ZooKeeper sessions for tests: on the real ensemble
// (Session) or on an in-memory one (Memory, MemorySession). It is apart
// from testenv because zksession's own tests use testenv.
package zktest

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/internal/pki"
	"github.com/shardvisor/shardvisor/zksession"
	"github.com/shardvisor/shardvisor/zksession/memzk"
)

// Session opens a ZooKeeper session for a test, waits until it is
// connected (up to 30 s) and closes it when the test ends.
func Session(t testing.TB, cfg zksession.Config) *zksession.Session {
	t.Helper()
	s, err := zksession.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return connected(t, s)
}

// Memory starts an in-memory ZooKeeper for the test and opens a connected
// session on it. Tests of topology, routing and planning decisions use it;
// what only ZooKeeper does (ACLs, the wire, real session timeouts) stays
// on Session.
func Memory(t testing.TB) (*memzk.Server, *zksession.Session) {
	t.Helper()
	srv := memzk.New()
	return srv, MemorySession(t, srv, zksession.Config{})
}

// MemorySession opens another connected session on srv, closed when the
// test ends: another process of the fleet.
func MemorySession(t testing.TB, srv *memzk.Server, cfg zksession.Config) *zksession.Session {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	s, err := srv.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return connected(t, s)
}

func connected(t testing.TB, s *zksession.Session) *zksession.Session {
	t.Helper()
	t.Cleanup(s.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// MemoryTree is a test's tree on an in-memory ZooKeeper with its Root
// created, as testenv.ZK's Root is on the real ensemble.
type MemoryTree struct {
	Server *memzk.Server
	Root   string
}

// NewMemoryTree starts an in-memory ZooKeeper with /shardvisor-test
// created, and opens a session on it.
func NewMemoryTree(t testing.TB) (*MemoryTree, *zksession.Session) {
	t.Helper()
	srv, s := Memory(t)
	m := &MemoryTree{Server: srv, Root: "/shardvisor-test"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.CreateAll(ctx, m.Root); err != nil {
		t.Fatal(err)
	}
	return m, s
}

// Session opens another session on the tree: another process.
func (m *MemoryTree) Session(t testing.TB) *zksession.Session {
	t.Helper()
	return MemorySession(t, m.Server, zksession.Config{})
}

// Put writes data at p, creating p and its parents as needed: records
// another program keeps (Patroni's, say), as a test needs them.
func Put(t testing.TB, s *zksession.Session, p, data string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.CreateAll(ctx, p); err != nil {
		t.Fatalf("zktest: creating %s: %v", p, err)
	}
	if _, err := s.Set(ctx, p, []byte(data), -1); err != nil {
		t.Fatalf("zktest: writing %s: %v", p, err)
	}
}

// TLSConfig is a session configuration that dials connect over TLS with
// f's certificate and names its identity (as internal/cliutil builds it
// from --zk-tls-*), for an ensemble such as testenv.StartTLSZK's.
func TLSConfig(t testing.TB, connect string, f pki.Files) zksession.Config {
	t.Helper()
	cfg := zksession.Config{Connect: connect}
	if err := cfg.UseTLS(f.CA, f.Cert, f.Key); err != nil {
		t.Fatal(err)
	}
	return cfg
}
