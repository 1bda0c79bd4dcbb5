package migrate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// More decisions of the mover, the rebalancer and the orphan watcher on
// the in-memory ZooKeeper (memCluster, decisions_test.go): every db node's
// DSN points at 127.0.0.1:1, so a step that reaches PostgreSQL fails at
// once and the test sees what the mover decides then.

// record creates a move record of bucket b from its owner to another node,
// in state, edited by edit (nil: none), and returns it.
func (c *memCluster) record(t *testing.T, id string, b uint32, state string, edit func(*topo.MoveRecord)) *topo.MoveRecord {
	t.Helper()
	m := mustLoad(t, c)
	lo, hi, err := keystream.Range(m.Level, b)
	if err != nil {
		t.Fatal(err)
	}
	src := m.Owner(b)
	now := time.Now().UTC()
	name := objectPrefix + strings.ReplaceAll(id, "-", "_")
	rec := &topo.MoveRecord{Version: topo.MoveVersion, ID: id, Bucket: b, Level: m.Level, Lo: lo, Hi: hi,
		Source: string(src), Target: string(otherThan(m, src)), State: state, Tables: []topo.TableRecord{kvTable},
		Publication: name, Subscription: name, Slot: name, StartVersion: m.Version, CreatedAt: now, UpdatedAt: now,
		Steps: []topo.MoveStep{{State: topo.MovePrepare, At: now}}, Runner: "dead-host-1"}
	if state != topo.MovePrepare {
		rec.Steps = append(rec.Steps, topo.MoveStep{State: state, At: now})
	}
	if edit != nil {
		edit(rec)
	}
	if err := topo.CreateMove(context.Background(), c.s, c.st.Paths(), rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// otherThan is the first node of m that is not n.
func otherThan(m *bucketmap.Map, n bucketmap.NodeID) bucketmap.NodeID {
	for _, x := range m.Nodes() {
		if x.ID != n {
			return x.ID
		}
	}
	return ""
}

func mustLoad(t *testing.T, c *memCluster) *bucketmap.Map {
	t.Helper()
	m, _, err := c.st.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// stored is a move record's bytes and znode version, to check that a
// decision left it alone.
func (c *memCluster) stored(t *testing.T, id string) string {
	t.Helper()
	data, ver, err := topo.ReadMoveData(context.Background(), c.s, c.st.Paths(), id)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s@%d", data, ver)
}

func (c *memCluster) mustGet(t *testing.T, id string) *topo.MoveRecord {
	t.Helper()
	rec, _, err := topo.ReadMove(context.Background(), c.s, c.st.Paths(), id)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// runnerHeld says whether a move's runner lock node exists.
func (c *memCluster) runnerHeld(t *testing.T, id string) bool {
	t.Helper()
	ok, _, err := c.s.Exists(context.Background(), c.st.Paths().MoveRunner(id))
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// A move id with no record is refused by every entry point, naming it.
func TestUnknownMoveIsNamed(t *testing.T) {
	c := newMemCluster(t, 1, 2, kvTable)
	ctx := context.Background()
	mv := New(c.st, Options{})
	const id = "b1-l1-v1-nosuch"
	if _, err := mv.Get(ctx, id); !errors.Is(err, zksession.ErrNoNode) || !strings.Contains(err.Error(), id) {
		t.Errorf("Get: %v", err)
	}
	for name, call := range map[string]func() (*topo.MoveRecord, error){
		"resume": func() (*topo.MoveRecord, error) { return mv.Resume(ctx, id) },
		"abort":  func() (*topo.MoveRecord, error) { return mv.Abort(ctx, id, "x") },
		"after-failure": func() (*topo.MoveRecord, error) {
			rec, _, err := mv.AbortAfterFailure(ctx, id)
			return rec, err
		},
	} {
		rec, err := call()
		if rec != nil || !errors.Is(err, zksession.ErrNoNode) || !strings.HasPrefix(err.Error(), "move "+id+": ") {
			t.Errorf("%s: %+v %v", name, rec, err)
		}
	}
	if ids, err := topo.ListMoves(ctx, c.s, c.st.Paths()); err != nil || len(ids) != 0 {
		t.Fatalf("records after refusals: %v %v", ids, err)
	}
}

// List returns records oldest first; one unreadable record makes List,
// a new move and the rebalancer fail, naming its znode, before anything
// is created or planned.
func TestListOrderAndMalformedRecord(t *testing.T) {
	c := newMemCluster(t, 2, 2, kvTable)
	ctx := context.Background()
	p := c.st.Paths()
	base := time.Now().UTC().Add(-time.Hour)
	for i, id := range []string{"a-newest", "b-oldest", "c-middle"} {
		at := base.Add([]time.Duration{3, 1, 2}[i] * time.Minute)
		c.record(t, id, uint32(i), topo.MoveDone, func(r *topo.MoveRecord) { r.CreatedAt = at })
	}
	mv := New(c.st, Options{})
	list, err := mv.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range list {
		got = append(got, r.ID)
	}
	if want := []string{"b-oldest", "c-middle", "a-newest"}; !slices.Equal(got, want) {
		t.Fatalf("List order %v, want %v", got, want)
	}

	if err := c.s.Create(ctx, p.Move("zz-bad"), []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	_, err = mv.List(ctx)
	var re *topo.RecordError
	if !errors.As(err, &re) || !errors.Is(err, topo.ErrMalformed) || re.Path != p.Move("zz-bad") {
		t.Fatalf("List with a malformed record: %v", err)
	}
	m := mustLoad(t, c)
	if _, err := mv.Move(ctx, 3, otherThan(m, m.Owner(3)), false); !errors.Is(err, topo.ErrMalformed) {
		t.Fatalf("Move with a malformed record: %v", err)
	}
	c.update(t, func(m *bucketmap.Map) error { return m.Drain("pg2") })
	rep, err := NewRebalancer(mv, bucketmap.Policy{}).Run(ctx)
	if !errors.Is(err, topo.ErrMalformed) || len(rep.Resumed) != 0 || len(rep.Moves) != 0 {
		t.Fatalf("Run with a malformed record: %+v %v", rep, err)
	}
	if ids, _ := topo.ListMoves(ctx, c.s, p); len(ids) != 4 {
		t.Fatalf("records now %v, want the 4 written", ids)
	}
}

// Resume, Abort and AbortAfterFailure of a move whose runner lock another
// session holds return ErrBusy naming the holder and leave the record and
// the lock alone; once the lock goes, a resume runs it.
func TestBusyMoveIsLeftAlone(t *testing.T) {
	c := newMemCluster(t, 1, 2, kvTable)
	ctx := context.Background()
	const id = "b0-busy"
	c.record(t, id, 0, topo.MoveCopy, nil)
	other := zktest.MemorySession(t, c.srv, zksession.Config{})
	held, err := topo.LockMoveRunner(ctx, other, c.st.Paths(), id, "other-host-7")
	if err != nil {
		t.Fatal(err)
	}
	mv := New(c.st, Options{})
	before := c.stored(t, id)
	_, err1 := mv.Resume(ctx, id)
	_, err2 := mv.Abort(ctx, id, "operator")
	_, _, err3 := mv.AbortAfterFailure(ctx, id)
	for _, err := range []error{err1, err2, err3} {
		if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "run by other-host-7") {
			t.Errorf("%v, want ErrBusy naming other-host-7", err)
		}
	}
	if after := c.stored(t, id); after != before {
		t.Errorf("record changed by refused calls:\n%s\n%s", before, after)
	}
	if !c.runnerHeld(t, id) {
		t.Error("its holder's lock was removed")
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := mv.Resume(ctx, id)
	if errors.Is(err, ErrBusy) || rec == nil || rec.State != topo.MoveAborting {
		t.Fatalf("resume after the holder left: %+v %v", rec, err)
	}
	if c.runnerHeld(t, id) {
		t.Fatal("the resume kept the runner lock after returning")
	}
}

// A finished move is returned as it is by Resume and Abort, even while
// another session holds its runner node; AbortAfterFailure refuses it.
func TestFinishedMoveIsReturnedUnchanged(t *testing.T) {
	c := newMemCluster(t, 1, 2, kvTable)
	ctx := context.Background()
	c.record(t, "b0-done", 0, topo.MoveDone, nil)
	c.record(t, "b1-aborted", 1, topo.MoveAborted, func(r *topo.MoveRecord) { r.Error = "first cause" })
	other := zktest.MemorySession(t, c.srv, zksession.Config{})
	if _, err := topo.LockMoveRunner(ctx, other, c.st.Paths(), "b0-done", "other-host-2"); err != nil {
		t.Fatal(err)
	}
	mv := New(c.st, Options{})
	for _, id := range []string{"b0-done", "b1-aborted"} {
		before := c.stored(t, id)
		want := c.mustGet(t, id)
		for name, call := range map[string]func() (*topo.MoveRecord, error){
			"resume": func() (*topo.MoveRecord, error) { return mv.Resume(ctx, id) },
			"abort":  func() (*topo.MoveRecord, error) { return mv.Abort(ctx, id, "another cause") },
		} {
			rec, err := call()
			if err != nil || rec == nil || rec.State != want.State || rec.Error != want.Error {
				t.Errorf("%s %s: %+v %v, want it as it was", name, id, rec, err)
			}
		}
		if _, _, err := mv.AbortAfterFailure(ctx, id); err == nil || !strings.Contains(err.Error(), "is "+want.State+", not failed") {
			t.Errorf("after-failure of %s: %v", id, err)
		}
		if after := c.stored(t, id); after != before {
			t.Errorf("%s changed:\n%s\n%s", id, before, after)
		}
	}
}

// Abort refuses a failed move (pointing at --after-failure) and a move past
// its flip (pointing at resume); Resume of a failed move repeats its error;
// AbortAfterFailure refuses a move that did not fail and a failed move the
// map no longer agrees with; none touches the record or keeps the lock.
func TestAbortAndResumeRefusals(t *testing.T) {
	c := newMemCluster(t, 2, 3, kvTable)
	ctx := context.Background()
	m := mustLoad(t, c)
	c.record(t, "b0-failed", 0, topo.MoveFailed, func(r *topo.MoveRecord) { r.Error = "verification mismatch: app.kv"; r.FlipVersion = 3 })
	c.record(t, "b1-flipped", 1, topo.MoveFlip, func(r *topo.MoveRecord) { r.FlipVersion = 4 })
	c.record(t, "b2-teardown", 2, topo.MoveTeardown, nil)
	c.record(t, "b3-copy", 3, topo.MoveCopy, nil)
	c.record(t, "b2-oldlevel", 2, topo.MoveFailed, func(r *topo.MoveRecord) { r.Level = 1; r.Bucket = 1 })
	// A failed move of bucket 3 whose map owner is neither of its nodes.
	from := otherThan(m, m.Owner(3))
	var to bucketmap.NodeID
	for _, n := range m.Nodes() {
		if n.ID != m.Owner(3) && n.ID != from {
			to = n.ID
		}
	}
	c.record(t, "b3-elsewhere", 3, topo.MoveFailed, func(r *topo.MoveRecord) { r.Source, r.Target = string(from), string(to) })

	mv := New(c.st, Options{})
	abort := func(id string) error { _, err := mv.Abort(ctx, id, "x"); return err }
	resume := func(id string) error { _, err := mv.Resume(ctx, id); return err }
	afterFailure := func(id string) error { _, _, err := mv.AbortAfterFailure(ctx, id); return err }
	for _, tc := range []struct {
		id   string
		call func(id string) error
		has  []string
		hint string // in the error's hint (what to run)
	}{
		{"b0-failed", abort, []string{"failed after its flip", "verification mismatch"}, "shardctl move abort b0-failed --after-failure"},
		{"b0-failed", resume, []string{"move b0-failed failed: verification mismatch: app.kv"}, ""},
		{"b1-flipped", abort, []string{"past its flip (flip)"}, "shardctl move resume b1-flipped"},
		{"b2-teardown", abort, []string{"past its flip (teardown)"}, ""},
		{"b3-copy", afterFailure, []string{"is copy, not failed"}, "shardctl move abort b3-copy"},
		{"b2-oldlevel", afterFailure, []string{"the map was split since", "bucket 1/1 is split further"}, ""},
		{"b3-elsewhere", afterFailure, []string{"owned by " + string(m.Owner(3)) + " now, neither"}, ""},
	} {
		before := c.stored(t, tc.id)
		err := tc.call(tc.id)
		for _, s := range tc.has {
			if err == nil || !strings.Contains(err.Error(), s) {
				t.Errorf("%s: %v, want %q", tc.id, err, s)
			}
		}
		if h := hint.Of(err); !strings.Contains(h, tc.hint) || strings.Contains(err.Error(), "shardctl") {
			t.Errorf("%s: hint %q, want %q (and none in the message: %v)", tc.id, h, tc.hint, err)
		}
		if after := c.stored(t, tc.id); after != before {
			t.Errorf("%s: record changed:\n%s\n%s", tc.id, before, after)
		}
		if c.runnerHeld(t, tc.id) {
			t.Errorf("%s: runner lock left behind", tc.id)
		}
	}
}

// A move whose record names an unknown state stops with an error naming it
// and is not rolled back.
func TestResumeOfUnknownStateRollsNothingBack(t *testing.T) {
	c := newMemCluster(t, 1, 2, kvTable)
	c.record(t, "b0-future", 0, "rebase", nil)
	before := c.stored(t, "b0-future")
	_, err := New(c.st, Options{}).Resume(context.Background(), "b0-future")
	if err == nil || !strings.Contains(err.Error(), `move b0-future: unknown state "rebase"`) {
		t.Fatalf("resume of an unknown state: %v", err)
	}
	if after := c.stored(t, "b0-future"); after != before {
		t.Fatalf("record changed:\n%s\n%s", before, after)
	}
}

// A move to a target that does not answer is rolled back as far as it can
// be: it stays aborting, its error names the node and the command to run,
// the map is unchanged and not moving, a second move of the bucket is
// refused, and a later abort keeps the first cause.
func TestMoveToUnreachableTargetStaysAborting(t *testing.T) {
	c := newMemCluster(t, 1, 2, kvTable)
	ctx := context.Background()
	m0 := mustLoad(t, c)
	src := m0.Owner(0)
	to := otherThan(m0, src)
	mv := New(c.st, Options{})
	rec, err := mv.Move(ctx, 0, to, false)
	if rec == nil {
		t.Fatalf("no record: %v", err)
	}
	id := rec.ID
	for _, s := range []string{"target unreachable", "db node " + string(to), "the cleanup is incomplete"} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("move error %v, want %q", err, s)
		}
	}
	if want := "run `shardctl move resume " + id + "` when the nodes answer"; hint.Of(err) != want {
		t.Errorf("move error's hint %q, want %q", hint.Of(err), want)
	}
	got := c.mustGet(t, id)
	if got.State != topo.MoveAborting || !strings.HasPrefix(got.Error, "target: db node "+string(to)) || got.FenceVersion != 0 {
		t.Fatalf("record after the failed move: state %s, error %q, fence %d", got.State, got.Error, got.FenceVersion)
	}
	m := mustLoad(t, c)
	if m.Owner(0) != src || m.Meta(0).State == bucketmap.BucketMoving || len(m.NonActive()) != 0 {
		t.Fatalf("map after the failed move: owner %s, meta %+v, non-active %v", m.Owner(0), m.Meta(0), m.NonActive())
	}
	if _, err := mv.Move(ctx, 0, to, false); err == nil || !strings.Contains(err.Error(), "unfinished move "+id+" (aborting)") {
		t.Fatalf("second move of bucket 0: %v", err)
	}
	if rec, err := mv.Abort(ctx, id, "operator gave up"); err == nil || rec.State != topo.MoveAborting || rec.Error != got.Error {
		t.Fatalf("abort of an aborting move: %+v %v", rec, err)
	}
	if c.runnerHeld(t, id) {
		t.Fatal("runner lock left behind")
	}
}

// Run resumes unfinished moves (not failed ones) before planning: one it
// cannot finish stops it before any new move; one another mover holds is
// skipped and planning goes on.
func TestRebalancerResumesUnfinishedMovesFirst(t *testing.T) {
	c := newMemCluster(t, 2, 3, kvTable)
	ctx := context.Background()
	c.record(t, "b0-aborting", 0, topo.MoveAborting, func(r *topo.MoveRecord) { r.Error = "source: gone" })
	c.record(t, "b1-failed", 1, topo.MoveFailed, func(r *topo.MoveRecord) { r.FlipVersion = 2 })
	c.update(t, func(m *bucketmap.Map) error { return m.Drain("pg3") })
	rb := NewRebalancer(New(c.st, Options{}), bucketmap.Policy{})
	rep, err := rb.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "b0-aborting") || !strings.Contains(hint.Of(err), "shardctl move resume b0-aborting") {
		t.Fatalf("run with an aborting move it cannot finish: %v (hint %q)", err, hint.Of(err))
	}
	if !slices.Equal(rep.Resumed, []string{"b0-aborting"}) || len(rep.Moves) != 0 || rep.Balanced {
		t.Fatalf("report: %+v", rep)
	}
	if ids, _ := topo.ListMoves(ctx, c.s, c.st.Paths()); len(ids) != 2 {
		t.Fatalf("the rebalancer started moves behind an unfinished one: %v", ids)
	}

	other := zktest.MemorySession(t, c.srv, zksession.Config{})
	if _, err := topo.LockMoveRunner(ctx, other, c.st.Paths(), "b0-aborting", "other-host-3"); err != nil {
		t.Fatal(err)
	}
	c.update(t, func(m *bucketmap.Map) error { return m.Activate("pg3") })
	rep, err = rb.Run(ctx)
	if err != nil || !slices.Equal(rep.Resumed, []string{"b0-aborting"}) || !rep.Balanced {
		t.Fatalf("run with the aborting move busy elsewhere: %+v %v", rep, err)
	}
	if c.mustGet(t, "b0-aborting").State != topo.MoveAborting {
		t.Fatal("a busy move was touched")
	}
}

// Concurrent moves to targets that do not answer stop the rebalancer at
// once ("rebalancer stopped"), without retrying: they did not abort
// cleanly. Each move is left aborting, the map unchanged, and the next Run
// resumes before planning.
func TestRebalancerStopsWhenMovesCannotReachTargets(t *testing.T) {
	c := newMemCluster(t, 2, 4, kvTable)
	ctx := context.Background()
	c.update(t, func(m *bucketmap.Map) error {
		if err := m.Drain("pg1"); err != nil {
			return err
		}
		return m.Drain("pg2")
	})
	before := mustLoad(t, c)
	rb := NewRebalancer(New(c.st, Options{}), bucketmap.Policy{Concurrency: 2})
	rb.Attempts, rb.Backoff = 3, time.Millisecond
	var mu sync.Mutex
	var said []string
	rb.Progress = func(p Progress) { mu.Lock(); said = append(said, p.Message); mu.Unlock() }
	first, err := rb.Run(ctx)
	if err == nil || !strings.HasPrefix(err.Error(), "rebalancer stopped: ") || !strings.Contains(err.Error(), "target unreachable") {
		t.Fatalf("run: %v", err)
	}
	// Both moves it started are in its report, the one whose error did
	// not stop it too.
	if len(first.Moves) != 2 {
		t.Fatalf("the report lists %d of the 2 moves started", len(first.Moves))
	}
	mu.Lock()
	joined := strings.Join(said, "\n")
	mu.Unlock()
	if !strings.Contains(joined, "starting 2") || strings.Contains(joined, "retrying") {
		t.Fatalf("progress:\n%s", joined)
	}
	list, err := New(c.st, Options{}).List(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("records: %d %v", len(list), err)
	}
	var ids []string
	for _, r := range list {
		if r.State != topo.MoveAborting || (r.Source != "pg1" && r.Source != "pg2") || (r.Target != "pg3" && r.Target != "pg4") {
			t.Errorf("move %s %s -> %s is %s", r.ID, r.Source, r.Target, r.State)
		}
		ids = append(ids, r.ID)
	}
	after := mustLoad(t, c)
	if len(after.NonActive()) != 0 || !slices.Equal(after.OwnerIndexes(), before.OwnerIndexes()) {
		t.Fatalf("map changed: non-active %v", after.NonActive())
	}
	rep, err := rb.Run(ctx)
	if err == nil || len(rep.Resumed) != 1 || !slices.Contains(ids, rep.Resumed[0]) || len(rep.Moves) != 0 {
		t.Fatalf("second run: %+v %v", rep, err)
	}
}

// RunForever stops being the rebalancer when another session deletes its
// lock node (a person breaking it), says so, and takes the lock again
// rather than exit.
func TestRunForeverRetakesItsLockWhenItIsDeleted(t *testing.T) {
	t.Parallel()
	c := newMemCluster(t, 1, 2, kvTable)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rb := NewRebalancer(New(c.st, Options{}), bucketmap.Policy{})
	var elections, losses atomic.Int32
	rb.Progress = func(p Progress) {
		switch {
		case strings.Contains(p.Message, "elected"):
			elections.Add(1)
		case strings.Contains(p.Message, "not the rebalancer any more"):
			losses.Add(1)
		}
	}
	done := make(chan error, 1)
	go func() { done <- rb.RunForever(ctx) }()
	testenv.WaitFor(t, 10*time.Second, func() bool { return elections.Load() == 1 }, "election")
	other := zktest.MemorySession(t, c.srv, zksession.Config{})
	lockPath := c.st.Paths().RebalanceLock()
	if err := other.Delete(ctx, lockPath, zksession.AnyVersion); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, func() bool { return losses.Load() == 1 && elections.Load() == 2 }, "the loss, then a second election")
	if ok, _, err := other.Exists(ctx, lockPath); err != nil || !ok {
		t.Fatalf("lock node after the second election: exists %v %v", ok, err)
	}
	select {
	case err := <-done:
		t.Fatalf("RunForever returned: %v", err)
	default:
	}
}

// The orphan watcher reports a frozen bucket whose runner is gone
// (Metrics.OldestFrozen, the gauge), resumes its move, and keeps reporting
// it, retrying, while the nodes do not answer; the map stops marking the
// bucket moving; the report ends with the watcher.
func TestWatchOrphansReportsFrozenBucketWhileNodesAreDown(t *testing.T) {
	t.Parallel()
	c := newMemCluster(t, 1, 2, kvTable)
	m := mustLoad(t, c)
	frozeAt := time.Now().UTC().Add(-time.Minute)
	rec := c.record(t, "b0-orphan", 0, topo.MoveFence, func(r *topo.MoveRecord) {
		r.FenceVersion = m.Version + 1
		r.FreezeStartedAt = &frozeAt
		r.Steps = append(r.Steps[:1], topo.MoveStep{State: topo.MoveCopy, At: frozeAt}, topo.MoveStep{State: topo.MoveFence, At: frozeAt})
	})
	c.update(t, func(m *bucketmap.Map) error {
		return m.SetMoving(bucketmap.Bucket{Prefix: 0, Depth: m.Level}, bucketmap.NodeID(rec.Target), rec.ID)
	})
	reg := prometheus.NewRegistry()
	met := NewMetrics(reg)
	mv := New(c.st, Options{Metrics: met})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); mv.WatchOrphans(ctx) }()
	resumes := func(result string) float64 {
		return gathered(t, reg, "shardvisor_move_orphan_resumes_total", map[string]string{"result": result})
	}
	testenv.WaitFor(t, 20*time.Second, func() bool { return resumes("error") >= 2 }, "two failed resumes")
	if d := met.OldestFrozen(); d < time.Minute {
		t.Fatalf("OldestFrozen %v while the pause is still open, want >= 1m", d)
	}
	if g := gauge(t, reg, "shardvisor_move_frozen_bucket_oldest_seconds"); g < 60 {
		t.Fatalf("gauge %v, want >= 60", g)
	}
	got := c.mustGet(t, rec.ID)
	if got.State != topo.MoveAborting || got.PauseEndedAt != nil || !strings.Contains(got.Error, ErrPauseCap.Error()) {
		t.Fatalf("record: state %s, pause ended %v, error %q", got.State, got.PauseEndedAt, got.Error)
	}
	if after := mustLoad(t, c); after.Meta(0).State == bucketmap.BucketMoving || after.Owner(0) != bucketmap.NodeID(rec.Source) {
		t.Fatalf("map after the resume: %+v owner %s", after.Meta(0), after.Owner(0))
	}
	if n := resumes("finished"); n != 0 {
		t.Fatalf("%v resumes counted finished", n)
	}
	cancel()
	testenv.Receive(t, done, 10*time.Second, "WatchOrphans did not return")
	if d := met.OldestFrozen(); d != 0 {
		t.Fatalf("OldestFrozen %v after the watcher stopped", d)
	}
}

