package migrate

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/gc"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/ownership"
	"github.com/shardvisor/shardvisor/topo"
)

// A single-bucket split under write load moves nothing and fails no write;
// a move of one half then copies that half only, every acknowledged write
// is on the node the map names, every node's fence agrees with the map,
// and GC deletes from the old owner that half's rows and nothing else.
func TestIntegrationSplitBucketThenMoveHalf(t *testing.T) {
	f := parallelFixture(t, 2, 2) // 4 buckets: pg1 0-1, pg2 2-3
	base := f.seedRows("seed", 600)
	ctx := context.Background()
	whole := bucketmap.Bucket{Prefix: 0, Depth: 2}
	h0, h1 := whole.Halves()
	before := f.rowsIn("pg1", 2, 0)
	if before == 0 || f.rowsIn("pg1", 3, 0) == 0 || f.rowsIn("pg1", 3, 1) == 0 {
		t.Fatalf("the seed left bucket 0 or a half empty (%d rows)", before)
	}
	l := f.startLoadEvery(4, 150, pacedWrite)
	testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= 20 }, "writes acknowledged before the split")
	res, err := ownership.New(f.st, ownership.Options{}).SplitBucket(ctx, whole)
	if err != nil {
		t.Fatal(err)
	}
	if d := res.Drift(); len(d) > 0 {
		t.Fatalf("fences drifted on the split: %+v", d)
	}
	m := res.Map
	if m.Buckets() != 5 || m.OwnerOf(h0) != "pg1" || m.OwnerOf(h1) != "pg1" {
		t.Fatalf("after the split: %d buckets, halves on %s and %s", m.Buckets(), m.OwnerOf(h0), m.OwnerOf(h1))
	}
	testenv.WaitFor(t, 10*time.Second, func() bool { return f.r.Map().Version == m.Version }, "the router applies the split")
	n := l.writes.Load()
	testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= n+20 }, "writes acknowledged after the split")
	if l.failed.Load() > 0 {
		t.Fatalf("%d writes failed across the split: %s", l.failed.Load(), *l.lastErr.Load())
	}
	rec, err := f.mover(Options{}).MoveBucket(ctx, h1, "pg2", false)
	if err != nil {
		t.Fatal(err)
	}
	n = l.writes.Load()
	testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= n+20 }, "writes acknowledged after the move")
	acked := l.finish()
	if rec.State != topo.MoveDone || rec.Bucket != h1.Prefix || rec.Level != h1.Depth || !rec.Verify.OK {
		t.Fatalf("move of %s: %s %+v, error %q", h1, rec.State, rec.Verify, rec.Error)
	}
	if l.failed.Load() > 0 {
		t.Fatalf("%d writes failed: %s", l.failed.Load(), *l.lastErr.Load())
	}
	// Only that half was copied: the target has none of the other half.
	if got := f.rowsIn("pg2", 3, 0); got != 0 {
		t.Fatalf("the target got %d rows of the half that stayed", got)
	}
	moved := f.rowsIn("pg2", 3, 1)
	if rec.Stats.RowsCopied == 0 || rec.Stats.RowsCopied > moved {
		t.Fatalf("copied %d rows, the target holds %d of the half", rec.Stats.RowsCopied, moved)
	}
	withSeeded(acked, base)
	f.checkAcked(acked, l.maybe)
	m = f.mapNow()
	if m.OwnerOf(h1) != "pg2" || m.OwnerOf(h0) != "pg1" {
		t.Fatalf("owners after the move: %s %s", m.OwnerOf(h0), m.OwnerOf(h1))
	}
	crec, err := topo.ReadCluster(ctx, f.s, f.st.Paths())
	if err != nil {
		t.Fatal(err)
	}
	for _, nd := range f.nodes {
		mm, err := fence.CheckFence(ctx, f.conn(nd.ID), crec.Name, crec.Tables, m, nd.ID)
		if err != nil || len(mm) > 0 {
			t.Fatalf("node %s: fence against the map: %v %v", nd.ID, mm, err)
		}
	}
	// GC deletes the moved half from pg1, and only it.
	keep := f.rowsIn("pg1", 3, 0)
	g, err := gc.New(ctx, f.st, gc.Options{Grace: -1})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := g.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Deleted == 0 || f.rowsIn("pg1", 3, 1) != 0 || f.rowsIn("pg1", 3, 0) != keep || f.rowsIn("pg2", 3, 1) != moved {
		t.Fatalf("gc deleted %d: pg1 half 0 %d (was %d), pg1 half 1 %d, pg2 half 1 %d (was %d); skipped %+v",
			rep.Deleted, f.rowsIn("pg1", 3, 0), keep, f.rowsIn("pg1", 3, 1), f.rowsIn("pg2", 3, 1), moved, rep.Skipped)
	}
	f.checkAcked(acked, l.maybe)
}

