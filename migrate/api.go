package migrate

// The mover's public API (Move, Resume, Abort, Get, List) and what Move
// does after the run itself ends: a failover's retry, the retries after a
// lost runner lock, the wait for another mover.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/backoff"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

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
				return nil, hint.New(fmt.Errorf("bucket %s's move %s is in its rollback window; end it first", bname, r.ID),
					fmt.Sprintf("shardctl move complete %s (or shardctl move rollback %s)", r.ID, r.ID))
			}
			return nil, hint.New(fmt.Errorf("bucket %s already has an unfinished move %s (%s); resume or abort it first", bname, r.ID, r.State),
				fmt.Sprintf("shardctl move resume %s (or shardctl move abort %s)", r.ID, r.ID))
		}
	}
	crec, err := topo.ReadCluster(ctx, mv.s, mv.p)
	if err != nil {
		return nil, err
	}
	if len(crec.Tables) == 0 && !noCopy {
		return nil, hint.New(errors.New("the cluster has no sharded tables; nothing to copy, use --no-copy"), "shardctl table add")
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
			return hint.New(fmt.Errorf("move %s failed after its flip (%s); resuming it would only repeat that", id, r.rec.Error),
				fmt.Sprintf("`shardctl move abort %s --after-failure` checks which node holds the bucket's rows, makes the map, the fences and the record agree, and releases GC", id))
		}
		if pastFlip(r.rec) {
			if canRollBackLater(r.rec) && r.rec.State != topo.MoveCompleting {
				return hint.New(fmt.Errorf("move %s is past its flip (%s): the bucket is on %s", id, r.rec.State, r.rec.Target),
					fmt.Sprintf("to give it back to %s with the writes made since: shardctl move rollback %s", r.rec.Source, id))
			}
			return hint.New(fmt.Errorf("move %s is past its flip (%s); it can only be finished", id, r.rec.State), "shardctl move resume "+id)
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
