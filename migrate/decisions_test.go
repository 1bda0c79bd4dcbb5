package migrate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
	"github.com/shardvisor/shardvisor/zksession/memzk"
)

// The tests in this file check the mover's and the rebalancer's decisions
// that need only the topology: they run on the in-memory ZooKeeper, with
// db nodes whose DSNs point nowhere (a test that reached PostgreSQL would
// fail, which is the point: these decisions are made before any copy).

// memCluster is a cluster on an in-memory ZooKeeper.
type memCluster struct {
	srv *memzk.Server
	s   *zksession.Session
	st  *bucketmap.Store
}

func newMemCluster(t *testing.T, level, nodes int, tables ...topo.TableRecord) *memCluster {
	t.Helper()
	srv, s := zktest.Memory(t)
	ctx := context.Background()
	var ns []bucketmap.Node
	for i := range nodes {
		ns = append(ns, bucketmap.Node{ID: bucketmap.NodeID(fmt.Sprintf("pg%d", i+1)),
			DSN: fmt.Sprintf("postgres://nobody@127.0.0.1:1/pg%d?connect_timeout=1", i+1), Weight: 1, State: bucketmap.NodeActive})
	}
	m, err := bucketmap.New(level, ns, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateAll(ctx, "/t"); err != nil {
		t.Fatal(err)
	}
	c := &memCluster{srv: srv, s: s, st: bucketmap.NewStore(s, topo.MustPaths("/t", "mv"))}
	rec := topo.ClusterRecord{Version: topo.ClusterVersion, Name: "mv", Seed: seedHex, CreatedAt: time.Now().UTC(), Tables: tables}
	if err := c.st.Create(ctx, rec, m, bucketmap.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *memCluster) update(t *testing.T, edit func(m *bucketmap.Map) error) {
	t.Helper()
	if _, err := c.st.Update(context.Background(), edit); err != nil {
		t.Fatal(err)
	}
}

// A move that cannot be made is refused before a record exists.
func TestMoveRefusesBadRequests(t *testing.T) {
	c := newMemCluster(t, 2, 3, kvTable)
	ctx := context.Background()
	c.update(t, func(m *bucketmap.Map) error { return m.Drain("pg3") })
	mv := New(c.st, Options{})
	for _, tc := range []struct {
		b      uint32
		to     bucketmap.NodeID
		errHas string
	}{
		{9, "pg2", "out of range"},
		{0, "pg1", "already on pg1"},
		{0, "ghost", "unknown db node"},
		{0, "pg3", "buckets move only to active nodes"},
	} {
		if _, err := mv.Move(ctx, tc.b, tc.to, false); err == nil || !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("move %d to %s: %v, want %q", tc.b, tc.to, err, tc.errHas)
		}
	}
	bad := New(c.st, Options{OnStraggler: "ignore"})
	if _, err := bad.Move(ctx, 1, "pg1", false); err == nil || !strings.Contains(err.Error(), "on-straggler") {
		t.Errorf("a mover with a bad OnStraggler: %v", err)
	}
	if ids, err := topo.ListMoves(ctx, c.s, c.st.Paths()); err != nil || len(ids) != 0 {
		t.Fatalf("refused moves left records: %v %v", ids, err)
	}
}

// A cluster without sharded tables has nothing to copy: only --no-copy.
func TestMoveWithoutTablesNeedsNoCopy(t *testing.T) {
	c := newMemCluster(t, 1, 2)
	_, err := New(c.st, Options{}).Move(context.Background(), 0, "pg2", false)
	if err == nil || !strings.Contains(err.Error(), "use --no-copy") || hint.Of(err) != "shardctl table add" {
		t.Fatalf("move without tables: %v (hint %q)", err, hint.Of(err))
	}
}

// A bucket with an unfinished move, or marked moving, takes no second one.
func TestMoveRefusesASecondMoveOfABucket(t *testing.T) {
	c := newMemCluster(t, 1, 2, kvTable)
	ctx := context.Background()
	p := c.st.Paths()
	m, _, _ := c.st.Load(ctx)
	owner := m.Owner(0)
	other := bucketmap.NodeID("pg1")
	if owner == other {
		other = "pg2"
	}
	rec := &topo.MoveRecord{Version: topo.MoveVersion, ID: "b0-old", Bucket: 0, Level: m.Level, State: topo.MoveCopy,
		Source: string(owner), Target: string(other), CreatedAt: time.Now().UTC(), UpdatedAt: time.Now().UTC()}
	if err := topo.CreateMove(ctx, c.s, p, rec); err != nil {
		t.Fatal(err)
	}
	_, err := New(c.st, Options{}).Move(ctx, 0, other, false)
	if err == nil || !strings.Contains(err.Error(), "unfinished move b0-old") || !strings.Contains(hint.Of(err), "shardctl move resume b0-old") {
		t.Fatalf("second move of bucket 0: %v (hint %q)", err, hint.Of(err))
	}
	// Bucket 1 marked moving (by a mover that created no record yet).
	to := bucketmap.NodeID("pg1")
	if m.Owner(1) == to {
		to = "pg2"
	}
	c.update(t, func(m *bucketmap.Map) error {
		return m.SetMoving(bucketmap.Bucket{Prefix: 1, Depth: m.Level}, to, "b1-x")
	})
	if _, err := New(c.st, Options{}).Move(ctx, 1, to, false); err == nil || !strings.Contains(err.Error(), "already moving to "+string(to)+" (move b1-x)") {
		t.Fatalf("move of a bucket marked moving: %v", err)
	}
}

// The rebalancer refuses to move while paused, while a node is down, and
// while its session is not connected, saying what to do; on a balanced map
// it does nothing.
func TestRebalancerRefusals(t *testing.T) {
	t.Parallel()
	c := newMemCluster(t, 2, 2, kvTable)
	ctx := context.Background()
	rb := NewRebalancer(New(c.st, Options{}), bucketmap.Policy{})
	rep, err := rb.Run(ctx)
	if err != nil || !rep.Balanced || len(rep.Moves) != 0 {
		t.Fatalf("balanced map: %+v %v", rep, err)
	}

	if err := rb.Pause(ctx, "checking a mismatch"); err != nil {
		t.Fatal(err)
	}
	if st, err := rb.State(ctx); err != nil || st == nil || !st.Paused || st.Reason != "checking a mismatch" {
		t.Fatalf("state after pause: %+v %v", st, err)
	}
	if _, err := rb.Run(ctx); !errors.Is(err, ErrPaused) || !strings.Contains(hint.Of(err), "shardctl rebalance --resume") {
		t.Fatalf("run while paused: %v (hint %q)", err, hint.Of(err))
	}
	if err := rb.Resume(ctx); err != nil {
		t.Fatal(err)
	}

	conn, err := c.srv.ConnOf(c.s.SessionID())
	if err != nil {
		t.Fatal(err)
	}
	conn.Disconnect()
	testenv.WaitFor(t, 20*time.Second, func() bool { return c.s.State() != zksession.StateConnected }, "the session to notice")
	// The map is cached nowhere: the load itself may time out first.
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := rb.Run(sctx); err == nil {
		t.Fatal("the rebalancer ran while its session was cut off")
	}
	conn.Reconnect()
	testenv.WaitFor(t, 20*time.Second, func() bool { return c.s.State() == zksession.StateConnected }, "reconnection")
	if rep, err := rb.Run(ctx); err != nil || !rep.Balanced {
		t.Fatalf("after reconnecting: %+v %v", rep, err)
	}

	// Last: a node marked down leaves its buckets with the others, so the
	// map is no longer balanced once it comes back.
	c.update(t, func(m *bucketmap.Map) error { _, err := m.MarkDown("pg2"); return err })
	if _, err := rb.Run(ctx); !errors.Is(err, ErrNodeDown) || !strings.Contains(err.Error(), "pg2") || !strings.Contains(hint.Of(err), "shardctl node up pg2") {
		t.Fatalf("run with a node down: %v (hint %q)", err, hint.Of(err))
	}
}

// With AutoSplit the rebalancer splits a map too small for its nodes before
// planning moves, through the map's compare-and-swap.
func TestRebalancerPlanSplitsFirst(t *testing.T) {
	c := newMemCluster(t, 1, 2, kvTable)
	rb := NewRebalancer(New(c.st, Options{}), bucketmap.Policy{AutoSplit: true, MinBucketsPerNode: 4})
	p, err := rb.Plan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if p.Splits != 2 || p.Level != 3 {
		t.Fatalf("plan for 2 buckets on 2 nodes wanting 4 each: %d splits to level %d, want 2 to level 3", p.Splits, p.Level)
	}
}

// RunForever waits while another rebalancer holds the lock (naming it), is
// elected when it goes, and when its session expires stops being the
// rebalancer (a rebalancer that may no longer be the only one stops
// moving), says so, and stands for election again with its new session:
// it never exits on its own.
func TestRebalancerSurvivesItsSessionExpiring(t *testing.T) {
	t.Parallel()
	c := newMemCluster(t, 1, 2, kvTable)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	other := zktest.MemorySession(t, c.srv, zksession.Config{})
	held, err := topo.LockRebalance(ctx, other, c.st.Paths(), []byte("other-host-1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var said []string
	count := func(sub string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, s := range said {
			if strings.Contains(s, sub) {
				n++
			}
		}
		return n
	}
	rb := NewRebalancer(New(c.st, Options{}), bucketmap.Policy{})
	rb.Progress = func(prog Progress) {
		mu.Lock()
		said = append(said, prog.Message)
		mu.Unlock()
	}
	done := make(chan error, 1)
	go func() { done <- rb.RunForever(ctx) }()
	testenv.WaitFor(t, 10*time.Second, func() bool { return count("another rebalancer (other-host-1) is running") > 0 }, "the waiting message")
	if count("elected") > 0 {
		t.Fatal("elected while another rebalancer held the lock")
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, func() bool { return count("elected as the cluster's rebalancer") == 1 }, "election")
	conn, err := c.srv.ConnOf(c.s.SessionID())
	if err != nil {
		t.Fatal(err)
	}
	conn.Expire()
	testenv.WaitFor(t, 10*time.Second, func() bool { return count("not the rebalancer any more") > 0 }, "the lost-lock message")
	testenv.WaitFor(t, 20*time.Second, func() bool { return count("elected as the cluster's rebalancer") == 2 }, "a second election")
	select {
	case err := <-done:
		t.Fatalf("RunForever returned after its session expired: %v", err)
	default:
	}
	holder, _, err := other.Get(ctx, c.st.Paths().RebalanceLock())
	if err != nil || !strings.Contains(string(holder), rb.mv.runner) {
		t.Fatalf("lock after the second election: %q %v", holder, err)
	}
	cancel()
	if err := testenv.Receive(t, done, 10*time.Second, "RunForever after its context ended"); !errors.Is(err, context.Canceled) {
		t.Fatalf("RunForever after cancel: %v", err)
	}
}

// The record tells whether a move is past its flip and whether a write
// pause is open; those decide between rolling back and finishing.
func TestPastFlipAndPauseOpen(t *testing.T) {
	at := time.Unix(1700000000, 0).UTC()
	for _, tc := range []struct {
		name            string
		rec             topo.MoveRecord
		past, open      bool
		frozen, frozen2 bool
	}{
		{name: "copying", rec: topo.MoveRecord{State: topo.MoveCopy}},
		{name: "frozen, not flipped", rec: topo.MoveRecord{State: topo.MoveFence, FreezeStartedAt: &at}, open: true, frozen: true},
		{name: "flip saved", rec: topo.MoveRecord{State: topo.MoveFlip, FreezeStartedAt: &at, FlipVersion: 7}, past: true, frozen: true},
		{name: "pause ended", rec: topo.MoveRecord{State: topo.MoveFence, FreezeStartedAt: &at, PauseEndedAt: &at}},
		{name: "verifying", rec: topo.MoveRecord{State: topo.MoveVerify, FreezeStartedAt: &at, PauseEndedAt: &at}, past: true},
		{name: "done", rec: topo.MoveRecord{State: topo.MoveDone, FreezeStartedAt: &at}, past: true},
		{name: "aborted", rec: topo.MoveRecord{State: topo.MoveAborted, FreezeStartedAt: &at}},
	} {
		if got := pastFlip(&tc.rec); got != tc.past {
			t.Errorf("%s: pastFlip %v, want %v", tc.name, got, tc.past)
		}
		if got := pauseOpen(&tc.rec); got != tc.open {
			t.Errorf("%s: pauseOpen %v, want %v", tc.name, got, tc.open)
		}
		if _, got := FrozenSince(&tc.rec); got != tc.frozen {
			t.Errorf("%s: FrozenSince %v, want %v", tc.name, got, tc.frozen)
		}
	}
}

func TestCheckOnStraggler(t *testing.T) {
	for _, ok := range []string{StragglerProceed, StragglerAbort} {
		if err := CheckOnStraggler(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	if err := CheckOnStraggler("wait"); err == nil || !strings.Contains(err.Error(), `"wait"`) {
		t.Errorf("wait: %v", err)
	}
}

// Only a flip whose answer was lost waits for ZooKeeper: a session that was
// not connected refused it before sending, and a server's refusal applied
// nothing; both thaw the source at once.
func TestFlipOutcomeUnknown(t *testing.T) {
	for _, tc := range []struct {
		err     error
		unknown bool
	}{
		{&zksession.OpError{Op: "multi", Path: "/m", Err: zksession.ErrConnection}, true},
		{&zksession.OpError{Op: "multi", Path: "/m", Err: zksession.ErrTimeout}, true},
		{context.Canceled, true},
		{fmt.Errorf("wrapped: %w", context.DeadlineExceeded), true},
		{&zksession.OpError{Op: "multi", Path: "/m", Err: zksession.ErrNotConnected}, false},
		{&zksession.OpError{Op: "multi", Path: "/m", Err: zksession.ErrBadVersion}, false},
		{bucketmap.ErrConflict, false},
		{errors.New("bucket 0 is no longer in this move's write pause"), false},
	} {
		if got := flipOutcomeUnknown(tc.err); got != tc.unknown {
			t.Errorf("flipOutcomeUnknown(%v) = %v, want %v", tc.err, got, tc.unknown)
		}
	}
}
