package schema

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// twoNodes is a cluster of two real PostgreSQL nodes with app.t on both.
func twoNodes(t *testing.T) (*bucketmap.Store, []*pgx.Conn) {
	t.Helper()
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 2)
	s := zktest.Session(t, zksession.Config{Connect: z.ConnectString})
	var nodes []bucketmap.Node
	var conns []*pgx.Conn
	for i, n := range pg.Nodes {
		nodes = append(nodes, bucketmap.Node{ID: bucketmap.NodeID(n.Name), DSN: n.DSN, Password: "file:" + n.PasswordFile, Weight: 1, State: bucketmap.NodeActive})
		conns = append(conns, pg.Nodes[i].Conn(t))
		if _, err := conns[i].Exec(context.Background(), `CREATE SCHEMA app; CREATE TABLE app.t (k bigint PRIMARY KEY, v int NOT NULL); INSERT INTO app.t SELECT g, g % 10 FROM generate_series(1, 100) g`); err != nil {
			t.Fatal(err)
		}
	}
	return clustertest.Create(t, s, z.Root, nodes, 2), conns
}

// A transaction holding the table longer than many lock timeouts: the
// change gives way once, waits for that transaction without queueing
// (the writer behind it keeps writing), and applies on the next attempt,
// not after a retry per lock timeout. The writes seen waiting behind its
// first attempt are reported.
func TestIntegrationChangeWaitsForBlockers(t *testing.T) {
	t.Parallel()
	st, conns := twoNodes(t)
	ctx := context.Background()
	holdConn := conns[0] // pg1, the default canary (fewest buckets, then the lowest id)
	tx, err := holdConn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE app.t SET v = v WHERE k = 1`); err != nil {
		t.Fatal(err)
	}
	// A writer on pg1: its statements queue behind the change's lock
	// request while an attempt waits.
	var writes atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w := testenvConn(t, st, "pg1")
		for k := int64(2); ; k = k%100 + 2 {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := w.Exec(ctx, `UPDATE app.t SET v = v + 1 WHERE k = $1`, k); err != nil {
				t.Error(err)
				return
			}
			writes.Add(1)
		}
	}()
	release := time.AfterFunc(800*time.Millisecond, func() { _ = tx.Commit(ctx) })
	defer release.Stop()
	ch, err := Parse("add-c.sql", "ALTER TABLE app.t ADD COLUMN c int DEFAULT 0")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Apply(ctx, st, ch, Options{LockTimeout: 100 * time.Millisecond})
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	n1 := res.Nodes[0]
	if n1.Node != "pg1" || n1.LockTimeouts < 1 || n1.BlockerWaitMS <= 0 || n1.Attempts > 3 {
		t.Fatalf("pg1: %+v (a change that waits for its blocker tries at most a few times, not once per 100 ms for 0.8 s)", n1)
	}
	if n1.AppWaitMaxMS <= 0 {
		t.Fatalf("no application statement was seen waiting behind the change on pg1: %+v", n1)
	}
	if writes.Load() == 0 {
		t.Fatal("the writer never wrote")
	}
}

func testenvConn(t *testing.T, st *bucketmap.Store, id bucketmap.NodeID) *pgx.Conn {
	t.Helper()
	m, _, err := st.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n, _ := m.Node(id)
	c, err := dbnode.Connect(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// A node that committed a change whose ZooKeeper write was lost (shardctl
// killed in between) is recorded as applied from its own table, and the
// change is not run there again.
func TestIntegrationNodeTableIsTheTruth(t *testing.T) {
	t.Parallel()
	st, conns := twoNodes(t)
	ctx := context.Background()
	ch, _ := Parse("add-d.sql", "ALTER TABLE app.t ADD COLUMN d int")
	if _, err := Apply(ctx, st, ch, Options{}); err != nil {
		t.Fatal(err)
	}
	rec, v, err := topo.ReadSchemaChange(ctx, st.Session(), st.Paths(), "add-d")
	if err != nil {
		t.Fatal(err)
	}
	delete(rec.Nodes, "pg2")
	rec.State = topo.SchemaPartial
	if _, err := topo.UpdateSchemaChange(ctx, st.Session(), st.Paths(), rec, v); err != nil {
		t.Fatal(err)
	}
	res, err := Apply(ctx, st, ch, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range res.Nodes {
		if len(n.Ran) != 0 || n.State != topo.SchemaApplied {
			t.Fatalf("re-apply ran the change again or failed: %+v", n)
		}
	}
	if rec, _, _ = topo.ReadSchemaChange(ctx, st.Session(), st.Paths(), "add-d"); !rec.Applied("pg2") || rec.State != topo.SchemaApplied {
		t.Fatalf("record after the re-apply: %+v", rec)
	}
	_ = conns
}

// A unique index built concurrently fails on duplicates and leaves an
// invalid index: the change fails on its canary and nowhere else runs.
// Once the data is fixed, the same apply drops the invalid index and
// builds it again.
func TestIntegrationConcurrentIndexResumes(t *testing.T) {
	t.Parallel()
	st, conns := twoNodes(t)
	ctx := context.Background()
	ch, err := Parse("uniq-v.sql", "CREATE UNIQUE INDEX CONCURRENTLY t_v ON app.t (v);\nCREATE INDEX CONCURRENTLY t_k_v ON app.t (k, v);")
	if err != nil || ch.Mode != topo.ModeStatements {
		t.Fatalf("parse: %+v %v", ch, err)
	}
	res, err := Apply(ctx, st, ch, Options{Canary: "pg2"})
	if !errors.Is(err, ErrCanaryFailed) || len(res.Nodes) != 1 {
		t.Fatalf("apply over duplicates: %v, %+v", err, res)
	}
	valid := func(c *pgx.Conn, idx string) string {
		var v *bool
		err := c.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)`, idx).Scan(&v)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return "none"
		case err != nil:
			return err.Error()
		case *v:
			return "valid"
		}
		return "invalid"
	}
	if got := valid(conns[1], "app.t_v") + "," + valid(conns[0], "app.t_v"); got != "invalid,none" {
		t.Fatalf("after the failed build: pg2,pg1 = %s", got)
	}
	for _, c := range conns {
		if _, err := c.Exec(ctx, `UPDATE app.t SET v = k`); err != nil {
			t.Fatal(err)
		}
	}
	if res, err = Apply(ctx, st, ch, Options{}); err != nil || res.State != topo.SchemaApplied {
		t.Fatalf("apply after the fix: %v %+v", err, res)
	}
	for i, c := range conns {
		if got := valid(c, "app.t_v") + "," + valid(c, "app.t_k_v"); got != "valid,valid" {
			t.Fatalf("node %d: %s", i+1, got)
		}
	}
}