// The orphan watcher leaves a frozen move alone while another session holds
// its runner lock, and resumes it once that session expires.
func TestWatchOrphansWaitsForTheRunnerToGo(t *testing.T) {
	t.Parallel()
	c := newMemCluster(t, 1, 2, kvTable)
	frozeAt := time.Now().UTC().Add(-time.Second)
	rec := c.record(t, "b1-held", 1, topo.MoveFence, func(r *topo.MoveRecord) { r.FreezeStartedAt = &frozeAt })
	other := zktest.MemorySession(t, c.srv, zksession.Config{})
	if _, err := topo.LockMoveRunner(context.Background(), other, c.st.Paths(), rec.ID, "other-host-4"); err != nil {
		t.Fatal(err)
	}
	before := c.stored(t, rec.ID)
	reg := prometheus.NewRegistry()
	met := NewMetrics(reg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); New(c.st, Options{Metrics: met}).WatchOrphans(ctx) }()
	defer func() { cancel(); <-done }()
	// The gauge is set after the watcher saw the runner held: its decision.
	testenv.WaitFor(t, 10*time.Second, func() bool { return met.OldestFrozen() > 0 }, "the frozen bucket to be reported")
	if after := c.stored(t, rec.ID); after != before {
		t.Fatalf("a move held by another runner was touched:\n%s\n%s", before, after)
	}
	for _, r := range []string{"finished", "busy", "error"} {
		if n := gathered(t, reg, "shardvisor_move_orphan_resumes_total", map[string]string{"result": r}); n != 0 {
			t.Fatalf("%v resumes (%s) while the runner was held", n, r)
		}
	}
	conn, err := c.srv.ConnOf(other.SessionID())
	if err != nil {
		t.Fatal(err)
	}
	conn.Expire()
	testenv.WaitFor(t, 20*time.Second, func() bool { return c.mustGet(t, rec.ID).State == topo.MoveAborting }, "the watcher to resume the move")
}

