package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/faultproxy"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/testkit"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
	"github.com/shardvisor/shardvisor/zksession/memzk"
)

func session(t *testing.T, connect string, timeout time.Duration) *zksession.Session {
	return zktest.Session(t, zksession.Config{Connect: connect, SessionTimeout: timeout, OpTimeout: 2 * time.Second})
}

// zkEnv is where a test's records live: an in-memory ZooKeeper for the
// routing logic (memEnv), the real ensemble for what only it does
// (realEnv: the wire, partitions through a proxy, Dial).
type zkEnv struct {
	Root string
	open func(t *testing.T, timeout time.Duration) *zksession.Session
	srv  *memzk.Server // memEnv only
}

func memEnv(t *testing.T) *zkEnv {
	t.Helper()
	srv := memzk.New()
	e := &zkEnv{Root: "/shardvisor-test", srv: srv, open: func(t *testing.T, timeout time.Duration) *zksession.Session {
		return zktest.MemorySession(t, srv, zksession.Config{SessionTimeout: timeout, OpTimeout: 2 * time.Second})
	}}
	if err := e.open(t, 0).CreateAll(context.Background(), e.Root); err != nil {
		t.Fatal(err)
	}
	return e
}

func realEnv(t *testing.T) (*zkEnv, *testenv.ZK) {
	t.Helper()
	z := testenv.StartZK(t)
	return &zkEnv{Root: z.Root, open: func(t *testing.T, timeout time.Duration) *zksession.Session {
		return session(t, z.ConnectString, timeout)
	}}, z
}

// cluster creates a cluster in the test's ZooKeeper root and returns an
// admin store for it.
func cluster(t *testing.T, z *zkEnv, nodes []bucketmap.Node, level int) *bucketmap.Store {
	return clustertest.Create(t, z.open(t, 0), z.Root, nodes, level)
}

func waitVersion(t *testing.T, r *Router, v uint64) {
	t.Helper()
	testenv.WaitFor(t, 15*time.Second, func() bool { m := r.Map(); return m != nil && m.Version >= v }, fmt.Sprintf("the router to apply map version %d", v))
}

