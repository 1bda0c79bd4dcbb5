package migrate

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// watcher runs `rebalance --watch` in the test (RunForever, on a session
// of its own), paused, so that it heals moves but starts none. It returns
// a count of its elections and a channel that gets RunForever's result.
func (f *fixture) watcher(ctx context.Context, sessionTimeout time.Duration) (elections *atomic.Int32, done <-chan error) {
	f.t.Helper()
	s := zktest.Session(f.t, zksession.Config{Connect: f.z.ConnectString, SessionTimeout: sessionTimeout})
	rb := NewRebalancer(New(bucketmap.NewStore(s, f.st.Paths()), Options{}), bucketmap.Policy{})
	if err := rb.Pause(ctx, "the test runs its own moves"); err != nil {
		f.t.Fatal(err)
	}
	elections = &atomic.Int32{}
	rb.Progress = func(p Progress) {
		if strings.Contains(p.Message, "elected as the cluster's rebalancer") {
			elections.Add(1)
		}
	}
	ch := make(chan error, 1)
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); ch <- rb.RunForever(rctx) }()
	f.t.Cleanup(func() { cancel(); wg.Wait() })
	testenv.WaitFor(f.t, 10*time.Second, func() bool { return elections.Load() == 1 }, "the watcher's election")
	return elections, ch
}

// killZooKeeperInPause is a mover's Progress hook: the target stops
// applying before the freeze (so the barrier's marker never arrives: after
// the freeze it could be applied before the target is told to stop), then,
// once the source is frozen, every ZooKeeper server is killed; when, goes
// to frozen if it is not nil.
func (f *fixture) killZooKeeperInPause(frozen chan<- time.Time) func(Progress) {
	dst := f.conn("pg2")
	var once sync.Once
	return func(p Progress) {
		switch p.Message {
		case topo.MoveFence:
			if _, err := dst.Exec(context.Background(), "ALTER SUBSCRIPTION "+ident(p.Move.Subscription)+" DISABLE"); err != nil {
				f.t.Error(err)
			}
		case topo.MoveBarrier:
			once.Do(func() {
				at := time.Now()
				for i := range f.z.Servers {
					if err := f.z.Kill(i); err != nil {
						f.t.Error(err)
					}
				}
				if frozen != nil {
					frozen <- at
				}
			})
		}
	}
}

// zkBack waits, after the ensemble came back, until the fixture's own
// session answers again (it reconnects on its own schedule).
func (f *fixture) zkBack() {
	f.t.Helper()
	testenv.WaitFor(f.t, 60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return topo.Sync(ctx, f.s, f.st.Paths()) == nil
	}, "the fixture's ZooKeeper session answering again")
}

