package migrate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
)

// A move under concurrent writes loses nothing and leaves nothing behind.
func TestIntegrationMoveUnderLoad(t *testing.T) {
	f := parallelFixture(t, 3, 2) // 8 buckets: pg1 0-3, pg2 4-7
	base := f.seedRows("seed", 400)
	l := f.startLoad(6, 200)
	testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= 20 }, "writes acknowledged before the move")
	ctx := context.Background()
	rec, err := f.mover(Options{}).Move(ctx, 1, "pg2", false)
	if err != nil {
		t.Fatal(err)
	}
	n := l.writes.Load()
	testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= n+20 }, "writes acknowledged after the move")
	acked := l.finish()
	if rec.State != topo.MoveDone || rec.Verify == nil || !rec.Verify.OK || rec.Verify.Inconclusive {
		t.Fatalf("move ended %s, verify %+v, error %q", rec.State, rec.Verify, rec.Error)
	}
	t.Logf("rows copied %d in %.0f ms, lag at fence %.1f ms, write pause %.1f ms; %d writes acknowledged, %d gave up",
		rec.Stats.RowsCopied, rec.Stats.CopyMS, rec.Stats.LagAtFenceMS, rec.Stats.PauseMS, l.writes.Load(), l.failed.Load())
	if l.failed.Load() > 0 {
		t.Fatalf("%d writes failed: %s", l.failed.Load(), *l.lastErr.Load())
	}
	m := f.mapNow()
	if m.Owner(1) != "pg2" || m.Meta(1).State != bucketmap.BucketActive || m.Meta(1).DataLost {
		t.Fatalf("bucket 1 after the move: %s %+v", m.Owner(1), m.Meta(1))
	}
	if h := m.HistoryOf(1); len(h) != 1 || h[0].Node != "pg1" || h[0].UntilVersion != rec.FlipVersion {
		t.Fatalf("history %+v", h)
	}
	withSeeded(acked, base)
	f.checkAcked(acked, l.maybe)
	if left := f.leftovers(); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
	// The old copy stays on the source (GC's job), fenced off.
	if n := f.rowsIn("pg1", 3, 1); n == 0 {
		t.Fatal("source copy already gone")
	}
	if _, err := f.conn("pg1").Exec(ctx, "INSERT INTO app.kv VALUES ($1, 'late', 1)", rec.Lo); err == nil || !strings.Contains(err.Error(), "SV001") {
		t.Fatalf("a late write to the old owner: %v", err)
	}
	mv := f.mover(Options{})
	list, err := mv.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != rec.ID {
		t.Fatalf("list: %v %v", list, err)
	}
}

func TestIntegrationMoveNoCopy(t *testing.T) {
	f := parallelFixture(t, 2, 2)
	f.seedRows("s", 100)
	ctx := context.Background()
	before := f.rowsIn("pg1", 2, 0)
	rec, err := f.mover(Options{}).Move(ctx, 0, "pg2", true)
	if err != nil || rec.State != topo.MoveDone {
		t.Fatalf("no-copy move: %+v %v", rec, err)
	}
	m := f.mapNow()
	if m.Owner(0) != "pg2" || !m.Meta(0).DataLost {
		t.Fatalf("after --no-copy: %s %+v", m.Owner(0), m.Meta(0))
	}
	if f.rowsIn("pg2", 2, 0) != 0 || f.rowsIn("pg1", 2, 0) != before {
		t.Fatal("no-copy moved rows")
	}
	if err := f.write(ctx, "new-user-after-nocopy", 1); err != nil {
		t.Fatal(err)
	}
}

// ReplicationObjects finds what a move leaves behind (by name prefix) and
// nothing else: the test harness and the benchmark count on it.
func TestIntegrationReplicationObjects(t *testing.T) {
	f := parallelFixture(t, 2, 2)
	ctx := context.Background()
	c := f.conn("pg1")
	for _, sql := range []string{`CREATE PUBLICATION sv_probe_left`, `CREATE PUBLICATION svxprobe`} {
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	defer c.Exec(ctx, `DROP PUBLICATION IF EXISTS sv_probe_left, svxprobe`)
	got, err := ReplicationObjects(ctx, c)
	if err != nil || len(got) != 1 || got[0] != "publication sv_probe_left" {
		t.Fatalf("got %v, %v", got, err)
	}
}
