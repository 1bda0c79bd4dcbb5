package migrate

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

const seedHex = clustertest.Seed

var kvTable = clustertest.KV

const kvDDL = clustertest.KVDDL

// fixture is a cluster of real PostgreSQL nodes with the fence installed,
// a map in ZooKeeper, and a router following it.
type fixture struct {
	t     *testing.T
	z     *testenv.ZK
	pg    *testenv.PG
	s     *zksession.Session
	st    *bucketmap.Store
	r     *router.Router
	ks    *keystream.Keystream
	nodes []bucketmap.Node
}

// parallelFixture is newFixture for a test that runs in parallel with the
// package's others (t.Parallel): every fixture has its own ZooKeeper path
// and databases.
func parallelFixture(t *testing.T, level, nodes int) *fixture {
	t.Parallel()
	return newFixture(t, level, nodes)
}

func newFixture(t *testing.T, level, nodes int) *fixture {
	t.Helper()
	pg := testenv.StartPGNodes(t, nodes)
	return newFixtureOn(t, level, &testenv.PG{Nodes: pg.Nodes[:nodes]})
}

// newFixtureOn is newFixture on the given servers, named pg1, pg2, ... in
// their order; a Patroni group among them is registered as one.
func newFixtureOn(t *testing.T, level int, pg *testenv.PG) *fixture {
	t.Helper()
	return newFixtureWith(t, level, pg, []topo.TableRecord{kvTable}, kvDDL)
}

// newFixtureWith is newFixtureOn with other sharded tables, created on
// every node by ddl.
func newFixtureWith(t *testing.T, level int, pg *testenv.PG, tables []topo.TableRecord, ddl string) *fixture {
	t.Helper()
	return newFixtureOf(t, level, pg, clustertest.NodesOf(pg, "pg"), tables, ddl)
}

// newFixtureOf is newFixtureWith with the node records given (nodes[i]
// on pg.Nodes[i]), a pool DSN among their fields, say.
func newFixtureOf(t *testing.T, level int, pg *testenv.PG, nodes []bucketmap.Node, tables []topo.TableRecord, ddl string) *fixture {
	t.Helper()
	z := testenv.StartZK(t)
	ctx := context.Background()
	s := zktest.Session(t, zksession.Config{Connect: z.ConnectString, SessionTimeout: 4 * time.Second})
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	f := &fixture{t: t, z: z, pg: pg, s: s, nodes: nodes}
	c := clustertest.MustBuild(t, s, clustertest.Spec{Root: z.Root, Name: "mv", Seed: seedHex, Level: level, Nodes: f.nodes, Tables: tables, DDL: []string{ddl}})
	f.st, f.ks = c.Store, c.Keystream
	f.r = router.New(s, f.st.Paths(), router.Options{MemberID: "test-router", TunePool: func(c *pgxpool.Config) { c.MaxConns = 8 }})
	t.Cleanup(f.r.Close)
	if err := f.r.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	return f
}

// conn opens a connection to a node, closed at the end of the test.
func (f *fixture) conn(id bucketmap.NodeID) *pgx.Conn {
	f.t.Helper()
	for _, n := range f.nodes {
		if n.ID == id {
			c, err := dbnode.Connect(context.Background(), n)
			if err != nil {
				f.t.Fatal(err)
			}
			f.t.Cleanup(func() { c.Close(context.Background()) })
			return c
		}
	}
	f.t.Fatalf("no node %s", id)
	return nil
}

func (f *fixture) mover(opts Options) *Mover { return New(f.st, opts) }

// truncateSourceOnCatchup is a Progress hook: an admin truncates app.kv on
// the source (pg1) as the move enters catchup. TRUNCATE is not published,
// so the target never hears of it.
func (f *fixture) truncateSourceOnCatchup(ctx context.Context) func(Progress) {
	src := f.conn("pg1")
	return func(prog Progress) {
		if prog.Message != topo.MoveCatchup {
			return
		}
		// The fence's guard wants a TRUNCATE said.
		if _, err := src.Exec(ctx, "BEGIN; SET LOCAL shardvisor.allow_truncate = on; TRUNCATE app.kv; COMMIT"); err != nil {
			f.t.Error(err)
		}
	}
}

