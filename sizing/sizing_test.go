package sizing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
)

var tables = []topo.TableRecord{{Name: "app.kv", KeyColumn: "bkey"}}

// setup: 2 nodes at level 3 (n1 owns 0-3, n2 4-7), bucket 1 split, rows
// per bucket as given on their owner, and leftovers of bucket 6 on n1.
func setup(t *testing.T, rows map[bucketmap.Bucket]int) (*bucketmap.Map, []*pgx.Conn) {
	t.Helper()
	pg := testenv.StartPGNodes(t, 2)
	var nodes []bucketmap.Node
	var conns []*pgx.Conn
	for i, pn := range pg.Nodes[:2] {
		nodes = append(nodes, bucketmap.Node{ID: bucketmap.NodeID(fmt.Sprintf("n%d", i+1)), DSN: pn.DSN, Password: "file:" + pn.PasswordFile, Weight: 1, State: bucketmap.NodeActive})
		c := pn.Conn(t)
		if _, err := c.Exec(context.Background(), `CREATE SCHEMA app; CREATE TABLE app.kv (bkey bigint NOT NULL, id int NOT NULL, pad text, PRIMARY KEY (bkey, id))`); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	m, err := bucketmap.New(3, nodes, time.Unix(1700000000, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SplitBucket(bk(1, 3)); err != nil {
		t.Fatal(err)
	}
	fill := func(c *pgx.Conn, b bucketmap.Bucket, n int) {
		lo, hi := b.Keys()
		// Keys spread evenly over the bucket's range, one per row.
		step := (uint64(hi) - uint64(lo)) / uint64(n+1)
		_, err := c.Exec(context.Background(), `INSERT INTO app.kv SELECT $1::bigint + g * $2::bigint, g, repeat('x', 50) FROM generate_series(0, $3 - 1) g`, lo, int64(step), n)
		if err != nil {
			t.Fatal(err)
		}
	}
	for b, n := range rows {
		owner := m.OwnerOf(b)
		fill(conns[owner[1]-'1'], b, n)
	}
	fill(conns[0], bk(6, 3), 300) // n2 owns it
	for _, c := range conns {
		if _, err := c.Exec(context.Background(), `ANALYZE app.kv`); err != nil {
			t.Fatal(err)
		}
	}
	return m, conns
}

// Exact counts per bucket at mixed depths, leftovers kept apart, the
// largest bucket measured finer with parts that add up to it, and bytes
// that add up to each table's size on disk.
func TestIntegrationMeasureExact(t *testing.T) {
	rows := map[bucketmap.Bucket]int{bk(0, 3): 1000, bk(2, 4): 4000, bk(3, 4): 500, bk(2, 3): 10, bk(5, 3): 2000}
	m, _ := setup(t, rows)
	rep, err := Measure(context.Background(), m, tables, Options{RefineTop: 1, RefineDepth: 3})
	if err != nil {
		t.Fatal(err)
	}
	got := map[bucketmap.Bucket]int64{}
	for _, b := range rep.Buckets {
		got[b.Bucket] = b.Rows
	}
	for _, b := range m.BucketList() {
		if got[b] != int64(rows[b]) {
			t.Errorf("bucket %s: %d rows measured, %d written", b, got[b], rows[b])
		}
	}
	if rep.Buckets[0].Bucket != (bk(2, 4)) || rep.Buckets[0].Owner != "n1" {
		t.Fatalf("largest first: %+v", rep.Buckets)
	}
	var n1 NodeReport
	for _, n := range rep.Nodes {
		if n.Node == "n1" {
			n1 = n
		}
	}
	if n1.Leftover.Rows != 300 || n1.Owned.Rows != 5510 || n1.Tables[0].Method != "exact" {
		t.Fatalf("n1: %+v", n1)
	}
	// Owned and leftover bytes are the table's live bytes, which its
	// size on disk holds with room to spare (indexes, page headers).
	if b := n1.Owned.Bytes + n1.Leftover.Bytes; b != n1.Tables[0].Bytes || b == 0 || n1.Physical <= b || n1.Physical != n1.Tables[0].Physical {
		t.Fatalf("n1 live bytes %d, table %d, %d on disk", b, n1.Tables[0].Bytes, n1.Physical)
	}
	// The largest bucket's parts: 8 cells at depth 7, adding up to it.
	if len(rep.Refined) != 1 || rep.Refined[0].Depth != 7 {
		t.Fatalf("refined %v", rep.Refined)
	}
	h0, h1 := bk(2, 4).Halves()
	s0, ok0 := rep.Sizes.Of(h0)
	s1, ok1 := rep.Sizes.Of(h1)
	whole, _ := rep.Sizes.Of(bk(2, 4))
	if !ok0 || !ok1 || s0.Rows+s1.Rows != whole.Rows || s0.Rows < 1900 || s1.Rows < 1900 {
		t.Fatalf("halves %+v %+v of %+v", s0, s1, whole)
	}
	if _, ok := rep.Sizes.Of(bk(0, 5)); ok {
		t.Fatal("a part of an unrefined bucket, deeper than the directory, has a known size")
	}
}

// The same rows measure the same on a node that took them by INSERT, in
// key order into an empty table, and on one that took them the way a move
// copies them (a binary COPY out of the first, into a table already
// holding higher keys: its key index splits its pages half full). On disk
// they differ by much more than 5%: that is reported, not balanced.
func TestIntegrationMeasureCopiedLikeInserted(t *testing.T) {
	ctx := context.Background()
	hot := bk(0, 3)
	m, conns := setup(t, map[bucketmap.Bucket]int{hot: 20000, bk(5, 3): 20000})
	// n2 takes bucket 0's rows as a move would: a binary COPY of the
	// range in key order.
	lo, hi := hot.Keys()
	var buf bytes.Buffer
	if _, err := conns[0].PgConn().CopyTo(ctx, &buf, fmt.Sprintf("COPY (SELECT bkey, id, pad FROM app.kv WHERE bkey BETWEEN %d AND %d ORDER BY bkey) TO STDOUT (FORMAT binary)", lo, hi)); err != nil {
		t.Fatal(err)
	}
	if _, err := conns[1].PgConn().CopyFrom(ctx, &buf, "COPY app.kv (bkey, id, pad) FROM STDIN (FORMAT binary)"); err != nil {
		t.Fatal(err)
	}
	if _, err := conns[1].Exec(ctx, `ANALYZE app.kv`); err != nil {
		t.Fatal(err)
	}
	measure := func(owner bucketmap.NodeID) (bucketmap.Size, NodeReport) {
		mm := m.Clone()
		if mm.OwnerOf(hot) != owner {
			if err := mm.Assign(hot, owner, bucketmap.AssignOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		rep, err := Measure(ctx, mm, tables, Options{})
		if err != nil {
			t.Fatal(err)
		}
		sz, _ := rep.Sizes.Of(hot)
		for _, n := range rep.Nodes {
			if n.Node == owner {
				return sz, n
			}
		}
		t.Fatalf("no report of %s", owner)
		return sz, NodeReport{}
	}
	ins, n1 := measure("n1")
	cp, n2 := measure("n2")
	ratio := float64(cp.Bytes) / float64(ins.Bytes)
	t.Logf("bucket 0: inserted %d rows %d B (%.1f B a row), copied %d rows %d B (%.1f B a row): copied/inserted %.3f; on disk n1 %d B for %d rows, n2 %d B for %d rows",
		ins.Rows, ins.Bytes, float64(ins.Bytes)/float64(ins.Rows), cp.Rows, cp.Bytes, float64(cp.Bytes)/float64(cp.Rows), ratio,
		n1.Physical, n1.Owned.Rows+n1.Leftover.Rows, n2.Physical, n2.Owned.Rows+n2.Leftover.Rows)
	if ins.Rows != 20000 || cp.Rows != 20000 {
		t.Fatalf("rows: inserted %d, copied %d", ins.Rows, cp.Rows)
	}
	if ratio < 0.95 || ratio > 1.05 {
		t.Fatalf("the same rows measure %d B inserted, %d B copied (%.3f)", ins.Bytes, cp.Bytes, ratio)
	}
}

// A table over ExactBelow rows (by its statistics) is sampled: counts are
// estimates, close for large buckets, and the method says so.
func TestIntegrationMeasureSampled(t *testing.T) {
	rows := map[bucketmap.Bucket]int{bk(0, 3): 60000, bk(2, 4): 20000, bk(5, 3): 30000}
	m, _ := setup(t, rows)
	rep, err := Measure(context.Background(), m, tables, Options{ExactBelow: 1000, SampleRows: 20000})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range rep.Nodes {
		if !strings.HasPrefix(n.Tables[0].Method, "sample ") {
			t.Fatalf("%s measured %s", n.Node, n.Tables[0].Method)
		}
	}
	for _, b := range rep.Buckets {
		want := float64(rows[b.Bucket])
		if want >= 20000 && (float64(b.Rows) < 0.6*want || float64(b.Rows) > 1.4*want) {
			t.Errorf("bucket %s: estimated %d rows, %0.f written", b.Name, b.Rows, want)
		}
	}
	t.Logf("sampled: %+v", rep.Buckets[:3])
}

// An owner that cannot be reached fails the measurement, naming it: its
// buckets would otherwise look empty to the planner.
func TestIntegrationMeasureUnreachable(t *testing.T) {
	m, _ := setup(t, map[bucketmap.Bucket]int{bk(0, 3): 10})
	_, err := Measure(context.Background(), m, tables, Options{Connect: func(ctx context.Context, n bucketmap.Node) (*pgx.Conn, error) {
		if n.ID == "n2" {
			return nil, errors.New("connection refused")
		}
		return dbnode.Connect(ctx, n)
	}})
	if err == nil || !strings.Contains(err.Error(), "measuring node n2") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("%v", err)
	}
	if _, err := Measure(context.Background(), m, nil, Options{}); err == nil || !strings.Contains(err.Error(), "no sharded tables") {
		t.Fatalf("no tables: %v", err)
	}
}

// slotExpr is the keystream's bucket in SQL.
func TestSlotExprMatchesKeystream(t *testing.T) {
	pg := testenv.StartPGNodes(t, 1)
	c := pg.Nodes[0].Conn(t)
	for _, d := range []int{0, 1, 3, 16, 20} {
		for _, p := range []uint64{0, 1, 1 << 63, 1<<63 - 1, ^uint64(0), 0x0123456789abcdef, 0xfedcba9876543210} {
			k := keystream.Key(p)
			var got int64
			if err := c.QueryRow(context.Background(), fmt.Sprintf("SELECT %s FROM (SELECT $1::bigint AS k) t", slotExpr("k", d)), k).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if want := keystream.BucketOf(p, d); uint32(got) != want {
				t.Fatalf("depth %d prefix %x: SQL %d, keystream %d", d, p, got, want)
			}
		}
	}
}

func bk(p uint32, d int) bucketmap.Bucket { return bucketmap.Bucket{Prefix: p, Depth: d} }

// BenchmarkMeasure: 2 nodes with 1,000,000 rows each at level 10, counted
// exactly and sampled (ExactBelow 100,000: about 200,000 rows of each
// table); the baseline is the
// exact count. It prints the sampled estimate's largest error on the 10
// largest buckets.
func BenchmarkMeasure(b *testing.B) {
	pg := testenv.StartPGNodes(b, 2)
	var nodes []bucketmap.Node
	for i, pn := range pg.Nodes[:2] {
		nodes = append(nodes, bucketmap.Node{ID: bucketmap.NodeID(fmt.Sprintf("n%d", i+1)), DSN: pn.DSN, Password: "file:" + pn.PasswordFile, Weight: 1, State: bucketmap.NodeActive})
		c := pn.Conn(b)
		// Keys spread over the whole key space; each node keeps its half.
		_, err := c.Exec(context.Background(), `CREATE SCHEMA app; CREATE TABLE app.kv (bkey bigint NOT NULL, id int NOT NULL, pad text, PRIMARY KEY (bkey, id));
			INSERT INTO app.kv SELECT (random() * 1.8e19 - 9e18)::numeric::bigint, g, repeat('x', 80) FROM generate_series(1, 1000000) g; ANALYZE app.kv`)
		if err != nil {
			b.Fatal(err)
		}
	}
	m, err := bucketmap.New(10, nodes, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	var exactNS, sampleNS float64
	var exact, sampled *Report
	for b.Loop() {
		t0 := time.Now()
		if exact, err = Measure(context.Background(), m, tables, Options{ExactBelow: -1}); err != nil {
			b.Fatal(err)
		}
		exactNS += float64(time.Since(t0).Nanoseconds())
		t0 = time.Now()
		if sampled, err = Measure(context.Background(), m, tables, Options{ExactBelow: 100_000}); err != nil {
			b.Fatal(err)
		}
		sampleNS += float64(time.Since(t0).Nanoseconds())
	}
	got := map[bucketmap.Bucket]int64{}
	for _, s := range sampled.Buckets {
		got[s.Bucket] = s.Rows
	}
	worst := 0.0
	for _, e := range exact.Buckets[:10] {
		worst = max(worst, math.Abs(float64(got[e.Bucket]-e.Rows))/float64(e.Rows))
	}
	b.ReportMetric(exactNS/float64(b.N)/1e6, "exact-ms")
	b.ReportMetric(sampleNS/float64(b.N)/1e6, "sampled-ms")
	b.ReportMetric(sampleNS/exactNS, "x-exact")
	b.Logf("2M rows over 2 nodes, 1,024 buckets: exact %.0f ms, sampled (%s) %.0f ms: ratio %.2f; sampled rows of the 10 largest buckets off by at most %.1f%%",
		exactNS/float64(b.N)/1e6, sampled.Nodes[0].Tables[0].Method, sampleNS/float64(b.N)/1e6, sampleNS/exactNS, 100*worst)
}
