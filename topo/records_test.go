package topo

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/zksession"
)

// zkCluster gives the test an in-memory ZooKeeper with a session on it
// (the records' logic needs no server; what only ZooKeeper does, ACLs and
// partitions, stays on the real ensemble); p are the paths of cluster c1
// under its root, ctx lasts a minute.
func zkCluster(t *testing.T) (ctx context.Context, z *zktest.MemoryTree, s *zksession.Session, p Paths) {
	t.Helper()
	z, s = zktest.NewMemoryTree(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx, z, s, MustPaths(z.Root, "c1")
}

// clusterNode creates the cluster's znode (empty) for a test of the
// records under it: only CreateCluster makes a cluster, and topo refuses
// to write under one that does not exist.
func clusterNode(t *testing.T, ctx context.Context, s *zksession.Session, p Paths) {
	t.Helper()
	if err := s.CreateAll(ctx, p.Cluster()); err != nil {
		t.Fatal(err)
	}
}

// flipOp creates the move record m1 in state from and returns the
// operation that sets it to MoveFlip (a flip's half of its transaction
// with the map) and the version it was created with.
func flipOp(t *testing.T, ctx context.Context, s *zksession.Session, p Paths, from string) (zksession.Op, int32) {
	t.Helper()
	rec := &MoveRecord{Version: MoveVersion, ID: "m1", State: from}
	if err := CreateMove(ctx, s, p, rec); err != nil {
		t.Fatal(err)
	}
	_, mv, err := ReadMove(ctx, s, p, "m1")
	if err != nil {
		t.Fatal(err)
	}
	rec.State = MoveFlip
	op, err := UpdateMoveOp(p, rec, mv)
	if err != nil {
		t.Fatal(err)
	}
	return op, mv
}

func testCluster(name string) ClusterRecord {
	return ClusterRecord{Version: ClusterVersion, Name: name, Seed: strings.Repeat("ab", 16), CreatedAt: time.Unix(1700000000, 0).UTC()}
}

// A cluster is created whole, once; its map is written only by
// compare-and-swap, alone or with a move record in one transaction, and a
// lost race on the map is told apart from a failure of the other records.
func TestClusterAndMapRecords(t *testing.T) {
	ctx, _, s, p := zkCluster(t)

	if _, _, err := ReadMapData(ctx, s, p); !errors.Is(err, ErrNoCluster) {
		t.Fatalf("map of a missing cluster: %v, want ErrNoCluster", err)
	}
	if err := CreateCluster(ctx, s, p, testCluster("other"), []byte(`{}`), nil); err == nil || !strings.Contains(err.Error(), `names "other"`) {
		t.Fatalf("record of another cluster: %v", err)
	}
	if err := CreateCluster(ctx, s, p, testCluster("c1"), []byte(`{"v":1}`), nil); err != nil {
		t.Fatal(err)
	}
	if err := CreateCluster(ctx, s, p, testCluster("c1"), []byte(`{"v":1}`), nil); !errors.Is(err, ErrClusterExists) {
		t.Fatalf("second create: %v, want ErrClusterExists", err)
	}
	for _, dir := range []string{p.Pools(), p.Routers(), p.Moves(), p.Locks()} {
		if ok, _, err := s.Exists(ctx, dir); !ok || err != nil {
			t.Fatalf("%s not created: %v", dir, err)
		}
	}
	if r, err := ReadCluster(ctx, s, p); err != nil || r.Name != "c1" {
		t.Fatalf("cluster record: %+v %v", r, err)
	}
	data, v0, err := ReadMapData(ctx, s, p)
	if err != nil || string(data) != `{"v":1}` {
		t.Fatalf("map: %q %v", data, err)
	}
	v1, stats, err := WriteMapData(ctx, s, p, []byte(`{"v":2}`), v0)
	if err != nil || v1 != v0+1 || len(stats) != 0 {
		t.Fatalf("write: version %d, %d stats, %v", v1, len(stats), err)
	}
	if _, _, err := WriteMapData(ctx, s, p, []byte(`{"v":3}`), v0); !errors.Is(err, ErrMapChanged) || !errors.Is(err, zksession.ErrBadVersion) {
		t.Fatalf("stale write: %v, want ErrMapChanged and ErrBadVersion", err)
	}

	// With a move record in the same transaction.
	op, mv := flipOp(t, ctx, s, p, MovePrepare)
	v2, stats, err := WriteMapData(ctx, s, p, []byte(`{"v":3}`), v1, op)
	if err != nil || v2 != v1+1 || len(stats) != 1 || stats[0].Version != mv+1 {
		t.Fatalf("write with a move: version %d, stats %+v, %v", v2, stats, err)
	}
	// The move record's version moved on: the transaction fails on it,
	// the map is not written, and it is not a lost race on the map.
	_, _, err = WriteMapData(ctx, s, p, []byte(`{"v":4}`), v2, op)
	if err == nil || errors.Is(err, ErrMapChanged) || !errors.Is(err, zksession.ErrBadVersion) {
		t.Fatalf("write with a stale move: %v, want a move conflict that is not ErrMapChanged", err)
	}
	if data, v, _ := ReadMapData(ctx, s, p); string(data) != `{"v":3}` || v != v2 {
		t.Fatalf("a failed transaction wrote the map: %q version %d", data, v)
	}
	if got, _, err := ReadMove(ctx, s, p, "m1"); err != nil || got.State != MoveFlip {
		t.Fatalf("move record after the transaction: %+v %v", got, err)
	}

	if err := DeleteCluster(ctx, s, p); err != nil {
		t.Fatal(err)
	}
	if ok, _, _ := s.Exists(ctx, p.Cluster()); ok {
		t.Fatal("the cluster is still there after DeleteCluster")
	}
	sc, err := CreateScratch(ctx, s, p, "bench-1", []byte("0"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sc.Write(ctx, []byte("1")); err != nil {
		t.Fatal(err)
	}
	if got, st, err := s.Get(ctx, p.Probe("bench-1")); err != nil || string(got) != "1" || st.EphemeralOwner != s.SessionID() {
		t.Fatalf("scratch node: %q owner 0x%x, %v", got, st.EphemeralOwner, err)
	}
	if err := DeleteRoot(ctx, s, p); err != nil {
		t.Fatal(err)
	}
	if ok, _, _ := s.Exists(ctx, p.Root()); ok {
		t.Fatal("the root is still there after DeleteRoot")
	}
}

// Tables are added and removed by compare-and-swap with their own rules.
func TestAddRemoveTable(t *testing.T) {
	ctx, _, s, p := zkCluster(t)
	if err := CreateCluster(ctx, s, p, testCluster("c1"), []byte(`{}`), nil); err != nil {
		t.Fatal(err)
	}
	tab := TableRecord{Name: "app.t", KeyColumn: "k"}
	if r, err := AddTable(ctx, s, p, tab); err != nil || len(r.Tables) != 1 || r.Version != 2 {
		t.Fatalf("add: %+v %v", r, err)
	}
	if _, err := AddTable(ctx, s, p, tab); err == nil || !strings.Contains(err.Error(), "table app.t is already sharded") {
		t.Fatalf("second add: %v", err)
	}
	if r, err := RemoveTable(ctx, s, p, "app.t"); err != nil || len(r.Tables) != 0 {
		t.Fatalf("remove: %+v %v", r, err)
	}
	if _, err := RemoveTable(ctx, s, p, "app.t"); err == nil || !strings.Contains(err.Error(), "table app.t is not a sharded table") {
		t.Fatalf("second remove: %v", err)
	}
}

// The pool config is created, then replaced only by compare-and-swap; the
// status is last writer wins; members are read back with one decoder, a
// malformed one reported, a departed one left out.
func TestPoolRecords(t *testing.T) {
	ctx, z, s, p := zkCluster(t)
	clusterNode(t, ctx, s, p)

	if _, _, err := ReadPoolConfig(ctx, s, p, "web"); !errors.Is(err, zksession.ErrNoNode) {
		t.Fatalf("config of a new pool: %v, want ErrNoNode", err)
	}
	cfg := &PoolConfig{Version: PoolConfigVersion, Command: "/bin/app", Workers: 2}
	if _, _, err := SetPoolConfig(ctx, s, p, "web", cfg, 0); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("expected version of a missing config: %v", err)
	}
	if _, _, err := SetPoolConfig(ctx, s, p, "web", &PoolConfig{Version: 1, Command: "x"}, -1); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "workers: 0") {
		t.Fatalf("invalid config: %v", err)
	}
	w := WatchPoolConfig(ctx, s, p, "web")
	defer w.Stop()
	if n := <-w.C; n.Exists {
		t.Fatalf("watch before the config exists: %+v", n)
	}
	if v, created, err := SetPoolConfig(ctx, s, p, "web", cfg, -1); err != nil || !created || v != 0 {
		t.Fatalf("create: version %d created %v: %v", v, created, err)
	}
	select {
	case n := <-w.C:
		if c, err := DecodePoolConfig("", n.Data); !n.Exists || err != nil || c.Workers != 2 {
			t.Fatalf("watched config %+v: %v", n, err)
		}
	case <-ctx.Done():
		t.Fatal("the watch did not see the config")
	}
	cfg.Workers = 3
	if v, created, err := SetPoolConfig(ctx, s, p, "web", cfg, -1); err != nil || created || v != 1 {
		t.Fatalf("update: version %d created %v: %v", v, created, err)
	}
	_, _, err := SetPoolConfig(ctx, s, p, "web", cfg, 0)
	if !errors.Is(err, ErrPoolConfigChanged) || !errors.Is(err, zksession.ErrBadVersion) || !strings.Contains(err.Error(), "changed (expected version 0)") {
		t.Fatalf("stale expected version: %v", err)
	}
	got, v, err := ReadPoolConfig(ctx, s, p, "web")
	if err != nil || v != 1 || got.Workers != 3 {
		t.Fatalf("read: %+v version %d: %v", got, v, err)
	}
	if data, v, err := ReadPoolConfigData(ctx, s, p, "web"); err != nil || v != 1 || !strings.Contains(string(data), `"workers": 3`) {
		t.Fatalf("raw read: %q %d %v", data, v, err)
	}

	if st, err := ReadPoolStatus(ctx, s, p, "web"); st != nil || err != nil {
		t.Fatalf("status before any: %+v %v", st, err)
	}
	for i, res := range []string{SwapFailed, SwapOK} {
		if err := WritePoolStatus(ctx, s, p, "api", PoolStatus{Version: PoolStatusVersion, Member: "h-1", Result: res, Generation: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := ReadPoolStatus(ctx, s, p, "api"); err != nil || st.Result != SwapOK || st.Generation != 1 {
		t.Fatalf("status: %+v %v", st, err)
	}
	if pools, err := ListPools(ctx, s, p); err != nil || strings.Join(pools, ",") != "api,web" {
		t.Fatalf("pools: %v %v", pools, err)
	}

	reg, err := RegisterPoolMember(ctx, s, p, "web", PoolMember{Version: PoolMemberVersion, Member: "h-2", State: "starting"})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Update(ctx, PoolMember{Version: PoolMemberVersion, Member: "h-2", State: "serving", MapVersion: 7}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateAll(ctx, p.PoolMembers("web")); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(ctx, p.PoolMember("web", "h-1"), []byte(`{"version":1,"member":"h-1","typo":1}`)); err != nil {
		t.Fatal(err)
	}
	ms, err := ListPoolMembers(ctx, s, p, "web")
	if err != nil || len(ms) != 2 {
		t.Fatalf("members: %+v %v", ms, err)
	}
	if ms[0].Name != "h-1" || ms[0].Rec != nil || !errors.Is(ms[0].Err, ErrMalformed) || ms[0].Path != p.PoolMember("web", "h-1") {
		t.Fatalf("malformed member: %+v", ms[0])
	}
	if ms[1].Name != "h-2" || ms[1].Err != nil || ms[1].Rec.State != "serving" || ms[1].Rec.MapVersion != 7 {
		t.Fatalf("member: %+v", ms[1])
	}
	ps, err := ReadPoolState(ctx, s, p, "web")
	if err != nil || ps.ConfigVersion == nil || *ps.ConfigVersion != 1 || ps.ConfigErr != nil || ps.Status != nil || len(ps.Members) != 2 || ps.ConfigPath != p.PoolConfig("web") {
		t.Fatalf("pool state: %+v %v", ps, err)
	}
	if ps, err := ReadPoolState(ctx, s, p, "api"); err != nil || ps.ConfigVersion != nil || ps.Status.Result != SwapOK || len(ps.Members) != 0 {
		t.Fatalf("state of a pool without config: %+v %v", ps, err)
	}
	if err := reg.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if ms, err := ListPoolMembers(ctx, s, p, "web"); err != nil || len(ms) != 1 {
		t.Fatalf("members after Remove: %+v %v", ms, err)
	}
	if ms, err := ListPoolMembers(ctx, s, p, "none"); err != nil || len(ms) != 0 {
		t.Fatalf("members of a pool without a directory: %+v %v", ms, err)
	}

	if rs, err := ListRouters(ctx, s, p); err != nil || len(rs) != 0 {
		t.Fatalf("routers before any: %+v %v", rs, err)
	}
	rr, err := RegisterRouter(ctx, s, p, RouterMember{Version: RouterMemberVersion, ID: "r1", MapVersion: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Remove(ctx)
	if rs, err := ListRouters(ctx, s, p); err != nil || len(rs) != 1 || rs[0].Rec.MapVersion != 3 || rs[0].Path != p.Router("r1") {
		t.Fatalf("routers: %+v %v", rs, err)
	}
	if err := Sync(ctx, s, p); err != nil {
		t.Fatal(err)
	}
	if err := Sync(ctx, s, MustPaths(z.Root, "none")); err != nil {
		t.Fatalf("sync on a missing cluster: %v", err)
	}
}

// One runner per move: a second session is refused, naming the holder,
// and takes over once the first releases.
func TestLockMoveRunner(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	clusterNode(t, ctx, s1, p)
	s2 := z.Session(t)
	rec := &MoveRecord{Version: MoveVersion, ID: "m1", State: MovePrepare}
	if err := CreateMove(ctx, s1, p, rec); err != nil {
		t.Fatal(err)
	}
	l1, err := LockMoveRunner(ctx, s1, p, "m1", "host-1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = LockMoveRunner(ctx, s2, p, "m1", "host-2")
	var le *zksession.LockedError
	if !errors.Is(err, zksession.ErrLocked) || !errors.As(err, &le) || string(le.Holder) != "host-1" {
		t.Fatalf("second runner: %v, want ErrLocked naming host-1", err)
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := LockMoveRunner(ctx, s2, p, "m1", "host-2")
	if err != nil {
		t.Fatalf("after the first released: %v", err)
	}
	l2.Release(ctx)
}
