package migrate

// A run: one move driven by this process, from its runner lock to its
// close; its record (save, enter, step) and its connections to the source
// and the target.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/failpoint"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// run is one move being driven by this process.
type run struct {
	mv  *Mover
	rec *topo.MoveRecord
	ver int32 // the record's znode version, for save's compare-and-swap
	// lock is the move's runner lock; unlock stops following it.
	lock   *zksession.Lock
	unlock context.CancelFunc

	runConns
	runPrepare
	runCopy
	runPause
	runVerify
	runWindow
	runPhases

	// cleaning: an abort runs, on whatever primaries the nodes have now.
	cleaning bool
}

// runConns are the run's nodes and its connections to them.
type runConns struct {
	src, dst bucketmap.Node
	srcConn  *pgx.Conn
	dstConn  *pgx.Conn
	// dstSpare is a second target connection opened before the freeze, so
	// that the write pause never waits for a connection (TCP + SCRAM).
	dstSpare *pgx.Conn
}

// runPrepare is what the prepare step leaves for the schema gate.
type runPrepare struct {
	// schemaEpoch is the schema epoch read before prepare compared the
	// schemas (topo.EnterMoveData checks it).
	schemaEpoch int32
	// comparedHere: this run compared the schemas in prepare and entered
	// copy through the schema gate.
	comparedHere bool
}

// runCopy is the forward stream's state: its markers and sequences.
type runCopy struct {
	// markerSeq numbers the run's markers (the lag probes' and the
	// barrier's); it starts at the time the run opened the move.
	markerSeq int64
	// seqs are the ascending PostgreSQL sequences the move's tables draw
	// from (sequences.go); nil until listed.
	seqs []string
	// slotTook is copyRange's time until every copy stream held the
	// slot's snapshot (topo.PhaseSlot).
	slotTook time.Duration
}

// runPause is the write pause's state (pause.go): fence, barrier, flip.
type runPause struct {
	frozenAt time.Time // zero if the freeze did not happen in this process
	// fenceMap is the map that set the bucket moving, with its znode
	// version: the flip's compare-and-swap starts from it instead of
	// reading ZooKeeper inside the write pause.
	fenceMap *bucketmap.Map
	fenceZV  int32
	// pendingOwn is the target's ownership, prepared before the freeze on
	// dstSpare and committed by the flip (rolled back by an abort).
	pendingOwn *fence.Pending
	// targetOwned: the target's fence owns the range at the flip's version.
	targetOwned bool
	// flipUnknown: the flip's ZooKeeper transaction was sent and no answer
	// says whether it was applied: the source must stay frozen until
	// ZooKeeper tells (awaitFlip).
	flipUnknown bool
	// thawedAt: this process ended the write pause without the flip
	// (thawInPause): the source owns the range again.
	thawedAt time.Time
	// reverseLSN is the target's WAL insert position read inside the
	// pause, for the flip to record (ReverseStream.StartLSN).
	reverseLSN string
	// undo is, in a rollback's run, the move it rolls back, read in the
	// fence step (with its znode version) for the flip's transaction.
	undo    *topo.MoveRecord
	undoVer int32
}

// runVerify holds the snapshots verification compares.
type runVerify struct {
	// verifyTx holds a snapshot of the target taken right after the
	// barrier, before the target accepts writes, so that verification
	// after the flip compares like with like. It exists only in the
	// process that passed the barrier.
	verifyTx pgx.Tx
	// verifyLost: the verification snapshot failed (its connection died).
	verifyLost bool
	// srcVerifyTx holds a snapshot of the source taken before the
	// reverse stream starts changing its range (on a connection of its
	// own, srcVerifyConn): verification compares it with verifyTx.
	srcVerifyConn *pgx.Conn
	srcVerifyTx   pgx.Tx
}

// runWindow is what the caller asked of the rollback window.
type runWindow struct {
	// completeNow: `move complete` ends the window at once; holdWindow:
	// `move rollback` drives a move to its window and keeps it there.
	completeNow, holdWindow bool
}

