package topo

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/testkit"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/zksession"
)

// Tests of the records' behaviour between processes (sessions), across
// session expiry and through watches, on the in-memory ZooKeeper.

const memWait = 10 * time.Second

// awaitNode reads w until a delivery satisfies pred (a watch may skip
// intermediate versions, never the latest) and returns it.
func awaitNode(t *testing.T, w *zksession.Watch, what string, pred func(zksession.Node) bool) zksession.Node {
	t.Helper()
	return testkit.Await(t, w.C, memWait, what, pred)
}

// expireSession ends s's current session as the ensemble does after its
// timeout, waits until s is connected on a new session and returns the old
// session id.
func expireSession(t *testing.T, z *zktest.MemoryTree, s *zksession.Session) int64 {
	t.Helper()
	old := s.SessionID()
	c, err := z.Server.ConnOf(old)
	if err != nil {
		t.Fatal(err)
	}
	sub := s.Subscribe()
	defer sub.Close()
	c.Expire()
	for {
		ch := testenv.Receive(t, sub.C, memWait, "no new session after the expiry")
		if ch.To == zksession.StateConnected && ch.NewSession {
			return old
		}
	}
}

// mustCreateCluster creates cluster p with map data mapData.
func mustCreateCluster(t *testing.T, ctx context.Context, s *zksession.Session, p Paths, mapData string) {
	t.Helper()
	if err := CreateCluster(ctx, s, p, testCluster(p.ClusterName()), []byte(mapData), nil); err != nil {
		t.Fatal(err)
	}
}

func poolCfg(workers int) *PoolConfig {
	return &PoolConfig{Version: PoolConfigVersion, Command: "/bin/app", Workers: workers}
}

// SetPoolConfig's compare-and-swap between two processes: the second
// writer of the same version loses and the first one's config stays; the
// pool's members directory and empty status are (re)created with it.
func TestSetPoolConfigCASBetweenSessions(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	clusterNode(t, ctx, s1, p)
	s2 := z.Session(t)
	if v, created, err := SetPoolConfig(ctx, s1, p, "web", poolCfg(2), -1); err != nil || !created || v != 0 {
		t.Fatalf("create: version %d created %v: %v", v, created, err)
	}
	if data, _, err := s2.Get(ctx, p.PoolStatus("web")); err != nil || len(data) != 0 {
		t.Fatalf("status created with the config: %q %v, want an empty record", data, err)
	}
	if ok, _, err := s2.Exists(ctx, p.PoolMembers("web")); !ok || err != nil {
		t.Fatalf("members directory not created: %v", err)
	}
	_, v1, err1 := ReadPoolConfig(ctx, s1, p, "web")
	_, v2, err2 := ReadPoolConfig(ctx, s2, p, "web")
	if err1 != nil || err2 != nil || v1 != 0 || v2 != 0 {
		t.Fatalf("reads: %d %v / %d %v", v1, err1, v2, err2)
	}
	if v, created, err := SetPoolConfig(ctx, s1, p, "web", poolCfg(3), v1); err != nil || created || v != 1 {
		t.Fatalf("first writer: version %d created %v: %v", v, created, err)
	}
	if _, _, err := SetPoolConfig(ctx, s2, p, "web", poolCfg(5), v2); !errors.Is(err, ErrPoolConfigChanged) || !errors.Is(err, zksession.ErrBadVersion) {
		t.Fatalf("second writer of version %d: %v, want ErrPoolConfigChanged", v2, err)
	}
	if got, v, err := ReadPoolConfig(ctx, s2, p, "web"); err != nil || v != 1 || got.Workers != 3 {
		t.Fatalf("after the lost race: %+v version %d %v, want the first writer's (3 workers, version 1)", got, v, err)
	}
	// A pool made by an older version (no members directory, no status)
	// is completed by the next set.
	if err := s1.Delete(ctx, p.PoolStatus("web"), -1); err != nil {
		t.Fatal(err)
	}
	if err := s1.Delete(ctx, p.PoolMembers("web"), -1); err != nil {
		t.Fatal(err)
	}
	if v, _, err := SetPoolConfig(ctx, s2, p, "web", poolCfg(4), -1); err != nil || v != 2 {
		t.Fatalf("set again: version %d: %v", v, err)
	}
	for _, at := range []string{p.PoolStatus("web"), p.PoolMembers("web")} {
		if ok, _, err := s1.Exists(ctx, at); !ok || err != nil {
			t.Fatalf("%s not re-created by the next set: %v", at, err)
		}
	}
}

