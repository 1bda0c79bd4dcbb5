package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/keystream"
)

// A sharded table partitioned by its bucket key (two range partitions),
// next to a plain one: table add, node prepare and check on every node, a
// misplaced write into a partition refused by the fence, a move of a
// bucket with rows in it, and GC of the old copy.
func TestIntegrationPartitionedTable(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 2)
	cmd := initCluster(t, z, pg, "part", 2, 2, func(int) string {
		return `CREATE SCHEMA app;
CREATE TABLE app.events (bkey bigint NOT NULL, id bigint NOT NULL, PRIMARY KEY (bkey, id));
CREATE TABLE app.pevents (bkey bigint NOT NULL, id bigint NOT NULL, body text, PRIMARY KEY (bkey, id)) PARTITION BY RANGE (bkey);
CREATE TABLE app.pevents_neg PARTITION OF app.pevents FOR VALUES FROM (MINVALUE) TO (0);
CREATE TABLE app.pevents_pos PARTITION OF app.pevents FOR VALUES FROM (0) TO (MAXVALUE)`
	})
	ctx := context.Background()
	conns := []*pgx.Conn{pg.Nodes[0].Conn(t), pg.Nodes[1].Conn(t)}
	exec := func(c *pgx.Conn, sql string, args ...any) {
		t.Helper()
		if _, err := c.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	mustData(t, cmd("table", "add", "app.events", "--key", "bkey")...)
	if out := mustData(t, cmd("table", "add", "app.pevents", "--key", "bkey")...); !strings.Contains(out, "app.pevents") {
		t.Fatalf("table add: %s", out)
	}
	for _, id := range []string{"pg1", "pg2"} {
		mustData(t, cmd("node", "prepare", id)...)
		if out := mustData(t, cmd("node", "prepare", id)...); !strings.Contains(out, "nothing changed") {
			t.Fatalf("node prepare %s again:\n%s", id, out)
		}
		if out := mustData(t, cmd("node", "check", id)...); !strings.Contains(out, "ok") {
			t.Fatalf("node check %s:\n%s", id, out)
		}
	}
	// The fence's triggers are on the parent only; PostgreSQL clones the
	// row triggers onto each partition.
	var parentOnly int
	if err := conns[0].QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgname = $1 AND tgparentid <> 0 AND tgrelid IN ('app.pevents_neg'::regclass, 'app.pevents_pos'::regclass)`, fence.TriggerName).Scan(&parentOnly); err != nil || parentOnly != 2 {
		t.Fatalf("cloned fence triggers on the partitions: %d, %v", parentOnly, err)
	}

	// Bucket 0 at level 2 holds negative keys: partition pevents_neg.
	const b = 0
	lo, hi, _ := keystream.Range(2, b)
	owner, other := 0, 1
	if _, err := conns[0].Exec(ctx, `INSERT INTO app.pevents VALUES ($1, 0, 'probe')`, lo); err != nil {
		if !fence.IsRejected(err) {
			t.Fatal(err)
		}
		owner, other = 1, 0
	}
	exec(conns[owner], `DELETE FROM app.pevents WHERE bkey = $1 AND id = 0`, lo)
	for i := range 40 {
		k := lo + int64(i)*((hi-lo)/40)
		exec(conns[owner], `INSERT INTO app.pevents VALUES ($1, $2, 'row')`, k, i+1)
		exec(conns[owner], `INSERT INTO app.events VALUES ($1, $2)`, k, i+1)
	}
	// A misplaced write, into the partition itself or through the parent,
	// on the node that does not own the bucket.
	for _, tbl := range []string{"app.pevents_neg", "app.pevents"} {
		if _, err := conns[other].Exec(ctx, `INSERT INTO `+tbl+` VALUES ($1, 999, 'misplaced')`, lo+7); !fence.IsRejected(err) {
			t.Fatalf("pg%d accepted a write into %s of a bucket it does not own: %v", other+1, tbl, err)
		}
	}

	to := []string{"pg1", "pg2"}[other]
	if out := mustData(t, cmd("move", "0", "--to", to, "--window", "0")...); !strings.Contains(out, ": done") {
		t.Fatalf("move:\n%s", out)
	}
	count := func(c *pgx.Conn, tbl string) int64 {
		t.Helper()
		var n int64
		if err := c.QueryRow(ctx, `SELECT count(*) FROM `+tbl+` WHERE bkey BETWEEN $1 AND $2`, lo, hi).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(conns[other], "app.pevents_neg"); n != 40 {
		t.Fatalf("after the move the new owner has %d rows of the bucket in the partition, want 40", n)
	}
	if _, err := conns[owner].Exec(ctx, `INSERT INTO app.pevents_neg VALUES ($1, 1000, 'late')`, lo+9); !fence.IsRejected(err) {
		t.Fatalf("the old owner accepted a write into the partition after the move: %v", err)
	}
	exec(conns[other], `INSERT INTO app.pevents_neg VALUES ($1, 1000, 'new owner')`, lo+9)

	out := mustData(t, cmd("gc", "--grace", "0s")...)
	if n := count(conns[owner], "app.pevents"); n != 0 {
		t.Fatalf("gc left %d rows of the moved bucket on the old owner:\n%s", n, out)
	}
	if n := count(conns[other], "app.pevents"); n != 41 {
		t.Fatalf("the new owner has %d rows of the bucket after gc, want 41", n)
	}
	// GC's pruning of the history is a map version of its own, which the
	// fences learn of at the next sync.
	mustData(t, cmd("node", "reconcile")...)
	for _, id := range []string{"pg1", "pg2"} {
		if out := mustData(t, cmd("node", "check", id)...); !strings.Contains(out, "ok") {
			t.Fatalf("node check %s after the move and gc:\n%s", id, out)
		}
	}
}