// pastFlip reports whether the map already gives the move's bucket to its
// target: the flip's ZooKeeper transaction set FlipVersion, or the record
// is in a later state. An in-memory flip state does not count: inside the
// write pause nothing is saved, and a failure there rolls back.
func pastFlip(rec *topo.MoveRecord) bool {
	if rec.FlipVersion != 0 {
		return true
	}
	switch rec.State {
	case topo.MoveTeardown, topo.MoveReverse, topo.MoveVerify, topo.MoveReversible, topo.MoveCompleting,
		topo.MoveDone, topo.MoveRolledBack, topo.MoveFailed:
		return true
	}
	return false
}

// open takes the move's runner lock and reads its record. The context it
// returns is cancelled if the lock is lost (the session was lost, so
// another mover may take the move over): from then on this run must not
// touch the move, and every call made with that context fails.
func (mv *Mover) open(ctx context.Context, id string) (*run, context.Context, error) {
	rec, ver, err := topo.ReadMove(ctx, mv.s, mv.p, id)
	if err != nil {
		if re := (*topo.RecordError)(nil); !errors.As(err, &re) {
			err = fmt.Errorf("move %s: %w", id, err)
		}
		return nil, nil, err
	}
	r := &run{mv: mv, rec: rec, ver: ver, runCopy: runCopy{markerSeq: time.Now().UnixNano()}}
	if rec.Finished() {
		return r, ctx, nil
	}
	lock, err := topo.LockMoveRunner(ctx, mv.s, mv.p, id, mv.runner)
	var le *zksession.LockedError
	switch {
	case errors.As(err, &le):
		return nil, nil, fmt.Errorf("%w: %s is run by %s (if that mover died, its ZooKeeper session expires within the session timeout)", ErrBusy, id, le.Holder)
	case errors.Is(err, zksession.ErrAlreadyHeld):
		return nil, nil, fmt.Errorf("%w: %s is run by this process (%s)", ErrBusy, id, mv.runner)
	case err != nil:
		return nil, nil, err
	}
	r.lock = lock
	mv.setRunning(id, true)
	ctx, r.unlock = lock.Context(ctx)
	return r, ctx, nil
}

// stopped turns the error of a run whose lock was lost into one that says
// so: nothing was rolled back, the move stays as its record says.
func (r *run) stopped(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); err != nil && errors.Is(cause, zksession.ErrLockLost) {
		return hint.New(fmt.Errorf("move %s stopped in %s: %w", r.rec.ID, r.rec.State, cause), "resume it: shardctl move resume "+r.rec.ID)
	}
	return err
}