// The case end to end: 3 nodes at level 2, one bucket holding
// 40,000 of 49,000 rows. Split it, then rebalance by size under write
// load, then GC: every node holds within 1.15 times the mean in rows and
// in live bytes (the node that kept its inserted rows must not look
// denser than those filled by copies), every row is on exactly one node
// (its owner), and no acknowledged write is lost.
func TestLongRebalanceBySizeHotBucket(t *testing.T) {
	testenv.Long(t)
	f := parallelFixture(t, 2, 3)
	ctx := context.Background()
	m := f.mapNow()
	for b, n := range []int{40000, 3000, 3000, 3000} {
		bk := bucketmap.Bucket{Prefix: uint32(b), Depth: 2}
		lo, hi := bk.Keys()
		step := (uint64(hi) - uint64(lo)) / uint64(n+1)
		if _, err := f.conn(m.OwnerOf(bk)).Exec(ctx, `INSERT INTO app.kv (bkey, uid, v) SELECT $1::bigint + g * $2::bigint, 'seed-' || g, 0 FROM generate_series(1, $3) g`, lo, int64(step), n); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range f.nodes {
		if _, err := f.conn(n.ID).Exec(ctx, `ANALYZE app.kv`); err != nil {
			t.Fatal(err)
		}
	}
	// Balancing by count cannot help: every node owns its share of buckets.
	if p, err := bucketmap.PlanFor(m, bucketmap.Policy{}); err != nil || len(p.Moves) != 0 {
		t.Fatalf("plan by count: %+v %v", p, err)
	}
	if _, err := ownership.New(f.st, ownership.Options{}).SplitBucket(ctx, bucketmap.Bucket{Prefix: 0, Depth: 2}); err != nil {
		t.Fatal(err)
	}
	if m = f.mapNow(); m.Buckets() != 5 {
		t.Fatalf("after split 0: %d buckets", m.Buckets())
	}
	l := f.startLoadEvery(4, 100, pacedWrite)
	testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= 20 }, "writes acknowledged before the rebalance")
	rb := NewRebalancer(f.mover(Options{}), bucketmap.Policy{})
	rb.BySize = &bucketmap.SizePolicy{By: "size"}
	rb.Progress = func(p Progress) { t.Logf("%s %s", time.Now().Format("05.000"), p.Message) }
	if _, err := rb.SetBalanceMode(ctx, "size", "the test"); err != nil {
		t.Fatal(err)
	}
	rep, err := rb.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := l.writes.Load()
	testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= n+20 }, "writes acknowledged after the rebalance")
	acked := l.finish()
	if !rep.Balanced || len(rep.Moves) == 0 || len(rep.SplitBuckets) == 0 {
		t.Fatalf("rebalance by size: %+v", rep)
	}
	if l.failed.Load() > 0 {
		t.Fatalf("%d writes failed: %s", l.failed.Load(), *l.lastErr.Load())
	}
	f.checkAcked(acked, l.maybe)
	// A rebalancer by count does not undo it: the cluster now balances
	// by size, and says so.
	if _, err := NewRebalancer(f.mover(Options{}), bucketmap.Policy{}).Run(ctx); !errors.Is(err, ErrBalanceMode) {
		t.Fatalf("a rebalance by count after one by size: %v", err)
	}
	g, err := gc.New(ctx, f.st, gc.Options{Grace: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Run(ctx); err != nil {
		t.Fatal(err)
	}
	m = f.mapNow()
	var total, totalBytes int64
	rows, live, disk := map[bucketmap.NodeID]int64{}, map[bucketmap.NodeID]int64{}, map[bucketmap.NodeID]int64{}
	for _, nd := range f.nodes {
		c := f.conn(nd.ID)
		for _, b := range m.BucketList() {
			lo, hi := b.Keys()
			var k, by int64
			if err := c.QueryRow(ctx, "SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0) FROM app.kv t WHERE bkey BETWEEN $1 AND $2", lo, hi).Scan(&k, &by); err != nil {
				t.Fatal(err)
			}
			if k > 0 && m.OwnerOf(b) != nd.ID {
				t.Fatalf("after GC, %s still holds %d rows of bucket %s, owned by %s", nd.ID, k, b, m.OwnerOf(b))
			}
			rows[nd.ID] += k
			live[nd.ID] += by
			total += k
			totalBytes += by
		}
		var d int64
		if err := c.QueryRow(ctx, "SELECT pg_total_relation_size('app.kv')").Scan(&d); err != nil {
			t.Fatal(err)
		}
		disk[nd.ID] = d
	}
	mean, meanBytes := float64(total)/3, float64(totalBytes)/3
	t.Logf("%d buckets split, %d moves; reported largest at %.3f of its fair share (rows %.3f, live bytes %.3f); after GC rows per node %v (mean %.0f), live bytes %v (mean %.0f), on disk %v; %d writes acknowledged during it",
		len(rep.SplitBuckets), len(rep.Moves), rep.MaxOverFair, rep.MaxOverFairRows, rep.MaxOverFairBytes, rows, mean, live, meanBytes, disk, len(acked))
	for id, k := range rows {
		if float64(k) > 1.15*mean || float64(live[id]) > 1.15*meanBytes {
			t.Fatalf("node %s holds %d rows, %.2f times the mean %.0f, and %d live bytes, %.2f times the mean %.0f: %v %v",
				id, k, float64(k)/mean, mean, live[id], float64(live[id])/meanBytes, meanBytes, rows, live)
		}
	}
	f.checkAcked(acked, l.maybe)
}

// A map change while a move prepared (here another bucket split), once
// the target's fence had applied it, made the move's mark of its target
// range stale (fence.ErrStale), and the move aborted before copying (CI:
// TestFaultsObservability, "target fence: fence has seen a newer map
// version"). The move reads the map again and marks the range at the
// newer version.
func TestIntegrationMapChangeDuringPrepare(t *testing.T) {
	f := newFixture(t, 2, 2) // 4 buckets: pg1 0-1, pg2 2-3
	seeded := f.seedRows("s", 100)
	ctx := context.Background()
	mv := f.mover(Options{})
	defer mv.Close()
	var split *bucketmap.Map
	mv.beforeMarkIncoming = func() {
		mv.beforeMarkIncoming = nil
		res, err := ownership.New(f.st, ownership.Options{}).SplitBucket(ctx, bucketmap.Bucket{Prefix: 3, Depth: 2})
		if err != nil {
			t.Errorf("split of bucket 3: %v", err)
			return
		}
		split = res.Map
		// The scenario needs the target's fence ahead of the map the
		// move read.
		if fc, err := fence.Read(ctx, f.conn("pg2")); err != nil || fc.MapVersion != split.Version {
			t.Errorf("pg2's fence after the split: %+v %v, want map version %d", fc, err, split.Version)
		}
	}
	rec, err := mv.Move(ctx, 0, "pg2", false)
	if err != nil || rec.State != topo.MoveDone {
		t.Fatalf("move: %v (%s, %s)", err, rec.State, rec.Error)
	}
	if split == nil {
		t.Fatal("the map did not change during prepare")
	}
	if m := f.mapNow(); m.Version <= split.Version || m.OwnerOf(bucketmap.Bucket{Prefix: 0, Depth: 2}) != "pg2" {
		t.Fatalf("after the move: map version %d (split at %d), bucket 0 on %s", m.Version, split.Version, m.OwnerOf(bucketmap.Bucket{Prefix: 0, Depth: 2}))
	}
	f.checkClean(seeded)
}