// A mover SIGKILLed on entering each state of a move, under a write load,
// with `rebalance --watch` running but paused: its orphan watcher takes
// every move over within the dead mover's session timeout + OrphanGrace + a
// few seconds, and finishes it or rolls it back, with no person acting and
// no acknowledged write lost. (TestFaultsMoverKilledAtEachStep has a
// person run `move resume` instead.)
func TestFaultsWatcherHealsMoverKilledInEveryState(t *testing.T) {
	testenv.Faults(t)
	f := newFixture(t, 5, 2) // 32 buckets: pg1 0-15, 15 of them moved
	seeded := f.seedRows("s", 300)
	ctx := context.Background()
	f.watcher(ctx, 4*time.Second)
	l := f.startLoad(4, 40)
	const sessionTimeout = 3 * time.Second
	want := map[string]string{
		topo.MovePrepare: topo.MoveDone, topo.MoveCopy: topo.MoveDone, crashCopied: topo.MoveDone, crashCopyEnabled: topo.MoveDone, topo.MoveCatchup: topo.MoveDone, topo.MoveFence: topo.MoveDone,
		topo.MoveBarrier: topo.MoveAborted, topo.MoveFlip: topo.MoveAborted, crashFlipped: topo.MoveDone,
		topo.MoveTeardown: topo.MoveDone, topo.MoveReverse: topo.MoveDone, topo.MoveVerify: topo.MoveDone,
		topo.MoveReversible: topo.MoveDone, topo.MoveCompleting: topo.MoveDone,
		// Killed as it starts rolling back (its pause cap too short for
		// any barrier): the source was thawed first, the watcher
		// finishes the rollback.
		// 1ns, not 1ms: a target that has applied the freeze's marker
		// within 0.8 ms of its commit (it happened, under CI) got
		// through a barrier of 1 ms, and the mover never rolled back.
		topo.MoveAborting: topo.MoveAborted,
	}
	b := uint32(0)
	for _, state := range []string{topo.MovePrepare, topo.MoveCopy, crashCopied, crashCopyEnabled, topo.MoveCatchup, topo.MoveFence, topo.MoveBarrier, topo.MoveFlip, crashFlipped, topo.MoveTeardown, topo.MoveReverse, topo.MoveVerify, topo.MoveReversible, topo.MoveCompleting, topo.MoveAborting} {
		var args []string
		if state == topo.MoveAborting {
			args = []string{"--pause-cap", "1ns"}
		}
		id, dead := f.killMoverAt(state, b, "pg2", sessionTimeout, args...)
		// Taken over: the runner lock is the watcher's, or the move is
		// finished. The bound is the session timeout + OrphanGrace + a
		// few seconds; 5 more are slack for this shared machine.
		bound := sessionTimeout + OrphanGrace + 3*time.Second
		var rec *topo.MoveRecord
		for {
			var err error
			if err = topo.Sync(ctx, f.s, f.st.Paths()); err == nil {
				rec, err = f.mover(Options{}).Get(ctx, id)
			}
			if err != nil {
				t.Fatal(err)
			}
			if rec.Finished() {
				break
			}
			if time.Since(dead) > bound+5*time.Second {
				t.Fatalf("killed on entering %s: move %s still %s (runner %s) %s after the kill; bound %s",
					state, id, rec.State, rec.Runner, time.Since(dead).Round(time.Millisecond), bound)
			}
			time.Sleep(50 * time.Millisecond)
		}
		healed := time.Since(dead)
		if rec.State != want[state] {
			t.Fatalf("killed on entering %s: the watcher ended the move %s (%s), want %s", state, rec.State, rec.Error, want[state])
		}
		owner := f.mapNow().Owner(b)
		if (rec.State == topo.MoveDone) != (owner == "pg2") {
			t.Fatalf("killed at %s: move %s but bucket %d is on %s", state, rec.State, b, owner)
		}
		if rec.State == topo.MoveDone && rec.Stats.PauseMS <= 0 {
			t.Errorf("killed at %s: the record says the pause lasted %.1f ms", state, rec.Stats.PauseMS)
		}
		t.Logf("killed on entering %-8s -> %-7s by the watcher %s after the kill (pause %.1f ms, copy %.1f ms, %d rows)",
			state, rec.State, healed.Round(time.Millisecond), rec.Stats.PauseMS, rec.Stats.CopyMS, rec.Stats.RowsCopied)
		if left := f.leftovers(); len(left) > 0 {
			t.Fatalf("killed at %s: left behind: %v", state, left)
		}
		b++
	}
	acked := l.finish()
	t.Logf("load: %d writes acknowledged, %d failed", l.writes.Load(), l.failed.Load())
	f.checkAcked(acked, l.maybe)
	f.checkClean(seeded)
}

