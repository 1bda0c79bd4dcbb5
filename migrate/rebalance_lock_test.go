package migrate

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// RunForever waits while another rebalancer holds the lock (naming it),
// is elected when it goes, and stops with ErrLockLost when its own lock
// vanishes: a rebalancer that may no longer be the only one stops moving.
func TestIntegrationRebalancerLockWaitsAndStopsWhenLost(t *testing.T) {
	f := newFixture(t, 1, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	other := zktest.Session(t, zksession.Config{Connect: f.z.ConnectString})
	lockPath := f.st.Paths().RebalanceLock()
	held, err := topo.LockRebalance(ctx, other, f.st.Paths(), []byte("other-host-1"), nil)
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var said []string
	saw := func(sub string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range said {
			if strings.Contains(s, sub) {
				return true
			}
		}
		return false
	}
	rb := NewRebalancer(f.mover(Options{}), bucketmap.Policy{})
	rb.Progress = func(prog Progress) {
		msg := prog.Message
		mu.Lock()
		said = append(said, msg)
		mu.Unlock()
	}
	done := make(chan error, 1)
	go func() { done <- rb.RunForever(ctx) }()

	testenv.WaitFor(t, 10*time.Second, func() bool { return saw("another rebalancer (other-host-1) is running") }, "the waiting message")
	if saw("elected") {
		t.Fatal("elected while another rebalancer held the lock")
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, func() bool { return saw("elected as the cluster's rebalancer") }, "election")

	// The lock node vanishes (as when the session is lost and the server
	// expires it): the rebalancer stops.
	if _, err := other.TryLock(ctx, lockPath, nil, topo.OpenACL()); !errors.Is(err, zksession.ErrLocked) {
		t.Fatalf("the elected rebalancer's lock: %v, want ErrLocked", err)
	}
	if err := other.Delete(ctx, lockPath, zksession.AnyVersion); err != nil {
		t.Fatal(err)
	}
	if err := testenv.Receive(t, done, 10*time.Second, "RunForever went on after losing its lock"); !errors.Is(err, zksession.ErrLockLost) {
		t.Fatalf("RunForever after losing its lock: %v, want ErrLockLost", err)
	}
}

// A mover whose runner lock is lost (its node vanishes, as when the
// session is lost and the server expires it) stops at once: it neither
// rolls the move back nor writes its record again, since another mover
// may run the move now. A resume by another mover finishes it.
func TestIntegrationMoverStopsWhenItsLockIsLost(t *testing.T) {
	f := newFixture(t, 2, 2)
	seeded := f.seedRows("s", 50)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	other := zktest.Session(t, zksession.Config{Connect: f.z.ConnectString})
	mv := f.mover(Options{})
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
	rec, err := mv.Move(ctx, 0, "pg2", false)
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
