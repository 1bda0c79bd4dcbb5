package migrate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/schema"
	"github.com/shardvisor/shardvisor/topo"
)

// applyLog runs a schema change and keeps its events in order.
type applyLog struct {
	mu     sync.Mutex
	events []schema.Event
}

func (l *applyLog) progress(e schema.Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

// index is the position of the first event on node whose message starts
// with prefix (-1: none).
func (l *applyLog) index(node, prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.IndexFunc(l.events, func(e schema.Event) bool { return e.Node == node && strings.HasPrefix(e.Message, prefix) })
}

// A schema change does not wait for a move's rollback window (ten minutes
// here), and the move does not lose its way back:
//   - an ADD COLUMN runs beside the window, on the stream's subscriber
//     (the old owner) before its publisher, and the stream runs on with no
//     apply error; rows written in the window, some with the new column,
//     all come back with a rollback;
//   - a DROP COLUMN, which the stream cannot carry, waits for the window
//     and says why (--windows wait), or closes it first: the move is done
//     on its target.
func TestIntegrationSchemaChangeBesideRollbackWindow(t *testing.T) {
	f := parallelFixture(t, 3, 2) // 8 buckets: pg1 0-3, pg2 4-7
	base := f.seedRows("seed", 300)
	l := f.startLoadEvery(4, 100, pacedWrite)
	testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= 20 }, "writes acknowledged before the move")
	ctx := context.Background()
	mv := f.mover(Options{Window: 10 * time.Minute})
	rec, err := mv.Move(ctx, 1, "pg2", false)
	if err != nil || rec.State != topo.MoveReversible {
		t.Fatalf("move: %v (%+v)", err, rec)
	}
	n := l.writes.Load()
	testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= n+50 }, "writes acknowledged in the window")

	// 1. ADD COLUMN beside the window. WaitMoves is far shorter than the
	// window: a change that waited for it would fail.
	add, err := schema.Parse("add-note.sql", "ALTER TABLE app.kv ADD COLUMN note text NOT NULL DEFAULT 'none'")
	if err != nil {
		t.Fatal(err)
	}
	var log applyLog
	res, err := schema.Apply(ctx, f.st, add, schema.Options{WaitMoves: 2 * time.Second, Progress: log.progress})
	if err != nil {
		t.Fatalf("the change beside the window: %v", err)
	}
	if res.State != topo.SchemaApplied || len(res.Windows) != 1 || res.Windows[0].Move != rec.ID || res.Windows[0].Stream != "running" || res.Windows[0].ApplyErrors != 0 {
		t.Fatalf("the change beside the window: %s, windows %+v", res.State, res.Windows)
	}
	if sub, pub := log.index("pg1", "applied"), log.index("pg2", "applying"); sub < 0 || pub < 0 || sub > pub {
		t.Fatalf("the subscriber pg1 was changed at event %d, the publisher pg2 began at %d: want the subscriber first", sub, pub)
	}
	if got, _ := mv.Get(ctx, rec.ID); got.State != topo.MoveReversible {
		t.Fatalf("the move is %s after the change, want still in its window", got.State)
	}

	// 2. Writes in the window that set the new column, on the target.
	noted := map[string]string{}
	for i := range 20 {
		uid := f.uidIn(f.mapNow(), 1, fmt.Sprintf("noted-%d", i))
		note := fmt.Sprintf("after the change %d", i)
		err := f.r.Do(ctx, uid, func(ctx context.Context, pool *pgxpool.Pool, _ router.Route) error {
			_, err := pool.Exec(ctx, "INSERT INTO app.kv (bkey, uid, v, note) VALUES ($1, $2, 1, $3)", keystream.Key(f.ks.Prefix64(uid)), uid, note)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		noted[uid] = note
	}
	n = l.writes.Load()
	testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= n+50 }, "writes acknowledged after the change")

	// 3. The rollback brings back every write made since the flip.
	out, err := mv.Rollback(ctx, rec.ID)
	if err != nil || out.State != topo.MoveRolledBack {
		t.Fatalf("rollback after the change: %v (%+v)", err, out)
	}
	if owner := f.mapNow().Owner(1); owner != "pg1" {
		t.Fatalf("bucket 1 is on %s after the rollback", owner)
	}
	for uid, note := range noted {
		var got string
		if err := f.conn("pg1").QueryRow(ctx, "SELECT note FROM app.kv WHERE bkey = $1 AND uid = $2", keystream.Key(f.ks.Prefix64(uid)), uid).Scan(&got); err != nil || got != note {
			t.Fatalf("%s after the rollback on pg1: note %q (%v), want %q", uid, got, err, note)
		}
	}

	// 4. DROP COLUMN: not one a stream carries. With --windows wait it
	// waits for the window and gives up naming why; with close, it
	// closes the window first.
	rec2, err := mv.Move(ctx, 2, "pg2", false)
	if err != nil || rec2.State != topo.MoveReversible {
		t.Fatalf("second move: %v (%+v)", err, rec2)
	}
	drop, err := schema.Parse("drop-note.sql", "ALTER TABLE app.kv DROP COLUMN note")
	if err != nil {
		t.Fatal(err)
	}
	_, err = schema.Apply(ctx, f.st, drop, schema.Options{WaitMoves: time.Second})
	if !errors.Is(err, schema.ErrMovesInFlight) || !strings.Contains(err.Error(), rec2.ID) || !strings.Contains(err.Error(), "rollback window") {
		t.Fatalf("DROP COLUMN with a window open and no CloseWindow: %v", err)
	}
	if !hasColumn(t, f, "pg1") || !hasColumn(t, f, "pg2") {
		t.Fatal("a node lost the column though the change waited")
	}
	var closed []string
	res, err = schema.Apply(ctx, f.st, drop, schema.Options{WaitMoves: time.Second, CloseWindow: func(ctx context.Context, r *topo.MoveRecord, why string) error {
		closed = append(closed, r.ID+": "+why)
		_, err := mv.Complete(ctx, r.ID)
		return err
	}})
	if err != nil || res.State != topo.SchemaApplied {
		t.Fatalf("DROP COLUMN closing the window: %v (%+v)", err, res)
	}
	if len(closed) != 1 || !strings.HasPrefix(closed[0], rec2.ID+": line 1: ALTER TABLE ... DROP COLUMN") || !slices.Equal(res.Closed, []string{rec2.ID}) {
		t.Fatalf("windows closed: %q, result %v", closed, res.Closed)
	}
	if got, _ := mv.Get(ctx, rec2.ID); got.State != topo.MoveDone || f.mapNow().Owner(2) != "pg2" {
		t.Fatalf("the closed move is %s, bucket 2 on %s: want done on pg2", got.State, f.mapNow().Owner(2))
	}
	if hasColumn(t, f, "pg1") || hasColumn(t, f, "pg2") {
		t.Fatal("a node kept the dropped column")
	}

	acked := l.finish()
	if l.failed.Load() > 0 {
		t.Fatalf("%d writes failed: %s", l.failed.Load(), *l.lastErr.Load())
	}
	withSeeded(acked, base)
	f.checkAcked(acked, l.maybe)
}