// The whole ZooKeeper ensemble stops inside a write pause whose barrier
// does not come (the target stopped applying): the mover ends the pause on
// the source by itself within the pause cap plus a second, ZooKeeper still
// down; when ZooKeeper is back the move is recorded aborted with the pause
// as it was, and `rebalance --watch`, whose session and lock were lost
// meanwhile, is still running and elected again.
func TestFaultsZooKeeperLossInsidePause(t *testing.T) {
	testenv.Faults(t)
	skipUnderRace(t)
	testenv.Exclusive(t)
	f := newFixture(t, 2, 2) // 4 buckets: pg1 0-1, pg2 2-3
	seeded := f.seedRows("s", 100)
	ctx := context.Background()
	elections, watcherDone := f.watcher(ctx, 4*time.Second)
	m := f.mapNow()
	uid := f.uidIn(m, 0, "thaw")
	key := keystream.Key(f.ks.Prefix64(uid))
	src := f.conn("pg1")

	const pauseCap = 6 * time.Second
	ms := zktest.Session(t, zksession.Config{Connect: f.z.ConnectString, SessionTimeout: 4 * time.Second})
	mv := New(bucketmap.NewStore(ms, f.st.Paths()), Options{PauseCap: pauseCap, Logger: zaptest.NewLogger(t)})
	frozen := make(chan time.Time, 1)
	mv.opts.Progress = f.killZooKeeperInPause(frozen)
	type result struct {
		rec *topo.MoveRecord
		err error
	}
	moved := make(chan result, 1)
	go func() {
		rec, err := mv.Move(ctx, 0, "pg2", false)
		moved <- result{rec, err}
	}()
	t.Cleanup(func() { _ = f.z.StartAll() })
	frozeAt := testenv.Receive(t, frozen, 60*time.Second, "the freeze")
	// The source takes the bucket's writes again, ZooKeeper down.
	var thawed time.Duration
	for {
		_, err := src.Exec(ctx, `INSERT INTO app.kv (bkey, uid, v) VALUES ($1, $2, 2) ON CONFLICT (bkey, uid) DO UPDATE SET v = EXCLUDED.v`, key, uid)
		if err == nil {
			thawed = time.Since(frozeAt)
			break
		}
		if !strings.Contains(err.Error(), "SV001") {
			t.Fatalf("write to the frozen source: %v", err)
		}
		if time.Since(frozeAt) > pauseCap+time.Second {
			t.Fatalf("the source still refuses the bucket's writes %s after the freeze (pause cap %s), ZooKeeper down: %v", time.Since(frozeAt).Round(time.Millisecond), pauseCap, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	seeded[uid] = 2
	t.Logf("the source took writes again %s after the freeze, ZooKeeper down", thawed.Round(time.Millisecond))
	// ZooKeeper stays down past every session's timeout, then comes back.
	time.Sleep(time.Until(frozeAt.Add(14 * time.Second)))
	if err := f.z.StartAll(); err != nil {
		t.Fatal(err)
	}
	f.zkBack()
	res := testenv.Receive(t, moved, 90*time.Second, "the move's end after ZooKeeper came back")
	if res.rec == nil || res.rec.State != topo.MoveAborted {
		t.Fatalf("the move after ZooKeeper came back: %+v %v", res.rec, res.err)
	}
	t.Logf("move %s: %v", res.rec.ID, res.err)
	if err := topo.Sync(ctx, f.s, f.st.Paths()); err != nil {
		t.Fatal(err)
	}
	rec, err := f.mover(Options{}).Get(ctx, res.rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	// Recorded as it was: from the freeze to the thaw, not to ZooKeeper's
	// return.
	if pause := time.Duration(rec.Stats.PauseMS * float64(time.Millisecond)); rec.State != topo.MoveAborted || pause <= 0 || pause > thawed+time.Second {
		t.Fatalf("record: %s, pause %.1f ms; the source took writes again %s after the freeze", rec.State, rec.Stats.PauseMS, thawed)
	}
	// The watcher lost its session and its lock in the outage: it is still
	// there, elected again.
	testenv.WaitFor(t, 30*time.Second, func() bool { return elections.Load() >= 2 }, "the watcher's second election")
	select {
	case err := <-watcherDone:
		t.Fatalf("rebalance --watch stopped: %v", err)
	default:
	}
	if owner := f.mapNow().Owner(0); owner != "pg1" {
		t.Fatalf("bucket 0 is on %s after the rollback", owner)
	}
	f.checkClean(seeded)
}

// A move's target stops inside the write pause and stays away for 20 s
// while its move is aborting, with `rebalance --watch` running: the
// watcher retries the abort with backoff and finishes it when the node is
// back, and the map gets at most 3 new versions meanwhile (it used to get
// one every retry, two a second, each sent to every router, supervisor and
// reconciler).
func TestFaultsNodeAwayDuringAbortKeepsTheMapStill(t *testing.T) {
	testenv.Faults(t)
	testenv.Exclusive(t)
	f := newFixture(t, 2, 2)
	seeded := f.seedRows("s", 100)
	ctx := context.Background()
	f.watcher(ctx, 4*time.Second)
	target := f.pg.Nodes[1]
	mv := f.mover(Options{AbortRetry: 2 * time.Second})
	var once sync.Once
	var before uint64
	mv.opts.Progress = func(p Progress) {
		if p.Message == topo.MoveBarrier {
			once.Do(func() {
				before = f.mapNow().Version // the map that says moving
				if err := target.Stop(); err != nil {
					t.Error(err)
				}
			})
		}
	}
	t.Cleanup(func() { _ = target.Start() })
	rec, err := mv.Move(ctx, 0, "pg2", false)
	if err == nil {
		t.Fatalf("the move survived its target being stopped: %+v", rec)
	}
	t.Logf("with the target down: %v (%s)", err, rec.State)
	time.Sleep(20 * time.Second)
	during := f.mapNow().Version - before
	if err := target.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, func() bool {
		r, err := f.mover(Options{}).Get(ctx, rec.ID)
		return err == nil && r.State == topo.MoveAborted
	}, "the watcher finishing the abort once the target is back")
	after := f.mapNow().Version - before
	t.Logf("map versions: +%d while the target was away, +%d in all", during, after)
	if during > 3 || after > 3 {
		t.Fatalf("the map got %d new versions while the target was away (%d in all); want at most 3", during, after)
	}
	f.checkClean(seeded)
}

// A move run by `rebalance --watch` itself (under RunForever the move's
// context ends with the rebalancer lock), the ensemble away for more than
// 2/3 of the session timeout inside the pause, then back: the session
// survives on the servers, so the runner lock node does too, owned by this
// live session although the run that held it stopped. The watcher in the
// same process takes that move over and ends it (it used to see the lock
// held and wait forever).
func TestFaultsRebalancerHealsItsOwnMoveAfterZooKeeperLoss(t *testing.T) {
	testenv.Faults(t)
	skipUnderRace(t)
	testenv.Exclusive(t)
	f := newFixture(t, 2, 2)
	ctx := context.Background()
	s := zktest.Session(t, zksession.Config{Connect: f.z.ConnectString, SessionTimeout: 6 * time.Second})
	mv := New(bucketmap.NewStore(s, f.st.Paths()), Options{PauseCap: 6 * time.Second, Logger: zaptest.NewLogger(t)})
	rb := NewRebalancer(mv, bucketmap.Policy{})
	if err := rb.Pause(ctx, "the test runs the move"); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = rb.RunForever(rctx) }()
	t.Cleanup(func() { rcancel(); wg.Wait() })
	time.Sleep(2 * time.Second)

	// The move's ctx ends when the session is lost, as Run's does with
	// the rebalancer lock under RunForever.
	mctx, mcancel := context.WithCancel(ctx)
	sub := s.Subscribe()
	go func() {
		defer sub.Close()
		for ch := range sub.C {
			if ch.To == zksession.StateLost {
				mcancel()
				return
			}
		}
	}()
	mv.opts.Progress = f.killZooKeeperInPause(nil)
	t.Cleanup(func() { _ = f.z.StartAll() })
	rec, err := mv.Move(mctx, 0, "pg2", false)
	t.Logf("Move returned: %v (rec %v)", err, rec != nil)
	time.Sleep(3 * time.Second) // ZooKeeper away ~7 s in all, > 2/3 of 6 s
	if err := f.z.StartAll(); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
	defer wcancel()
	if err := s.WaitConnected(wctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("session 0x%x connected again", s.SessionID())
	f.zkBack()
	list, err := f.mover(Options{}).List(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("moves: %v %v", list, err)
	}
	id := list[0].ID
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) {
		r, err := f.mover(Options{}).Get(ctx, id)
		if err == nil && r.Finished() {
			t.Logf("move %s %s: healed", id, r.State)
			return
		}
		time.Sleep(time.Second)
	}
	ok, st, err := f.s.Exists(ctx, f.st.Paths().MoveRunner(id))
	r, _ := f.mover(Options{}).Get(ctx, id)
	m := f.mapNow()
	t.Fatalf("move %s still %s 45 s after ZooKeeper came back; runner lock exists=%v owner=0x%x (watcher's session 0x%x) err=%v; map v%d bucket 0 %s",
		id, r.State, ok, st.EphemeralOwner, s.SessionID(), err, m.Version, m.Meta(0).State)
}
