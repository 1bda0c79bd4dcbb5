package migrate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/failpoint"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
)

// checkClean asserts the cluster is whole after a move ended: no
// replication objects, no bucket moving, every fence matching the map, and
// every seeded row on its owner.
func (f *fixture) checkClean(seeded map[string]int64) {
	f.t.Helper()
	if left := f.leftovers(); len(left) > 0 {
		f.t.Fatalf("left behind: %v", left)
	}
	m := f.mapNow()
	for _, b := range m.NonActive() {
		if m.MetaOf(b).State == bucketmap.BucketMoving {
			f.t.Fatalf("bucket %s still moving", b)
		}
	}
	crec, err := topo.ReadCluster(context.Background(), f.s, f.st.Paths())
	if err != nil {
		f.t.Fatal(err)
	}
	for _, n := range f.nodes {
		mism, err := fence.CheckFence(context.Background(), f.conn(n.ID), "mv", crec.Tables, m, n.ID)
		if err != nil {
			f.t.Fatal(err)
		}
		for _, x := range mism {
			// A fence a step behind the map is fine (the reconciler's
			// job); a range wrongly owned or missing is not.
			if x.Kind != fence.KindFenceVersion {
				f.t.Fatalf("%s fence: %s: %s", n.ID, x.Kind, x.Message)
			}
		}
	}
	f.checkAcked(seeded, nil)
}

func TestIntegrationLagAboveThresholdBlocksFence(t *testing.T) {
	f := parallelFixture(t, 2, 2)
	seeded := f.seedRows("s", 50)
	rec, err := f.mover(Options{MaxLag: time.Nanosecond, CatchupTimeout: 500 * time.Millisecond}).Move(context.Background(), 0, "pg2", false)
	if err == nil || !strings.Contains(err.Error(), "refusing to fence") || rec.State != topo.MoveAborted {
		t.Fatalf("move with an impossible lag threshold: %v (%+v)", err, rec)
	}
	for _, st := range rec.Steps {
		if st.State == topo.MoveFence {
			t.Fatal("the move fenced although the lag was above the threshold")
		}
	}
	if f.mapNow().Owner(0) != "pg1" || f.rowsIn("pg2", 2, 0) != 0 {
		t.Fatal("an aborted move changed ownership or left rows on the target")
	}
	f.checkClean(seeded)
}

func TestIntegrationPauseCapAborts(t *testing.T) {
	f := parallelFixture(t, 2, 2)
	seeded := f.seedRows("s", 50)
	ctx := context.Background()
	rec, err := f.mover(Options{PauseCap: time.Microsecond}).Move(ctx, 0, "pg2", false)
	if !errors.Is(err, ErrPauseCap) || rec.State != topo.MoveAborted {
		t.Fatalf("move with a 1 µs pause cap: %v (%s)", err, rec.State)
	}
	m := f.mapNow()
	if m.Owner(0) != "pg1" || m.Meta(0).State != bucketmap.BucketActive {
		t.Fatalf("after the abort: %s %+v", m.Owner(0), m.Meta(0))
	}
	// The source accepts writes again.
	if err := f.write(ctx, "after-abort", 7); err != nil {
		t.Fatal(err)
	}
	f.checkClean(seeded)
}

// TRUNCATE on the source is not published, so the target's own buckets
// survive it.
func TestIntegrationTruncateOnSourceSparesTarget(t *testing.T) {
	f := parallelFixture(t, 2, 2)
	f.seedRows("s", 200)
	ctx := context.Background()
	targetOwn := f.rowsIn("pg2", 2, 2) + f.rowsIn("pg2", 2, 3)
	if targetOwn == 0 {
		t.Fatal("no rows in the target's own buckets")
	}
	mv := f.mover(Options{})
	mv.opts.Progress = f.truncateSourceOnCatchup(ctx)
	if _, err := mv.Move(ctx, 0, "pg2", false); err != nil && !errors.Is(err, ErrVerifyMismatch) {
		t.Fatal(err)
	}
	if got := f.rowsIn("pg2", 2, 2) + f.rowsIn("pg2", 2, 3); got != targetOwn {
		t.Fatalf("the target's own buckets went from %d to %d rows after a TRUNCATE on the source", targetOwn, got)
	}
}

