package sidecar

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fleet"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/faultproxy"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// fleetScene is a cluster with a fleet in ZooKeeper: this router (r-self,
// current), a router left behind (r-old), pool "web" with a current
// supervisor (sup-a) and a straggler that went through a fail-static
// episode (sup-b), pool "api" with no status and an unreadable member, and
// moves: one copying, one failed, 22 done (one with stragglers) and one
// aborted.
type fleetScene struct {
	st       *bucketmap.Store
	p        topo.Paths
	s        *zksession.Session // the admin session that wrote the records
	r        *router.Router
	rs       *zksession.Session // the router's session
	old, cur uint64             // map version of the stragglers, and the router's
	oldNext  time.Time          // when map version old+1 was written
	supB     *topo.PoolMemberRegistration
	supBRec  topo.PoolMember
	fs       topo.FailStatic
	copying  string // move ids
	failed   string
	window   string // a move in its rollback window
	straggly string // a done move that went on without sup-b
	newest   string // the newest done move
}

// text lets a test put its own strings (an attack) into the records' free
// text fields; name is the field ("host", "last_error", ...).
type textFn func(name, def string) string

func plain(_, def string) string { return def }

// bump writes a new map version (pg1's weight toggles) and returns it.
func bump(t *testing.T, st *bucketmap.Store) *bucketmap.Map {
	t.Helper()
	m, err := st.Update(context.Background(), func(m *bucketmap.Map) error {
		n, _ := m.Node("pg1")
		return m.SetWeight("pg1", 3-n.Weight)
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newFleetScene(t *testing.T, z *testenv.ZK, text textFn) *fleetScene {
	t.Helper()
	ctx := context.Background()
	st := cluster(t, z, clustertest.Nodes(3), 4)
	sc := &fleetScene{st: st, p: st.Paths(), s: st.Session()}
	m0, _, err := st.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sc.old = m0.Version
	// The router starts at the first version and sees the next two.
	sc.rs = session(t, z.ConnectString, 0)
	sc.r = router.New(sc.rs, sc.p, router.Options{MemberID: "r-self", MemberAddr: "127.0.0.1:8484"})
	t.Cleanup(sc.r.Close)
	if err := sc.r.WaitReady(ctxTimeout(t, 15*time.Second)); err != nil {
		t.Fatal(err)
	}
	m1 := bump(t, st)
	sc.oldNext = m1.UpdatedAt
	waitVersion(t, sc.r, m1.Version) // so that the router knows it, not only the next
	sc.cur = bump(t, st).Version
	waitVersion(t, sc.r, sc.cur)
	waitRouterRecord(t, sc.s, sc.p, "r-self", sc.cur) // written after the map is applied

	now := time.Now().UTC()
	if _, err := topo.RegisterRouter(ctx, sc.s, sc.p, topo.RouterMember{Version: topo.RouterMemberVersion, ID: "r-old",
		Host: text("router host", "web7"), PID: 4242, Addr: text("router addr", "127.0.0.1:9999"), MapVersion: sc.old,
		StartedAt: now.Add(-time.Hour).Format(time.RFC3339), AppliedAt: now.Add(-10 * time.Minute).Format(time.RFC3339Nano)}); err != nil {
		t.Fatal(err)
	}

	cfg := &topo.PoolConfig{Version: 1, Command: "app", Workers: 2, Env: map[string]string{"APP_SECRET": "hunter2-do-not-show"},
		MapDelivery: topo.MapDelivery{Mode: topo.MapDeliveryReload}}
	if _, _, err := topo.SetPoolConfig(ctx, sc.s, sc.p, "web", cfg, -1); err != nil {
		t.Fatal(err)
	}
	started := now.Add(-time.Hour)
	ready := func(id int64, v uint64) topo.WorkerInfo {
		return topo.WorkerInfo{ID: id, PID: 1000 + int(id), Generation: 4, State: "ready", StartedAt: started, MapVersion: v}
	}
	supA := topo.PoolMember{Version: topo.PoolMemberVersion, Member: "sup-a", Host: "web1", PID: 101, State: "serving", Accepting: true,
		Generation: 4, ConfigVersion: 0, MapVersion: sc.cur, MapDelivery: topo.MapDeliveryReload, ZK: "connected", Target: 2,
		Workers: []topo.WorkerInfo{ready(1, sc.cur), ready(2, sc.cur)}, StartedAt: started, UpdatedAt: now}
	if _, err := topo.RegisterPoolMember(ctx, sc.s, sc.p, "web", supA); err != nil {
		t.Fatal(err)
	}
	sc.fs = topo.FailStatic{Since: now.Add(-20 * time.Minute).Truncate(time.Second), Until: now.Add(-17 * time.Minute).Truncate(time.Second), Peers: 2}
	sc.supBRec = topo.PoolMember{Version: topo.PoolMemberVersion, Member: "sup-b", Host: text("host", "web2"), PID: 102, State: "degraded", Accepting: true,
		Generation: 4, ConfigVersion: 0, MapVersion: sc.old, MapDelivery: topo.MapDeliveryReload, ZK: "suspended", FailStatic: &sc.fs, Target: 2,
		Workers:   []topo.WorkerInfo{ready(3, sc.old), {ID: 4, PID: 1004, Generation: 4, State: "starting", StartedAt: now}},
		LastError: text("last_error", "worker 3 did not acknowledge map version"), StartedAt: started, UpdatedAt: now.Add(-time.Minute)}
	if sc.supB, err = topo.RegisterPoolMember(ctx, sc.s, sc.p, "web", sc.supBRec); err != nil {
		t.Fatal(err)
	}
	if err := topo.WritePoolStatus(ctx, sc.s, sc.p, "web", topo.PoolStatus{Version: topo.PoolStatusVersion, Member: "sup-a", Result: topo.SwapFailed,
		Generation: 4, ConfigVersion: 0, MapVersion: sc.cur, Error: text("swap error", "2 new workers not ready within 60s"), SwapSeconds: 61.5, At: now.Add(-5 * time.Minute)}); err != nil {
		t.Fatal(err)
	}

	// Pool api: a config, no swap yet, and a member whose record is not
	// a member record.
	if _, _, err := topo.SetPoolConfig(ctx, sc.s, sc.p, "api", &topo.PoolConfig{Version: 1, Command: "api", Workers: 1}, -1); err != nil {
		t.Fatal(err)
	}
	if err := sc.s.Create(ctx, sc.p.PoolMember("api", "sup-x"), []byte(`{"version":1,"member":"sup-x","bogus":true}`)); err != nil {
		t.Fatal(err)
	}

	move := func(id, state string, created time.Time, mut func(*topo.MoveRecord)) string {
		rec := &topo.MoveRecord{Version: topo.MoveVersion, ID: id, Bucket: 3, Level: 4, Source: "pg1", Target: "pg3", State: state,
			StartVersion: sc.old, CreatedAt: created, UpdatedAt: created.Add(30 * time.Second),
			Steps: []topo.MoveStep{{State: topo.MovePrepare, At: created}, {State: state, At: created.Add(2 * time.Second)}}}
		if mut != nil {
			mut(rec)
		}
		if err := topo.CreateMove(ctx, sc.s, sc.p, rec); err != nil {
			t.Fatal(err)
		}
		return id
	}
	base := now.Add(-3 * time.Hour)
	for i := range 22 {
		id := move(fmt.Sprintf("b%d-l4-v1-done%02d", i, i), topo.MoveDone, base.Add(time.Duration(i)*time.Minute), func(r *topo.MoveRecord) {
			r.Bucket = uint32(i % 16)
			r.Stats = topo.MoveStats{RowsCopied: 100, PauseMS: 10 + float64(i), MemberWaitMS: 3}
			r.Verify = &topo.MoveCheck{OK: true}
			if i == 20 {
				r.Stats.MemberWaitMS = 2000
				r.Stragglers = []topo.Straggler{{Member: text("straggler member", sc.p.PoolMember("web", "sup-b")), MapVersion: sc.old},
					{Member: sc.p.PoolMember("api", "sup-x"), Error: text("straggler error", "pool member record does not decode")}}
			}
		})
		switch i {
		case 20:
			sc.straggly = id
		case 21:
			sc.newest = id
		}
	}
	move("b9-l4-v1-aborted", topo.MoveAborted, base.Add(-time.Hour), nil) // finished long ago: not among the newest 20
	sc.window = move("b7-l4-v3-window", topo.MoveReversible, now.Add(-90*time.Second), func(r *topo.MoveRecord) {
		r.Bucket = 7
		r.Verify = &topo.MoveCheck{OK: true}
		until := now.Add(10 * time.Minute)
		r.Reverse = &topo.ReverseStream{Publication: "p", Slot: "s", Subscription: "s", StartLSN: "0/1", Enabled: true, WindowS: 900, Until: &until}
	})
	lag := int64(4096)
	if err := topo.WriteReverseState(ctx, sc.s, sc.p, sc.window, topo.ReverseState{State: "running", LagBytes: &lag, At: now.Add(-3 * time.Second), By: "w1"}); err != nil {
		t.Fatal(err)
	}
	sc.copying = move("b3-l4-v3-copying", topo.MoveCopy, now.Add(-time.Minute), func(r *topo.MoveRecord) { r.Stats.RowsCopied = 5000 })
	sc.failed = move("b5-l4-v2-failed", topo.MoveFailed, now.Add(-2*time.Hour), func(r *topo.MoveRecord) {
		r.Bucket, r.Source, r.Target = 5, "pg2", "pg1"
		r.Stats = topo.MoveStats{PauseMS: 42.5, MemberWaitMS: 1500}
		r.Error = text("move error", "verify: table notes differs")
		r.Verify = &topo.MoveCheck{OK: false}
	})
	// The schema history: one change applied on pg1..pg3, one partial
	// (pg2 unreachable), and a drift check.
	for i, c := range []*topo.SchemaChange{
		{ID: "001-init", State: topo.SchemaApplied, Nodes: map[string]*topo.SchemaNodeStatus{"pg1": {State: topo.SchemaApplied}, "pg2": {State: topo.SchemaApplied}, "pg3": {State: topo.SchemaApplied}}},
		{ID: "002-note", State: topo.SchemaPartial, Nodes: map[string]*topo.SchemaNodeStatus{"pg1": {State: topo.SchemaApplied},
			"pg2": {State: topo.SchemaUnreachable, Error: text("schema error", "connection refused")}, "pg3": {State: topo.SchemaApplied}}},
	} {
		c.Version, c.Seq, c.SHA256, c.SQL, c.Mode, c.Statements = 1, i+1, strings.Repeat("ab", 32), "SELECT 1", topo.ModeTransaction, 1
		c.By, c.Source, c.CreatedAt, c.UpdatedAt = text("schema by", "ops@admin"), "x.sql", now.Add(-time.Hour), now
		if err := topo.CreateSchemaChange(ctx, sc.s, sc.p, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := topo.WriteSchemaDrift(ctx, sc.s, sc.p, &topo.SchemaDrift{Version: 1, At: now, By: "ops@admin", Reference: "pg1", Nodes: []string{"pg1", "pg2", "pg3"},
		Count: 2, Blocking: 1, Sample: []string{text("drift sample", "pg1 vs pg2: column body differs")}}); err != nil {
		t.Fatal(err)
	}
	return sc
}

// waitRouterRecord waits until router id's member record says map version
// v (a router writes it after applying the map).
func waitRouterRecord(t *testing.T, s *zksession.Session, p topo.Paths, id string, v uint64) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if err := topo.Sync(ctx, s, p); err != nil {
			t.Fatal(err)
		}
		routers, err := topo.ListRouters(ctx, s, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range routers {
			if e.Name == id && e.Rec != nil && e.Rec.MapVersion == v {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("router %s's member record never said map version %d: %+v", id, v, routers)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// handler is the sidecar of the scene's router, its fleet status read with
// the given TTL (0: the default).
func (sc *fleetScene) handler(ttl time.Duration) http.Handler {
	st := fleet.NewStatus(sc.rs, sc.p, fleet.StatusOptions{TTL: ttl})
	return Handler(sc.r, HandlerOptions{Fleet: st, MemberID: "r-self"})
}

func fleetJSON(t *testing.T, h http.Handler) *fleet.View {
	t.Helper()
	res, body := get(t, h, "/v1/fleet")
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /v1/fleet: %d %s\n%s", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
	var v fleet.View
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decoding %s: %v", body, err)
	}
	return &v
}

func member(t *testing.T, v *fleet.View, kind, name string) fleet.Member {
	t.Helper()
	for _, m := range v.Members {
		if m.Kind == kind && m.Name == name {
			return m
		}
	}
	t.Fatalf("no %s %s in the fleet view: %+v", kind, name, v.Members)
	return fleet.Member{}
}

// The fleet view shows every member against this router's map: the
// stragglers (and since when), the pools with their last swap, the moves
// with their pauses and stragglers, and the members' view of ZooKeeper.
func TestIntegrationFleetView(t *testing.T) {
	z := testenv.StartZK(t)
	sc := newFleetScene(t, z, plain)
	h := sc.handler(0)
	v := fleetJSON(t, h)
	if !v.Available || v.Stale || v.RefreshError != "" || v.Cluster != "c1" {
		t.Fatalf("view not available and fresh: %+v", v)
	}
	if v.Router.ID != "r-self" || v.Router.ZKState != "connected" || v.Router.MapVersion != sc.cur || v.Router.Source != string(router.SourceZooKeeper) {
		t.Fatalf("router: %+v, want r-self connected at map version %d", v.Router, sc.cur)
	}
	if len(v.Members) != 5 {
		t.Fatalf("%d members, want 5 (2 routers, 3 supervisors): %+v", len(v.Members), v.Members)
	}
	if v.Stragglers != 3 {
		t.Fatalf("%d stragglers, want 3 (r-old, sup-b, unreadable sup-x)", v.Stragglers)
	}

	self := member(t, v, fleet.KindRouter, "r-self")
	if !self.Self || self.Straggler || self.MapVersion != sc.cur || self.Addr != "127.0.0.1:8484" || self.UpdatedAt.IsZero() {
		t.Fatalf("this router's own record: %+v", self)
	}
	old := member(t, v, fleet.KindRouter, "r-old")
	if old.Self || !old.Straggler || old.Behind != sc.cur-sc.old || old.Host != "web7" || old.PID != 4242 {
		t.Fatalf("r-old: %+v, want a straggler %d versions behind", old, sc.cur-sc.old)
	}
	// The router saw map old+1 being written: r-old has been behind since.
	if !old.BehindSince.Equal(sc.oldNext) || old.BehindAtLeast {
		t.Fatalf("r-old behind since %s (at least: %v), want exactly %s", old.BehindSince, old.BehindAtLeast, sc.oldNext)
	}

	a := member(t, v, fleet.KindSupervisor, "sup-a")
	if a.Pool != "web" || a.Straggler || a.Behind != 0 || a.State != "serving" || a.ZK != "connected" || a.FailStatic != nil {
		t.Fatalf("sup-a: %+v", a)
	}
	if s := a.Supervisor; s == nil || s.Generation != 4 || s.MapDelivery != "reload" || s.ReadyWorkers != 2 || s.TargetWorkers != 2 || s.WorkersBehind != 0 || !s.Accepting {
		t.Fatalf("sup-a supervisor: %+v", a.Supervisor)
	}
	b := member(t, v, fleet.KindSupervisor, "sup-b")
	if !b.Straggler || b.Behind != sc.cur-sc.old || b.State != "degraded" || b.ZK != "suspended" || !b.BehindSince.Equal(sc.oldNext) {
		t.Fatalf("sup-b: %+v", b)
	}
	if s := b.Supervisor; s == nil || s.ReadyWorkers != 1 || s.TargetWorkers != 2 || s.Workers != 2 || s.WorkersBehind != 1 || s.LastError == "" {
		t.Fatalf("sup-b supervisor: %+v", b.Supervisor)
	}
	if fs := b.FailStatic; fs == nil || !fs.Since.Equal(sc.fs.Since) || !fs.Until.Equal(sc.fs.Until) || fs.Ongoing || fs.Peers != 2 {
		t.Fatalf("sup-b fail-static episode: %+v, want %+v", b.FailStatic, sc.fs)
	}
	x := member(t, v, fleet.KindSupervisor, "sup-x")
	if x.Pool != "api" || !x.Straggler || !strings.Contains(x.Error, "bogus") || x.Supervisor != nil {
		t.Fatalf("unreadable sup-x: %+v", x)
	}

	if len(v.Pools) != 2 || v.Pools[0].Name != "api" || v.Pools[1].Name != "web" {
		t.Fatalf("pools: %+v", v.Pools)
	}
	api, web := v.Pools[0], v.Pools[1]
	if api.LastSwap != nil || api.ConfigVersion == nil || api.MapDelivery != "swap" || api.Supervisors != 1 || api.Stragglers != 1 {
		t.Fatalf("pool api: %+v", api)
	}
	if web.ConfigVersion == nil || *web.ConfigVersion != 0 || web.MapDelivery != "reload" || web.Supervisors != 2 || web.Stragglers != 1 {
		t.Fatalf("pool web: %+v", web)
	}
	if s := web.LastSwap; s == nil || s.Result != "failed" || s.Generation != 4 || s.Member != "sup-a" || s.SwapSeconds != 61.5 || !strings.Contains(s.Error, "not ready") {
		t.Fatalf("pool web last swap: %+v", web.LastSwap)
	}

	mv := v.Moves
	if len(mv.InFlight) != 3 || mv.InFlight[0].ID != sc.failed || mv.InFlight[1].ID != sc.window || mv.InFlight[2].ID != sc.copying {
		t.Fatalf("moves in flight: %+v, want %s, %s, %s (oldest first)", mv.InFlight, sc.failed, sc.window, sc.copying)
	}
	if w := mv.InFlight[1]; w.State != topo.MoveReversible || w.Verify != "ok" || w.Reverse == nil || w.Reverse.State != "running" || w.Reverse.WindowUntil.IsZero() ||
		w.Reverse.LagBytes == nil || *w.Reverse.LagBytes != 4096 {
		t.Fatalf("move in its window: %+v %+v", w, w.Reverse)
	}
	if f := mv.InFlight[0]; f.State != "failed" || f.PauseMS != 42.5 || f.MemberWaitMS != 1500 || f.Verify != "mismatch" || f.Error == "" || f.Source != "pg2" {
		t.Fatalf("failed move: %+v", f)
	}
	if c := mv.InFlight[2]; c.State != "copy" || c.RowsCopied != 5000 || c.StateSince.IsZero() {
		t.Fatalf("copying move: %+v", c)
	}
	if mv.Finished != 23 || len(mv.Recent) != 20 || mv.Recent[0].ID != sc.newest || mv.Recent[1].ID != sc.straggly {
		t.Fatalf("recent moves: %d of %d, first %v", len(mv.Recent), mv.Finished, mv.Recent)
	}
	for _, r := range mv.Recent {
		if r.State != "done" {
			t.Fatalf("recent moves include %s (%s): the aborted one is older than the 20 newest", r.ID, r.State)
		}
	}
	s := mv.Recent[1]
	if s.PauseMS != 30 || s.MemberWaitMS != 2000 || s.Verify != "ok" || len(s.Stragglers) != 2 ||
		s.Stragglers[0].Member != sc.p.PoolMember("web", "sup-b") || s.Stragglers[0].MapVersion != sc.old || s.Stragglers[1].Error == "" {
		t.Fatalf("move with stragglers: %+v", s)
	}

	// Nothing of a pool config but its version and delivery mode shows.
	if _, body := get(t, h, "/v1/fleet"); strings.Contains(body, "hunter2") || strings.Contains(body, "APP_SECRET") {
		t.Fatalf("the fleet view shows the pool config's env: %s", body)
	}

	// sup-b catches up: a refresh (due after the TTL) shows it.
	sc.supBRec.MapVersion = sc.cur
	sc.supBRec.Workers[0].MapVersion = sc.cur
	if err := sc.supB.Update(context.Background(), sc.supBRec); err != nil {
		t.Fatal(err)
	}
	v = fleetJSON(t, sc.handler(-1))
	if b := member(t, v, fleet.KindSupervisor, "sup-b"); b.Straggler || b.Behind != 0 || b.Supervisor.WorkersBehind != 0 || v.Stragglers != 2 {
		t.Fatalf("after sup-b caught up: %+v, %d stragglers", b, v.Stragglers)
	}
}

// Page views share one read of ZooKeeper: many concurrent viewers while
// the snapshot is due cause one refresh, and none while it is fresh. A
// new map makes it due at once.
func TestIntegrationFleetReadsZooKeeperOncePerRefresh(t *testing.T) {
	z := testenv.StartZK(t)
	sc := newFleetScene(t, z, plain)
	c := fleet.NewStatus(sc.rs, sc.p, fleet.StatusOptions{TTL: time.Hour}) // only a new map makes the snapshot due
	h := Handler(sc.r, HandlerOptions{Fleet: c, MemberID: "r-self"})
	view := func(n int) []*fleet.View {
		out := make([]*fleet.View, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() { defer wg.Done(); out[i] = h.(*handler).fleetView(context.Background()) }()
		}
		wg.Wait()
		return out
	}
	before := c.Reads()
	for _, v := range view(30) {
		if !v.Available {
			t.Fatalf("view not available: %s", v.Reason)
		}
	}
	if n := c.Reads() - before; n != 1 {
		t.Fatalf("30 concurrent first views read the fleet %d times, want 1", n)
	}
	taken := fleetJSON(t, h).TakenAt
	view(30)
	if n := c.Reads() - before; n != 1 {
		t.Fatalf("views of a fresh snapshot read the fleet again (%d reads)", n)
	}
	v := bump(t, sc.st)
	waitVersion(t, sc.r, v.Version)
	for _, fv := range view(30) {
		if fv.Router.MapVersion != v.Version || !fv.TakenAt.After(taken) {
			t.Fatalf("after map version %d: view of the router at %d taken %s (before: %s)", v.Version, fv.Router.MapVersion, fv.TakenAt, taken)
		}
		if a := member(t, fv, fleet.KindSupervisor, "sup-a"); a.Behind != 1 {
			t.Fatalf("sup-a after a new map: %+v", a)
		}
	}
	if n := c.Reads() - before; n != 2 {
		t.Fatalf("a new map and 30 concurrent views: %d reads in all, want 2", n)
	}
}

// While this router's session is away the view is the last one read,
// marked stale with its age, and ZooKeeper is not asked; once it is back
// the view is fresh again.
func TestIntegrationFleetStaleOnZooKeeperLoss(t *testing.T) {
	skipUnderRace(t)
	z := testenv.StartZK(t)
	sc := newFleetScene(t, z, plain)
	proxy, err := faultproxy.New(z.Servers[0])
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	rs := session(t, proxy.Addr(), 4*time.Second)
	r := router.New(rs, sc.p, router.Options{MemberID: "r-proxied"})
	defer r.Close()
	if err := r.WaitReady(ctxTimeout(t, 15*time.Second)); err != nil {
		t.Fatal(err)
	}
	st := fleet.NewStatus(rs, sc.p, fleet.StatusOptions{})
	h := Handler(r, HandlerOptions{Fleet: st, MemberID: "r-proxied"})
	v := fleetJSON(t, h)
	if !v.Available || v.Stale || len(v.Members) != 5 && len(v.Members) != 6 {
		t.Fatalf("before the partition: %+v", v)
	}
	taken := v.TakenAt

	proxy.SetMode(faultproxy.Blackhole)
	deadline := time.Now().Add(20 * time.Second)
	for r.ZKState() == zksession.StateConnected {
		if time.Now().After(deadline) {
			t.Fatal("the session never left connected")
		}
		time.Sleep(20 * time.Millisecond)
	}
	reads := st.Reads()
	time.Sleep(fleet.DefaultTTL + 100*time.Millisecond) // the snapshot is due now, but cannot be read
	v = fleetJSON(t, h)
	if !v.Available || !v.Stale || !v.TakenAt.Equal(taken) || v.AgeSeconds < fleet.DefaultTTL.Seconds() || v.Router.ZKState == "connected" {
		t.Fatalf("while away: %+v, want the view taken at %s, stale", v, taken)
	}
	if member(t, v, fleet.KindRouter, "r-old").Behind == 0 {
		t.Fatal("the last view lost its stragglers")
	}
	if n := st.Reads(); n != reads {
		t.Fatalf("the fleet was read %d times while the session was away", n-reads)
	}
	if bin := chromiumOrSkip(t); bin != "" {
		srv := newServer(t, h)
		dom := headless(t, bin, srv+"/", "--dump-dom")
		// (suspended, or lost by now)
		want := ": map may be stale; showing the last fleet view from " + taken.Format(time.RFC3339Nano)
		if !regexp.MustCompile(`<div id="fleet-banner" class="banner">ZooKeeper session (suspended|lost)`+regexp.QuoteMeta(want)).MatchString(dom) ||
			!strings.Contains(dom, `data-member="router/r-old" class="straggler"`) {
			t.Fatalf("the page while away lacks the banner %q or the last view:\n%s", want, dom)
		}
	}

	proxy.SetMode(faultproxy.Pass)
	deadline = time.Now().Add(30 * time.Second)
	for {
		v = fleetJSON(t, h)
		if !v.Stale && v.TakenAt.After(taken) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the view stayed stale after healing: %+v", v)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A router from a map file has no ZooKeeper, so no fleet to show.
func TestFleetFromMapFile(t *testing.T) {
	m, _ := bucketmap.New(4, clustertest.Nodes(2), t0)
	h := Handler(fileRouter(t, m), HandlerOptions{})
	v := fleetJSON(t, h)
	if v.Available || v.Reason != "no fleet view: router runs from a map file" || v.Router.Source != string(router.SourceFile) || v.Router.MapVersion != m.Version || len(v.Members) != 0 {
		t.Fatalf("file router's fleet view: %+v", v)
	}
	if res, _ := post(t, h, "/v1/fleet", "{}"); res.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST /v1/fleet: %d", res.StatusCode)
	}
}

// The status page's policy lets its one inline script run (by hash) and
// nothing else: an inline handler smuggled in by a record is refused even
// if it ever became markup.
func TestStatusPageContentSecurityPolicy(t *testing.T) {
	m, _ := bucketmap.New(4, clustertest.Nodes(2), t0)
	res, page := get(t, Handler(fileRouter(t, m), HandlerOptions{}), "/")
	csp := res.Header.Get("Content-Security-Policy")
	if n := strings.Count(page, "<script"); n != 1 {
		t.Fatalf("%d script elements in the page; the policy allows exactly one", n)
	}
	script := page[strings.Index(page, "<script>")+len("<script>") : strings.Index(page, "</script>")]
	sum := sha256.Sum256([]byte(script))
	for _, want := range []string{"default-src 'none'", "script-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "';", "connect-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Fatalf("Content-Security-Policy %q lacks %q", csp, want)
		}
	}
	for _, d := range strings.Split(csp, ";") {
		if d = strings.TrimSpace(d); strings.HasPrefix(d, "script-src") && strings.Contains(d, "unsafe") {
			t.Fatalf("Content-Security-Policy %q lets any inline script run", csp)
		}
	}
}