// A pause written by one rebalancer is seen, and honoured, by a rebalancer
// on another session; that one's resume lets the first run again.
func TestPauseIsSharedAcrossSessions(t *testing.T) {
	c := newMemCluster(t, 1, 2, kvTable)
	ctx := context.Background()
	rb := NewRebalancer(New(c.st, Options{}), bucketmap.Policy{})
	if err := rb.Pause(ctx, "investigating move b3"); err != nil {
		t.Fatal(err)
	}
	s2 := zktest.MemorySession(t, c.srv, zksession.Config{})
	rb2 := NewRebalancer(New(bucketmap.NewStore(s2, c.st.Paths()), Options{}), bucketmap.Policy{})
	st, err := rb2.State(ctx)
	if err != nil || st == nil || !st.Paused || st.Reason != "investigating move b3" || st.Move != "" {
		t.Fatalf("state seen by another session: %+v %v", st, err)
	}
	if _, err := rb2.Run(ctx); !errors.Is(err, ErrPaused) || !strings.Contains(err.Error(), "investigating move b3") {
		t.Fatalf("run on another session while paused: %v", err)
	}
	if err := rb2.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if rep, err := rb.Run(ctx); err != nil || !rep.Balanced {
		t.Fatalf("run after the other session resumed: %+v %v", rep, err)
	}
	if st, err := rb.State(ctx); err != nil || st == nil || st.Paused {
		t.Fatalf("state after resume: %+v %v", st, err)
	}
}