func TestFollowsMapAndRegisters(t *testing.T) {
	z := memEnv(t)
	st := cluster(t, z, clustertest.Nodes(3), 4)
	ctx := context.Background()
	s := z.open(t, 0)
	r := New(s, st.Paths(), Options{MemberID: "r1", MemberAddr: "127.0.0.1:9"})
	defer r.Close()
	if err := r.WaitReady(ctxTimeout(t, 15*time.Second)); err != nil {
		t.Fatal(err)
	}
	uid := "someone"
	before, _ := r.Route(uid)
	to := bucketmap.NodeID("pg1")
	if before.Node == to {
		to = "pg2"
	}
	start := time.Now()
	m, err := st.Update(ctx, func(m *bucketmap.Map) error {
		return m.Assign(bucketmap.Bucket{Prefix: before.Bucket, Depth: before.Level}, to, bucketmap.AssignOptions{})
	})
	if err != nil {
		t.Fatal(err)
	}
	waitVersion(t, r, m.Version)
	t.Logf("map version %d reached the router in %s", m.Version, time.Since(start).Round(time.Millisecond))
	after, _ := r.Route(uid)
	if after.Node != to || after.MapVersion != m.Version {
		t.Fatalf("after the change: %+v, want %s at v%d", after, to, m.Version)
	}
	if rt, _ := r.RouteAt(uid, before.MapVersion); !rt.Moved || rt.MovedFrom != before.Node {
		t.Fatalf("stale-map protocol: %+v", rt)
	}
	// The member record follows the applied version.
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.Sync(ctx, st.Paths().Router("r1"))
		data, _, err := s.Get(ctx, st.Paths().Router("r1"))
		if err == nil {
			rec, err := topo.DecodeRouterMember("", data)
			if err != nil {
				t.Fatal(err)
			}
			if rec.MapVersion == m.Version && rec.Addr == "127.0.0.1:9" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("member record never showed map version %d: %s %v", m.Version, data, err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A malformed map written by hand is refused; the last good one stays.
	if _, err := st.Session().Set(ctx, st.Paths().Map(), []byte(`{"version":1,"map_version":99}`), zksession.AnyVersion); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, func() bool { return r.Stats().MapRejected.Load() > 0 }, "the malformed map to be reported")
	if rt, _ := r.Route(uid); rt.MapVersion != m.Version || rt.Node != to {
		t.Fatalf("after a malformed map: %+v", rt)
	}
	if e := r.Stats().LastError.Load(); e == nil || !strings.Contains(*e, "map_version") && !strings.Contains(*e, "owners") {
		t.Fatalf("last error %v", e)
	}
	r.Close()
	if ok, _, _ := s.Exists(ctx, st.Paths().Router("r1")); ok {
		t.Fatal("member record left after Close")
	}
}

// A map stored compressed is followed like a plain one, and GET /v1/map
// (MapFile) still carries the map's plain JSON, the same document a plain
// record gives: clients in other languages never see the compression.
func TestFollowsCompressedMap(t *testing.T) {
	z := memEnv(t)
	st := cluster(t, z, clustertest.Nodes(3), 6)
	ctx := context.Background()
	r := New(z.open(t, 0), st.Paths(), Options{})
	defer r.Close()
	if err := r.WaitReady(ctxTimeout(t, 15*time.Second)); err != nil {
		t.Fatal(err)
	}
	m, changed, err := st.SetEncoding(ctx, bucketmap.MapGzip)
	if err != nil || !changed {
		t.Fatalf("switch to gzip: %v", err)
	}
	waitVersion(t, r, m.Version)
	if r.Stats().MapRejected.Load() != 0 {
		t.Fatalf("the compressed map was rejected: %v", *r.Stats().LastError.Load())
	}
	m, err = st.Update(ctx, func(m *bucketmap.Map) error {
		return m.Assign(bucketmap.Bucket{Prefix: 5, Depth: m.Level}, m.Owner(60), bucketmap.AssignOptions{})
	})
	if err != nil {
		t.Fatal(err)
	}
	waitVersion(t, r, m.Version)
	if got := r.Map(); got.Owner(5) != m.Owner(60) {
		t.Fatalf("bucket 5 on %s after the change, want %s", got.Owner(5), m.Owner(60))
	}
	file, _, err := r.MapFile()
	if err != nil {
		t.Fatal(err)
	}
	js, err := bucketmap.EncodeJSON(m)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := bucketmap.EncodeMapFile("c1", clustertest.Seed, js)
	if string(file) != string(want) {
		t.Fatalf("map file of a compressed map is not the plain document:\n%.200s", file)
	}
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// While ZooKeeper is unreachable the router keeps answering, and says how
// much to trust the answer.
func TestIntegrationZooKeeperLossMarksAnswers(t *testing.T) {
	skipUnderRace(t)
	e, z := realEnv(t)
	st := cluster(t, e, clustertest.Nodes(2), 3)
	proxy, err := faultproxy.New(z.Servers[0])
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	s := session(t, proxy.Addr(), 4*time.Second)
	r := New(s, st.Paths(), Options{})
	defer r.Close()
	if err := r.WaitReady(ctxTimeout(t, 15*time.Second)); err != nil {
		t.Fatal(err)
	}
	want, _ := r.Route("u1")
	proxy.SetMode(faultproxy.Blackhole)
	sawSuspended := false
	deadline := time.Now().Add(20 * time.Second)
	for {
		rt, err := r.Route("u1")
		if err != nil || rt.Node != want.Node {
			t.Fatalf("answer during the partition: %+v %v", rt, err)
		}
		sawSuspended = sawSuspended || rt.Suspended
		if rt.Stale {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("answers never marked stale; last %+v", rt)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !sawSuspended {
		t.Fatal("answers were never marked suspended before stale")
	}
	if _, rts, err := r.RouteBatch(nil, []string{"u1"}, 0); err != nil || !rts[0].Stale {
		t.Fatalf("batch answer while lost: %+v %v", rts, err)
	}
	proxy.SetMode(faultproxy.Pass)
	deadline = time.Now().Add(30 * time.Second)
	for {
		if rt, _ := r.Route("u1"); !rt.Stale && !rt.Suspended {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("answers still marked after healing")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The same on the in-memory ZooKeeper, cut off by memzk rather than a
// proxy: no go-zookeeper reconnect, so it runs under -race too, and the
// session expiring meanwhile brings a new one that the router follows.
func TestCutOffMarksAnswersThenRecovers(t *testing.T) {
	z := memEnv(t)
	st := cluster(t, z, clustertest.Nodes(2), 3)
	s := z.open(t, 3*time.Second)
	r := New(s, st.Paths(), Options{MemberID: "r1"})
	defer r.Close()
	if err := r.WaitReady(ctxTimeout(t, 15*time.Second)); err != nil {
		t.Fatal(err)
	}
	want, _ := r.Route("u1")
	conn, err := z.srv.ConnOf(s.SessionID())
	if err != nil {
		t.Fatal(err)
	}
	conn.Disconnect()
	testenv.WaitFor(t, 20*time.Second, func() bool { rt, _ := r.Route("u1"); return rt.Suspended }, "answers marked suspended")
	testenv.WaitFor(t, 20*time.Second, func() bool { rt, _ := r.Route("u1"); return rt.Stale }, "answers marked stale")
	if rt, err := r.Route("u1"); err != nil || rt.Node != want.Node {
		t.Fatalf("answer while cut off: %+v %v; the last map must keep answering", rt, err)
	}
	// The ensemble expires the session meanwhile, and the map changes.
	conn.Expire()
	to := bucketmap.NodeID("pg1")
	if want.Node == to {
		to = "pg2"
	}
	m, err := st.Update(context.Background(), func(m *bucketmap.Map) error {
		return m.Assign(bucketmap.Bucket{Prefix: want.Bucket, Depth: want.Level}, to, bucketmap.AssignOptions{})
	})
	if err != nil {
		t.Fatal(err)
	}
	conn.Reconnect()
	waitVersion(t, r, m.Version)
	testenv.WaitFor(t, 20*time.Second, func() bool { rt, _ := r.Route("u1"); return !rt.Stale && !rt.Suspended && rt.Node == to }, "a fresh answer from the new map")
	// Its member record is back, on the new session.
	testenv.WaitFor(t, 20*time.Second, func() bool {
		rs, err := topo.ListRouters(context.Background(), st.Session(), st.Paths())
		return err == nil && len(rs) == 1 && rs[0].Rec != nil && rs[0].Rec.MapVersion == m.Version
	}, "the router's member record re-created at the new version")
}

// Lookups racing map swaps always see one whole map: the owner they report
// is the owner in the map version they report.
func TestConcurrentLookupsDuringSwaps(t *testing.T) {
	z := memEnv(t)
	st := cluster(t, z, clustertest.Nodes(4), 5)
	r := New(z.open(t, 0), st.Paths(), Options{})
	defer r.Close()
	if err := r.WaitReady(ctxTimeout(t, 15*time.Second)); err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		versions = map[uint64]*bucketmap.Map{}
	)
	m0, _, err := st.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	versions[m0.Version] = m0
	r.OnUpdate(func(uint64) {})
	stop := make(chan struct{})
	var checked atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			testkit.Until(stop, func(i int) bool {
				uid := fmt.Sprintf("g%d-%d", g, i%5000)
				rt, err := r.Route(uid)
				if err != nil {
					errs <- err
					return false
				}
				mu.Lock()
				m := versions[rt.MapVersion]
				mu.Unlock()
				if m == nil {
					return true // written but not yet recorded by the writer below
				}
				if got := m.Owner(rt.Bucket); got != rt.Node || rt.Level != m.Level {
					errs <- fmt.Errorf("%s: answer %+v, but map version %d says %s at level %d", uid, rt, rt.MapVersion, got, m.Level)
					return false
				}
				checked.Add(1)
				return true
			})
		}()
	}
	ctx := context.Background()
	for i := range 30 {
		m, err := st.Update(ctx, func(m *bucketmap.Map) error {
			if i == 10 {
				return m.Split()
			}
			b := uint32(i*7) % uint32(m.Buckets())
			to := m.Nodes()[(i+1)%4].ID
			if m.Owner(b) == to {
				to = m.Nodes()[(i+2)%4].ID
			}
			return m.Assign(bucketmap.Bucket{Prefix: b, Depth: m.Level}, to, bucketmap.AssignOptions{})
		})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		versions[m.Version] = m
		mu.Unlock()
	}
	last, _, _ := st.Load(ctx)
	waitVersion(t, r, last.Version)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if checked.Load() == 0 {
		t.Fatal("no lookup was checked")
	}
	t.Logf("%d lookups checked across 30 map versions", checked.Load())
}

// pgCluster is a level-2 cluster of the first two local PostgreSQL nodes
// (pg1, pg2) with a ready router on it.
func pgCluster(t *testing.T) (*testenv.PG, *bucketmap.Store, *Router, context.Context) {
	t.Helper()
	z, _ := realEnv(t)
	pg := testenv.StartPG(t)
	var nodes []bucketmap.Node
	for i, n := range pg.Nodes[:2] {
		nodes = append(nodes, bucketmap.Node{ID: bucketmap.NodeID(fmt.Sprintf("pg%d", i+1)), DSN: n.DSN, Password: "file:" + n.PasswordFile, Weight: 1, State: bucketmap.NodeActive})
	}
	st := cluster(t, z, nodes, 2)
	r := New(z.open(t, 0), st.Paths(), Options{})
	t.Cleanup(r.Close)
	ctx := ctxTimeout(t, 30*time.Second)
	if err := r.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return pg, st, r, ctx
}

func TestIntegrationPools(t *testing.T) {
	pg, st, r, ctx := pgCluster(t)
	seen := map[bucketmap.NodeID]int{}
	for i := range 40 {
		pool, rt, err := r.Pool(ctx, fmt.Sprint("user", i))
		if err != nil {
			t.Fatal(err)
		}
		var port int
		if err := pool.QueryRow(ctx, "select inet_server_port()").Scan(&port); err != nil {
			t.Fatal(err)
		}
		want := pg.Nodes[0].Port
		if rt.Node == "pg2" {
			want = pg.Nodes[1].Port
		}
		if port != want {
			t.Fatalf("%s routed to %s but the pool reached port %d", fmt.Sprint("user", i), rt.Node, port)
		}
		seen[rt.Node]++
	}
	if len(seen) != 2 {
		t.Fatalf("users landed on %v", seen)
	}
	p2, err := r.NodePool(ctx, "pg2")
	if err != nil {
		t.Fatal(err)
	}
	// pg2 leaves the registry: its pool is closed.
	m, err := st.Update(ctx, func(m *bucketmap.Map) error {
		for b := range m.Buckets() {
			if m.Owner(uint32(b)) == "pg2" {
				if err := m.Assign(bucketmap.Bucket{Prefix: uint32(b), Depth: m.Level}, "pg1", bucketmap.AssignOptions{}); err != nil {
					return err
				}
			}
		}
		if err := m.RemoveNode("pg2"); err != nil {
			return err
		}
		m.PruneHistory(func(bucketmap.Handoff) bool { return true })
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	waitVersion(t, r, m.Version)
	if err := p2.Ping(ctx); err == nil {
		t.Fatal("the removed node's pool still works")
	}
	if _, err := r.NodePool(ctx, "pg2"); err == nil || !strings.Contains(err.Error(), "not in the registry") {
		t.Fatalf("pool of a removed node: %v", err)
	}
	if _, err := r.Route("x"); errors.Is(err, ErrNotReady) {
		t.Fatal(err)
	}
}

// Do writes a moving bucket on its owner (the pause starts at the source's
// freeze, not when the map says moving), and retries a write the fence
// rejects until the map names the new owner.
func TestIntegrationDoDuringAMove(t *testing.T) {
	_, st, r, ctx := pgCluster(t)
	const uid = "mover-user"
	rt, err := r.Route(uid)
	if err != nil {
		t.Fatal(err)
	}
	from, to := rt.Node, bucketmap.NodeID("pg2")
	if from == to {
		to = "pg1"
	}
	m, err := st.Update(ctx, func(m *bucketmap.Map) error {
		return m.SetMoving(bucketmap.Bucket{Prefix: rt.Bucket, Depth: rt.Level}, to, "m1")
	})
	if err != nil {
		t.Fatal(err)
	}
	waitVersion(t, r, m.Version)

	// Moving, not frozen: written on the owner, once.
	var calls []Route
	err = r.Do(ctx, uid, func(ctx context.Context, pool *pgxpool.Pool, rt Route) error {
		calls = append(calls, rt)
		return nil
	})
	if err != nil || len(calls) != 1 || calls[0].Node != from || calls[0].State != bucketmap.BucketMoving {
		t.Fatalf("write to a moving bucket: %v, calls %+v", err, calls)
	}

	// Frozen on the source: rejected until the map flips, then written on
	// the target.
	calls = nil
	// The map flips once the source has rejected the write at least once
	// (not after a fixed 200 ms, which a slow first attempt can outlast).
	rejected := make(chan struct{})
	var rejectedOnce sync.Once
	flipped := make(chan error, 1)
	go func() {
		<-rejected
		_, err := st.Update(ctx, func(m *bucketmap.Map) error {
			return m.Assign(bucketmap.Bucket{Prefix: rt.Bucket, Depth: rt.Level}, to, bucketmap.AssignOptions{})
		})
		flipped <- err
	}()
	err = r.Do(ctx, uid, func(ctx context.Context, pool *pgxpool.Pool, rt Route) error {
		calls = append(calls, rt)
		if rt.Node == from {
			rejectedOnce.Do(func() { close(rejected) })
			return &pgconn.PgError{Code: fence.SQLState, Message: "bucket frozen"}
		}
		return nil
	})
	rejectedOnce.Do(func() { close(rejected) }) // never rejected: let the flip end, the check below fails
	if ferr := <-flipped; ferr != nil {
		t.Fatal(ferr)
	}
	if err != nil || len(calls) < 2 || calls[len(calls)-1].Node != to {
		t.Fatalf("write during the pause: %v after %d attempts", err, len(calls))
	}
	t.Logf("%d attempts during the pause", len(calls))

	// Another error is not retried.
	calls = nil
	boom := errors.New("boom")
	if err := r.Do(ctx, uid, func(ctx context.Context, pool *pgxpool.Pool, rt Route) error {
		calls = append(calls, rt)
		return boom
	}); !errors.Is(err, boom) || len(calls) != 1 {
		t.Fatalf("a plain error: %v after %d attempts", err, len(calls))
	}
}

// A write a standby refused (25006: a failover seen through a member's
// pooler) on a Patroni group's node is retried on connections made after
// it: the pool is reset, so neither the refused connection nor an idle
// one is used again. On a plain node the same refusal (the application's
// own READ ONLY transaction) is returned at once.
func TestIntegrationDoRetriesAStandbysRefusalOnFreshConnections(t *testing.T) {
	z, _ := realEnv(t)
	pg := testenv.StartPG(t)
	pw := "file:" + pg.Nodes[0].PasswordFile
	nodes := []bucketmap.Node{
		// One server standing for a group (its records are not read here).
		{ID: "g1", DSN: pg.Nodes[0].DSN + "&target_session_attrs=read-write", Password: pw, Weight: 1, State: bucketmap.NodeActive,
			Patroni: bucketmap.Patroni{Namespace: bucketmap.DefaultPatroniNamespace, Scope: "g1"}},
		{ID: "pg2", DSN: pg.Nodes[1].DSN, Password: pw, Weight: 1, State: bucketmap.NodeActive},
	}
	st := cluster(t, z, nodes, 2)
	r := New(z.open(t, 0), st.Paths(), Options{})
	t.Cleanup(r.Close)
	ctx := ctxTimeout(t, 30*time.Second)
	if err := r.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	uidOn := func(node bucketmap.NodeID) string {
		for i := range 1000 {
			uid := fmt.Sprint("standby-user-", i)
			if rt, err := r.Route(uid); err == nil && rt.Node == node {
				return uid
			}
		}
		t.Fatalf("no user on %s", node)
		return ""
	}
	// The first attempt runs a READ ONLY transaction: the server refuses
	// its write with 25006, as a demoted member does.
	attempts := func(uid string) ([]uint32, map[uint32]bool, error) {
		rt, _ := r.Route(uid)
		pool, err := r.NodePool(ctx, rt.Node)
		if err != nil {
			t.Fatal(err)
		}
		a, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		old := map[uint32]bool{a.Conn().PgConn().PID(): true, b.Conn().PgConn().PID(): true}
		a.Release()
		b.Release()
		var pids []uint32
		err = r.Do(ctx, uid, func(ctx context.Context, pool *pgxpool.Pool, _ Route) error {
			c, err := pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer c.Release()
			pids = append(pids, c.Conn().PgConn().PID())
			tx, err := c.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			if len(pids) == 1 {
				if _, err := tx.Exec(ctx, "SET TRANSACTION READ ONLY"); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, "CREATE TEMP TABLE standby_probe (x int)"); err != nil {
				return err
			}
			return tx.Commit(ctx)
		})
		return pids, old, err
	}
	pids, old, err := attempts(uidOn("g1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pids) != 2 || !old[pids[0]] || old[pids[1]] {
		t.Fatalf("attempts on backends %v; the pool's before Do: %v (want the retry on a new one)", pids, old)
	}
	pids, _, err = attempts(uidOn("pg2"))
	if len(pids) != 1 || err == nil || !strings.Contains(err.Error(), "25006") {
		t.Fatalf("a plain node's 25006: %d attempts, %v; want one, and the error", len(pids), err)
	}
}