func (r *run) close() {
	if _, open := FrozenSince(r.rec); !open {
		r.pauseGauge(false)
	}
	if r.pendingOwn != nil {
		r.pendingOwn.Rollback(context.Background())
	}
	if r.verifyTx != nil {
		r.verifyTx.Rollback(context.Background())
	}
	if r.srcVerifyTx != nil {
		r.srcVerifyTx.Rollback(context.Background())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if r.srcVerifyConn != nil {
		r.srcVerifyConn.Close(ctx)
	}
	if r.srcConn != nil {
		r.srcConn.Close(ctx)
	}
	if r.dstSpare != nil {
		r.dstSpare.Close(ctx)
	}
	if r.dstConn != nil {
		r.dstConn.Close(ctx)
	}
	if r.lock != nil {
		r.unlock()
		_ = r.lock.Release(ctx)
		r.mv.setRunning(r.rec.ID, false)
	}
}

// save writes the record by compare-and-swap: only the runner holding the
// lock writes it, so a conflict means something is badly wrong.
func (r *run) save(ctx context.Context) error {
	start := time.Now()
	defer func() { r.saved(time.Since(start)) }()
	r.rec.UpdatedAt = time.Now().UTC()
	r.rec.Runner = r.mv.runner
	ver, err := topo.UpdateMove(ctx, r.mv.s, r.mv.p, r.rec, r.ver)
	for attempt := 0; errors.Is(err, zksession.ErrNotConnected) && attempt < 3; attempt++ {
		// A suspended session usually comes back within its timeout:
		// wait for it rather than fail the move over a blip.
		wctx, cancel := context.WithTimeout(ctx, 2*r.mv.s.SessionTimeout())
		werr := r.mv.s.WaitConnected(wctx)
		cancel()
		if werr != nil {
			break
		}
		ver, err = topo.UpdateMove(ctx, r.mv.s, r.mv.p, r.rec, r.ver)
	}
	if err != nil {
		return fmt.Errorf("saving move %s: %w", r.rec.ID, err)
	}
	r.ver = ver
	return nil
}

// enter moves the record to state and saves it; a change the state table
// (topo.MoveTransitions) does not allow is refused, with nothing written.
func (r *run) enter(ctx context.Context, state string) error {
	if err := checkTransition(r.rec, state); err != nil {
		return err
	}
	r.leaving(state)
	r.rec.State = state
	r.rec.Steps = append(r.rec.Steps, topo.MoveStep{State: state, At: time.Now().UTC()})
	if err := r.save(ctx); err != nil {
		return err
	}
	r.progress(state)
	r.crashHook(state)
	return nil
}

// step enters a state inside the write pause without saving the record:
// the pause has no time for ZooKeeper writes. The record keeps saying
// fence until the flip writes it together with the map, so a mover that
// dies in between resumes in fence, finds the bucket moving, and rolls
// back (the pause could not be bounded), which is also what the barrier
// would do.
func (r *run) step(state string) error {
	if err := checkTransition(r.rec, state); err != nil {
		return err
	}
	r.leaving(state)
	r.rec.State = state
	r.rec.Steps = append(r.rec.Steps, topo.MoveStep{State: state, At: time.Now().UTC()})
	r.progress(state)
	r.crashHook(state)
	return nil
}

// checkTransition refuses a change of rec's state to state that the state
// table (topo.MoveTransitions) does not allow: a *topo.MoveTransitionError
// naming the move.
func checkTransition(rec *topo.MoveRecord, state string) error {
	err := topo.CheckMoveTransition(rec.State, state)
	if err == nil {
		return nil
	}
	if refusedTransition != nil {
		refusedTransition(rec.ID, err)
	}
	return fmt.Errorf("move %s: %w", rec.ID, err)
}

// refusedTransition, when set (by this package's tests, before they run),
// hears of every transition checkTransition refuses: a test run that
// drives moves through their paths then shows that the table allows
// every transition the mover takes.
var refusedTransition func(move string, err error)

// Failpoints (package internal/failpoint, in builds with -tags
// failpoints): "move:<state>" on entering each state; crashMoving right
// after the map says moving (before the member wait and the freeze); and
// crashFlipped right after the flip's ZooKeeper transaction, before the
// target's ownership is committed and the source's fence released. A test
// kills the mover at each of them and checks that a resume recovers.
const (
	failpointPrefix = "move:"
	crashMoving     = "moving"
	crashFlipped    = "flipped"
)

func (r *run) crashHook(state string) { failpoint.Inject(failpointPrefix + state) }

func (r *run) progress(msg string) {
	r.mv.log.Info("move "+msg, zap.String("move", r.rec.ID), zap.Uint32("bucket", r.rec.Bucket),
		zap.String("from", r.rec.Source), zap.String("to", r.rec.Target))
	if r.mv.opts.Progress != nil {
		r.mv.opts.Progress(Progress{Message: msg, Move: r.rec})
	}
}

func (r *run) nodes(ctx context.Context) (*bucketmap.Map, error) {
	m, _, err := r.mv.st.Load(ctx)
	if err != nil {
		return nil, err
	}
	var ok bool
	if r.src, ok = m.Node(bucketmap.NodeID(r.rec.Source)); !ok {
		return nil, fmt.Errorf("source node %s is no longer in the registry", r.rec.Source)
	}
	if r.dst, ok = m.Node(bucketmap.NodeID(r.rec.Target)); !ok {
		return nil, fmt.Errorf("target node %s is no longer in the registry", r.rec.Target)
	}
	return m, nil
}

func (r *run) source(ctx context.Context) (*pgx.Conn, error) {
	return r.conn(ctx, &r.srcConn, r.src, "source")
}

func (r *run) target(ctx context.Context) (*pgx.Conn, error) {
	return r.conn(ctx, &r.dstConn, r.dst, "target")
}

// conn returns the open connection in *slot, or opens a new one to node.
// Before the flip, a new connection that reaches another primary than the
// move began on (a failover: see topo.MoveServers) fails with
// ErrFailover, and the move aborts; the abort itself connects to
// whichever primary the node has now.
func (r *run) conn(ctx context.Context, slot **pgx.Conn, node bucketmap.Node, role string) (*pgx.Conn, error) {
	if *slot != nil && !(*slot).IsClosed() {
		return *slot, nil
	}
	c, err := dbnode.Connect(ctx, node)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", role, err)
	}
	// The fence changes and markers a move commits must be on a group's
	// synchronous standby before the move goes on, whatever the server's
	// default.
	if _, err := c.Exec(ctx, "SET synchronous_commit = on"); err != nil {
		c.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("%s: %w", role, err)
	}
	if want := r.recordedServer(role); want != "" && !r.cleaning && !pastFlip(r.rec) {
		inc, err := dbnode.Identify(ctx, c)
		if err != nil {
			c.Close(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("%s %s: identifying the server: %w", role, node.ID, err)
		}
		if now := inc.String(); now != want {
			c.Close(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("%w: the %s %s was %s when the move began, and is now %s", ErrFailover, role, node.ID, want, now)
		}
	}
	*slot = c
	return c, nil
}

// conns returns the source's and the target's connections.
func (r *run) conns(ctx context.Context) (src, dst *pgx.Conn, err error) {
	if src, err = r.source(ctx); err != nil {
		return nil, nil, err
	}
	if dst, err = r.target(ctx); err != nil {
		return nil, nil, err
	}
	return src, dst, nil
}

// sameServer checks that c still reaches the primary the move began on.
func (r *run) sameServer(ctx context.Context, c *pgx.Conn, role string) error {
	if r.recordedServer(role) == "" {
		return nil
	}
	inc, err := dbnode.Identify(ctx, c)
	return r.checkServer(inc, err, role)
}

// checkServer is sameServer's verdict on an identification (dbnode.Identify
// or QueueIdentify).
func (r *run) checkServer(inc dbnode.Incarnation, err error, role string) error {
	want := r.recordedServer(role)
	if want == "" {
		return nil
	}
	if err != nil {
		return err
	}
	if now := inc.String(); now != want {
		return fmt.Errorf("%w: the %s was %s when the move began, and is now %s", ErrFailover, role, want, now)
	}
	return nil
}

func (r *run) recordedServer(role string) string {
	if r.rec.Servers == nil {
		return ""
	}
	if role == "source" {
		return r.rec.Servers.Source
	}
	return r.rec.Servers.Target
}

// recordServers notes the primaries the move begins on, once.
func (r *run) recordServers(ctx context.Context, src, dst *pgx.Conn) error {
	if r.rec.Servers != nil {
		return nil
	}
	s := &topo.MoveServers{}
	if src != nil {
		inc, err := dbnode.Identify(ctx, src)
		if err != nil {
			return fmt.Errorf("source: identifying the server: %w", err)
		}
		s.Source = inc.String()
	}
	inc, err := dbnode.Identify(ctx, dst)
	if err != nil {
		return fmt.Errorf("target: identifying the server: %w", err)
	}
	s.Target = inc.String()
	r.rec.Servers = s
	return nil
}

// reached reports whether the move ever entered state.
func (r *run) reached(state string) bool {
	for _, st := range r.rec.Steps {
		if st.State == state {
			return true
		}
	}
	return false
}

// slot is the directory slot where the move's bucket begins in m: m.Meta
// of it is the bucket's state, or that of the bucket now covering its
// first keys if the map changed shape (then never this move's pause).
func (r *run) slot(m *bucketmap.Map) uint32 {
	lo, _ := recBucket(r.rec).Keys()
	return keystream.BucketOf(keystream.PrefixFromKey(lo), m.Level)
}

// groupInvolved: the source or the target is a Patroni group.
func (r *run) groupInvolved() bool {
	return !r.src.Patroni.IsZero() || !r.dst.Patroni.IsZero()
}

// slotOnSource: the move's slot is on the source (a source that failed
// over has none: DROP SUBSCRIPTION must then not try to drop it there).
// Unknown counts as there, as before.
func (r *run) slotOnSource(ctx context.Context, src *pgx.Conn) bool {
	if src == nil {
		return false
	}
	ok, err := slotExists(ctx, src, r.rec.Slot)
	return err != nil || ok
}