// A config znode that does not decode strictly fails ReadPoolConfig with
// an error naming its path, is still readable raw and reported (not
// fatal) by ReadPoolState, and can be overwritten by SetPoolConfig.
func TestReadPoolConfigMalformed(t *testing.T) {
	ctx, _, s, p := zkCluster(t)
	if err := s.CreateAll(ctx, p.Pool("web")); err != nil {
		t.Fatal(err)
	}
	bad := `{"version":1,"command":"/bin/app","workers":2,"wrokers":3}`
	if err := s.Create(ctx, p.PoolConfig("web"), []byte(bad)); err != nil {
		t.Fatal(err)
	}
	_, _, err := ReadPoolConfig(ctx, s, p, "web")
	var re *RecordError
	if !errors.Is(err, ErrMalformed) || !errors.As(err, &re) || re.Path != p.PoolConfig("web") || !strings.Contains(err.Error(), "wrokers") {
		t.Fatalf("malformed config: %v, want ErrMalformed naming %s and the unknown field", err, p.PoolConfig("web"))
	}
	if data, v, err := ReadPoolConfigData(ctx, s, p, "web"); err != nil || string(data) != bad || v != 0 {
		t.Fatalf("raw read: %q version %d %v", data, v, err)
	}
	ps, err := ReadPoolState(ctx, s, p, "web")
	if err != nil || ps.ConfigVersion == nil || *ps.ConfigVersion != 0 || !errors.Is(ps.ConfigErr, ErrMalformed) {
		t.Fatalf("pool state of a malformed config: %+v %v", ps, err)
	}
	// A newer format is refused as such, not as an unknown field.
	if _, err := s.Set(ctx, p.PoolConfig("web"), []byte(`{"version":99,"command":"x","workers":1}`), -1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadPoolConfig(ctx, s, p, "web"); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "format version 99 is not supported") {
		t.Fatalf("newer format: %v", err)
	}
	if v, created, err := SetPoolConfig(ctx, s, p, "web", poolCfg(2), 1); err != nil || created || v != 2 {
		t.Fatalf("fixing it: version %d created %v: %v", v, created, err)
	}
	if cfg, _, err := ReadPoolConfig(ctx, s, p, "web"); err != nil || cfg.Workers != 2 {
		t.Fatalf("after the fix: %+v %v", cfg, err)
	}
}

