package bucketmap

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

func clusterRec(name string) topo.ClusterRecord {
	return topo.ClusterRecord{Version: topo.ClusterVersion, Name: name, Seed: strings.Repeat("ab", 16), CreatedAt: t0}
}

// zkStore starts a ZooKeeper root for the test, opens a session on it and
// returns a store of cluster name there, not created yet.
func zkStore(t *testing.T, name string) (ctx context.Context, z *testenv.ZK, s *zksession.Session, st *Store) {
	t.Helper()
	z = testenv.StartZK(t)
	s = zktest.Session(t, zksession.Config{Connect: z.ConnectString})
	return context.Background(), z, s, NewStore(s, topo.MustPaths(z.Root, name))
}

// createdStore is zkStore with the cluster created, its map at level over
// n nodes.
func createdStore(t *testing.T, name string, level, n int) (ctx context.Context, z *testenv.ZK, s *zksession.Session, st *Store) {
	t.Helper()
	ctx, z, s, st = zkStore(t, name)
	if err := st.Create(ctx, clusterRec(name), mustNew(t, level, nodes(n)), CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return ctx, z, s, st
}

func TestIntegrationStoreCreateLoadUpdate(t *testing.T) {
	ctx, _, s, st := zkStore(t, "c1")
	if _, _, err := st.Load(ctx); !errors.Is(err, topo.ErrNoCluster) {
		t.Fatalf("load before init: %v", err)
	}
	m := mustNew(t, 4, nodes(3))
	if err := st.Create(ctx, clusterRec("c1"), m, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := st.Create(ctx, clusterRec("c1"), m, CreateOptions{}); !errors.Is(err, ErrClusterExists) {
		t.Fatalf("second create: %v", err)
	}
	for _, p := range []string{st.Paths().Routers(), st.Paths().Pools(), st.Paths().Moves(), st.Paths().Locks()} {
		if ok, _, err := s.Exists(ctx, p); !ok || err != nil {
			t.Fatalf("%s not created: %v", p, err)
		}
	}
	got, _, err := st.Load(ctx)
	if err != nil || got.Version != 1 || got.Buckets() != 16 {
		t.Fatalf("load: %+v %v", got, err)
	}
	next, err := st.Update(ctx, func(m *Map) error { return m.Split() })
	if err != nil || next.Version != 2 || next.Level != 5 {
		t.Fatalf("update: %+v %v", next, err)
	}
	// A failing edit writes nothing.
	if _, err := st.Update(ctx, func(m *Map) error { return m.Assign(at(m, 999), "n1", AssignOptions{}) }); !errors.Is(err, ErrBucketRange) {
		t.Fatalf("bad edit: %v", err)
	}
	if cur, _, _ := st.Load(ctx); cur.Version != 2 {
		t.Fatalf("a failed edit changed the map to version %d", cur.Version)
	}
	// An edit that would make the map inconsistent is refused before
	// writing.
	_, err = st.Update(ctx, func(m *Map) error { m.nodes[0].State = NodeRemoved; return nil })
	if err == nil || !strings.Contains(err.Error(), "removed node n1") {
		t.Fatalf("inconsistent edit: %v", err)
	}
}

// Many admins racing: every update lands exactly once; none is lost.
func TestIntegrationStoreConcurrentWritersLoseNothing(t *testing.T) {
	ctx, z, s0, st0 := createdStore(t, "race", 3, 1)
	p := st0.Paths()
	const writers, each = 6, 5
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	conflicts := make(chan int, writers)
	for w := range writers {
		s := zktest.Session(t, zksession.Config{Connect: z.ConnectString})
		st := NewStore(s, p)
		st.Retries = 100
		wg.Add(1)
		go func() {
			defer wg.Done()
			tries := 0
			for i := range each {
				id := NodeID(fmt.Sprintf("w%d-%d", w, i))
				if _, err := st.Update(ctx, func(m *Map) error {
					tries++
					return m.AddNode(node(string(id), 1))
				}); err != nil {
					errs <- err
				}
			}
			conflicts <- tries - each
		}()
	}
	wg.Wait()
	close(errs)
	close(conflicts)
	for err := range errs {
		t.Fatal(err)
	}
	retried := 0
	for c := range conflicts {
		retried += c
	}
	if err := s0.Sync(ctx, p.Map()); err != nil {
		t.Fatal(err)
	}
	m, _, err := NewStore(s0, p).Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.Version != 1+writers*each || len(m.Nodes()) != 1+writers*each {
		t.Fatalf("version %d with %d nodes, want %d and %d", m.Version, len(m.Nodes()), 1+writers*each, 1+writers*each)
	}
	t.Logf("%d updates by %d writers, %d retries after lost compare-and-swaps", writers*each, writers, retried)

	// With no retries allowed a lost race is a clear conflict error.
	a, b := NewStore(s0, p), NewStore(zktest.Session(t, zksession.Config{Connect: z.ConnectString}), p)
	a.Retries = 0
	_, err = a.Update(ctx, func(m *Map) error {
		// b writes in between a's read and a's write.
		if _, err := b.Update(ctx, func(m *Map) error { return m.SetWeight("n1", 2) }); err != nil {
			t.Fatal(err)
		}
		return m.SetWeight("n1", 3)
	})
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "lost to another writer") {
		t.Fatalf("lost race: %v", err)
	}
}

func TestIntegrationStoreACL(t *testing.T) {
	z := testenv.StartZK(t)
	ctx := context.Background()
	admin := zksession.Credential{User: "admin", Password: "a-secret"}
	reader := zksession.Credential{User: "reader", Password: "r-secret"}
	p := topo.MustPaths(z.Root, "sec")
	as := zktest.Session(t, zksession.Config{Connect: z.ConnectString, Auth: []zksession.Credential{admin}})
	opt := CreateOptions{ACL: zksession.ClusterACL(&admin, &reader)}
	if err := NewStore(as, p).Create(ctx, clusterRec("sec"), mustNew(t, 2, nodes(2)), opt); err != nil {
		t.Fatal(err)
	}
	rs := zktest.Session(t, zksession.Config{Connect: z.ConnectString, Auth: []zksession.Credential{reader}})
	rst := NewStore(rs, p)
	if err := rs.Sync(ctx, p.Map()); err != nil {
		t.Fatal(err)
	}
	if m, _, err := rst.Load(ctx); err != nil || m.Version != 1 {
		t.Fatalf("reader load: %v", err)
	}
	if _, err := rst.Update(ctx, func(m *Map) error { return m.Drain("n1") }); !errors.Is(err, zksession.ErrNoAuth) {
		t.Fatalf("reader update: %v, want ErrNoAuth", err)
	}
	// Readers may register members (routers) but not touch the map.
	if _, err := topo.RegisterRouter(ctx, rs, p, topo.RouterMember{Version: topo.RouterMemberVersion, ID: "r1"}); err != nil {
		t.Fatalf("reader registering a router: %v", err)
	}
	anon := zktest.Session(t, zksession.Config{Connect: z.ConnectString})
	if _, _, err := NewStore(anon, p).Load(ctx); !errors.Is(err, zksession.ErrNoAuth) {
		t.Fatalf("anonymous load: %v, want ErrNoAuth", err)
	}
	if _, err := NewStore(as, p).Update(ctx, func(m *Map) error { return m.Drain("n1") }); err != nil {
		t.Fatalf("admin update: %v", err)
	}
}

func TestIntegrationMalformedZnodeIsReportedNotUsed(t *testing.T) {
	ctx, _, s, st := createdStore(t, "bad", 2, 2)
	p := st.Paths()
	// Someone edits the znode by hand and gets it wrong.
	if _, err := s.Set(ctx, p.Map(), []byte(`{"version":1,"map_version":7,"level":2,"nodes":[{"id":"n1","dsn":"postgres://h/d","weight":1,"state":"active"}],"owners":"AAAAAAAAAAE="}`), zksession.AnyVersion); err != nil {
		t.Fatal(err)
	}
	_, _, err := st.Load(ctx)
	if err == nil || !strings.Contains(err.Error(), p.Map()) || !strings.Contains(err.Error(), "owner index 1 is not in the registry") {
		t.Fatalf("load of a malformed map: %v", err)
	}
	if _, err := st.Update(ctx, func(m *Map) error { return nil }); err == nil {
		t.Fatal("update on top of a malformed map succeeded")
	}
}

// UpdateAlso writes the map and the extra records together or not at all,
// starts from the caller's map without a read, and falls back to reading
// when that map is stale.
func TestIntegrationStoreUpdateAlso(t *testing.T) {
	ctx, _, s, st := createdStore(t, "c1", 4, 3)
	rec := st.Paths().Move("m1")
	if err := s.Create(ctx, rec, []byte("v0")); err != nil {
		t.Fatal(err)
	}
	m, zv, err := st.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	also := func(data string, version int32) func(*Map) ([]zksession.Op, error) {
		return func(next *Map) ([]zksession.Op, error) {
			return []zksession.Op{zksession.SetOp(rec, []byte(fmt.Sprintf("%s@%d", data, next.Version)), version)}, nil
		}
	}
	// From the caller's map: both written.
	next, nzv, stats, err := st.UpdateAlso(ctx, m, zv, func(m *Map) error { return m.Assign(at(m, 0), "n2", AssignOptions{}) }, also("v1", 0))
	if err != nil || next.Version != 2 || nzv != zv+1 || len(stats) != 1 || stats[0].Version != 1 {
		t.Fatalf("update: %+v %d %+v %v", next, nzv, stats, err)
	}
	if data, _, _ := s.Get(ctx, rec); string(data) != "v1@2" {
		t.Fatalf("record: %q", data)
	}
	// From a stale map (version 1): a conflict, then a fresh read; the
	// edit sees the current map.
	next, _, _, err = st.UpdateAlso(ctx, m, zv, func(m *Map) error {
		if m.Owner(0) != "n2" {
			return fmt.Errorf("edit saw a stale map: bucket 0 on %s", m.Owner(0))
		}
		return m.Assign(at(m, 1), "n3", AssignOptions{})
	}, also("v2", 1))
	if err != nil || next.Version != 3 {
		t.Fatalf("update from a stale map: %+v %v", next, err)
	}
	// The record moved on: neither is written, and no retry hides it.
	_, _, _, err = st.UpdateAlso(ctx, nil, 0, func(m *Map) error { return m.Assign(at(m, 2), "n3", AssignOptions{}) }, also("v3", 0))
	if !errors.Is(err, zksession.ErrBadVersion) {
		t.Fatalf("stale record: %v", err)
	}
	if cur, _, _ := st.Load(ctx); cur.Version != 3 {
		t.Fatalf("the map was written with a failed record: version %d", cur.Version)
	}
	if data, _, _ := s.Get(ctx, rec); string(data) != "v2@3" {
		t.Fatalf("record: %q", data)
	}
}

// The encoding switch: SetEncoding rewrites the record compressed, every
// later write (Update, UpdateAlso from a map the caller holds) keeps it,
// a switch to the form already stored writes nothing, and switching back
// writes plain again.
func TestIntegrationStoreEncoding(t *testing.T) {
	ctx, _, _, st := createdStore(t, "enc", 8, 3)
	stored := func() []byte {
		t.Helper()
		data, _, err := topo.ReadMapData(ctx, st.Session(), st.Paths())
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	isGzip := func(data []byte) bool { return len(data) > 2 && data[0] == 0x1f && data[1] == 0x8b }
	if data := stored(); isGzip(data) || data[0] != '{' {
		t.Fatal("a new cluster's map is not plain")
	}
	if _, _, err := st.SetEncoding(ctx, "zstd"); err == nil {
		t.Fatal("unknown encoding accepted")
	}
	m, changed, err := st.SetEncoding(ctx, MapGzip)
	if err != nil || !changed || m.Version != 2 || m.Encoding != MapGzip {
		t.Fatalf("switch to gzip: %+v changed=%v %v", m, changed, err)
	}
	if !isGzip(stored()) {
		t.Fatal("after the switch the znode is not gzip")
	}
	if m, changed, err = st.SetEncoding(ctx, MapGzip); err != nil || changed || m.Version != 2 {
		t.Fatalf("a second switch to gzip wrote: version %d changed=%v %v", m.Version, changed, err)
	}
	next, err := st.Update(ctx, func(m *Map) error { return m.Assign(at(m, 0), "n2", AssignOptions{}) })
	if err != nil || !isGzip(stored()) {
		t.Fatalf("an update did not keep gzip: %v", err)
	}
	cur, zv, err := st.Load(ctx)
	if err != nil || cur.Encoding != MapGzip || cur.Owner(0) != "n2" || cur.Version != next.Version {
		t.Fatalf("load of the gzip map: %+v %v", cur, err)
	}
	if _, _, _, err := st.UpdateAlso(ctx, cur, zv, func(m *Map) error { return m.SetMoving(at(m, 1), "n3", "mv-1") }, nil); err != nil || !isGzip(stored()) {
		t.Fatalf("UpdateAlso from the caller's map did not keep gzip: %v", err)
	}
	if m, changed, err = st.SetEncoding(ctx, MapPlain); err != nil || !changed || m.Meta(1).Move != "mv-1" {
		t.Fatalf("switch back: %+v %v", m, err)
	}
	if data := stored(); isGzip(data) || data[0] != '{' {
		t.Fatal("after switching back the znode is not plain JSON")
	}
}

// An edit that changes nothing writes no version (an abort's cleanup
// retried while a node is away would otherwise send a map a second to the
// whole fleet), and a real edit after it still does.
func TestIntegrationStoreNoVersionWithoutChange(t *testing.T) {
	ctx, _, s, st := createdStore(t, "noop", 2, 2)
	_, zv0, err := st.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		m, err := st.Update(ctx, func(m *Map) error {
			if err := m.SetWeight("n1", 1); err != nil { // already 1
				return err
			}
			return m.ClearMoving(at(m, 0)) // not moving: a no-op
		})
		if err != nil {
			t.Fatal(err)
		}
		if m.Version != 1 {
			t.Fatalf("no-op update %d returned map version %d, want 1", i, m.Version)
		}
	}
	_, st0, err := s.Get(ctx, st.Paths().Map())
	if err != nil {
		t.Fatal(err)
	}
	if st0.Version != zv0 {
		t.Fatalf("no-op updates wrote the znode: version %d -> %d", zv0, st0.Version)
	}
	m, err := st.Update(ctx, func(m *Map) error { return m.SetWeight("n1", 3) })
	if err != nil || m.Version != 2 {
		t.Fatalf("a real edit: version %v, %v", m, err)
	}
}
