package gc

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
)

// GC deletes a moved bucket's leftovers from a table partitioned by the
// bucket key (HASH, two partitions) through the parent, in every batch
// order (heap order, which walks one table's pages, falls back to key
// order: a partitioned table has no pages of its own), and leaves the
// owner's rows and the other buckets alone.
func TestIntegrationGCPartitionedTable(t *testing.T) {
	t.Parallel()
	pevents := topo.TableRecord{Name: "app.pevents", KeyColumn: "bkey"}
	for _, order := range []string{OrderAuto, OrderKey, OrderHeap} {
		t.Run("order="+order, func(t *testing.T) {
			ctx := context.Background()
			c := newCluster(t, 2, 2)
			tables := []topo.TableRecord{events, pevents}
			for _, id := range c.ids {
				c.exec(c.conns[id], `CREATE TABLE app.pevents (bkey bigint NOT NULL, id bigint NOT NULL, body text, PRIMARY KEY (bkey, id)) PARTITION BY HASH (bkey);
CREATE TABLE app.pevents_p0 PARTITION OF app.pevents FOR VALUES WITH (MODULUS 2, REMAINDER 0);
CREATE TABLE app.pevents_p1 PARTITION OF app.pevents FOR VALUES WITH (MODULUS 2, REMAINDER 1)`)
				if _, err := fence.Install(ctx, c.conns[id], "c1", id, tables); err != nil {
					t.Fatal(err)
				}
			}
			m := c.load()
			x := m.Owner(0)
			var y bucketmap.NodeID
			for _, id := range c.ids {
				if id != x {
					y = id
				}
			}
			// 5,000 rows of bucket 0 (more than a batch sample) and 500 of
			// bucket 1, on the owner of both through the fence, and bucket
			// 0's on y too, as after a move's copy.
			r := rand.New(rand.NewPCG(6, 16))
			lo, hi, _ := keystream.Range(m.Level, 0)
			var rows0 [][]any
			for i := range 5000 {
				rows0 = append(rows0, []any{lo + int64(r.Uint64N(uint64(hi-lo))), int64(i), "x"})
			}
			if m.Owner(1) != x {
				t.Fatalf("setup: buckets 0 and 1 have different owners")
			}
			lo1, hi1, _ := keystream.Range(m.Level, 1)
			var rows1 [][]any
			for i := range 500 {
				rows1 = append(rows1, []any{lo1 + int64(r.Uint64N(uint64(hi1-lo1))), int64(i), "x"})
			}
			for _, rows := range [][][]any{rows0, rows1} {
				if _, err := c.conns[x].CopyFrom(ctx, pgx.Identifier{"app", "pevents"}, []string{"bkey", "id", "body"}, pgx.CopyFromRows(rows)); err != nil {
					t.Fatal(err)
				}
			}
			tx, err := c.conns[y].Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{"app", "pevents"}, []string{"bkey", "id", "body"}, pgx.CopyFromRows(rows0)); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			c.update(func(m *bucketmap.Map) error {
				return m.Assign(bucketmap.Bucket{Prefix: 0, Depth: m.Level}, y, bucketmap.AssignOptions{})
			})

			g := c.gc(Options{Grace: -1, Order: order, Batch: 1000})
			g.Tables = tables
			rep, err := g.Run(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Deleted != 5000 || len(rep.Skipped) != 0 || rep.Pruned != 1 {
				t.Fatalf("gc: deleted %d (want 5000), skipped %+v, pruned %d", rep.Deleted, rep.Skipped, rep.Pruned)
			}
			for _, w := range rep.Work {
				for _, tw := range w.Tables {
					if tw.Table == pevents.Name && tw.Order != OrderKey {
						t.Errorf("%s took %s order, want key order", tw.Table, tw.Order)
					}
				}
			}
			count := func(id bucketmap.NodeID, lo, hi int64) int64 {
				var n int64
				if err := c.conns[id].QueryRow(ctx, `SELECT count(*) FROM app.pevents WHERE bkey BETWEEN $1 AND $2`, lo, hi).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			if n := count(x, lo, hi); n != 0 {
				t.Errorf("%d rows of bucket 0 left on %s", n, x)
			}
			if n := count(y, lo, hi); n != 5000 {
				t.Errorf("the owner %s has %d rows of bucket 0, want 5000", y, n)
			}
			if n := count(x, lo1, hi1); n != 500 {
				t.Errorf("%s has %d rows of bucket 1, which it owns, want 500", x, n)
			}
		})
	}
}