// A move past its flip whose node is gone from the registry is never
// aborted (the target owns the bucket; topo.MoveTransitions has no way
// back): it stops where it is, records why and says how to finish it.
func TestPastFlipMoveWithoutItsNodeStops(t *testing.T) {
	c := newMemCluster(t, 1, 2, kvTable)
	c.record(t, "b0-gone", 0, topo.MoveTeardown, func(r *topo.MoveRecord) { r.Target = "pg9" })
	_, err := New(c.st, Options{}).Resume(context.Background(), "b0-gone")
	if err == nil || !strings.Contains(err.Error(), "target node pg9 is no longer in the registry") {
		t.Fatalf("resume past the flip without its target: %v", err)
	}
	if want := "add the node back (shardctl node add), then finish the move: shardctl move resume b0-gone"; hint.Of(err) != want {
		t.Errorf("hint %q, want %q", hint.Of(err), want)
	}
	got := c.mustGet(t, "b0-gone")
	if got.State != topo.MoveTeardown || !strings.Contains(got.Error, "pg9") {
		t.Fatalf("record: state %s, error %q", got.State, got.Error)
	}
}

// rebalance --watch says why it stopped, once, with what to run: the
// hint of a paused rebalancer (it was in the message before hints).
func TestRunForeverSaysWhatToRunWhenItStops(t *testing.T) {
	c := newMemCluster(t, 1, 2, kvTable)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rb := NewRebalancer(New(c.st, Options{}), bucketmap.Policy{})
	if err := rb.Pause(ctx, "investigating move b3"); err != nil {
		t.Fatal(err)
	}
	stops := make(chan string, 16)
	rb.Progress = func(p Progress) {
		if strings.HasPrefix(p.Message, "stopped: ") {
			stops <- p.Message
		}
	}
	done := make(chan error, 1)
	go func() { done <- rb.RunForever(ctx) }()
	msg := testenv.Receive(t, stops, 10*time.Second, "the watcher's stop")
	if !strings.Contains(msg, "investigating move b3") || !strings.Contains(msg, "shardctl rebalance --resume") {
		t.Errorf("stop message %q: want the reason and what to run", msg)
	}
	cancel()
	<-done
}
