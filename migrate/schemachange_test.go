package migrate

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/schema"
	"github.com/shardvisor/shardvisor/topo"
)

// A schema change and moves on the same nodes, under write load: a change
// waits for a move past its start (here held in catchup), and a move that
// starts while a change runs waits for it at its gate, then compares the
// schemas again and copies. Neither deadlocks, both nodes end with the
// column, and no acknowledged write is lost or failed.
func TestIntegrationSchemaChangeDuringMove(t *testing.T) {
	f := parallelFixture(t, 2, 2) // 4 buckets: pg1 0-1, pg2 2-3
	base := f.seedRows("seed", 300)
	ctx := context.Background()
	l := f.startLoadEvery(2, 100, pacedWrite)

	// 1. The move first: held in catchup until the change is seen waiting.
	release := make(chan struct{})
	inCatchup := make(chan struct{})
	var once sync.Once
	hold := func(p Progress) {
		if p.Message == topo.MoveCatchup {
			once.Do(func() { close(inCatchup); <-release })
		}
	}
	moved := make(chan *topo.MoveRecord, 1)
	go func() {
		rec, err := f.mover(Options{Progress: hold}).MoveBucket(ctx, bucketmap.Bucket{Prefix: 0, Depth: 2}, "pg2", false)
		if err != nil {
			t.Error(err)
		}
		moved <- rec
	}()
	<-inCatchup
	ch, err := schema.Parse("add-note.sql", "ALTER TABLE app.kv ADD COLUMN note text NOT NULL DEFAULT 'none'")
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	var wonce sync.Once
	applied := make(chan *schema.Result, 1)
	go func() {
		res, err := schema.Apply(ctx, f.st, ch, schema.Options{WaitMoves: time.Minute, Progress: func(e schema.Event) {
			if strings.HasPrefix(e.Message, "waiting for 1 moves") {
				wonce.Do(func() { close(waiting) })
			}
		}})
		if err != nil {
			t.Error(err)
		}
		applied <- res
	}()
	select {
	case <-waiting:
	case res := <-applied:
		t.Fatalf("the change ran while a move was in catchup: %+v", res)
	case <-time.After(30 * time.Second):
		t.Fatal("the change neither waited for the move nor ran")
	}
	if hasColumn(t, f, "pg1") || hasColumn(t, f, "pg2") {
		t.Fatal("a node got the column while the move was in flight")
	}
	close(release)
	rec := <-moved
	res := <-applied
	if rec == nil || rec.State != topo.MoveDone {
		t.Fatalf("move: %+v", rec)
	}
	if res == nil || res.State != topo.SchemaApplied || res.WaitedMS <= 0 {
		t.Fatalf("change: %+v", res)
	}
	if done := stepAt(rec, topo.MoveDone); !done.Before(time.Now()) {
		t.Fatalf("move done at %s", done)
	}

	// 2. The change first: a move started while it holds the lock waits
	// at the gate in prepare. The change sleeps inside its transaction so
	// that the move surely starts during it.
	ch2, err := schema.Parse("add-tag.sql", "SELECT pg_catalog.pg_sleep(0.7); ALTER TABLE app.kv ADD COLUMN tag int DEFAULT 7")
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	var sonce sync.Once
	applied2 := make(chan time.Time, 1)
	go func() {
		_, err := schema.Apply(ctx, f.st, ch2, schema.Options{Progress: func(e schema.Event) {
			if e.Message == "applying" {
				sonce.Do(func() { close(started) })
			}
		}})
		if err != nil {
			t.Error(err)
		}
		applied2 <- time.Now()
	}()
	<-started
	var gated atomic.Bool
	rec2, err := f.mover(Options{Progress: func(p Progress) {
		if strings.HasPrefix(p.Message, "waiting for the schema change") {
			gated.Store(true)
		}
	}}).MoveBucket(ctx, bucketmap.Bucket{Prefix: 2, Depth: 2}, "pg1", false)
	if err != nil {
		t.Fatal(err)
	}
	end := <-applied2
	if rec2.State != topo.MoveDone {
		t.Fatalf("second move: %s %s", rec2.State, rec2.Error)
	}
	if !gated.Load() {
		t.Fatal("the move started during the change never waited at the gate")
	}
	if copyAt := stepAt(rec2, topo.MoveCopy); copyAt.Before(end.Add(-300 * time.Millisecond)) {
		t.Fatalf("the move entered copy at %s, before the change ended at %s", copyAt, end)
	}
	acked := l.finish()
	if l.failed.Load() > 0 {
		t.Fatalf("%d writes failed: %s", l.failed.Load(), *l.lastErr.Load())
	}
	withSeeded(acked, base)
	f.checkAcked(acked, l.maybe)
	// Both nodes have both columns, and nothing else differs.
	a, _ := fence.ReadSchemas(ctx, f.conn("pg1"), []topo.TableRecord{kvTable})
	b, _ := fence.ReadSchemas(ctx, f.conn("pg2"), []topo.TableRecord{kvTable})
	if d := fence.CompareSchemas("pg1", a, "pg2", b); len(d) > 0 || len(a[0].Columns) != 5 {
		t.Fatalf("after the changes: %d columns, differences %+v", len(a[0].Columns), d)
	}
}

func hasColumn(t *testing.T, f *fixture, node bucketmap.NodeID) bool {
	t.Helper()
	var n int
	if err := f.conn(node).QueryRow(context.Background(), `SELECT count(*) FROM pg_attribute WHERE attrelid = 'app.kv'::regclass AND attname = 'note'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

func stepAt(rec *topo.MoveRecord, state string) time.Time {
	for _, s := range rec.Steps {
		if s.State == state {
			return s.At
		}
	}
	return time.Time{}
}
