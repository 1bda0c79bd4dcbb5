// Package migrate moves a bucket's rows between PostgreSQL db nodes online,
// and drives the planner's moves (the rebalancer).
//
// A move is a crash-safe state machine whose state lives in a ZooKeeper
// move record, advanced step by step; every step is idempotent, so a mover
// killed at any point resumes or rolls back cleanly when run again:
//
//	prepare   schemas compared (source vs target), target range marked
//	          incoming, leftovers cleared
//	copy      logical replication with a row filter on the bucket's key range
//	catchup   marker round trip below the lag threshold, else no fence
//	fence     map says moving; every router and supervisor has seen it,
//	          or Options.MemberWait ran out (the rest are recorded as
//	          stragglers); the source range is frozen (its writers drained)
//	barrier   a marker committed after the freeze is applied on the target
//	flip      target owns the range; the map gives it the bucket (CAS);
//	          the source releases it
//	teardown  subscription, publication and slot dropped
//	verify    row counts and checksums compared on both nodes
//
// The write pause runs from the freeze to the map flip. A move that cannot
// flip within Options.PauseCap is aborted: the source owns the range again
// and the target's partial copy is removed.
package migrate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/fleet"
	"github.com/shardvisor/shardvisor/internal/backoff"
	"github.com/shardvisor/shardvisor/internal/failpoint"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/ownership"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// Options tune moves.