// Pool status: none before any write, last writer wins between two
// supervisors, the pool directory is created by the first write, and a
// record with an unknown result fails both ReadPoolStatus and ReadPoolState.
func TestPoolStatusLastWriterWins(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	clusterNode(t, ctx, s1, p)
	s2 := z.Session(t)
	if st, err := ReadPoolStatus(ctx, s1, p, "api"); st != nil || err != nil {
		t.Fatalf("status of a pool without records: %+v %v", st, err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := WritePoolStatus(ctx, s1, p, "api", PoolStatus{Version: PoolStatusVersion, Member: "h-1", Result: SwapOK, Generation: 1, At: at}); err != nil {
		t.Fatal(err)
	}
	if err := WritePoolStatus(ctx, s2, p, "api", PoolStatus{Version: PoolStatusVersion, Member: "h-2", Result: SwapRolledBack, Generation: 2, MapVersion: 9, At: at}); err != nil {
		t.Fatal(err)
	}
	st, err := ReadPoolStatus(ctx, s1, p, "api")
	if err != nil || st.Member != "h-2" || st.Result != SwapRolledBack || st.Generation != 2 || st.MapVersion != 9 || !st.At.Equal(at) {
		t.Fatalf("status: %+v %v, want h-2's", st, err)
	}
	if err := WritePoolStatus(ctx, s1, p, "api", PoolStatus{Version: PoolStatusVersion, Member: "h-1", Result: "exploded"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadPoolStatus(ctx, s2, p, "api"); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), `result "exploded" is unknown`) {
		t.Fatalf("unknown result: %v", err)
	}
	if ps, err := ReadPoolState(ctx, s2, p, "api"); !errors.Is(err, ErrMalformed) {
		t.Fatalf("pool state with an unreadable status: %+v %v, want it to fail", ps, err)
	}
}

// ListPools and ListPoolMembers are sorted by name whatever the creation
// order and the session that wrote them; a member that does not decode is
// listed with its error among the others.
func TestListPoolsAndMembersSorted(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	clusterNode(t, ctx, s1, p)
	s2 := z.Session(t)
	if pools, err := ListPools(ctx, s1, p); pools != nil || err != nil {
		t.Fatalf("pools without a pools directory: %v %v", pools, err)
	}
	for _, name := range []string{"zeta", "alpha", "mid"} {
		if _, _, err := SetPoolConfig(ctx, s1, p, name, poolCfg(1), -1); err != nil {
			t.Fatal(err)
		}
	}
	if pools, err := ListPools(ctx, s2, p); err != nil || strings.Join(pools, ",") != "alpha,mid,zeta" {
		t.Fatalf("pools: %v %v", pools, err)
	}
	for _, m := range []struct {
		s    *zksession.Session
		name string
	}{{s1, "m-c"}, {s2, "m-a"}} {
		if _, err := RegisterPoolMember(ctx, m.s, p, "mid", PoolMember{Version: PoolMemberVersion, Member: m.name, State: "serving"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s2.Create(ctx, p.PoolMember("mid", "m-b"), []byte(`{"version":2,"member":"m-b"}`)); err != nil {
		t.Fatal(err)
	}
	ms, err := ListPoolMembers(ctx, s1, p, "mid")
	if err != nil || len(ms) != 3 {
		t.Fatalf("members: %+v %v", ms, err)
	}
	for i, want := range []string{"m-a", "m-b", "m-c"} {
		if ms[i].Name != want || ms[i].Path != p.PoolMember("mid", want) {
			t.Fatalf("member %d: %+v, want %s", i, ms[i], want)
		}
	}
	if ms[0].Err != nil || ms[0].Rec.Member != "m-a" || ms[2].Err != nil || ms[2].Rec.Member != "m-c" {
		t.Fatalf("decodable members: %+v / %+v", ms[0], ms[2])
	}
	if ms[1].Rec != nil || !errors.Is(ms[1].Err, ErrMalformed) {
		t.Fatalf("malformed member: %+v", ms[1])
	}
}

// A pool member record belongs to its process: another session cannot
// take the name, and after the owner's session expires the record is
// re-created on its new session with its latest contents.
func TestPoolMemberRecreatedAfterExpiry(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	clusterNode(t, ctx, s1, p)
	s2 := z.Session(t)
	if _, _, err := SetPoolConfig(ctx, s1, p, "web", poolCfg(1), -1); err != nil {
		t.Fatal(err)
	}
	reg, err := RegisterPoolMember(ctx, s1, p, "web", PoolMember{Version: PoolMemberVersion, Member: "h-1", State: "starting"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := RegisterPoolMember(ctx, s2, p, "web", PoolMember{Version: PoolMemberVersion, Member: "h-1"}); !errors.Is(err, zksession.ErrOwnedElsewhere) {
		t.Fatalf("another process registering h-1: %v, want ErrOwnedElsewhere", err)
	}
	if h, err := ReadPoolMemberHolder(ctx, s2, p, "web", "h-1"); err != nil || h.Owner != s1.SessionID() || h.Rec == nil || h.Rec.State != "starting" {
		t.Fatalf("holder of h-1: %+v %v, want the record owned by session 0x%x", h, err, s1.SessionID())
	}
	if _, err := ReadPoolMemberHolder(ctx, s2, p, "web", "h-9"); !errors.Is(err, zksession.ErrNoNode) {
		t.Fatalf("holder of a free name: %v, want ErrNoNode", err)
	}
	if err := reg.Update(ctx, PoolMember{Version: PoolMemberVersion, Member: "h-1", State: "serving", MapVersion: 4}); err != nil {
		t.Fatal(err)
	}
	old := expireSession(t, z, s1)
	testenv.WaitFor(t, memWait, func() bool {
		data, st, err := s2.Get(ctx, p.PoolMember("web", "h-1"))
		if err != nil || st.EphemeralOwner == old || st.EphemeralOwner != s1.SessionID() {
			return false
		}
		m, err := DecodePoolMember("", data)
		return err == nil && m.State == "serving" && m.MapVersion == 4
	}, "h-1's record re-created, updated, on its new session")
	if err := reg.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if ms, err := ListPoolMembers(ctx, s2, p, "web"); err != nil || len(ms) != 0 {
		t.Fatalf("members after Remove: %+v %v", ms, err)
	}
}

// An Update made while the session is cut off fails, but is the record
// re-created when the session comes back expired.
func TestPoolMemberUpdateWhileAwayIsRecreated(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	clusterNode(t, ctx, s1, p)
	s2 := zktest.MemorySession(t, z.Server, zksession.Config{OpTimeout: 500 * time.Millisecond})
	if _, _, err := SetPoolConfig(ctx, s1, p, "web", poolCfg(1), -1); err != nil {
		t.Fatal(err)
	}
	reg, err := RegisterPoolMember(ctx, s2, p, "web", PoolMember{Version: PoolMemberVersion, Member: "h-2", State: "serving"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := z.Server.ConnOf(s2.SessionID())
	if err != nil {
		t.Fatal(err)
	}
	c.Disconnect()
	testenv.WaitFor(t, memWait, func() bool { return s2.State() == zksession.StateSuspended }, "s2 suspended")
	if err := reg.Update(ctx, PoolMember{Version: PoolMemberVersion, Member: "h-2", State: "degraded", LastError: "zk away"}); err == nil {
		t.Fatal("Update while cut off succeeded")
	}
	c.Expire()
	if ok, _, err := s1.Exists(ctx, p.PoolMember("web", "h-2")); ok || err != nil {
		t.Fatalf("h-2's record outlived its session: %v", err)
	}
	c.Reconnect()
	testenv.WaitFor(t, memWait, func() bool {
		data, st, err := s1.Get(ctx, p.PoolMember("web", "h-2"))
		if err != nil || st.EphemeralOwner != s2.SessionID() {
			return false
		}
		m, err := DecodePoolMember("", data)
		return err == nil && m.State == "degraded" && m.LastError == "zk away"
	}, "h-2's record re-created with the update made while away")
}

// A router record goes with its session when the process closes it; the
// same process cannot register one id twice, and the id is free again
// once the owner is gone.
func TestRouterRecordGoesWithItsSession(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	s2 := z.Session(t)
	mustCreateCluster(t, ctx, s1, p, `{}`)
	rr, err := RegisterRouter(ctx, s2, p, RouterMember{Version: RouterMemberVersion, ID: "r1", MapVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := RegisterRouter(ctx, s2, p, RouterMember{Version: RouterMemberVersion, ID: "r1"}); !errors.Is(err, zksession.ErrAlreadyHeld) {
		t.Fatalf("registering r1 twice in one process: %v, want ErrAlreadyHeld", err)
	}
	if err := rr.Update(ctx, RouterMember{Version: RouterMemberVersion, ID: "r1", MapVersion: 2}); err != nil {
		t.Fatal(err)
	}
	if rs, err := ListRouters(ctx, s1, p); err != nil || len(rs) != 1 || rs[0].Rec.MapVersion != 2 {
		t.Fatalf("routers: %+v %v", rs, err)
	}
	s2.Close()
	testenv.WaitFor(t, memWait, func() bool {
		rs, err := ListRouters(ctx, s1, p)
		return err == nil && len(rs) == 0
	}, "r1's record gone with its session")
	r2, err := RegisterRouter(ctx, s1, p, RouterMember{Version: RouterMemberVersion, ID: "r1", MapVersion: 3})
	if err != nil {
		t.Fatalf("r1 after its owner left: %v", err)
	}
	defer r2.Remove(ctx)
	if rs, err := ListRouters(ctx, s1, p); err != nil || len(rs) != 1 || rs[0].Rec.MapVersion != 3 {
		t.Fatalf("routers: %+v %v", rs, err)
	}
}

// WatchPoolConfig, on another session, delivers the config's creation,
// each update with its version, and its deletion.
func TestWatchPoolConfigFollowsChanges(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	clusterNode(t, ctx, s1, p)
	s2 := z.Session(t)
	w := WatchPoolConfig(ctx, s2, p, "web")
	defer w.Stop()
	awaitNode(t, w, "no config yet", func(n zksession.Node) bool { return !n.Exists })
	workersAt := func(workers int, version int32) func(zksession.Node) bool {
		return func(n zksession.Node) bool {
			c, err := DecodePoolConfig("", n.Data)
			return n.Exists && err == nil && c.Workers == workers && n.Stat.Version == version
		}
	}
	if _, _, err := SetPoolConfig(ctx, s1, p, "web", poolCfg(2), -1); err != nil {
		t.Fatal(err)
	}
	awaitNode(t, w, "the created config", workersAt(2, 0))
	if _, _, err := SetPoolConfig(ctx, s1, p, "web", poolCfg(4), 0); err != nil {
		t.Fatal(err)
	}
	awaitNode(t, w, "the updated config", workersAt(4, 1))
	if err := s1.DeleteAll(ctx, p.Pool("web")); err != nil {
		t.Fatal(err)
	}
	awaitNode(t, w, "the deleted config", func(n zksession.Node) bool { return !n.Exists })
}

// WatchMap delivers another process's map writes with their versions and
// the map's deletion; a writer holding an older version loses.
func TestWatchMapFollowsWrites(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	s2 := z.Session(t)
	mustCreateCluster(t, ctx, s1, p, `{"v":1}`)
	w := WatchMap(ctx, s2, p)
	defer w.Stop()
	awaitNode(t, w, "the first map", func(n zksession.Node) bool { return n.Exists && string(n.Data) == `{"v":1}` })
	_, v0, err := ReadMapData(ctx, s2, p)
	if err != nil {
		t.Fatal(err)
	}
	v1, _, err := WriteMapData(ctx, s1, p, []byte(`{"v":2}`), v0)
	if err != nil {
		t.Fatal(err)
	}
	awaitNode(t, w, "the second map", func(n zksession.Node) bool {
		return n.Exists && string(n.Data) == `{"v":2}` && n.Stat.Version == v1
	})
	if _, _, err := WriteMapData(ctx, s2, p, []byte(`{"v":"stale"}`), v0); !errors.Is(err, ErrMapChanged) {
		t.Fatalf("write on version %d after %d: %v, want ErrMapChanged", v0, v1, err)
	}
	if err := DeleteCluster(ctx, s1, p); err != nil {
		t.Fatal(err)
	}
	awaitNode(t, w, "the map deleted", func(n zksession.Node) bool { return !n.Exists })
}

// The rebalance record: none before any pause, round-trips every field,
// last writer wins, watched on another session; a malformed one fails.
func TestRebalanceRecord(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	s2 := z.Session(t)
	mustCreateCluster(t, ctx, s1, p, `{}`)
	if r, err := ReadRebalance(ctx, s1, p); r != nil || err != nil {
		t.Fatalf("before any pause: %+v %v", r, err)
	}
	w := WatchRebalance(ctx, s2, p)
	defer w.Stop()
	awaitNode(t, w, "no record yet", func(n zksession.Node) bool { return !n.Exists })
	at := time.Date(2026, 3, 4, 5, 6, 7, 8, time.UTC)
	pause := RebalanceRecord{Version: RebalanceVersion, Paused: true, Reason: "verify failed", Move: "m7", At: at}
	if err := WriteRebalance(ctx, s1, p, pause); err != nil {
		t.Fatal(err)
	}
	if r, err := ReadRebalance(ctx, s2, p); err != nil || r.Paused != true || r.Reason != pause.Reason || r.Move != "m7" || !r.At.Equal(at) {
		t.Fatalf("read back: %+v %v, want %+v", r, err, pause)
	}
	awaitNode(t, w, "the pause", func(n zksession.Node) bool {
		r, err := DecodeRebalance("", n.Data)
		return n.Exists && err == nil && r.Paused && r.Move == "m7"
	})
	if err := WriteRebalance(ctx, s2, p, RebalanceRecord{Version: RebalanceVersion, At: at}); err != nil {
		t.Fatal(err)
	}
	if r, err := ReadRebalance(ctx, s1, p); err != nil || r.Paused || r.Move != "" {
		t.Fatalf("after resume: %+v %v", r, err)
	}
	awaitNode(t, w, "the resume", func(n zksession.Node) bool {
		r, err := DecodeRebalance("", n.Data)
		return n.Exists && err == nil && !r.Paused && n.Stat.Version == 1
	})
	if _, err := s1.Set(ctx, p.Rebalance(), []byte(`{"version":1,"paused":"yes"}`), -1); err != nil {
		t.Fatal(err)
	}
	var re *RecordError
	if _, err := ReadRebalance(ctx, s1, p); !errors.Is(err, ErrMalformed) || !errors.As(err, &re) || re.Path != p.Rebalance() {
		t.Fatalf("malformed record: %v", err)
	}
}

// CreateMove creates the moves directory if needed, writes the record
// compact and whole, and refuses an id that exists (keeping the first).
func TestCreateMoveRefusesDuplicate(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	s2 := z.Session(t)
	mustCreateCluster(t, ctx, s1, p, `{}`)
	if err := s1.Delete(ctx, p.Moves(), -1); err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	rec := &MoveRecord{Version: MoveVersion, ID: "m1", Bucket: 7, Level: 3, Lo: -5, Hi: 99, Source: "pg-a", Target: "pg-b",
		State: MovePrepare, Tables: []TableRecord{{Name: "app.t", KeyColumn: "k"}}, StartVersion: 12, CreatedAt: created}
	if err := CreateMove(ctx, s1, p, rec); err != nil {
		t.Fatal(err)
	}
	data, v, err := ReadMoveData(ctx, s2, p, "m1")
	if err != nil || v != 0 || strings.Contains(string(data), "\n") || !strings.HasPrefix(string(data), `{"version":1,"id":"m1",`) {
		t.Fatalf("stored record: %q version %d %v, want compact JSON", data, v, err)
	}
	dup := *rec
	dup.State = MoveCopy
	dup.Target = "pg-c"
	if err := CreateMove(ctx, s2, p, &dup); !errors.Is(err, zksession.ErrNodeExists) {
		t.Fatalf("duplicate id: %v, want ErrNodeExists", err)
	}
	got, v, err := ReadMove(ctx, s2, p, "m1")
	if err != nil || v != 0 || got.State != MovePrepare || got.Target != "pg-b" || got.Bucket != 7 || got.Level != 3 ||
		got.Lo != -5 || got.Hi != 99 || got.StartVersion != 12 || !got.CreatedAt.Equal(created) || len(got.Tables) != 1 || got.Tables[0] != rec.Tables[0] {
		t.Fatalf("record after the refused duplicate: %+v version %d %v", got, v, err)
	}
	if _, _, err := ReadMove(ctx, s1, p, "m2"); !errors.Is(err, zksession.ErrNoNode) {
		t.Fatalf("missing move: %v, want ErrNoNode", err)
	}
}

// UpdateMove is a compare-and-swap: of two runners holding the same
// version the second loses with ErrBadVersion and writes nothing.
func TestUpdateMoveCASBetweenRunners(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	s2 := z.Session(t)
	mustCreateCluster(t, ctx, s1, p, `{}`)
	if err := CreateMove(ctx, s1, p, &MoveRecord{Version: MoveVersion, ID: "m1", State: MovePrepare}); err != nil {
		t.Fatal(err)
	}
	r1, v1, err1 := ReadMove(ctx, s1, p, "m1")
	r2, v2, err2 := ReadMove(ctx, s2, p, "m1")
	if err1 != nil || err2 != nil || v1 != v2 {
		t.Fatalf("reads: %v %v, versions %d %d", err1, err2, v1, v2)
	}
	r1.State = MoveCopy
	nv, err := UpdateMove(ctx, s1, p, r1, v1)
	if err != nil || nv != v1+1 {
		t.Fatalf("first update: version %d %v", nv, err)
	}
	r2.State = MoveAborting
	if _, err := UpdateMove(ctx, s2, p, r2, v2); !errors.Is(err, zksession.ErrBadVersion) {
		t.Fatalf("stale update: %v, want ErrBadVersion", err)
	}
	if got, v, err := ReadMove(ctx, s2, p, "m1"); err != nil || got.State != MoveCopy || v != nv {
		t.Fatalf("after the lost update: %+v version %d %v", got, v, err)
	}
	r1.State = MoveCatchup
	if v, err := UpdateMove(ctx, s1, p, r1, nv); err != nil || v != nv+1 {
		t.Fatalf("update with the returned version: %d %v", v, err)
	}
	if _, err := UpdateMove(ctx, s1, p, &MoveRecord{Version: MoveVersion, ID: "nope"}, 0); !errors.Is(err, zksession.ErrNoNode) {
		t.Fatalf("update of a missing move: %v, want ErrNoNode", err)
	}
}

// ListMoves: nothing without a moves directory, then every move's id and
// nothing else (not a runner lock below a move).
func TestListMovesListsEveryMove(t *testing.T) {
	ctx, _, s, p := zkCluster(t)
	clusterNode(t, ctx, s, p)
	if ids, err := ListMoves(ctx, s, p); ids != nil || err != nil {
		t.Fatalf("without a moves directory: %v %v", ids, err)
	}
	for _, id := range []string{"m3", "m1", "m2"} {
		if err := CreateMove(ctx, s, p, &MoveRecord{Version: MoveVersion, ID: id, State: MovePrepare}); err != nil {
			t.Fatal(err)
		}
	}
	l, err := LockMoveRunner(ctx, s, p, "m1", "host-1")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	ids, err := ListMoves(ctx, s, p)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids) // the server's order: ZooKeeper does not sort
	if strings.Join(ids, ",") != "m1,m2,m3" {
		t.Fatalf("moves: %v, want m1, m2, m3", ids)
	}
}

// A flip (map + move record in one Multi) whose map version is stale
// fails with ErrMapChanged and writes neither record; with the fresh
// version it writes both.
func TestUpdateMoveOpAllOrNoneOnStaleMap(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	s2 := z.Session(t)
	mustCreateCluster(t, ctx, s1, p, `{"v":1}`)
	op, mv := flipOp(t, ctx, s1, p, MoveBarrier)
	_, v0, _ := ReadMapData(ctx, s1, p)
	v1, _, err := WriteMapData(ctx, s2, p, []byte(`{"v":"other"}`), v0) // another writer
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := WriteMapData(ctx, s1, p, []byte(`{"v":2}`), v0, op); !errors.Is(err, ErrMapChanged) {
		t.Fatalf("flip on a stale map: %v, want ErrMapChanged", err)
	}
	if got, v, err := ReadMove(ctx, s2, p, "m1"); err != nil || got.State != MoveBarrier || v != mv {
		t.Fatalf("the move record was written by a failed flip: %+v version %d %v", got, v, err)
	}
	if data, v, _ := ReadMapData(ctx, s2, p); string(data) != `{"v":"other"}` || v != v1 {
		t.Fatalf("map after the failed flip: %q version %d", data, v)
	}
	nv, stats, err := WriteMapData(ctx, s1, p, []byte(`{"v":2}`), v1, op)
	if err != nil || nv != v1+1 || len(stats) != 1 || stats[0].Version != mv+1 {
		t.Fatalf("flip on the fresh map: %d %+v %v", nv, stats, err)
	}
	if got, _, err := ReadMove(ctx, s2, p, "m1"); err != nil || got.State != MoveFlip {
		t.Fatalf("move after the flip: %+v %v", got, err)
	}
}

// The GC lock is exclusive, names its holder to the refused, is lost when
// its session expires and is not taken back by the new session; a
// release of the lost lock leaves the next holder's node alone.
func TestLockGCExclusiveAndLostOnExpiry(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	s2 := z.Session(t)
	mustCreateCluster(t, ctx, s1, p, `{}`)
	l1, err := LockGC(ctx, s1, p, []byte("gc-1"))
	if err != nil {
		t.Fatal(err)
	}
	var le *zksession.LockedError
	if _, err := LockGC(ctx, s2, p, []byte("gc-2")); !errors.As(err, &le) || string(le.Holder) != "gc-1" || le.Path != p.GCLock() {
		t.Fatalf("second GC: %v, want a LockedError naming gc-1 at %s", err, p.GCLock())
	}
	expireSession(t, z, s1)
	testenv.Receive(t, l1.Done(), memWait, "the GC lock not reported lost after its session expired")
	l2, err := LockGC(ctx, s2, p, []byte("gc-2"))
	if err != nil {
		t.Fatalf("GC lock after the holder expired: %v", err)
	}
	defer l2.Release(ctx)
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	data, st, err := s1.Get(ctx, p.GCLock())
	if err != nil || string(data) != "gc-2" || st.EphemeralOwner != s2.SessionID() {
		t.Fatalf("lock node after the old holder's release: %q owner 0x%x %v", data, st.EphemeralOwner, err)
	}
	select {
	case <-l2.Done():
		t.Fatal("the new holder lost the lock")
	default:
	}
	if _, err := LockGC(ctx, s1, p, []byte("gc-1")); !errors.As(err, &le) || string(le.Holder) != "gc-2" {
		t.Fatalf("old holder's new session: %v, want a LockedError naming gc-2", err)
	}
}

// LockRebalance waits, telling onWait who holds it, and takes over when
// the holder releases; a waiter whose context ends gives up.
func TestLockRebalanceWaitsThenTakesOver(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	s2, s3 := z.Session(t), z.Session(t)
	mustCreateCluster(t, ctx, s1, p, `{}`)
	l1, err := LockRebalance(ctx, s1, p, []byte("rb-1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	waits := make(chan string, 16)
	type result struct {
		l   *zksession.Lock
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := LockRebalance(ctx, s2, p, []byte("rb-2"), func(le *zksession.LockedError) {
			select {
			case waits <- string(le.Holder):
			default:
			}
		})
		got <- result{l, err}
	}()
	if h := testenv.Receive(t, waits, memWait, "no onWait call"); h != "rb-1" {
		t.Fatalf("onWait named %q, want rb-1", h)
	}
	ctx3, cancel3 := context.WithCancel(ctx)
	gave := make(chan error, 1)
	go func() {
		_, err := LockRebalance(ctx3, s3, p, []byte("rb-3"), func(*zksession.LockedError) { cancel3() })
		gave <- err
	}()
	if err := testenv.Receive(t, gave, memWait, "the cancelled waiter did not give up"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v, want context.Canceled", err)
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := testenv.Receive(t, got, memWait, "the waiter did not take the lock after the release")
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.l.Release(ctx)
	if data, st, err := s1.Get(ctx, p.RebalanceLock()); err != nil || string(data) != "rb-2" || st.EphemeralOwner != s2.SessionID() {
		t.Fatalf("rebalance lock: %q owner 0x%x %v", data, st.EphemeralOwner, err)
	}
}

// WatchMoveRunner sees the runner lock appear with its holder, vanish
// when the holder's session expires (Done closed, the move record kept),
// and the next runner take it.
func TestMoveRunnerLostOnExpiryAndRetaken(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	s2 := z.Session(t)
	mustCreateCluster(t, ctx, s1, p, `{}`)
	if err := CreateMove(ctx, s1, p, &MoveRecord{Version: MoveVersion, ID: "m1", State: MoveCopy}); err != nil {
		t.Fatal(err)
	}
	w := WatchMoveRunner(ctx, s2, p, "m1")
	defer w.Stop()
	awaitNode(t, w, "no runner yet", func(n zksession.Node) bool { return !n.Exists })
	l1, err := LockMoveRunner(ctx, s1, p, "m1", "host-1")
	if err != nil {
		t.Fatal(err)
	}
	awaitNode(t, w, "host-1 running m1", func(n zksession.Node) bool { return n.Exists && string(n.Data) == "host-1" })
	expireSession(t, z, s1)
	awaitNode(t, w, "the runner lock gone with host-1's session", func(n zksession.Node) bool { return !n.Exists })
	testenv.Receive(t, l1.Done(), memWait, "host-1 not told it lost m1")
	if got, _, err := ReadMove(ctx, s2, p, "m1"); err != nil || got.State != MoveCopy {
		t.Fatalf("move record after the runner's expiry: %+v %v", got, err)
	}
	l2, err := LockMoveRunner(ctx, s2, p, "m1", "host-2")
	if err != nil {
		t.Fatalf("taking m1 over: %v", err)
	}
	defer l2.Release(ctx)
	awaitNode(t, w, "host-2 running m1", func(n zksession.Node) bool {
		return n.Exists && string(n.Data) == "host-2" && n.Stat.EphemeralOwner == s2.SessionID()
	})
}

// DeleteCluster removes every record of one cluster (its GC lock is lost
// with it) and nothing of another; the name can then be created again.
func TestDeleteClusterRemovesEverything(t *testing.T) {
	ctx, z, s, p := zkCluster(t)
	p2 := MustPaths(z.Root, "c2")
	mustCreateCluster(t, ctx, s, p, `{"c":1}`)
	mustCreateCluster(t, ctx, s, p2, `{"c":2}`)
	if _, _, err := SetPoolConfig(ctx, s, p, "web", poolCfg(1), -1); err != nil {
		t.Fatal(err)
	}
	if err := CreateMove(ctx, s, p, &MoveRecord{Version: MoveVersion, ID: "m1", State: MoveCopy}); err != nil {
		t.Fatal(err)
	}
	if err := WriteRebalance(ctx, s, p, RebalanceRecord{Version: RebalanceVersion, Paused: true}); err != nil {
		t.Fatal(err)
	}
	gc, err := LockGC(ctx, s, p, []byte("gc-1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := DeleteCluster(ctx, s, p); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadCluster(ctx, s, p); !errors.Is(err, ErrNoCluster) {
		t.Fatalf("cluster record: %v, want ErrNoCluster", err)
	}
	if _, _, err := ReadMapData(ctx, s, p); !errors.Is(err, ErrNoCluster) {
		t.Fatalf("map: %v, want ErrNoCluster", err)
	}
	if pools, err := ListPools(ctx, s, p); pools != nil || err != nil {
		t.Fatalf("pools: %v %v", pools, err)
	}
	if ids, err := ListMoves(ctx, s, p); ids != nil || err != nil {
		t.Fatalf("moves: %v %v", ids, err)
	}
	if r, err := ReadRebalance(ctx, s, p); r != nil || err != nil {
		t.Fatalf("rebalance: %+v %v", r, err)
	}
	testenv.Receive(t, gc.Done(), memWait, "the GC lock not lost with its cluster")
	if r, err := ReadCluster(ctx, s, p2); err != nil || r.Name != "c2" {
		t.Fatalf("the other cluster: %+v %v", r, err)
	}
	if data, _, err := ReadMapData(ctx, s, p2); err != nil || string(data) != `{"c":2}` {
		t.Fatalf("the other cluster's map: %q %v", data, err)
	}
	mustCreateCluster(t, ctx, s, p, `{"c":3}`)
	if data, v, err := ReadMapData(ctx, s, p); err != nil || string(data) != `{"c":3}` || v != 0 {
		t.Fatalf("re-created cluster's map: %q version %d %v", data, v, err)
	}
}

// Two processes creating the same cluster at once: exactly one wins, the
// other gets ErrClusterExists, and the map is the winner's.
func TestCreateClusterRaceOneWins(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	s2 := z.Session(t)
	errs := make(chan error, 2)
	start := make(chan struct{})
	for i, s := range []*zksession.Session{s1, s2} {
		go func() {
			<-start
			errs <- CreateCluster(ctx, s, p, testCluster("c1"), []byte{'0' + byte(i)}, nil)
		}()
	}
	close(start)
	var won, lost int
	for range 2 {
		err := testenv.Receive(t, errs, memWait, "CreateCluster did not return")
		switch {
		case err == nil:
			won++
		case errors.Is(err, ErrClusterExists):
			lost++
		default:
			t.Fatalf("create: %v", err)
		}
	}
	if won != 1 || lost != 1 {
		t.Fatalf("%d created, %d refused; want one each", won, lost)
	}
	data, v, err := ReadMapData(ctx, s2, p)
	if err != nil || v != 0 || (string(data) != "0" && string(data) != "1") {
		t.Fatalf("map: %q version %d %v", data, v, err)
	}
	if r, err := ReadCluster(ctx, s1, p); err != nil || r.Name != "c1" {
		t.Fatalf("cluster: %+v %v", r, err)
	}
}

// Sync succeeds with or without the cluster and fails on a closed
// session; what another session wrote is read after it.
func TestSyncOnMemory(t *testing.T) {
	ctx, z, s1, p := zkCluster(t)
	s2 := z.Session(t)
	if err := Sync(ctx, s2, p); err != nil {
		t.Fatalf("sync without a cluster: %v", err)
	}
	mustCreateCluster(t, ctx, s1, p, `{"v":1}`)
	if err := Sync(ctx, s2, p); err != nil {
		t.Fatal(err)
	}
	if data, _, err := ReadMapData(ctx, s2, p); err != nil || string(data) != `{"v":1}` {
		t.Fatalf("map after sync: %q %v", data, err)
	}
	s3 := z.Session(t)
	s3.Close()
	if err := Sync(ctx, s3, p); err == nil {
		t.Fatal("sync on a closed session succeeded")
	}
}

// The moves' schema gate: a move enters its data state only while no
// schema change holds the lock and none began since the move read the
// epoch; a refusal writes nothing.
func TestEnterMoveDataGate(t *testing.T) {
	z, s := zktest.NewMemoryTree(t)
	ctx := context.Background()
	p := MustPaths(z.Root, "g")
	rec := &MoveRecord{Version: 1, ID: "m1", State: MovePrepare}
	if err := CreateMove(ctx, s, p, rec); err != nil {
		t.Fatal(err)
	}
	epoch, err := ReadSchemaEpoch(ctx, s, p)
	if err != nil {
		t.Fatal(err)
	}
	// A change began (and may have ended partial) after the read.
	if err := BumpSchemaEpoch(ctx, s, p); err != nil {
		t.Fatal(err)
	}
	rec.State = MoveCopy
	if _, err := EnterMoveData(ctx, s, p, rec, 0, epoch); !errors.Is(err, ErrSchemaChanging) {
		t.Fatalf("stale epoch: %v", err)
	}
	// A change running now.
	if epoch, err = ReadSchemaEpoch(ctx, s, p); err != nil {
		t.Fatal(err)
	}
	other := z.Session(t)
	lock, err := LockSchema(ctx, other, p, []byte("someone"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := EnterMoveData(ctx, s, p, rec, 0, epoch); !errors.Is(err, ErrSchemaChanging) {
		t.Fatalf("lock held: %v", err)
	}
	if got, _, _ := ReadMove(ctx, s, p, "m1"); got.State != MovePrepare {
		t.Fatalf("a refused gate wrote the record: %s", got.State)
	}
	if err := lock.Release(ctx); err != nil {
		t.Fatal(err)
	}
	v, err := EnterMoveData(ctx, s, p, rec, 0, epoch)
	if err != nil {
		t.Fatal(err)
	}
	if got, gv, _ := ReadMove(ctx, s, p, "m1"); got.State != MoveCopy || gv != v {
		t.Fatalf("after the gate: %s version %d (returned %d)", got.State, gv, v)
	}
	if _, busy, err := SchemaChanging(ctx, s, p); busy || err != nil {
		t.Fatalf("the gate left the lock node behind: %v %v", busy, err)
	}
}
