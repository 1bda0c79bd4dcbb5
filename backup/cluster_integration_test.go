package backup_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/backup"
	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/migrate"
	"github.com/shardvisor/shardvisor/topo"
)

// TestLongRestoreWholeCluster: a restore point is cut while a move is in
// flight (copying); the move then finishes and writes go on. The whole
// cluster is recovered to the point into new servers, the nodes are
// pointed at them and the point's map applied: node check passes on every
// node, and every row is on its owner at the point's map, each bucket
// exactly as it was.
func TestLongRestoreWholeCluster(t *testing.T) {
	testenv.Long(t)
	cl := newCluster(t, 3)
	ctx := context.Background()
	cl.seed(30)
	for _, n := range cl.nodes {
		if _, err := cl.pg.Backup(ctx, testenvStanza(t, cl, n.ID), backup.Incr); err != nil {
			t.Fatal(err)
		}
	}
	m0 := cl.mapNow()
	moving := m0.BucketAt(2)
	src, dst := m0.OwnerOf(moving), bucketmap.NodeID("pg2")
	if src == dst {
		dst = "pg1"
	}
	// The snapshot the point must give back: every bucket's rows.
	want := map[bucketmap.Bucket][]string{}
	for _, b := range m0.BucketList() {
		want[b] = cl.rows(b)
	}
	var rp *topo.RestorePoint
	var pointErr error
	mv := migrate.New(cl.st, migrate.Options{Progress: func(p migrate.Progress) {
		if p.Message == topo.MoveCatchup && rp == nil && pointErr == nil {
			rp, pointErr = backup.CreatePoint(ctx, cl.st, "mid-move", backup.PointOptions{SwitchWAL: true, By: "test"})
		}
	}})
	defer mv.Close()
	rec, err := mv.MoveBucket(ctx, moving, dst, false)
	if err != nil || pointErr != nil || rp == nil {
		t.Fatalf("move %v: %v; point: %v", rec, err, pointErr)
	}
	if len(rp.Moves) != 1 || rp.Moves[0].ID != rec.ID || rp.Moves[0].Subscription == "" {
		t.Fatalf("the point's moves in flight: %+v, want move %s with its subscription", rp.Moves, rec.ID)
	}
	if rec.State != topo.MoveDone && rec.State != topo.MoveReversible {
		t.Fatalf("move ended %s", rec.State)
	}
	// After the point: the move flipped; writes to every bucket.
	m1 := cl.mapNow()
	for _, b := range m1.BucketList() {
		if _, err := cl.conns[m1.OwnerOf(b)].Exec(ctx, `INSERT INTO app.notes (bkey, uid, id, body) VALUES ($1, 'after', 1, 'after the point')`, key(b, 3)); err != nil {
			t.Fatal(err)
		}
	}

	// The disaster: every node recovered to the point into a new server.
	for _, n := range cl.nodes {
		db, err := dbName(n)
		if err != nil {
			t.Fatal(err)
		}
		port := testenv.FreePort(t)
		sc, err := cl.pg.RecoverServer(ctx, scratchDir(t), "", string(n.ID), testenvStanza(t, cl, n.ID), db, backup.Target{Name: rp.WALName, LSN: rp.Nodes[string(n.ID)].LSN}, port)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sc.Close)
		t.Logf("node %s recovered to %s in %s", n.ID, rp.Name, sc.Recovered.Round(time.Millisecond))
		dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", port, db)
		if _, err := cl.st.Update(ctx, func(m *bucketmap.Map) error {
			nn, _ := m.Node(n.ID)
			nn.DSN, nn.PoolDSN = dsn, ""
			return m.SetConnection(n.ID, nn)
		}); err != nil {
			t.Fatal(err)
		}
	}
	res, err := backup.ApplyPointMap(ctx, cl.st, rp.Name, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("applied: map version %d (the point's %d), moves %+v, drift %v", res.MapVersion, res.From, res.Moves, res.Drift)
	if len(res.Drift) > 0 || len(res.Moves) != 1 || len(res.Moves[0].Errors) > 0 || res.Moves[0].Flipped {
		t.Fatalf("apply-map: %+v", res)
	}
	m2 := cl.mapNow()
	rec2, err := topo.ReadCluster(ctx, cl.st.Session(), cl.st.Paths())
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range m0.BucketList() {
		if m2.OwnerOf(b) != m0.OwnerOf(b) {
			t.Fatalf("bucket %s owned by %s, the point's map says %s", b, m2.OwnerOf(b), m0.OwnerOf(b))
		}
	}
	for _, n := range m2.Nodes() {
		c, err := dbnode.Connect(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		// node check's fence half.
		mism, err := fence.Check(ctx, c, rec2, m2, n.ID)
		if err != nil || len(mism) > 0 {
			t.Fatalf("node %s check: %v %v", n.ID, mism, err)
		}
		// Every row on its owner, each bucket as at the point.
		for _, b := range m2.BucketList() {
			lo, hi := b.Keys()
			rows, err := c.Query(ctx, `SELECT format('%s|%s|%s|%s|%s', bkey, uid, id, body, coalesce(tag, '<null>')) FROM app.notes WHERE bkey BETWEEN $1 AND $2 ORDER BY 1`, lo, hi)
			if err != nil {
				t.Fatal(err)
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			if m2.OwnerOf(b) != n.ID {
				if len(got) > 0 {
					t.Fatalf("node %s holds %d rows of bucket %s, owned by %s", n.ID, len(got), b, m2.OwnerOf(b))
				}
				continue
			}
			if fmt.Sprint(got) != fmt.Sprint(want[b]) {
				t.Fatalf("bucket %s on %s: %d rows, want %d as at the point", b, n.ID, len(got), len(want[b]))
			}
		}
		// Nothing of the move left to stream or hold WAL (slots are not
		// in a base backup: none comes back to drop).
		var subs, slots, pubs int
		if err := c.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_subscription), (SELECT count(*) FROM pg_replication_slots), (SELECT count(*) FROM pg_publication WHERE pubname LIKE 'sv_%')`).Scan(&subs, &slots, &pubs); err != nil || subs+slots+pubs != 0 {
			t.Fatalf("node %s: %d subscriptions, %d slots, %d publications left (%v)", n.ID, subs, slots, pubs, err)
		}
	}
}

func dbName(n bucketmap.Node) (string, error) {
	cfg, err := pgx.ParseConfig(n.DSN)
	if err != nil {
		return "", err
	}
	return cfg.Database, nil
}
