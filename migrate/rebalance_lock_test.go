package migrate

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// A mover whose runner lock is lost (its node vanishes, as when the
// session is lost and the server expires it) stops at once: it neither
// rolls the move back nor writes its record again, since another mover
// may run the move now. A resume by another mover finishes it. (Move, the
// exported entry, then takes the move again itself: see below.)
func TestIntegrationMoverStopsWhenItsLockIsLost(t *testing.T) {
	t.Parallel()
	f, seeded, ctx, other, mv := lockLossSetup(t)
	var lockPath string
	mv.opts.Progress = func(prog Progress) {
		rec, msg := prog.Move, prog.Message
		if msg != topo.MoveCopy || lockPath != "" {
			return
		}
		lockPath = f.st.Paths().MoveRunner(rec.ID)
		if err := other.Delete(ctx, lockPath, zksession.AnyVersion); err != nil {
			t.Error(err)
		}
		time.Sleep(500 * time.Millisecond) // for the lock's watch to notice
	}
	rec, err := mv.move(ctx, bucketmap.Bucket{Prefix: 0, Depth: bucketmap.AtLevel}, "pg2", false)
	if !errors.Is(err, zksession.ErrLockLost) {
		t.Fatalf("move after losing its lock: %v, want ErrLockLost", err)
	}
	saved, gerr := mv.Get(ctx, rec.ID)
	if gerr != nil {
		t.Fatal(gerr)
	}
	if saved.State != topo.MoveCopy || saved.Error != "" {
		t.Fatalf("the mover went on writing its record after losing the lock: %s %q", saved.State, saved.Error)
	}
	if ok, _, _ := other.Exists(ctx, lockPath); ok {
		t.Fatal("the runner lock was re-created after it was lost")
	}
	done, err := f.mover(Options{}).Resume(ctx, rec.ID)
	if err != nil || done.State != topo.MoveDone {
		t.Fatalf("resume: %v (%s)", err, done.State)
	}
	f.checkClean(seeded)
}

// Move, whose runner lock is lost mid-move, takes the move again once it
// can and sees it through: `shardctl move` exits with the move's outcome.
func TestIntegrationMoveTakesItsMoveBackAfterLosingTheLock(t *testing.T) {
	t.Parallel()
	f, seeded, ctx, other, mv := lockLossSetup(t)
	var lost []string
	mv.opts.Progress = func(prog Progress) {
		if prog.Message == topo.MoveCopy && len(lost) == 0 {
			lost = append(lost, prog.Move.ID)
			if err := other.Delete(ctx, f.st.Paths().MoveRunner(prog.Move.ID), zksession.AnyVersion); err != nil {
				t.Error(err)
			}
			time.Sleep(500 * time.Millisecond) // for the lock's watch to notice
		}
	}
	rec, err := mv.Move(ctx, 0, "pg2", false)
	if err != nil || rec.State != topo.MoveDone || len(lost) != 1 || rec.ID != lost[0] {
		t.Fatalf("move after losing its lock: %v %+v (lost %v)", err, rec, lost)
	}
	f.checkClean(seeded)
}

// lockLossSetup is the lock-loss tests' start: two nodes with 50 rows, a
// minute's context, a second session that deletes the runner lock, and a
// mover.
func lockLossSetup(t *testing.T) (*fixture, map[string]int64, context.Context, *zksession.Session, *Mover) {
	t.Helper()
	f := newFixture(t, 2, 2)
	seeded := f.seedRows("s", 50)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	other := zktest.Session(t, zksession.Config{Connect: f.z.ConnectString})
	return f, seeded, ctx, other, f.mover(Options{})
}