func TestIntegrationVerifyMismatchPausesRebalancer(t *testing.T) {
	f := parallelFixture(t, 2, 2)
	f.seedRows("s", 100)
	ctx := context.Background()
	mv := f.mover(Options{})
	lo, hi, _ := keystream.Range(2, 0)
	src := f.conn("pg1")
	mv.opts.Progress = func(prog Progress) {
		msg := prog.Message
		if msg == topo.MoveTeardown {
			// Corrupt the source's copy behind the fence's back, before
			// verification reads it.
			tx, err := src.Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			defer tx.Rollback(ctx)
			tx.Exec(ctx, "SET LOCAL session_replication_role = replica")
			if _, err := tx.Exec(ctx, "DELETE FROM app.kv WHERE bkey = (SELECT min(bkey) FROM app.kv WHERE bkey BETWEEN $1 AND $2)", lo, hi); err != nil {
				t.Error(err)
			}
			tx.Commit(ctx)
		}
	}
	rec, err := mv.Move(ctx, 0, "pg2", false)
	if !errors.Is(err, ErrVerifyMismatch) || rec.State != topo.MoveRolledBack || rec.Verify.OK {
		t.Fatalf("move with a corrupted source: %v %s %+v", err, rec.State, rec.Verify)
	}
	rb := NewRebalancer(f.mover(Options{}), bucketmap.Policy{})
	if err := f.st.Session().Sync(ctx, f.st.Paths().Rebalance()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.Update(ctx, func(m *bucketmap.Map) error { return m.AddNode(f.nodes[0]) }); err == nil {
		t.Fatal("duplicate node accepted")
	}
	if _, err := rb.Run(ctx); !errors.Is(err, ErrPaused) || !strings.Contains(err.Error(), rec.ID) {
		t.Fatalf("rebalancer after a mismatch: %v", err)
	}
	if err := rb.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := rb.State(ctx); st.Paused {
		t.Fatal("still paused after Resume")
	}
}

func TestIntegrationDrainEmptiesNode(t *testing.T) {
	f := parallelFixture(t, 3, 3)
	seeded := f.seedRows("s", 300)
	ctx := context.Background()
	l := f.startLoad(3, 100)
	if _, err := f.st.Update(ctx, func(m *bucketmap.Map) error { return m.Drain("pg3") }); err != nil {
		t.Fatal(err)
	}
	rb := NewRebalancer(f.mover(Options{}), bucketmap.Policy{Concurrency: 2})
	rep, err := rb.Run(ctx)
	acked := l.finish()
	if err != nil {
		t.Fatal(err)
	}
	m := f.mapNow()
	if m.Counts()["pg3"] != 0 || !rep.Balanced || len(rep.Moves) != 2 {
		t.Fatalf("after draining pg3: counts %v, report %+v", m.Counts(), rep)
	}
	for _, r := range rep.Moves {
		if r.State != topo.MoveDone || r.Source != "pg3" {
			t.Fatalf("move %+v", r)
		}
	}
	withSeeded(acked, seeded)
	f.checkClean(acked)
	if _, err := f.st.Update(ctx, func(m *bucketmap.Map) error { return m.RemoveNode("pg3") }); err != nil {
		t.Fatalf("removing the drained node: %v", err)
	}
}

func TestFaultsNodeStoppedMidMove(t *testing.T) {
	testenv.Faults(t) // stops PostgreSQL servers: make test's budget
	for _, which := range []string{"target", "source"} {
		t.Run(which, func(t *testing.T) {
			testenv.Exclusive(t)
			f := newFixture(t, 2, 2)
			seeded := f.seedRows("s", 100)
			ctx := context.Background()
			pgNode := f.pg.Nodes[1] // pg2, the target
			if which == "source" {
				pgNode = f.pg.Nodes[0]
			}
			mv := f.mover(Options{})
			var once sync.Once
			mv.opts.Progress = func(prog Progress) {
				msg := prog.Message
				if msg == topo.MoveCatchup {
					once.Do(func() {
						if err := pgNode.Stop(); err != nil {
							t.Error(err)
						}
					})
				}
			}
			rec, err := mv.Move(ctx, 0, "pg2", false)
			if err == nil {
				t.Fatalf("the move survived its %s being stopped: %+v", which, rec)
			}
			t.Logf("with the %s down: %v", which, err)
			if rec.State != topo.MoveAborting && rec.State != topo.MoveAborted {
				t.Fatalf("state %s after the %s stopped", rec.State, which)
			}
			if f.mapNow().Owner(0) != "pg1" {
				t.Fatal("ownership changed although the move failed")
			}
			if err := pgNode.Start(); err != nil {
				t.Fatal(err)
			}
			rec, err = f.mover(Options{}).Resume(ctx, rec.ID)
			if rec.State != topo.MoveAborted {
				t.Fatalf("resume after the %s came back: %v %s", which, err, rec.State)
			}
			f.checkClean(seeded)
		})
	}
}

// builtBin builds one command of this module once per test binary (go
// build with tags) and returns its path.
func builtBin(t *testing.T, cmd string, tags ...string) string {
	t.Helper()
	key := cmd + " " + strings.Join(tags, ",")
	binsMu.Lock()
	b := bins[key]
	if b == nil {
		b = &builtOnce{}
		bins[key] = b
	}
	binsMu.Unlock()
	b.once.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		dir, err := os.MkdirTemp("", cmd+"-migrate")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, cmd)
		args := []string{"build"}
		if len(tags) > 0 {
			args = append(args, "-tags", strings.Join(tags, ","))
		}
		args = append(args, "-o", b.path, filepath.Join(filepath.Dir(file), "..", "cmd", cmd))
		if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
			b.err = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

type builtOnce struct {
	once sync.Once
	path string
	err  error
}

var (
	binsMu sync.Mutex
	bins   = map[string]*builtOnce{}
)

// shardctlBin is shardctl with the failpoints that kill it at each step of
// a move.
func shardctlBin(t *testing.T) string { return builtBin(t, "shardctl", "failpoints") }

// The mover killed with SIGKILL on entering each step resumes or rolls back
// cleanly when a person runs `shardctl move resume`. (In make test-faults:
// TestFaultsWatcherHealsMoverKilledInEveryState kills it in every state
// too, and has the orphan watcher heal it.)
func TestFaultsMoverKilledAtEachStep(t *testing.T) {
	testenv.Faults(t)
	bin := shardctlBin(t)
	f := newFixture(t, 4, 2) // 16 buckets: pg1 0-7
	seeded := f.seedRows("s", 300)
	ctx := context.Background()
	// The killed mover's session is short so that its runner lock expires
	// soon after the kill, but not so short that it expires under a loaded
	// machine while the mover runs: a mover that loses its lock stops
	// (before the step it should be killed at).
	zkArgs := []string{"--zk", f.z.ConnectString, "--zk-root", f.z.Root, "--cluster", "mv", "--zk-session-timeout", "3s"}
	want := map[string]string{
		topo.MoveCopy: topo.MoveDone, topo.MoveCatchup: topo.MoveDone, topo.MoveFence: topo.MoveDone,
		// Inside the write pause the record still says fence (nothing is
		// saved there); the flip writes it with the map.
		topo.MoveBarrier: topo.MoveAborted, topo.MoveFlip: topo.MoveAborted, topo.MoveTeardown: topo.MoveDone, topo.MoveVerify: topo.MoveDone,
		// After the flip's ZooKeeper transaction, before the fences
		// follow: the resume brings them to the flip's version
		// (checkClean compares every fence with the map).
		crashFlipped: topo.MoveDone,
	}
	b := uint32(0)
	for _, state := range []string{topo.MoveCopy, topo.MoveCatchup, topo.MoveFence, topo.MoveBarrier, topo.MoveFlip, crashFlipped, topo.MoveTeardown, topo.MoveVerify} {
		cmd := exec.Command(bin, append(append([]string{}, zkArgs...), "move", fmt.Sprint(b), "--to", "pg2", "--window", "0")...)
		cmd.Env = append(os.Environ(), failpoint.Env+"="+failpointPrefix+state)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != -1 {
			t.Fatalf("crash at %s: the mover was not killed: %v\n%s", state, err, out)
		}
		var id string
		if err := topo.Sync(ctx, f.s, f.st.Paths()); err != nil {
			t.Fatal(err)
		}
		list, _ := f.mover(Options{}).List(ctx)
		for _, r := range list {
			if r.Bucket == b && !r.Finished() {
				id = r.ID
			}
		}
		if id == "" {
			t.Fatalf("crash at %s: no unfinished move record for bucket %d", state, b)
		}
		// Resume once the dead mover's session (and its lock) is gone.
		deadline := time.Now().Add(30 * time.Second)
		var rout []byte
		for {
			// Only the mover that gets killed needs a short session (so
			// that its lock expires quickly); the resuming one is normal.
			rout, err = exec.Command(bin, append(append([]string{}, zkArgs[:len(zkArgs)-2]...), "move", "resume", id)...).CombinedOutput()
			if err == nil || !strings.Contains(string(rout), "run by") || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		// The resume was another process: catch up with the leader before
		// reading what it wrote (a follower may not have it yet).
		if err := topo.Sync(ctx, f.s, f.st.Paths()); err != nil {
			t.Fatal(err)
		}
		rec, gerr := f.mover(Options{}).Get(ctx, id)
		if gerr != nil {
			t.Fatal(gerr)
		}
		if rec.State != want[state] {
			t.Fatalf("killed at %s, resumed to %s (want %s): %v\n%s\nfirst run:\n%s", state, rec.State, want[state], err, rout, out)
		}
		owner := f.mapNow().Owner(b)
		if (rec.State == topo.MoveDone) != (owner == "pg2") {
			t.Fatalf("killed at %s: move %s but bucket %d is on %s", state, rec.State, b, owner)
		}
		t.Logf("killed on entering %-8s -> %s", state, rec.State)
		f.checkClean(seeded)
		b++
	}
}

// A move that aborts cleanly (here: a router that never applies the map,
// with --on-straggler=abort) is retried by the rebalancer instead of
// stopping it.
func TestIntegrationRebalancerRetriesCleanAbort(t *testing.T) {
	f := parallelFixture(t, 2, 2)
	seeded := f.seedRows("s", 50)
	ctx := context.Background()
	stale, err := f.s.CreateEphemeral(ctx, f.st.Paths().Router("stuck-router"), []byte(`{"version":1,"id":"stuck-router","map_version":1}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.Update(ctx, func(m *bucketmap.Map) error { return m.Drain("pg2") }); err != nil {
		t.Fatal(err)
	}
	mv := f.mover(Options{MemberWait: 300 * time.Millisecond, OnStraggler: StragglerAbort})
	var once sync.Once
	mv.opts.Progress = func(prog Progress) {
		msg := prog.Message
		if msg == topo.MoveAborted {
			// The router catches up (to a version above any this test
			// reaches). Its going away would not do: a vanished record
			// counts for the mover's session timeout, past every retry.
			once.Do(func() { _ = stale.Set(ctx, []byte(`{"version":1,"id":"stuck-router","map_version":1099511627776}`)) })
		}
	}
	rb := NewRebalancer(mv, bucketmap.Policy{})
	rb.Backoff = 10 * time.Millisecond
	rep, err := rb.Run(ctx)
	if err != nil {
		t.Fatalf("rebalancer gave up: %v", err)
	}
	aborted, done := 0, 0
	for _, r := range rep.Moves {
		switch r.State {
		case topo.MoveAborted:
			aborted++
			if !strings.Contains(r.Error, "stuck-router") {
				t.Fatalf("abort reason %q does not name the lagging member", r.Error)
			}
		case topo.MoveDone:
			done++
		}
	}
	if aborted != 1 || done != 2 || f.mapNow().Counts()["pg2"] != 0 {
		t.Fatalf("%d aborted, %d done, counts %v", aborted, done, f.mapNow().Counts())
	}
	f.checkClean(seeded)
}
