package migrate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/topo"
)

// A move that failed after its flip (here: verification, after a TRUNCATE
// on the source while it copied) blocked GC of its range for good, and
// `move abort` sent the operator to `move resume`, which fails again.
// AbortAfterFailure refuses while the owner holds fewer rows than the
// other node, and otherwise leaves the record aborted (GC no longer sees a
// move in flight), the fences matching the map, nothing behind.
func TestIntegrationAbortAfterFailure(t *testing.T) {
	f := parallelFixture(t, 2, 2)
	f.seedRows("s", 200)
	ctx := context.Background()
	src := f.conn("pg1")
	mv := f.mover(Options{})
	// Without its reverse stream (its slot dropped before it starts), a
	// move whose verification fails cannot be rolled back: it fails.
	truncate := f.truncateSourceOnCatchup(ctx)
	dst0 := f.conn("pg2")
	mv.opts.Progress = func(p Progress) {
		truncate(p)
		if p.Message == topo.MoveTeardown {
			if _, err := dst0.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", p.Move.Reverse.Slot); err != nil {
				t.Error(err)
			}
		}
	}
	rec, err := mv.Move(ctx, 0, "pg2", false)
	if !errors.Is(err, ErrVerifyMismatch) || rec.State != topo.MoveFailed {
		t.Fatalf("want a failed move: %v (%s)", err, rec.State)
	}
	mv = f.mover(Options{})
	if _, err := mv.Resume(ctx, rec.ID); err == nil {
		t.Fatal("resume of a failed move succeeded")
	}
	if _, err := mv.Abort(ctx, rec.ID, "operator"); err == nil || !strings.Contains(err.Error(), "failed after its flip") || !strings.Contains(hint.Of(err), "--after-failure") {
		t.Fatalf("abort of a failed move: %v (hint %q)", err, hint.Of(err))
	}
	if got, _ := mv.Get(ctx, rec.ID); got.Finished() {
		t.Fatalf("a failed move is %s after a plain abort", got.State)
	}

	// The owner (the target) with fewer rows than the old source: refused.
	dst := f.conn("pg2")
	if _, err := src.Exec(ctx, fmt.Sprintf(`BEGIN; SET LOCAL session_replication_role = replica;
		INSERT INTO app.kv VALUES (%d, 'only-on-source', 1), (%d, 'only-on-source-2', 1); COMMIT`, rec.Lo, rec.Lo+1)); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.Exec(ctx, fmt.Sprintf(`BEGIN; SET LOCAL session_replication_role = replica;
		DELETE FROM app.kv WHERE bkey BETWEEN %[1]d AND %[2]d AND uid <> (SELECT min(uid) FROM app.kv WHERE bkey BETWEEN %[1]d AND %[2]d); COMMIT`, rec.Lo, rec.Hi)); err != nil {
		t.Fatal(err)
	}
	got, rep, err := mv.AbortAfterFailure(ctx, rec.ID)
	if !errors.Is(err, ErrOwnerHasFewerRows) || got.State != topo.MoveFailed || rep == nil || rep.Owner != "pg2" {
		t.Fatalf("after-failure with the owner short of rows: %v (state %s, report %+v)", err, got.State, rep)
	}
	t.Logf("refused: %v", err)

	// Rows back on the owner: it goes through.
	if _, err := src.Exec(ctx, `BEGIN; SET LOCAL session_replication_role = replica; DELETE FROM app.kv WHERE uid LIKE 'only-on-source%'; COMMIT`); err != nil {
		t.Fatal(err)
	}
	got, rep, err = mv.AbortAfterFailure(ctx, rec.ID)
	if err != nil || got.State != topo.MoveAborted || rep.Owner != "pg2" || rep.Other != "pg1" || !rep.CopiesDiffer {
		t.Fatalf("after-failure: %v (state %s, report %+v)", err, got.State, rep)
	}
	t.Logf("record error: %s", got.Error)
	if !strings.Contains(got.Error, "aborted after failure: pg2 owns the bucket") {
		t.Errorf("record error %q", got.Error)
	}
	if got, _ := mv.Get(ctx, rec.ID); !got.Finished() {
		t.Fatalf("record %s: GC would still see a move in flight", got.State)
	}
	if left := f.leftovers(); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
	m := f.mapNow()
	if m.Owner(0) != "pg2" {
		t.Fatalf("owner %s", m.Owner(0))
	}
	for _, n := range f.nodes {
		mism, err := fence.CheckFence(ctx, f.conn(n.ID), "mv", []topo.TableRecord{kvTable}, m, n.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range mism {
			if x.Kind != fence.KindFenceVersion {
				t.Fatalf("%s fence: %s: %s", n.ID, x.Kind, x.Message)
			}
		}
	}
	// Again: nothing to do, it says so.
	if _, _, err := mv.AbortAfterFailure(ctx, rec.ID); err == nil || !strings.Contains(err.Error(), "not failed") {
		t.Fatalf("second after-failure: %v", err)
	}
}