func (f *fixture) mapNow() *bucketmap.Map {
	m, _, err := f.st.Load(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return m
}

// seedRows writes n rows directly into the owners (fence-respecting).
func (f *fixture) seedRows(prefix string, n int) map[string]int64 {
	f.t.Helper()
	ctx := context.Background()
	acked := map[string]int64{}
	for i := range n {
		uid := fmt.Sprintf("%s-%d", prefix, i)
		if err := f.write(ctx, uid, 1); err != nil {
			f.t.Fatal(err)
		}
		acked[uid] = 1
	}
	return acked
}

// write upserts uid's value through the router, retrying across moves.
func (f *fixture) write(ctx context.Context, uid string, v int64) error {
	key := keystream.Key(f.ks.Prefix64(uid))
	return f.r.Do(ctx, uid, func(ctx context.Context, pool *pgxpool.Pool, _ router.Route) error {
		_, err := pool.Exec(ctx, clustertest.KVUpsert, key, uid, v)
		return err
	})
}

// load is a constant write load: each writer owns its users and records
// every acknowledged write.
type load struct {
	stop  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	acked map[string]int64
	// maybe holds, per user, the highest value whose write failed
	// without an answer (a timeout, a connection the failover cut): it
	// may have committed, so finding it is no loss.
	maybe   map[string]int64
	writes  atomic.Int64
	failed  atomic.Int64
	lastErr atomic.Pointer[string]
}

func (f *fixture) startLoad(writers, usersPerWriter int) *load {
	return f.startLoadEvery(writers, usersPerWriter, 0)
}

// pacedWrite is the pause after each write of a load that is the backdrop
// of a test rather than its subject: 4 writers then offer about 800
// writes/s, where unpaced ones each keep a core busy on a 2-core machine
// whose CPU make test's other packages wait for. Tests of the pause and
// of rollbacks under load keep the unpaced one.
const pacedWrite = 5 * time.Millisecond

// startLoadEvery is startLoad with each writer pausing every after each
// write (0: none).
func (f *fixture) startLoadEvery(writers, usersPerWriter int, every time.Duration) *load {
	l := &load{stop: make(chan struct{}), acked: map[string]int64{}, maybe: map[string]int64{}}
	for w := range writers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			vals := map[string]int64{}
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				uid := fmt.Sprintf("w%d-u%d", w, rng.IntN(usersPerWriter))
				v := vals[uid] + 1
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				err := f.write(ctx, uid, v)
				cancel()
				if err != nil {
					l.failed.Add(1)
					msg := err.Error()
					l.lastErr.Store(&msg)
					l.mu.Lock()
					l.maybe[uid] = max(l.maybe[uid], v)
					l.mu.Unlock()
					continue
				}
				vals[uid] = v
				l.writes.Add(1)
				l.mu.Lock()
				l.acked[uid] = v
				l.mu.Unlock()
				if every > 0 {
					select {
					case <-l.stop:
						return
					case <-time.After(every):
					}
				}
			}
		}()
	}
	return l
}

func (l *load) finish() map[string]int64 {
	close(l.stop)
	l.wg.Wait()
	return l.acked
}

// withSeeded adds to acked the seeded rows no acknowledged write changed
// since (their seeded value is the last one written).
func withSeeded(acked, seeded map[string]int64) {
	for uid, v := range seeded {
		if _, ok := acked[uid]; !ok {
			acked[uid] = v
		}
	}
}

// checkAcked verifies that every acknowledged write is on the node that
// owns its user in the current map, with its last acknowledged value or a
// later one whose write failed without an answer (maybe, nil for none):
// each user's values only grow, so anything else is a lost write.
func (f *fixture) checkAcked(acked, maybe map[string]int64) {
	f.t.Helper()
	ctx := context.Background()
	m := f.mapNow()
	conns := map[bucketmap.NodeID]*pgx.Conn{}
	missing := 0
	for uid, want := range acked {
		owner := m.OwnerOf(m.BucketOf(f.ks, uid))
		c, ok := conns[owner]
		if !ok {
			c = f.conn(owner)
			conns[owner] = c
		}
		var got int64
		err := c.QueryRow(ctx, "SELECT v FROM app.kv WHERE bkey = $1 AND uid = $2", keystream.Key(f.ks.Prefix64(uid)), uid).Scan(&got)
		if errors.Is(err, pgx.ErrNoRows) || got < want || (got > want && got > maybe[uid]) {
			missing++
			if missing <= 5 {
				f.t.Errorf("acknowledged write %s=%d not on its owner %s (found %d, %v)", uid, want, owner, got, err)
			}
			continue
		}
		if err != nil {
			f.t.Fatal(err)
		}
	}
	if missing > 0 {
		f.t.Fatalf("%d of %d acknowledged writes missing", missing, len(acked))
	}
}

// leftovers reports replication objects left on any node.
func (f *fixture) leftovers() []string {
	f.t.Helper()
	ctx := context.Background()
	var out []string
	for _, n := range f.nodes {
		objs, err := ReplicationObjects(ctx, f.conn(n.ID))
		if err != nil {
			f.t.Fatal(err)
		}
		for _, o := range objs {
			out = append(out, string(n.ID)+": "+o)
		}
	}
	return out
}

// rowsIn counts the rows of a bucket's range on a node.
func (f *fixture) rowsIn(id bucketmap.NodeID, level int, b uint32) int64 {
	f.t.Helper()
	lo, hi, _ := keystream.Range(level, b)
	var n int64
	if err := f.conn(id).QueryRow(context.Background(), "SELECT count(*) FROM app.kv WHERE bkey BETWEEN $1 AND $2", lo, hi).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}
