package gc

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

var events = clustertest.Events

const eventsDDL = clustertest.EventsDDL

// cluster is a real test cluster: a ZooKeeper root with the map, and
// PostgreSQL nodes with app.events fenced.
type cluster struct {
	t     testing.TB
	z     *testenv.ZK
	pg    *testenv.PG
	s     *zksession.Session
	st    *bucketmap.Store
	conns map[bucketmap.NodeID]*pgx.Conn
	ids   []bucketmap.NodeID
	// clock is what the map store stamps handoffs with.
	clock time.Time
	id    int64
}

func newCluster(t testing.TB, level, n int) *cluster {
	t.Helper()
	return newClusterOn(t, level, testenv.StartPGNodes(t, n))
}

// newClusterOn is newCluster on the given servers, named n1, n2, ... in
// their order; a Patroni group among them is registered as one.
func newClusterOn(t testing.TB, level int, pg *testenv.PG) *cluster {
	t.Helper()
	c := &cluster{t: t, z: testenv.StartZK(t), pg: pg, conns: map[bucketmap.NodeID]*pgx.Conn{},
		clock: time.Now().Add(-48 * time.Hour)}
	c.s = zktest.Session(t, zksession.Config{Connect: c.z.ConnectString})
	nodes := clustertest.NodesOf(c.pg, "n")
	for _, n := range nodes {
		c.ids = append(c.ids, n.ID)
	}
	cl := clustertest.MustBuild(t, c.s, clustertest.Spec{Root: c.z.Root, Name: "c1", Seed: strings.Repeat("ab", 16), Level: level, Nodes: nodes,
		Tables: []topo.TableRecord{events}, DDL: []string{eventsDDL}, Now: c.clock})
	c.st = cl.Store
	c.st.Now = func() time.Time { return c.clock }
	for i, pn := range c.pg.Nodes {
		c.conns[c.ids[i]] = pn.Conn(t)
	}
	return c
}

// session opens another session on the cluster's ZooKeeper, as another
// process would.
func (c *cluster) session() *zksession.Session {
	c.t.Helper()
	return zktest.Session(c.t, zksession.Config{Connect: c.z.ConnectString})
}

func (c *cluster) exec(conn *pgx.Conn, sql string, args ...any) {
	c.t.Helper()
	if _, err := conn.Exec(context.Background(), sql, args...); err != nil {
		c.t.Fatalf("%s: %v", sql, err)
	}
}

func (c *cluster) syncAll(m *bucketmap.Map) {
	c.t.Helper()
	for _, id := range c.ids {
		if _, err := fence.Sync(context.Background(), c.conns[id], m, id); err != nil {
			c.t.Fatalf("sync %s: %v", id, err)
		}
	}
}

func (c *cluster) load() *bucketmap.Map {
	c.t.Helper()
	m, _, err := c.st.Load(context.Background())
	if err != nil {
		c.t.Fatal(err)
	}
	return m
}

// filled loads the map and writes n rows into each of its buckets (insert).
func (c *cluster) filled(r *rand.Rand, n int) *bucketmap.Map {
	c.t.Helper()
	m := c.load()
	for b := range uint32(m.Buckets()) {
		c.insert(r, m, b, n)
	}
	return m
}

// update changes the map and brings every fence in step.
func (c *cluster) update(edit func(m *bucketmap.Map) error) *bucketmap.Map {
	c.t.Helper()
	m, err := c.st.Update(context.Background(), edit)
	if err != nil {
		c.t.Fatal(err)
	}
	c.syncAll(m)
	return m
}

// insert writes n rows with random keys in bucket b (at the map's level)
// on its owner, through the fence.
func (c *cluster) insert(r *rand.Rand, m *bucketmap.Map, b uint32, n int) {
	c.t.Helper()
	lo, hi, _ := keystream.Range(m.Level, b)
	conn := c.conns[m.Owner(b)]
	rows := make([][]any, n)
	for i := range rows {
		c.id++
		rows[i] = []any{lo + int64(r.Uint64N(uint64(hi-lo))), c.id, "x"}
	}
	if _, err := conn.CopyFrom(context.Background(), pgx.Identifier{"app", "events"}, []string{"bkey", "id", "body"}, pgx.CopyFromRows(rows)); err != nil {
		c.t.Fatal(err)
	}
}

// move copies bucket b's rows to node to (as a mover would, through
// replication apply, i.e. bypassing the fence) and then assigns it there.
func (c *cluster) move(m *bucketmap.Map, b uint32, to bucketmap.NodeID) *bucketmap.Map {
	c.t.Helper()
	ctx := context.Background()
	lo, hi, _ := keystream.Range(m.Level, b)
	rows, err := c.conns[m.Owner(b)].Query(ctx, `SELECT bkey, id, body FROM app.events WHERE bkey BETWEEN $1 AND $2`, lo, hi)
	if err != nil {
		c.t.Fatal(err)
	}
	data, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) {
		var k, id int64
		var body *string
		err := r.Scan(&k, &id, &body)
		return []any{k, id, body}, err
	})
	if err != nil {
		c.t.Fatal(err)
	}
	dst := c.conns[to]
	tx, err := dst.Begin(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	c.exec(dst, `SET LOCAL session_replication_role = replica`)
	c.exec(dst, `CREATE TEMP TABLE incoming (LIKE app.events) ON COMMIT DROP`)
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"incoming"}, []string{"bkey", "id", "body"}, pgx.CopyFromRows(data)); err != nil {
		c.t.Fatal(err)
	}
	c.exec(dst, `INSERT INTO app.events SELECT * FROM incoming ON CONFLICT DO NOTHING`)
	if err := tx.Commit(ctx); err != nil {
		c.t.Fatal(err)
	}
	return c.update(func(m *bucketmap.Map) error {
		return m.Assign(bucketmap.Bucket{Prefix: b, Depth: m.Level}, to, bucketmap.AssignOptions{})
	})
}

// counts returns the rows per bucket (at level) on a node.
func (c *cluster) counts(id bucketmap.NodeID, level int) map[uint32]int64 {
	c.t.Helper()
	rows, err := c.conns[id].Query(context.Background(), `SELECT bkey FROM app.events`)
	if err != nil {
		c.t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[uint32]int64{}
	for _, k := range keys {
		out[keystream.BucketOf(keystream.PrefixFromKey(k), level)]++
	}
	return out
}

func (c *cluster) gc(opt Options) *GC {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	return &GC{Session: c.s, Store: c.st, Tables: []topo.TableRecord{events}, Opt: opt}
}

func (c *cluster) run(opt Options) *Report {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := c.gc(opt).Run(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	return rep
}

func fmtSQL(format string, args ...any) string { return fmt.Sprintf(format, args...) }