type Options struct {
	// MaxLag is the replication delay (a marker's trip from source to
	// target) under which the mover may fence. Default 250 ms.
	MaxLag time.Duration
	// CatchupTimeout bounds the wait for the lag to fall. Default 5 min.
	CatchupTimeout time.Duration
	// CopyTimeout bounds the initial copy. Default 1 h.
	CopyTimeout time.Duration
	// PauseCap is the longest write pause allowed; a move that would pause
	// longer is aborted before its flip. Default 2 s.
	PauseCap time.Duration
	// MemberWait bounds the wait for every live router and supervisor to
	// apply the map that sets the bucket moving. Default 10 s.
	MemberWait time.Duration
	// OnStraggler is what a move does with the members that have not
	// applied that map when MemberWait runs out: StragglerProceed (the
	// default) or StragglerAbort.
	OnStraggler string
	// Metrics, if set, counts stragglers and times the member wait.
	Metrics *Metrics
	Logger  *zap.Logger
	// Progress, when set, receives a line per state and copy progress,
	// with the move's record.
	Progress func(Progress)
	// Window is how long a move keeps its reverse stream after a good
	// verification, so that `move rollback` can give the bucket back
	// with the writes made since the flip; 0 completes the move as soon
	// as it is verified (the stream still serves the automatic rollback
	// of a copy that differs). GC prunes the old owner's rows only after.
	Window time.Duration
	// AbortRetry bounds how long an abort retries a cleanup that failed
	// while both nodes answer (a fence change that hit its lock timeout
	// because a writer held a transaction open, say) before it leaves the
	// move aborting for a resume. Default 1 min.
	AbortRetry time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxLag <= 0 {
		o.MaxLag = 250 * time.Millisecond
	}
	if o.CatchupTimeout <= 0 {
		o.CatchupTimeout = 5 * time.Minute
	}
	if o.CopyTimeout <= 0 {
		o.CopyTimeout = time.Hour
	}
	if o.PauseCap <= 0 {
		o.PauseCap = 2 * time.Second
	}
	if o.MemberWait <= 0 {
		o.MemberWait = 10 * time.Second
	}
	if o.OnStraggler == "" {
		o.OnStraggler = StragglerProceed
	}
	if o.AbortRetry <= 0 {
		o.AbortRetry = time.Minute
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// What a move does with stragglers (Options.OnStraggler).
const (
	// StragglerProceed goes on without them: the fence refuses their
	// clients' writes to the old owner until they catch up (see
	// docs/moves.md, "Stragglers"), so one hung web head cannot stop every
	// move.
	StragglerProceed = "proceed"
	// StragglerAbort aborts the move, as movers did before the option.
	StragglerAbort = "abort"
)

// CheckOnStraggler says whether s is an Options.OnStraggler value.
func CheckOnStraggler(s string) error {
	if s != StragglerProceed && s != StragglerAbort {
		return fmt.Errorf("on-straggler %q is neither %q nor %q", s, StragglerProceed, StragglerAbort)
	}
	return nil
}

// Errors a caller can test for.
var (
	ErrVerifyMismatch = errors.New("verification found a difference between source and target")
	ErrPauseCap       = errors.New("the write pause would exceed its cap")
	ErrBusy           = errors.New("move is being run by another mover")
)

// Mover runs moves for one cluster.
type Mover struct {
	st     *bucketmap.Store
	s      *zksession.Session
	p      topo.Paths
	opts   Options
	log    *zap.Logger
	runner string

	viewMu sync.Mutex
	view   *fleet.MemberView // started by the first fence step; Close stops it

	// thawed holds when this process ended a move's write pause without
	// ZooKeeper (run.thawInPause), for the resume that records it.
	thawMu sync.Mutex
	thawed map[string]time.Time

	// running: moves whose runner lock a run of this process holds.
	runMu   sync.Mutex
	running map[string]bool
}

func (mv *Mover) setRunning(id string, on bool) {
	mv.runMu.Lock()
	defer mv.runMu.Unlock()
	if mv.running == nil {
		mv.running = map[string]bool{}
	}
	if on {
		mv.running[id] = true
	} else {
		delete(mv.running, id)
	}
}

// runs reports whether a run of this process holds move id's lock.
func (mv *Mover) runs(id string) bool {
	mv.runMu.Lock()
	defer mv.runMu.Unlock()
	return mv.running[id]
}

func (mv *Mover) noteThaw(id string, at time.Time) {
	mv.thawMu.Lock()
	defer mv.thawMu.Unlock()
	if mv.thawed == nil {
		mv.thawed = map[string]time.Time{}
	}
	mv.thawed[id] = at
}

func (mv *Mover) thawTime(id string) (time.Time, bool) {
	mv.thawMu.Lock()
	defer mv.thawMu.Unlock()
	t, ok := mv.thawed[id]
	return t, ok
}

// New returns a mover using the store's session.
func New(st *bucketmap.Store, opts Options) *Mover {
	opts = opts.withDefaults()
	host, _ := os.Hostname()
	return &Mover{st: st, s: st.Session(), p: st.Paths(), opts: opts, log: opts.Logger.With(zap.String("component", "mover")),
		runner: fmt.Sprintf("%s-%d", host, os.Getpid())}
}

// checkOptions refuses options that withDefaults cannot mend.
func (mv *Mover) checkOptions() error {
	if err := CheckOnStraggler(mv.opts.OnStraggler); err != nil {
		return fmt.Errorf("mover options: %w", err)
	}
	return nil
}

// Close stops following the cluster's members (the view the fence steps
// wait on). Moves run afterwards start a new one. Closing the session
// stops it too.
func (mv *Mover) Close() {
	mv.viewMu.Lock()
	defer mv.viewMu.Unlock()
	if mv.view != nil {
		mv.view.Close()
		mv.view = nil
	}
}

// members is the view of the members' applied map versions that the fence
// steps wait on. It lives as long as the Mover, not one wait: a rebalance
// runs many moves, one after another and side by side, and a view per wait
// would list and read all N member records and arm N watches for every
// move; this one does that once, then reads a record only when it changes.
// Between waits it costs little: members change their records when a map
// changes, which during a rebalance is mostly the moves' own doing, and the
// waits would read those changes anyway.
func (mv *Mover) members() *fleet.MemberView {
	mv.viewMu.Lock()
	defer mv.viewMu.Unlock()
	if mv.view == nil {
		mv.view = fleet.WatchMembers(context.Background(), mv.s, mv.p)
	}
	return mv.view
}

// run is one move being driven by this process.
type run struct {
	mv  *Mover
	rec *topo.MoveRecord
	ver int32
	// schemaEpoch is the schema epoch read before prepare compared the
	// schemas (topo.EnterMoveData checks it).
	schemaEpoch int32
	src, dst    bucketmap.Node
	srcConn     *pgx.Conn
	dstConn     *pgx.Conn
	// dstSpare is a second target connection opened before the freeze, so
	// that the write pause never waits for a connection (TCP + SCRAM).
	dstSpare *pgx.Conn
	// seqs are the ascending sequences the move's tables draw from
	// (sequences.go); nil until listed.
	seqs []string
	// verifyTx holds a snapshot of the target taken right after the
	// barrier, before the target accepts writes, so that verification
	// after the flip compares like with like. It exists only in the
	// process that passed the barrier.
	verifyTx pgx.Tx
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
	seq         int64
	// cleaning: an abort runs, on whatever primaries the nodes have now.
	cleaning bool
	// verifyLost: the verification snapshot failed (its connection died).
	verifyLost bool
	// flipUnknown: the flip's ZooKeeper transaction was sent and no answer
	// says whether it was applied: the source must stay frozen until
	// ZooKeeper tells (awaitFlip).
	flipUnknown bool
	// thawedAt: this process ended the write pause without the flip
	// (thawInPause): the source owns the range again.
	thawedAt time.Time
	// srcVerifyTx holds a snapshot of the source taken before the
	// reverse stream starts changing its range (on a connection of its
	// own, srcVerifyConn): verification compares it with verifyTx.
	srcVerifyConn *pgx.Conn
	srcVerifyTx   pgx.Tx
	// reverseLSN is the target's WAL insert position read inside the
	// pause, for the flip to record (ReverseStream.StartLSN).
	reverseLSN string
	// completeNow: `move complete` ends the window at once; holdWindow:
	// `move rollback` drives a move to its window and keeps it there.
	completeNow, holdWindow bool
	// undo is, in a rollback's run, the move it rolls back, read in the
	// fence step (with its znode version) for the flip's transaction.
	undo    *topo.MoveRecord
	undoVer int32
	lock    *zksession.Lock
	unlock  context.CancelFunc // stops following the lock
}

// Move creates a move of bucket to target and runs it to the end. With
// noCopy the rows are not copied: ownership changes after a short pause
// and the bucket is marked data-lost.
//
// A move aborted because the source's or the target's primary changed
// under it (a Patroni failover: the new primary has no replication slot,
// or may lack what the old one confirmed) is started again, as a new
// move on the new primaries, up to FailoverRetries times.
//
// Move names the bucket by its number on a map at one depth; MoveBucket
// names any bucket, at any depth.
func (mv *Mover) Move(ctx context.Context, bucket uint32, target bucketmap.NodeID, noCopy bool) (*topo.MoveRecord, error) {
	return mv.MoveBucket(ctx, bucketmap.Bucket{Prefix: bucket, Depth: bucketmap.AtLevel}, target, noCopy)
}

// recBucket is the bucket a move record names.
func recBucket(r *topo.MoveRecord) bucketmap.Bucket {
	return bucketmap.Bucket{Prefix: r.Bucket, Depth: r.Level}
}

// MoveBucket is Move for any bucket of the map, at any depth: a move of
// one half of a split bucket copies only that half's rows. A Depth of
// bucketmap.AtLevel names a bucket by its bare number, as Move does.
func (mv *Mover) MoveBucket(ctx context.Context, bucket bucketmap.Bucket, target bucketmap.NodeID, noCopy bool) (*topo.MoveRecord, error) {
	for attempt := 1; ; attempt++ {
		rec, err := mv.move(ctx, bucket, target, noCopy)
		if err != nil && rec != nil && errors.Is(err, zksession.ErrLockLost) && ctx.Err() == nil {
			rec, err = mv.afterLockLoss(ctx, rec.ID, err)
		}
		if err == nil || rec == nil || rec.State != topo.MoveAborted || attempt > FailoverRetries || ctx.Err() != nil {
			return rec, err
		}
		if !errors.Is(err, ErrFailover) && !mv.failedOver(ctx, rec) {
			return rec, err
		}
		mv.log.Warn("move aborted by a failover; starting it again on the new primaries", zap.String("move", rec.ID), zap.Int("attempt", attempt+1), zap.Error(err))
		if mv.opts.Progress != nil {
			mv.opts.Progress(Progress{Message: fmt.Sprintf("move %s aborted by a failover (%v); starting it again", rec.ID, err), Move: rec})
		}
	}
}

// FailoverRetries bounds how often Move starts a move again after a
// failover aborted it.
const FailoverRetries = 3

// afterLockLoss sees a move through after this process lost its runner
// lock (its ZooKeeper session was lost, inside a pause or not): it waits
// for ZooKeeper, resumes the move, and, if another mover (an orphan
// watcher) took it first, waits for that one to end it, taking it again if
// that one goes away too. A move started by `shardctl move` so ends as it
// would have, with the outcome on record: an error unless done. Only
// ZooKeeper being away is waited out; any other error is returned.
func (mv *Mover) afterLockLoss(ctx context.Context, id string, cause error) (*topo.MoveRecord, error) {
	b := backoff.New(time.Second, 10*time.Second)
	for {
		mv.log.Warn("lost the move's runner lock; resuming it once ZooKeeper answers", zap.String("move", id), zap.Error(cause))
		if mv.opts.Progress != nil {
			mv.opts.Progress(Progress{Message: fmt.Sprintf("lost the runner lock of move %s (%v); resuming it once ZooKeeper answers", id, cause)})
		}
		if err := mv.s.WaitConnected(ctx); err != nil {
			return nil, fmt.Errorf("%w (waiting for ZooKeeper: %v)", cause, err)
		}
		rec, err := mv.Resume(ctx, id)
		if errors.Is(err, ErrBusy) {
			rec, err = mv.await(ctx, id)
			if !errors.Is(err, errRunnerGone) {
				return rec, err
			}
		}
		switch {
		case ctx.Err() != nil:
			return rec, cmp.Or(err, ctx.Err())
		case rec != nil && (rec.Finished() || rec.State == topo.MoveFailed || rec.State == topo.MoveReversible):
			return rec, outcome(rec, err)
		case err == nil:
			return rec, nil
		case !zkAway(err):
			return rec, err
		}
		cause = err
		select {
		case <-ctx.Done():
			return rec, cause
		case <-time.After(b.Next()):
		}
	}
}

// zkAway: err says ZooKeeper could not be asked (or the lock went with the
// session), which waiting mends.
func zkAway(err error) bool {
	return errors.Is(err, zksession.ErrLockLost) || errors.Is(err, zksession.ErrNotConnected) ||
		errors.Is(err, zksession.ErrConnection) || errors.Is(err, zksession.ErrTimeout) || errors.Is(err, errRunnerGone)
}

// outcome is the error a finished move's record stands for: nil when it is
// done; else err if there is one, or one made from the record.
func outcome(rec *topo.MoveRecord, err error) error {
	switch {
	case rec.State == topo.MoveDone, rec.State == topo.MoveReversible && (rec.Verify == nil || rec.Verify.OK):
		return nil
	case err != nil:
		return err
	case rec.State == topo.MoveRolledBack && rec.Verify != nil && !rec.Verify.OK:
		return fmt.Errorf("%w: %s; rolled back: bucket %d is on %s again", ErrVerifyMismatch, describe(rec.Verify), rec.Bucket, rec.Source)
	case rec.State == topo.MoveRolledBack:
		return nil
	case rec.State == topo.MoveFailed:
		return fmt.Errorf("move %s failed (run by %s): %s", rec.ID, rec.Runner, rec.Error)
	}
	return fmt.Errorf("move %s %s (run by %s): %s", rec.ID, rec.State, rec.Runner, rec.Error)
}

// errRunnerGone: the mover await waited for went away, the move unfinished.
var errRunnerGone = errors.New("the move's runner went away before it finished")

// await waits for another mover to end move id, and returns its record
// with outcome's error; errRunnerGone if that mover goes (its runner lock
// gone for OrphanGrace) with the move unfinished, so that the caller takes
// it again.
func (mv *Mover) await(ctx context.Context, id string) (*topo.MoveRecord, error) {
	w := topo.WatchMove(ctx, mv.s, mv.p, id)
	defer w.Stop()
	rw := topo.WatchMoveRunner(ctx, mv.s, mv.p, id)
	defer rw.Stop()
	var absentSince time.Time
	for {
		rec, _, err := topo.ReadMove(ctx, mv.s, mv.p, id)
		switch {
		case err == nil && (rec.Finished() || rec.State == topo.MoveFailed || (rec.State == topo.MoveReversible && !WindowDue(rec))):
			return rec, outcome(rec, nil)
		case err != nil && !zkAway(err):
			return rec, err
		case !absentSince.IsZero() && time.Since(absentSince) >= OrphanGrace:
			return rec, errRunnerGone
		}
		select {
		case <-ctx.Done():
			return rec, ctx.Err()
		case <-w.C:
		case n := <-rw.C:
			if n.Exists {
				absentSince = time.Time{}
			} else if absentSince.IsZero() {
				absentSince = time.Now()
			}
		case <-time.After(OrphanGrace):
		}
	}
}

// failedOver reports whether the source's or the target's primary is not
// the one the move began on, waiting (within AbortRetry) for a group
// that has none yet. Unknown (no servers recorded, a node that stays
// unreachable) is false.
func (mv *Mover) failedOver(ctx context.Context, rec *topo.MoveRecord) bool {
	if rec.Servers == nil {
		return false
	}
	m, _, err := mv.st.Load(ctx)
	if err != nil {
		return false
	}
	check := func(id, want string) bool {
		n, ok := m.Node(bucketmap.NodeID(id))
		if !ok || want == "" {
			return false
		}
		deadline := time.Now().Add(mv.opts.AbortRetry)
		b := backoff.New(100*time.Millisecond, time.Second)
		for {
			c, err := dbnode.Connect(ctx, n)
			if err == nil {
				inc, ierr := dbnode.Identify(ctx, c)
				c.Close(context.WithoutCancel(ctx))
				return ierr == nil && inc.String() != want
			}
			if n.Patroni.IsZero() || time.Now().After(deadline) || ctx.Err() != nil {
				return false
			}
			select {
			case <-ctx.Done():
				return false
			case <-time.After(b.Next()):
			}
		}
	}
	return check(rec.Source, rec.Servers.Source) || check(rec.Target, rec.Servers.Target)
}

func (mv *Mover) move(ctx context.Context, b bucketmap.Bucket, target bucketmap.NodeID, noCopy bool) (*topo.MoveRecord, error) {
	if err := mv.checkOptions(); err != nil {
		return nil, err // before a record exists
	}
	m, _, err := mv.st.Load(ctx)
	if err != nil {
		return nil, err
	}
	if b, err = m.Resolve(b); err != nil {
		return nil, err
	}
	bucket, bname := b.Prefix, m.Name(b)
	src := m.OwnerOf(b)
	if src == target {
		return nil, fmt.Errorf("bucket %s is already on %s", bname, target)
	}
	if n, ok := m.Node(target); !ok {
		return nil, fmt.Errorf("%w %q", bucketmap.ErrUnknownNode, target)
	} else if n.State != bucketmap.NodeActive {
		return nil, fmt.Errorf("node %s is %s; buckets move only to active nodes", target, n.State)
	}
	if bm := m.MetaOf(b); bm.State == bucketmap.BucketMoving {
		return nil, fmt.Errorf("bucket %s is already moving to %s (move %s)", bname, bm.Target, bm.Move)
	}
	inflight, err := mv.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range inflight {
		// A move of the same keys: this bucket, or one it was split
		// from or into since (its record would not match the map).
		if rb := recBucket(r); !r.Finished() && (rb.Contains(b) || b.Contains(rb)) {
			if r.State == topo.MoveReversible {
				return nil, fmt.Errorf("bucket %s's move %s is in its rollback window; end it first: shardctl move complete %s (or shardctl move rollback %s)", bname, r.ID, r.ID, r.ID)
			}
			return nil, fmt.Errorf("bucket %s already has an unfinished move %s (%s); resume or abort it first", bname, r.ID, r.State)
		}
	}
	crec, err := topo.ReadCluster(ctx, mv.s, mv.p)
	if err != nil {
		return nil, err
	}
	if len(crec.Tables) == 0 && !noCopy {
		return nil, errors.New("the cluster has no sharded tables (shardctl table add); nothing to copy, use --no-copy")
	}
	lo, hi := b.Keys()
	id := moveID(bucket, b.Depth, m.Version)
	name := objectPrefix + strings.ReplaceAll(id, "-", "_")
	now := time.Now().UTC()
	rec := &topo.MoveRecord{Version: topo.MoveVersion, ID: id, Bucket: bucket, Level: b.Depth, Lo: lo, Hi: hi,
		Source: string(src), Target: string(target), State: topo.MovePrepare, NoCopy: noCopy, Tables: crec.Tables,
		Publication: name, Subscription: name, Slot: name, StartVersion: m.Version, CreatedAt: now, UpdatedAt: now,
		Steps: []topo.MoveStep{{State: topo.MovePrepare, At: now}}, Runner: mv.runner}
	if !noCopy {
		rec.Reverse = newReverse(name, mv.opts.Window)
	}
	if err := topo.CreateMove(ctx, mv.s, mv.p, rec); err != nil {
		return nil, err
	}
	mv.log.Info("move created", zap.String("move", id), zap.Uint32("bucket", bucket), zap.String("from", string(src)), zap.String("to", string(target)), zap.Bool("no_copy", noCopy))
	out, err := mv.drive(ctx, id)
	if errors.Is(err, ErrBusy) {
		// An orphan watcher took the new move before this process took
		// its lock (ZooKeeper slower than OrphanGrace): see it through.
		return mv.await(ctx, id)
	}
	return out, err
}

// Resume continues a move left unfinished (its mover died, or a node was
// unreachable): forward if it can still honour the pause cap, or from the
// flip on; otherwise it rolls the move back.
func (mv *Mover) Resume(ctx context.Context, id string) (*topo.MoveRecord, error) {
	return mv.drive(ctx, id)
}

// Abort rolls back a move that has not flipped yet.
func (mv *Mover) Abort(ctx context.Context, id, reason string) (*topo.MoveRecord, error) {
	return mv.withRun(ctx, id, func(ctx context.Context, r *run) error {
		if r.rec.State == topo.MoveFailed {
			return fmt.Errorf("move %s failed after its flip (%s); `shardctl move resume` would only repeat that: `shardctl move abort %s --after-failure` checks which node holds the bucket's rows, makes the map, the fences and the record agree, and releases GC", id, r.rec.Error, id)
		}
		if pastFlip(r.rec) {
			if canRollBackLater(r.rec) && r.rec.State != topo.MoveCompleting {
				return fmt.Errorf("move %s is past its flip (%s): the bucket is on %s. To give it back to %s with the writes made since: shardctl move rollback %s", id, r.rec.State, r.rec.Target, r.rec.Source, id)
			}
			return fmt.Errorf("move %s is past its flip (%s); it can only be finished: shardctl move resume %s", id, r.rec.State, id)
		}
		return r.stopped(ctx, r.abort(ctx, errors.New(reason)))
	})
}

// withRun opens the move (taking its runner lock) and, unless it is
// finished, calls fn with the lock's context; it returns the record as fn
// left it.
func (mv *Mover) withRun(ctx context.Context, id string, fn func(context.Context, *run) error) (*topo.MoveRecord, error) {
	r, ctx, err := mv.open(ctx, id)
	if err != nil {
		return nil, err
	}
	defer r.close()
	if r.rec.Finished() {
		return r.rec, nil
	}
	err = fn(ctx, r)
	return r.rec, err
}

// Get reads one move record.
func (mv *Mover) Get(ctx context.Context, id string) (*topo.MoveRecord, error) {
	rec, _, err := topo.ReadMove(ctx, mv.s, mv.p, id)
	return rec, err
}

// List reads every move record, oldest first. An unreadable record is an
// error: nobody should plan around a move it cannot see.
func (mv *Mover) List(ctx context.Context) ([]*topo.MoveRecord, error) {
	kids, err := topo.ListMoves(ctx, mv.s, mv.p)
	if err != nil {
		return nil, err
	}
	var out []*topo.MoveRecord
	for _, k := range kids {
		rec, err := mv.Get(ctx, k)
		if errors.Is(err, zksession.ErrNoNode) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	slices.SortFunc(out, func(a, b *topo.MoveRecord) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
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
	r := &run{mv: mv, rec: rec, ver: ver, seq: time.Now().UnixNano()}
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
		return fmt.Errorf("move %s stopped in %s: %w (resume it with `shardctl move resume %s`)", r.rec.ID, r.rec.State, cause, r.rec.ID)
	}
	return err
}

func (r *run) close() {
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

func (r *run) enter(ctx context.Context, state string) error {
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
func (r *run) step(state string) {
	r.rec.State = state
	r.rec.Steps = append(r.rec.Steps, topo.MoveStep{State: state, At: time.Now().UTC()})
	r.progress(state)
	r.crashHook(state)
}

// Failpoints (package internal/failpoint, in builds with -tags
// failpoints): "move:<state>" on entering each state, and crashFlipped
// right after the flip's ZooKeeper transaction, before the target's
// ownership is committed and the source's fence released. A test kills
// the mover at each of them and checks that a resume recovers.
const (
	failpointPrefix = "move:"
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

// sameServer checks that c still reaches the primary the move began on.
func (r *run) sameServer(ctx context.Context, c *pgx.Conn, role string) error {
	want := r.recordedServer(role)
	if want == "" {
		return nil
	}
	inc, err := dbnode.Identify(ctx, c)
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

// drive runs a move from its recorded state to the end.
func (mv *Mover) drive(ctx context.Context, id string) (*topo.MoveRecord, error) {
	if err := mv.checkOptions(); err != nil {
		return nil, err
	}
	return mv.withRun(ctx, id, func(ctx context.Context, r *run) error { return r.drive(ctx) })
}

// drive runs the steps from the recorded state on, and decides what a
// failed step means: roll back before the flip, stop after it.
func (r *run) drive(ctx context.Context) error {
	id := r.rec.ID
	if _, err := r.nodes(ctx); err != nil {
		return r.stopped(ctx, r.abort(ctx, err))
	}
	// Each state's step; a step that succeeds has saved the next state.
	steps := map[string]func(context.Context) error{
		topo.MovePrepare: r.prepare, topo.MoveCopy: r.copy, topo.MoveCatchup: r.catchup, topo.MoveFence: r.fence,
		topo.MoveBarrier: r.barrier, topo.MoveFlip: r.flip, topo.MoveTeardown: r.teardown, topo.MoveReverse: r.startReverse,
		topo.MoveVerify: r.verify, topo.MoveReversible: r.window, topo.MoveCompleting: r.complete,
	}
	var groupWait time.Time
	groupBackoff := backoff.New(200*time.Millisecond, 2*time.Second)
	for {
		step := steps[r.rec.State]
		switch r.rec.State {
		case topo.MoveAborting:
			return r.stopped(ctx, r.abort(ctx, errors.New(r.rec.Error)))
		case topo.MoveDone, topo.MoveAborted:
			return nil
		case topo.MoveRolledBack:
			if v := r.rec.Verify; v != nil && !v.OK {
				return fmt.Errorf("%w: %s; rolled back: bucket %d is on %s again, with every write made since the flip", ErrVerifyMismatch, describe(v), r.rec.Bucket, r.rec.Source)
			}
			return nil
		case topo.MoveFailed:
			return fmt.Errorf("move %s failed: %s", id, r.rec.Error)
		}
		if step == nil {
			return fmt.Errorf("move %s: unknown state %q", id, r.rec.State)
		}
		err := step(ctx)
		if err == nil {
			continue
		}
		if errors.Is(err, errWindowOpen) {
			return nil
		}
		if r.inPause() {
			if r.flipUnknown {
				// Only ZooKeeper knows whether the bucket is the target's
				// now: the source stays frozen until it says.
				if werr := r.awaitFlip(ctx, err); werr != nil {
					return r.stopped(ctx, werr)
				}
				if pastFlip(r.rec) {
					// Flipped after all: finish, on the spare target
					// connection (the first holds the verification
					// snapshot), as the flip's own success does.
					if r.verifyTx != nil {
						r.dstConn, r.dstSpare = r.dstSpare, r.dstConn
					}
					continue
				}
			}
			// Never flipped: the source takes the writes back now, by
			// itself, whether or not ZooKeeper answers; the rest of the
			// abort follows (and waits for ZooKeeper if it must).
			r.thawInPause(err)
		}
		if errors.Is(context.Cause(ctx), zksession.ErrLockLost) {
			// Another mover may run the move now: neither roll back nor
			// record anything, leave it as its record says.
			return r.stopped(ctx, err)
		}
		if errors.Is(err, ErrVerifyMismatch) {
			return err
		}
		if pastFlip(r.rec) && r.groupInvolved() && ctx.Err() == nil {
			// A Patroni group gets a new primary within its ttl: try
			// the step again for a while rather than leave it to a
			// person.
			if groupWait.IsZero() {
				groupWait = time.Now().Add(r.mv.opts.AbortRetry)
			}
			if time.Now().Before(groupWait) {
				d := groupBackoff.Next()
				r.mv.log.Warn("move step failed past the flip; a Patroni group is involved, trying again", zap.String("move", id), zap.String("state", r.rec.State), zap.Duration("in", d), zap.Error(err))
				select {
				case <-ctx.Done():
				case <-time.After(d):
				}
				continue
			}
		}
		if pastFlip(r.rec) {
			// Past the flip the target owns the bucket: never roll back.
			// Record the error and leave the rest for `move resume`.
			r.rec.Error = err.Error()
			_ = r.save(ctx)
			return fmt.Errorf("move %s stopped in %s (the bucket is already on %s; finish with `shardctl move resume %s`): %w", id, r.rec.State, r.rec.Target, id, err)
		}
		return r.stopped(ctx, r.abort(ctx, err))
	}
}

// prepare checks the move and readies the target, then enters its first
// data state through the schema gate (topo.EnterMoveData): while a schema
// change runs, the move waits here, and checks again once it is over, so
// that a move never copies between nodes a change has reached one of.
func (r *run) prepare(ctx context.Context) error {
	r.crashHook(topo.MovePrepare) // the record exists, nothing else yet
	for {
		if err := r.waitSchema(ctx); err != nil {
			return err
		}
		// Read before the schemas are compared: a change that begins
		// after this fails the gate, and the move compares again.
		epoch, err := topo.ReadSchemaEpoch(ctx, r.mv.s, r.mv.p)
		if err != nil {
			return err
		}
		r.schemaEpoch = epoch
		err = r.prepareOnce(ctx)
		if !errors.Is(err, topo.ErrSchemaChanging) {
			return err
		}
		r.progress("a schema change ran during prepare: comparing the schemas again")
	}
}

// waitSchema waits while a schema change holds the schema lock.
func (r *run) waitSchema(ctx context.Context) error {
	var said time.Time
	for {
		holder, busy, err := topo.SchemaChanging(ctx, r.mv.s, r.mv.p)
		if err != nil || !busy {
			return err
		}
		if time.Since(said) >= 5*time.Second {
			r.progress("waiting for the schema change of " + holder)
			said = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// enterData is enter for the move's first data state, through the schema
// gate: topo.ErrSchemaChanging, with nothing written, while a schema
// change runs.
func (r *run) enterData(ctx context.Context, state string) error {
	prev, steps := r.rec.State, len(r.rec.Steps)
	r.rec.State = state
	r.rec.Steps = append(r.rec.Steps, topo.MoveStep{State: state, At: time.Now().UTC()})
	r.rec.UpdatedAt = time.Now().UTC()
	r.rec.Runner = r.mv.runner
	ver, err := topo.EnterMoveData(ctx, r.mv.s, r.mv.p, r.rec, r.ver, r.schemaEpoch)
	if err != nil {
		r.rec.State, r.rec.Steps = prev, r.rec.Steps[:steps]
		if errors.Is(err, topo.ErrSchemaChanging) {
			return err
		}
		return fmt.Errorf("saving move %s: %w", r.rec.ID, err)
	}
	r.ver = ver
	r.progress(state)
	r.crashHook(state)
	return nil
}

func (r *run) prepareOnce(ctx context.Context) error {
	m, err := r.nodes(ctx)
	if err != nil {
		return err
	}
	if err := m.Check(recBucket(r.rec)); err != nil {
		return fmt.Errorf("the map was split before the move started copying: %w", err)
	}
	if owner := m.OwnerOf(recBucket(r.rec)); string(owner) != r.rec.Source {
		return fmt.Errorf("bucket %s is now owned by %s, not %s", recBucket(r.rec), owner, r.rec.Source)
	}
	if err := r.checkGroups(ctx); err != nil {
		return err
	}
	dst, err := r.target(ctx)
	if err != nil {
		return err
	}
	if !r.rec.NoCopy {
		src, err := r.source(ctx)
		if err != nil {
			return err
		}
		if err := ensureMarker(ctx, src); err != nil {
			return fmt.Errorf("source: %w", err)
		}
		if err := ensureMarker(ctx, dst); err != nil {
			return fmt.Errorf("target: %w", err)
		}
		mism, err := fence.CheckTables(ctx, dst, r.rec.Tables)
		if err != nil {
			return fmt.Errorf("target: %w", err)
		}
		if len(mism) > 0 {
			return fmt.Errorf("target %s does not match the sharded-table contract: %s (see shardctl node check %s)", r.rec.Target, mism[0].Message, r.rec.Target)
		}
		// Before the target's range is marked incoming and cleared, and
		// long before any row is copied or the source frozen.
		if err := r.compareSchemas(ctx, src, dst); err != nil {
			return err
		}
	}
	var src *pgx.Conn
	if !r.rec.NoCopy {
		src = r.srcConn
	}
	if err := r.recordServers(ctx, src, dst); err != nil {
		return err
	}
	if _, err := fence.SetIncoming(ctx, dst, r.rec.Lo, r.rec.Hi, m.Version); err != nil {
		return fmt.Errorf("target fence: %w", err)
	}
	if n, err := clearRange(ctx, dst, r.rec.Tables, r.rec.Lo, r.rec.Hi); err != nil {
		return fmt.Errorf("target: %w", err)
	} else if n > 0 {
		r.mv.log.Warn("removed leftover rows from the target range", zap.String("move", r.rec.ID), zap.Int64("rows", n))
	}
	if r.rec.NoCopy {
		return r.enterData(ctx, topo.MoveFence)
	}
	return r.enterData(ctx, topo.MoveCopy)
}

func (r *run) copy(ctx context.Context) error {
	src, err := r.source(ctx)
	if err != nil {
		return err
	}
	dst, err := r.target(ctx)
	if err != nil {
		return err
	}
	// Again, for a move resumed in copy: nothing is copied across a
	// difference that appeared since prepare.
	if err := r.compareSchemas(ctx, src, dst); err != nil {
		return err
	}
	// The copy starts over when the move is resumed here (restartCopy),
	// so this attempt's time is the time of every row it reports.
	start := time.Now()
	if err := r.restartCopy(ctx, src, dst); err != nil {
		return err
	}
	if err := createPublication(ctx, src, r.rec.Publication, r.rec.ID, r.rec.Tables, r.rec.Lo, r.rec.Hi); err != nil {
		return fmt.Errorf("source: publication: %w", err)
	}
	conninfo, err := dbnode.ConnString(r.src)
	if err != nil {
		return err
	}
	// Disabled, on the slot copyRange creates (see copy.go).
	if err := createSubscription(ctx, dst, r.rec.Subscription, r.rec.Slot, r.rec.Publication, conninfo); err != nil {
		return fmt.Errorf("target: subscription: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, r.mv.opts.CopyTimeout)
	defer cancel()
	n, err := r.copyRange(cctx, src, dst)
	if err != nil {
		if ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("initial copy not finished within %s: %w", r.mv.opts.CopyTimeout, err)
		}
		return err
	}
	r.crashHook(crashCopied)
	// The rows are committed: the apply worker replays, from the slot's
	// start, what changed since the snapshot they were copied from.
	if err := enableSubscription(ctx, dst, r.rec.Subscription); err != nil {
		return fmt.Errorf("target: enabling the subscription: %w", err)
	}
	r.crashHook(crashCopyEnabled)
	r.rec.Stats.CopyMS = float64(time.Since(start).Microseconds()) / 1000
	r.rec.Stats.RowsCopied = n
	return r.enter(ctx, topo.MoveCatchup)
}

// probe sends a marker and returns how long it took to be applied.
func (r *run) probe(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	src, err := r.source(ctx)
	if err != nil {
		return 0, err
	}
	dst, err := r.target(ctx)
	if err != nil {
		return 0, err
	}
	r.seq++
	start := time.Now()
	if _, err := insertMarker(ctx, src, r.markerID(), r.seq); err != nil {
		return 0, fmt.Errorf("source: marker: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := waitMarker(wctx, dst, r.markerID(), r.seq, 2*time.Millisecond); err != nil {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			// A marker that does not arrive: an apply error may have
			// disabled the subscription, which no wait would mend.
			if enabled, _, serr := subscriptionState(ctx, dst, r.rec.Subscription); serr == nil && !enabled {
				return 0, r.applyError(ctx, src, dst)
			}
			return time.Since(start), nil
		}
		return 0, fmt.Errorf("target: marker: %w", err)
	}
	return time.Since(start), nil
}

func (r *run) catchup(ctx context.Context) error {
	if r.forwardReverse() {
		// First, not between the last lag probe and the fence: creating
		// the slot waits for the target's open transactions (hundreds of
		// milliseconds under load), and lag that builds up meanwhile
		// would be waited out inside the pause, at the barrier.
		src, dst, err := r.conns(ctx)
		if err != nil {
			return err
		}
		if err := r.setupReverse(ctx, src, dst); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(r.mv.opts.CatchupTimeout)
	for {
		lag, err := r.probe(ctx, 10*r.mv.opts.MaxLag)
		if err != nil {
			return err
		}
		r.rec.Stats.LagAtFenceMS = float64(lag.Microseconds()) / 1000
		if lag <= r.mv.opts.MaxLag {
			// A rollback's target had these rows before the move.
			if r.rec.RollbackOf == "" {
				if err := r.checkForeignKeysOnTarget(ctx); err != nil {
					return err
				}
			}
			// Most of the sequences' distance outside the pause; the
			// barrier carries the rest.
			if !r.rec.NoCopy {
				src, dst, err := r.conns(ctx)
				if err != nil {
					return err
				}
				if err := r.carrySequences(ctx, src, dst, "before the pause"); err != nil {
					return err
				}
			}
			return r.enter(ctx, topo.MoveFence)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replication lag %s stayed above %s for %s: refusing to fence", lag.Round(time.Millisecond), r.mv.opts.MaxLag, r.mv.opts.CatchupTimeout)
		}
		r.progress(fmt.Sprintf("catching up: lag %s above %s", lag.Round(time.Millisecond), r.mv.opts.MaxLag))
	}
}

func (r *run) fence(ctx context.Context) error {
	m, _, err := r.mv.st.Load(ctx)
	if err != nil {
		return err
	}
	if bm := m.Meta(r.slot(m)); bm.State == bucketmap.BucketMoving && bm.Move == r.rec.ID {
		// A mover died after setting the map: the freeze may have
		// started long ago, so the pause cap cannot be honoured.
		return fmt.Errorf("%w: resumed after the fence began", ErrPauseCap)
	}
	if r.rec.RollbackOf != "" {
		if err := r.readRolledBack(ctx); err != nil {
			return err
		}
	}
	next, zv, _, err := r.mv.st.UpdateAlso(ctx, nil, 0, func(m *bucketmap.Map) error {
		if err := m.Check(recBucket(r.rec)); err != nil {
			return fmt.Errorf("the map was split during the move: %w", err)
		}
		if owner := m.OwnerOf(recBucket(r.rec)); string(owner) != r.rec.Source {
			return fmt.Errorf("bucket %s is now owned by %s, not %s", recBucket(r.rec), owner, r.rec.Source)
		}
		return m.SetMoving(recBucket(r.rec), bucketmap.NodeID(r.rec.Target), r.rec.ID)
	}, nil)
	if err != nil {
		return err
	}
	r.fenceMap, r.fenceZV = next, zv
	r.rec.FenceVersion = next.Version
	if err := r.save(ctx); err != nil {
		return err
	}
	if err := r.waitMembers(ctx, next.Version); err != nil {
		return err
	}
	src, err := r.source(ctx)
	if err != nil {
		return err
	}
	if _, err := r.target(ctx); err != nil {
		return err
	}
	if r.dstSpare == nil {
		if r.dstSpare, err = dbnode.Connect(ctx, r.dst); err != nil {
			return fmt.Errorf("target: %w", err)
		}
	}
	// The target's ownership is prepared now, outside the pause, on the
	// spare connection, and committed right after the map names the
	// target: one round trip inside the pause instead of a whole fence
	// change, and the target never owns the range before the map says so.
	// Writers to it wait for the commit meanwhile (none should come: no
	// current map names the target).
	if r.pendingOwn, err = fence.PrepareOwn(ctx, r.dstSpare, r.rec.Lo, r.rec.Hi, next.Version+1); err != nil {
		return fmt.Errorf("target fence: %w", err)
	}
	// The barrier marker is written by the freeze's own transaction: it
	// commits after every write the freeze drained, so once the target
	// has applied it, it has applied them all (logical replication applies
	// in commit order). No round trip of its own inside the pause.
	var also []fence.Stmt
	if !r.rec.NoCopy {
		r.seq++
		// Flushed at commit even where synchronous_commit is off: a
		// walsender sends only flushed WAL, and the WAL writer would
		// otherwise take up to wal_writer_delay (200 ms) to get to it.
		// "on", not "local": with synchronous standbys, the freeze must
		// survive a failover of the source.
		also = append(also, fence.Stmt{SQL: `SET LOCAL synchronous_commit = on`}, markerStmt(r.markerID(), r.seq))
	}
	// The freeze's start is saved before the freeze, outside the pause: a
	// mover that dies inside the pause leaves it in the record, and the
	// resume that ends the pause records how long it really lasted.
	startedAt := time.Now().UTC()
	r.rec.FreezeStartedAt = &startedAt
	if err := r.save(ctx); err != nil {
		return err
	}
	if _, err := fence.FreezeWith(ctx, src, r.rec.Lo, r.rec.Hi, next.Version, also...); err != nil {
		// The freeze's transaction rolled back: writers queued behind its
		// lock request go on now. They waited that long: a pause.
		r.endPause(time.Now())
		return fmt.Errorf("source fence: %w", err)
	}
	r.frozenAt = time.Now()
	if r.rec.NoCopy {
		r.step(topo.MoveFlip)
		return nil
	}
	r.step(topo.MoveBarrier)
	return nil
}

func (r *run) barrier(ctx context.Context) error {
	if r.frozenAt.IsZero() {
		return fmt.Errorf("%w: resumed during the write pause", ErrPauseCap)
	}
	// Leave room in the cap for the flip's own round trips.
	budget := r.mv.opts.PauseCap - time.Since(r.frozenAt) - r.mv.opts.PauseCap/5
	if budget <= 0 {
		return fmt.Errorf("%w (%s)", ErrPauseCap, r.mv.opts.PauseCap)
	}
	dst, err := r.target(ctx)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	overCap := func(err error, what string) error {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w: %s took the barrier over %s (cap %s)", ErrPauseCap, what, budget.Round(time.Millisecond), r.mv.opts.PauseCap)
		}
		return fmt.Errorf("target: %s: %w", what, err)
	}
	if err := waitMarker(wctx, dst, r.markerID(), r.seq, time.Millisecond); err != nil {
		return overCap(err, "marker")
	}
	// The source writes the bucket no more: its sequences have handed out
	// every id the moved rows have. Before the target can own the range.
	src, err := r.source(ctx)
	if err != nil {
		return err
	}
	if err := r.carrySequences(wctx, src, dst, "inside the pause"); err != nil {
		return overCap(err, "carrying the sequences")
	}
	// Everything applied on the target so far is on its synchronous
	// standbys before the map names it the owner, so that a failover of
	// the target right after the flip loses none of it (the apply worker
	// commits without waiting for standbys). Within the pause's budget: a
	// standby that just died may hold the commit until Patroni drops it
	// from synchronous_standby_names, and the source stays frozen
	// meanwhile; past the cap the move aborts and thaws it.
	if err := syncPoint(wctx, dst); err != nil {
		return overCap(err, "waiting for its synchronous standbys")
	}
	// The connection is the one the move checked when it opened it, but
	// a pooler in front of a group could have moved it to a promoted
	// standby since: ask once more, before the target can own the range.
	if err := r.sameServer(wctx, dst, "target"); err != nil {
		return overCap(err, "identifying the server")
	}
	if !r.rec.NoCopy && r.rec.RollbackOf == "" {
		// The verification snapshot: every row from before the freeze,
		// none written after the flip. Its first statement reads where
		// the target's WAL is: past every change the forward stream
		// applied, before any the application makes once it owns the
		// range, so the reverse stream starts there.
		tx, err := dst.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&r.reverseLSN); err != nil {
			tx.Rollback(ctx)
			return err
		}
		r.verifyTx = tx
	}
	r.step(topo.MoveFlip)
	return nil
}

func (r *run) flip(ctx context.Context) error {
	after := topo.MoveTeardown
	if r.rec.NoCopy {
		after = topo.MoveDone
	}
	if r.rec.FlipVersion == 0 {
		pending := r.pendingOwn
		r.pendingOwn = nil
		if pending == nil {
			// Resumed in flip (a record written by an older mover): no
			// pause to keep short any more.
			m, _, err := r.mv.st.Load(ctx)
			if err != nil {
				return err
			}
			dst, err := r.target(ctx)
			if err != nil {
				return err
			}
			if pending, err = fence.PrepareOwn(ctx, dst, r.rec.Lo, r.rec.Hi, m.Version+1); err != nil {
				return fmt.Errorf("target fence: %w", err)
			}
		}
		// The map and the move record change in one ZooKeeper
		// transaction: the record says the flip happened (FlipVersion)
		// exactly when the map does, whatever instant the mover dies at.
		// The map half of the flip goes through ownership; its fence half
		// is settleFences, after it.
		var rec topo.MoveRecord
		flip := ownership.Flip{Move: r.rec.ID, Bucket: recBucket(r.rec), Target: bucketmap.NodeID(r.rec.Target), NoCopy: r.rec.NoCopy}
		next, _, stats, err := ownership.FlipMap(ctx, r.mv.st, r.fenceMap, r.fenceZV, flip, func(next *bucketmap.Map) ([]zksession.Op, error) {
			rec = *r.rec
			rec.FlipVersion = next.Version
			rec.State = topo.MoveFlip
			rec.UpdatedAt = time.Now().UTC()
			rec.Runner = r.mv.runner
			if rec.Reverse != nil && r.reverseLSN != "" {
				rv := *rec.Reverse
				rv.StartLSN = r.reverseLSN
				rec.Reverse = &rv
			}
			op, err := topo.UpdateMoveOp(r.mv.p, &rec, r.ver)
			if err != nil || r.undo == nil {
				return []zksession.Op{op}, err
			}
			// A rollback's flip ends the move it rolls back, in the same
			// transaction.
			undo, err := r.rolledBackOp(rec.UpdatedAt)
			return []zksession.Op{op, undo}, err
		})
		if err != nil {
			// Not flipped, or not known to be (ZooKeeper did not answer
			// the transaction): then drive waits for ZooKeeper to tell
			// before anything is undone (awaitFlip).
			pending.Rollback(context.WithoutCancel(ctx))
			r.flipUnknown = flipOutcomeUnknown(err)
			return err
		}
		*r.rec, r.ver = rec, stats[0].Version
		r.crashHook(crashFlipped)
		committed := pending.Commit(ctx)
		if r.verifyTx != nil {
			// The first target connection holds the verification
			// snapshot until verify; the spare, free again, serves the
			// rest of the move.
			r.dstConn, r.dstSpare = r.dstSpare, r.dstConn
		}
		if !r.frozenAt.IsZero() {
			r.rec.Stats.PauseMS = float64(time.Since(r.frozenAt).Microseconds()) / 1000
		}
		if committed == nil && next.Version == pending.Change.ToVersion {
			r.targetOwned = true
		} else if committed != nil {
			r.mv.log.Warn("target fence: committing its ownership failed; owning it again", zap.String("move", r.rec.ID), zap.Error(committed))
		}
	}
	// Resumed past the flip (its mover died right after it): the pause
	// ended when the target came to own the range. If it owns it already,
	// the dead mover committed that right after the flip, whose time the
	// record keeps (the flip wrote it, nothing since); else this resume
	// ends the pause now.
	var pauseEnd time.Time
	if r.rec.Stats.PauseMS == 0 && r.rec.FreezeStartedAt != nil && !r.targetOwned {
		if dst, err := r.target(ctx); err == nil {
			if f, err := fence.Read(ctx, dst); err == nil && ownsAll(f, r.rec.Lo, r.rec.Hi) && f.MapVersion >= r.rec.FlipVersion &&
				r.rec.UpdatedAt.After(*r.rec.FreezeStartedAt) {
				pauseEnd = r.rec.UpdatedAt
			}
		}
	}
	if err := r.settleFences(ctx); err != nil {
		return err
	}
	if r.rec.Stats.PauseMS == 0 && r.rec.FreezeStartedAt != nil {
		if pauseEnd.IsZero() {
			pauseEnd = time.Now()
		}
		r.rec.Stats.PauseMS = float64(pauseEnd.Sub(*r.rec.FreezeStartedAt).Microseconds()) / 1000
	}
	if r.rec.Stats.PauseMS > 0 {
		r.progress(fmt.Sprintf("flipped: write pause %.1f ms", r.rec.Stats.PauseMS))
	}
	return r.enter(ctx, after)
}

// settleFences brings both fences to the flip's map version
// (ownership.SettleFlip, the fence half of the flip): the target owns the
// range (unless this process committed exactly that already), the source
// releases it. It runs after the flip, and again when a move is resumed
// past it, so that a mover dying in between leaves nothing frozen. An
// unreachable source is left to the reconciler (`shardctl node reconcile`);
// the target must own the range, or its writes are refused.
func (r *run) settleFences(ctx context.Context) error {
	owned, err := ownership.SettleFlip(ctx, ownership.FlipFences{
		Move: r.rec.ID, Lo: r.rec.Lo, Hi: r.rec.Hi, Version: r.rec.FlipVersion, TargetOwned: r.targetOwned,
		Target: func(ctx context.Context) (fence.DB, error) { return r.target(ctx) },
		Source: func(ctx context.Context) (fence.DB, error) { return r.source(ctx) },
		Logger: r.mv.log,
	})
	if err != nil {
		return err
	}
	r.targetOwned = owned
	return nil
}

func (r *run) teardown(ctx context.Context) error {
	src, srcErr := r.source(ctx)
	dst, err := r.target(ctx)
	if err != nil {
		return err
	}
	if err := dropSubscription(ctx, dst, r.rec.Subscription, srcErr == nil && r.slotOnSource(ctx, src)); err != nil {
		return fmt.Errorf("target: dropping subscription: %w", err)
	}
	_ = clearMarkers(ctx, dst, r.markerID())
	if srcErr != nil {
		r.rec.SlotPending = true
		r.mv.log.Warn("source unreachable: its publication and slot stay until it is back (shardctl move resume)", zap.String("move", r.rec.ID), zap.Error(srcErr))
		if err := r.save(ctx); err != nil {
			return err
		}
		return fmt.Errorf("source unreachable at teardown: %w", srcErr)
	}
	if r.rec.SlotPending {
		if err := dropSlot(ctx, src, r.rec.Slot); err != nil {
			return fmt.Errorf("source: dropping slot: %w", err)
		}
	}
	if err := dropPublication(ctx, src, r.rec.Publication); err != nil {
		return fmt.Errorf("source: dropping publication: %w", err)
	}
	_ = clearMarkers(ctx, src, r.markerID())
	if left, err := slotExists(ctx, src, r.rec.Slot); err != nil {
		return err
	} else if left {
		return fmt.Errorf("replication slot %s is still on the source", r.rec.Slot)
	}
	r.rec.SlotPending = false
	if r.forwardReverse() && r.rec.Reverse.Lost == "" {
		// The forward stream is gone: the reverse one cannot send its
		// own rows back to the target.
		return r.enter(ctx, topo.MoveReverse)
	}
	return r.enter(ctx, topo.MoveVerify)
}

func (r *run) verify(ctx context.Context) error {
	if r.rec.RollbackOf != "" {
		// A rollback gives the bucket back to the node that had every row
		// before the move: the node it leaves may be the one whose copy
		// differed, so there is nothing to compare it with.
		return r.enter(ctx, topo.MoveDone)
	}
	if r.verifyTx == nil {
		r.rec.Verify = &topo.MoveCheck{OK: true, Inconclusive: true}
		if r.verifyLost {
			// Said loudly: the one check of the copy after a failover of
			// the target is lost with the old primary's snapshot.
			r.mv.log.Warn("move verification impossible: the target's snapshot was lost (its primary failed over after the flip); check the bucket with shardctl node check", zap.String("move", r.rec.ID), zap.String("target", r.rec.Target))
			r.progress(fmt.Sprintf("verification impossible: %s failed over after the flip; run shardctl node check %s", r.rec.Target, r.rec.Target))
		}
		return r.afterVerify(ctx)
	}
	defer func() {
		r.verifyTx.Rollback(ctx)
		r.verifyTx = nil
		if r.srcVerifyTx != nil {
			r.srcVerifyTx.Rollback(ctx)
			r.srcVerifyTx = nil
		}
	}()
	// The source as the freeze left it: its snapshot from before the
	// reverse stream started, or the source itself when it has none (it
	// is frozen then: nothing writes the range there).
	var src querier = r.srcVerifyTx
	if r.srcVerifyTx == nil {
		if canRollBack(r.rec) {
			r.rec.Verify = &topo.MoveCheck{OK: true, Inconclusive: true}
			return r.afterVerify(ctx)
		}
		c, err := r.source(ctx)
		if err != nil {
			return err
		}
		src = c
	}
	r.progress("verifying: counting and summing the range on both nodes")
	chk, serr, terr := compareRange(ctx, src, r.verifyTx, r.rec.Tables, r.rec.Lo, r.rec.Hi)
	if serr != nil {
		return fmt.Errorf("source: %w", serr)
	}
	if terr != nil {
		r.verifyLost = true
		return fmt.Errorf("target: %w", terr)
	}
	r.rec.Verify = chk
	if !chk.OK {
		r.rec.Error = "verification mismatch: " + describe(chk)
		_ = r.mv.pause(ctx, fmt.Sprintf("move %s failed verification: %s", r.rec.ID, describe(chk)), r.rec.ID)
		if canRollBack(r.rec) {
			// The target never keeps a copy that differs: the rollback
			// gives the bucket back with the writes made since the flip.
			r.mv.log.Error("move verification mismatch: rolling back; rebalancer paused", zap.String("move", r.rec.ID), zap.String("detail", describe(chk)))
			return r.enterWindow(ctx)
		}
		if err := r.enter(ctx, topo.MoveFailed); err != nil {
			return err
		}
		r.mv.log.Error("move verification mismatch: rebalancer paused", zap.String("move", r.rec.ID), zap.String("detail", describe(chk)))
		return fmt.Errorf("%w: %s", ErrVerifyMismatch, describe(chk))
	}
	return r.afterVerify(ctx)
}

// afterVerify: the rollback window if the reverse stream runs, else done.
func (r *run) afterVerify(ctx context.Context) error {
	if canRollBack(r.rec) {
		return r.enterWindow(ctx)
	}
	return r.enter(ctx, topo.MoveDone)
}

func (r *run) enterWindow(ctx context.Context) error {
	rv := r.rec.Reverse
	until := time.Now().UTC().Add(time.Duration(rv.WindowS * float64(time.Second)))
	rv.Until = &until
	if rv.WindowS > 0 {
		r.progress(fmt.Sprintf("rollback window open until %s: shardctl move rollback %s gives the bucket back to %s; shardctl move complete %s ends it now",
			until.Local().Format("15:04:05"), r.rec.ID, r.rec.Source, r.rec.ID))
	}
	return r.enter(ctx, topo.MoveReversible)
}

func describe(c *topo.MoveCheck) string {
	var parts []string
	for _, t := range c.Tables {
		if t.SourceRows != t.TargetRows || t.SourceSum != t.TargetSum {
			parts = append(parts, fmt.Sprintf("%s: source %d rows (sum %s), target %d rows (sum %s)", t.Table, t.SourceRows, t.SourceSum, t.TargetRows, t.TargetSum))
		}
	}
	for i, ch := range c.Chunks {
		if i == 3 {
			break
		}
		p := fmt.Sprintf("%s keys %d..%d: source %d rows, target %d", ch.Table, ch.Lo, ch.Hi, ch.SourceRows, ch.TargetRows)
		if len(ch.Rows) > 0 {
			p += " (" + strings.Join(ch.Rows, "; ") + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// abort rolls a move back before its flip: the source owns the range
// again, the target's partial copy is removed, and nothing is left behind.
// A cleanup that fails while both nodes answer (a fence change that hit its
// lock timeout behind a writer's open transaction, say) is tried again,
// with backoff, for up to Options.AbortRetry: a clean abort finishes by
// itself. A node that cannot be reached leaves the move in aborting, to
// finish with `move resume` (or the rebalancer's orphan watcher).
func (r *run) abort(ctx context.Context, cause error) error {
	// The cleanup acts on the nodes' primaries as they are now.
	r.cleaning = true
	if r.rec.State != topo.MoveAborting {
		r.rec.Error = cause.Error()
		if err := r.enter(ctx, topo.MoveAborting); err != nil {
			return err
		}
	}
	r.mv.log.Warn("aborting move", zap.String("move", r.rec.ID), zap.Error(cause))
	if r.pendingOwn != nil {
		r.pendingOwn.Rollback(ctx)
		r.pendingOwn = nil
	}
	if r.verifyTx != nil {
		r.verifyTx.Rollback(ctx)
		r.verifyTx = nil
	}
	deadline := time.Now().Add(r.mv.opts.AbortRetry)
	b := backoff.New(100*time.Millisecond, 2*time.Second)
	for {
		problems, unreachable, err := r.cleanup(ctx)
		if err != nil {
			return err
		}
		if len(problems) == 0 {
			break
		}
		// A Patroni group comes back by itself (a standby is promoted
		// within its ttl): wait for it as for a node that answers.
		if (unreachable && !r.groupInvolved()) || ctx.Err() != nil || time.Now().After(deadline) {
			_ = r.save(ctx)
			return fmt.Errorf("move %s: aborting after %v, but the cleanup is incomplete (run `shardctl move resume %s` when the nodes answer): %s", r.rec.ID, cause, r.rec.ID, strings.Join(problems, "; "))
		}
		wait := b.Next()
		r.mv.log.Warn("abort cleanup incomplete; trying again", zap.String("move", r.rec.ID), zap.Duration("in", wait), zap.Strings("problems", problems))
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	if err := r.enter(ctx, topo.MoveAborted); err != nil {
		return err
	}
	return fmt.Errorf("move %s aborted: %w", r.rec.ID, cause)
}

// checkGroups refuses a move that a Patroni group's configuration would
// break, before anything is created: a source group that drops unknown
// logical slots (no ignore_slots for them) would drop the move's within
// seconds, and a target group not in synchronous mode could lose copied
// rows in a failover right after the flip (the barrier's sync point
// waits for synchronous standbys only).
func (r *run) checkGroups(ctx context.Context) error {
	if p := r.src.Patroni; !p.IsZero() && !r.rec.NoCopy {
		g, err := topo.ReadPatroni(ctx, r.mv.s, p.Namespace, p.Scope)
		if err != nil {
			return fmt.Errorf("source %s: %w", r.rec.Source, err)
		}
		if g.Config == nil || !topo.PatroniKeepsLogicalSlots(g.Config.IgnoreSlots) {
			return fmt.Errorf("source %s is a Patroni group whose ignore_slots does not keep logical pgoutput slots: Patroni would drop the move's slot (add ignore_slots: [{type: logical, plugin: pgoutput}]; see shardctl node check %s)", r.rec.Source, r.rec.Source)
		}
	}
	if p := r.dst.Patroni; !p.IsZero() {
		g, err := topo.ReadPatroni(ctx, r.mv.s, p.Namespace, p.Scope)
		if err != nil {
			return fmt.Errorf("target %s: %w", r.rec.Target, err)
		}
		if r.rec.Reverse != nil && (g.Config == nil || !topo.PatroniKeepsLogicalSlots(g.Config.IgnoreSlots)) {
			return fmt.Errorf("target %s is a Patroni group whose ignore_slots does not keep logical pgoutput slots: Patroni would drop the move's reverse slot, and with it the way back (add ignore_slots: [{type: logical, plugin: pgoutput}]; see shardctl node check %s)", r.rec.Target, r.rec.Target)
		}
		if g.Config == nil || !g.Config.SynchronousMode {
			return fmt.Errorf("target %s is a Patroni group not in synchronous_mode: a failover right after the flip could lose copied rows (set synchronous_mode: true; see shardctl node check %s)", r.rec.Target, r.rec.Target)
		}
	}
	return nil
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

// groupInvolved: the source or the target is a Patroni group.
func (r *run) groupInvolved() bool {
	return !r.src.Patroni.IsZero() || !r.dst.Patroni.IsZero()
}

// endPause records the end of a write pause that did not end with a flip
// (a rollback), measured from the freeze's recorded start, so that a pause
// cut short by a crash is reported as long as it really was.
func (r *run) endPause(at time.Time) {
	if r.rec.FreezeStartedAt == nil || r.rec.PauseEndedAt != nil {
		return
	}
	end := at.UTC()
	r.rec.PauseEndedAt = &end
	if d := end.Sub(*r.rec.FreezeStartedAt); d > 0 {
		r.rec.Stats.PauseMS = float64(d.Microseconds()) / 1000
	}
}

// pauseOpen reports whether the record says a write pause began and has not
// ended: the source's fence may still freeze the range.
func pauseOpen(rec *topo.MoveRecord) bool {
	return rec.FreezeStartedAt != nil && rec.PauseEndedAt == nil && !pastFlip(rec) && !rec.Finished()
}

// thawSource makes the source's fence own the range again after a freeze
// that may have happened. A range the fence still owns (the freeze never
// committed: it hit its lock timeout, or the mover died before it) is left
// alone: re-owning it would wait for the same writers the freeze waited
// for.
func (r *run) thawSource(ctx context.Context, src *pgx.Conn, version uint64) error {
	f, err := fence.Read(ctx, src)
	if errors.Is(err, fence.ErrNotInstalled) {
		return nil
	}
	if err != nil {
		return err
	}
	if !ownsAll(f, r.rec.Lo, r.rec.Hi) {
		if _, err := fence.Own(ctx, src, r.rec.Lo, r.rec.Hi, version); err != nil && !errors.Is(err, fence.ErrNotInstalled) {
			return err
		}
		r.endPause(time.Now())
		return nil
	}
	r.endPause(r.thawedBefore(f))
	return nil
}

// thawedBefore is when the write pause of a source found owning the range
// again ended: this process's thaw without ZooKeeper if it made one, else
// the fence's last change if it came after the freeze began (another
// process's thaw), else now.
func (r *run) thawedBefore(f *fence.Fence) time.Time {
	if t, ok := r.mv.thawTime(r.rec.ID); ok {
		return t
	}
	now := time.Now()
	if r.rec.FreezeStartedAt != nil && f.UpdatedAt.After(*r.rec.FreezeStartedAt) && f.UpdatedAt.Before(now) {
		return f.UpdatedAt
	}
	return now
}

// inPause: this process froze the source, has not flipped (as far as the
// record knows) and has not thawed it.
func (r *run) inPause() bool {
	return !r.frozenAt.IsZero() && r.thawedAt.IsZero() && !pastFlip(r.rec)
}

// thawInPause ends a write pause that did not end with the flip, before
// anything else and without ZooKeeper: the source's fence owns the range
// again, and the target's prepared ownership is rolled back. Only
// PostgreSQL is asked, on the connection that froze it, within the pause
// cap, so that a ZooKeeper outage (or a lost lock) cannot keep the bucket
// frozen. It is safe because the flip was never sent (or ZooKeeper said it
// was not applied): the map still gives the bucket to the source, and no
// mover can flip it any more (a resume finds the pause begun and rolls
// back). The fence's version becomes one past the fence map's and past
// the fence's own, so that a reconciler holding a map that still says
// moving (so frozen) finds it stale and does not freeze the range again;
// the abort's map change brings every fence in step. Until then the
// source's fence is ahead of the map, which reconcilers and `node check`
// report.
// If it fails, the abort's cleanup thaws the source as before.
func (r *run) thawInPause(cause error) {
	log := r.mv.log.With(zap.String("move", r.rec.ID), zap.Uint32("bucket", r.rec.Bucket), zap.String("source", r.rec.Source))
	ctx, cancel := context.WithTimeout(context.Background(), max(r.mv.opts.PauseCap-time.Since(r.frozenAt), 0)+time.Second)
	defer cancel()
	if r.pendingOwn != nil {
		r.pendingOwn.Rollback(ctx)
		r.pendingOwn = nil
	}
	src := r.srcConn
	if src == nil || src.IsClosed() {
		c, err := dbnode.Connect(ctx, r.src)
		if err != nil {
			log.Warn("could not reach the source to end the write pause; the abort will", zap.Error(err))
			return
		}
		r.srcConn, src = c, c
	}
	// Past the fence map's version and past whatever the source's fence
	// has applied since (another move's map): a reconciler holding a map
	// that still says moving must find it stale, not freeze it again.
	var err error
	for try := 0; try < 3; try++ {
		epoch := r.rec.FenceVersion
		if f, rerr := fence.Read(ctx, src); rerr == nil {
			epoch = max(epoch, f.MapVersion)
		}
		if _, err = fence.Own(ctx, src, r.rec.Lo, r.rec.Hi, epoch+1); !errors.Is(err, fence.ErrStale) {
			break
		}
	}
	if err != nil {
		log.Warn("could not end the write pause on the source; the abort will", zap.Error(err))
		return
	}
	r.thawedAt = time.Now()
	r.endPause(r.thawedAt)
	r.mv.noteThaw(r.rec.ID, r.thawedAt)
	r.mv.opts.Metrics.thawed()
	log.Warn("write pause ended without a flip: the source accepts the bucket's writes again; rolling the move back",
		zap.Float64("pause_ms", r.rec.Stats.PauseMS), zap.NamedError("cause", cause))
}

// flipOutcomeUnknown says whether a failed flip may have been applied:
// the transaction was sent and its answer lost (a connection lost, a
// timeout). A session not connected refuses writes before sending them,
// and a server's refusal (a version conflict) applied nothing.
func flipOutcomeUnknown(err error) bool {
	return errors.Is(err, zksession.ErrConnection) || errors.Is(err, zksession.ErrTimeout) || errors.Is(err, zksession.ErrClosed) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// awaitFlip waits, with the source frozen, until ZooKeeper says whether a
// flip whose answer was lost was applied: it syncs with the leader and
// reads the move record (the flip writes it with the map). It raises the
// alert meanwhile: a log line at error level and the gauge
// shardvisor_move_flip_outcome_unknown. It returns nil with r.rec as
// ZooKeeper has it, or an error once the lock is lost (a resume decides
// then, from the same record).
func (r *run) awaitFlip(ctx context.Context, cause error) error {
	met := r.mv.opts.Metrics
	met.flipUnknown(1)
	defer met.flipUnknown(-1)
	r.mv.log.Error("flip outcome unknown: ZooKeeper did not answer the flip's transaction; the bucket stays frozen until it does",
		zap.String("move", r.rec.ID), zap.Uint32("bucket", r.rec.Bucket), zap.String("source", r.rec.Source), zap.String("target", r.rec.Target), zap.Error(cause))
	b := backoff.New(100*time.Millisecond, 2*time.Second)
	for {
		if ctx.Err() != nil {
			return fmt.Errorf("flip outcome unknown (%v): %w", cause, context.Cause(ctx))
		}
		if err := topo.Sync(ctx, r.mv.s, r.mv.p); err == nil {
			rec, ver, err := topo.ReadMove(ctx, r.mv.s, r.mv.p, r.rec.ID)
			if err == nil {
				r.flipUnknown = false
				if rec.FlipVersion != 0 {
					*r.rec, r.ver = *rec, ver
					r.mv.log.Warn("the flip was applied after all: finishing the move", zap.String("move", r.rec.ID), zap.Uint64("flip_version", rec.FlipVersion))
				} else {
					r.mv.log.Warn("the flip was not applied: rolling the move back", zap.String("move", r.rec.ID))
				}
				return nil
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(b.Next()):
		}
	}
}

// ownsAll reports whether a fence owns every key of lo..hi.
func ownsAll(f *fence.Fence, lo, hi int64) bool {
	next := lo
	for _, sp := range f.Spans {
		if sp.Hi < next || sp.Lo > next {
			continue
		}
		if sp.State != fence.Owned {
			return false
		}
		if sp.Hi >= hi {
			return true
		}
		next = sp.Hi + 1
	}
	return false
}

// cleanup is one attempt at an abort's cleanup; every part of it is
// idempotent. It returns what is still left to do, and whether a node did
// not answer (retrying then is the resume's job, not the abort's).
func (r *run) cleanup(ctx context.Context) (problems []string, unreachable bool, _ error) {
	m, _, err := r.mv.st.Load(ctx)
	if err != nil {
		return nil, false, err
	}
	src, srcErr := r.source(ctx)
	dst, dstErr := r.target(ctx)
	if r.rec.RollbackOf != "" {
		// A rollback that did not flip leaves the move it rolls back as
		// it was: its reverse stream and the rows on this rollback's
		// target (that move's source) stay.
		return r.cleanupRollback(ctx, m, src, srcErr, dstErr)
	}
	if r.forwardReverse() {
		problems = append(problems, r.dropReverse(ctx)...)
	}
	if dstErr == nil && r.rec.Subscription != "" {
		if err := dropSubscription(ctx, dst, r.rec.Subscription, srcErr == nil && r.slotOnSource(ctx, src)); err != nil {
			problems = append(problems, "target: dropping subscription: "+err.Error())
		} else if srcErr != nil {
			r.rec.SlotPending = true
		}
	}
	sourceOwns := true
	if srcErr == nil {
		if err := dropPublication(ctx, src, r.rec.Publication); err != nil {
			problems = append(problems, "source: dropping publication: "+err.Error())
		}
		if r.rec.SlotPending {
			if err := dropSlot(ctx, src, r.rec.Slot); err != nil {
				problems = append(problems, "source: dropping slot: "+err.Error())
			} else {
				r.rec.SlotPending = false
			}
		}
		// If the freeze may have happened, the source owns the range
		// again before the map says so, so that writers sent back to it
		// are accepted.
		if r.rec.FenceVersion != 0 {
			if err := r.thawSource(ctx, src, m.Version); err != nil {
				sourceOwns = false
				problems = append(problems, "source fence: "+err.Error())
			}
		}
		_ = clearMarkers(ctx, src, r.markerID())
	} else if r.reached(topo.MoveCopy) || r.rec.FenceVersion != 0 {
		// A publication and slot may be on the source: finish later.
		problems = append(problems, "source unreachable: "+srcErr.Error())
		unreachable = true
	}
	// The map stops saying moving only once the source accepts the
	// bucket's writes again (or cannot be asked): a frozen source under a
	// map that says active would refuse writes with nothing to show why.
	if sourceOwns {
		if err := r.clearMoving(ctx); err != nil {
			problems = append(problems, "map: "+err.Error())
		}
	}
	if dstErr == nil {
		// The target's fence first, then its rows: nothing can be
		// written there once it no longer claims the range.
		if m2, _, err := r.mv.st.Load(ctx); err != nil {
			problems = append(problems, "map (to release the target's fence): "+err.Error())
		} else if !m2.Has(recBucket(r.rec)) || string(m2.OwnerOf(recBucket(r.rec))) != r.rec.Target {
			_, err := fence.Release(ctx, dst, r.rec.Lo, r.rec.Hi, m2.Version)
			if errors.Is(err, fence.ErrStale) {
				// A newer map reached the target's fence: fine, unless it
				// still claims the range.
				if f, rerr := fence.Read(ctx, dst); rerr != nil {
					err = rerr
				} else if claimsAny(f, r.rec.Lo, r.rec.Hi) {
					err = fmt.Errorf("its fence, at map version %d, still claims the range", f.MapVersion)
				} else {
					err = nil
				}
			}
			if err != nil && !errors.Is(err, fence.ErrNotInstalled) {
				problems = append(problems, "target fence: "+err.Error())
			}
		}
		if _, err := clearRange(ctx, dst, r.rec.Tables, r.rec.Lo, r.rec.Hi); err != nil {
			problems = append(problems, "target: removing the partial copy: "+err.Error())
		}
		_ = clearMarkers(ctx, dst, r.markerID())
	} else {
		problems = append(problems, "target unreachable: "+dstErr.Error())
		unreachable = true
	}
	return problems, unreachable, nil
}

// clearMoving ends, in the map, the bucket's moving state if this move
// set it (an edit that changes nothing writes no version).
func (r *run) clearMoving(ctx context.Context) error {
	_, err := r.mv.st.Update(ctx, func(m *bucketmap.Map) error {
		if bm := m.Meta(r.slot(m)); bm.State == bucketmap.BucketMoving && bm.Move == r.rec.ID {
			return m.ClearMoving(recBucket(r.rec))
		}
		return nil
	})
	return err
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

// claimsAny reports whether a fence has any state for keys in lo..hi.
func claimsAny(f *fence.Fence, lo, hi int64) bool {
	for _, sp := range f.Spans {
		if sp.Lo <= hi && sp.Hi >= lo {
			return true
		}
	}
	return false
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

// pause stops the rebalancer until an operator resumes it.
func (mv *Mover) pause(ctx context.Context, reason, move string) error {
	by, err := balanceMode(ctx, mv)
	if err != nil {
		return err
	}
	return topo.WriteRebalance(ctx, mv.s, mv.p, topo.RebalanceRecord{Version: topo.RebalanceVersion, Paused: true, Reason: reason, Move: move, At: time.Now().UTC(), By: by})
}

// balanceMode is the rebalance record's By ("" without a record), which
// pause and resume carry over.
func balanceMode(ctx context.Context, mv *Mover) (string, error) {
	rec, err := topo.ReadRebalance(ctx, mv.s, mv.p)
	if err != nil || rec == nil {
		return "", err
	}
	return rec.By, nil
}

// waitMembers waits, up to Options.MemberWait, until every live router and
// supervisor has applied map version v, the one that sets the bucket
// moving, so that their clients know it is moving before the freeze (they
// then retry refused writes at once when the map flips). Members that have
// not by then are stragglers: recorded in the move record, logged, counted;
// then the move goes on without them, which the fence makes safe, or
// aborts (Options.OnStraggler).
func (r *run) waitMembers(ctx context.Context, v uint64) error {
	start := time.Now()
	stragglers, err := r.mv.members().Wait(ctx, v, r.mv.opts.MemberWait)
	waited := time.Since(start)
	r.rec.Stats.MemberWaitMS = float64(waited.Microseconds()) / 1000
	r.mv.opts.Metrics.memberWait(waited)
	if err != nil {
		return fmt.Errorf("waiting for routers and supervisors to apply map version %d: %w", v, err)
	}
	if len(stragglers) == 0 {
		return nil
	}
	r.rec.Stragglers = stragglers
	action := r.mv.opts.OnStraggler
	for _, st := range stragglers {
		r.mv.opts.Metrics.straggler(r.mv.p.MemberKind(st.Member), action)
		fields := []zap.Field{zap.String("move", r.rec.ID), zap.String("member", st.Member), zap.Uint64("member_map_version", st.MapVersion),
			zap.Uint64("fence_map_version", v), zap.Duration("member_wait", r.mv.opts.MemberWait), zap.String("on_straggler", action)}
		if st.Error != "" {
			fields = append(fields, zap.String("record_error", st.Error))
		}
		r.mv.log.Warn("straggler: member has not applied the map that sets the bucket moving", fields...)
	}
	msg := fmt.Sprintf("%d members have not applied map version %d within %s: %s", len(stragglers), v, r.mv.opts.MemberWait, fleet.DescribeStragglers(stragglers))
	if action == StragglerAbort {
		return errors.New(msg)
	}
	if err := r.save(ctx); err != nil {
		return err
	}
	r.progress("going on without stragglers: " + msg)
	return nil
}

// slot is the directory slot where the move's bucket begins in m: m.Meta
// of it is the bucket's state, or that of the bucket now covering its
// first keys if the map changed shape (then never this move's pause).
func (r *run) slot(m *bucketmap.Map) uint32 {
	lo, _ := recBucket(r.rec).Keys()
	return keystream.BucketOf(keystream.PrefixFromKey(lo), m.Level)
}
