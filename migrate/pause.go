package migrate

// The write pause: the fence, barrier and flip steps, and their helpers.
// These three steps are the pause, and each bounds a part of it:
//
//	fence    the map says moving and the members have seen it (bounded by
//	         Options.MemberWait, before the pause; the source takes the
//	         bucket's writes meanwhile, fence.Wanted), then the source's
//	         range is frozen: the pause starts as the freeze is sent (its
//	         lock holds writers back, its commit refuses them);
//	barrier  the marker the freeze committed is applied on the target, the
//	         sequences carried over, the standbys synced: bounded by what
//	         is left of Options.PauseCap (a fifth kept for the flip);
//	flip     the map and the record name the target in one ZooKeeper
//	         transaction, the target's ownership commits: the pause ends.
//
// A failure inside the pause thaws the source without ZooKeeper
// (thawInPause) before the abort; a flip whose answer was lost keeps the
// source frozen until ZooKeeper tells (awaitFlip).

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
	"github.com/shardvisor/shardvisor/fleet"
	"github.com/shardvisor/shardvisor/internal/backoff"
	"github.com/shardvisor/shardvisor/ownership"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

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
	moving := r.mark()
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
	r.timed(topo.PhaseMapMoving, moving)
	r.fenceMap, r.fenceZV = next, zv
	r.rec.FenceVersion = next.Version
	if err := r.save(ctx); err != nil {
		return err
	}
	r.crashHook(crashMoving)
	if err := r.waitMembers(ctx, next.Version); err != nil {
		return err
	}
	// The freeze's start is saved before the freeze, outside the pause: a
	// mover that dies inside the pause leaves it in the record, and the
	// resume that ends the pause records how long it really lasted. It is
	// saved before the target's ownership is prepared, not right before
	// the freeze: the orphan watcher (the frozen-bucket gauge of
	// `rebalance --watch`, maybe another process) learns of it by a
	// ZooKeeper watch, a notification and a read after this save, and
	// should know before the freeze refuses a writer. Until the freeze is
	// sent nothing is frozen: a failure in between ends the pause where
	// it began (a pause of 0).
	startedAt := time.Now().UTC()
	r.rec.FreezeStartedAt = &startedAt
	if err := r.save(ctx); err != nil {
		return err
	}
	r.pauseGauge(true)
	notFrozen := func(err error) error {
		r.endPause(startedAt)
		return err
	}
	prep := r.mark()
	src, err := r.source(ctx)
	if err != nil {
		return notFrozen(err)
	}
	if _, err := r.target(ctx); err != nil {
		return notFrozen(err)
	}
	if r.dstSpare == nil {
		if r.dstSpare, err = dbnode.Connect(ctx, r.dst); err != nil {
			return notFrozen(fmt.Errorf("target: %w", err))
		}
	}
	// The target's ownership is prepared now, outside the pause, on the
	// spare connection, and committed right after the map names the
	// target: one round trip inside the pause instead of a whole fence
	// change, and the target never owns the range before the map says so.
	// Writers to it wait for the commit meanwhile (none should come: no
	// current map names the target).
	if r.pendingOwn, err = fence.PrepareOwn(ctx, r.dstSpare, r.rec.Lo, r.rec.Hi, next.Version+1); err != nil {
		return notFrozen(fmt.Errorf("target fence: %w", err))
	}
	// The barrier marker is written by the freeze's own transaction: it
	// commits after every write the freeze drained, so once the target
	// has applied it, it has applied them all (logical replication applies
	// in commit order). No round trip of its own inside the pause.
	var also []fence.Stmt
	if !r.rec.NoCopy {
		r.markerSeq++
		// Flushed at commit even where synchronous_commit is off: a
		// walsender sends only flushed WAL, and the WAL writer would
		// otherwise take up to wal_writer_delay (200 ms) to get to it.
		// "on", not "local": with synchronous standbys, the freeze must
		// survive a failover of the source.
		also = append(also, fence.Stmt{SQL: `SET LOCAL synchronous_commit = on`}, markerStmt(r.markerID(), r.markerSeq))
	}
	r.timed(topo.PhasePrepareOwn, prep)
	// The pause starts as the freeze is sent, not when it commits: from
	// its lock on, writers to the bucket wait, then are refused.
	freezing := time.Now()
	if _, err := fence.FreezeWith(ctx, src, r.rec.Lo, r.rec.Hi, next.Version, also...); err != nil {
		// The freeze's transaction rolled back: writers queued behind its
		// lock request go on now. They waited that long: a pause.
		r.endPause(time.Now())
		return fmt.Errorf("source fence: %w", err)
	}
	r.frozenAt = freezing
	r.rec.Stats.AddPhase(topo.PhaseFreeze, time.Since(freezing))
	if r.rec.NoCopy {
		return r.step(topo.MoveFlip)
	}
	return r.step(topo.MoveBarrier)
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
	r.rec.Stats.AddPhase(topo.PhaseMemberWait, waited)
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
	ph := r.mark()
	if err := waitMarker(wctx, dst, r.markerID(), r.markerSeq, 5*time.Millisecond); err != nil {
		return overCap(err, "marker")
	}
	r.timed(topo.PhaseApply, ph)
	ph = r.mark()
	// The source writes the bucket no more: its sequences have handed out
	// every id the moved rows have. Before the target can own the range.
	src, err := r.source(ctx)
	if err != nil {
		return err
	}
	if err := r.carrySequences(wctx, src, dst, "inside the pause"); err != nil {
		return overCap(err, "carrying the sequences")
	}
	r.timed(topo.PhaseSequences, ph)
	ph = r.mark()
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
	r.timed(topo.PhaseSyncPoint, ph)
	ph = r.mark()
	// The connection is the one the move checked when it opened it, but
	// a pooler in front of a group could have moved it to a promoted
	// standby since: ask once more, before the target can own the range.
	if r.rec.NoCopy || r.rec.RollbackOf != "" {
		if err := r.sameServer(wctx, dst, "target"); err != nil {
			return overCap(err, "identifying the server")
		}
	} else {
		// The verification snapshot: every row from before the freeze,
		// none written after the flip. Its statements identify the
		// server and read where the target's WAL is: past every change
		// the forward stream applied, before any the application makes
		// once it owns the range, so the reverse stream starts there.
		// Both in one round trip.
		tx, err := dst.BeginTx(wctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return overCap(err, "taking the verification snapshot")
		}
		var inc dbnode.Incarnation
		var idErr error
		b := &pgx.Batch{}
		dbnode.QueueIdentify(b, &inc, &idErr)
		b.Queue("SELECT pg_current_wal_insert_lsn()::text").QueryRow(func(row pgx.Row) error { return row.Scan(&r.reverseLSN) })
		err = tx.SendBatch(wctx, b).Close()
		if err == nil {
			err = r.checkServer(inc, idErr, "target")
		}
		if err != nil {
			tx.Rollback(context.WithoutCancel(ctx))
			return overCap(err, "identifying the server")
		}
		r.verifyTx = tx
	}
	r.timed(topo.PhaseSnapshot, ph)
	return r.step(topo.MoveFlip)
}

func (r *run) flip(ctx context.Context) error {
	after := topo.MoveTeardown
	if r.rec.NoCopy {
		after = topo.MoveDone
	}
	if r.rec.FlipVersion == 0 {
		ph := r.mark()
		pending, err := r.flipPending(ctx)
		if err != nil {
			return err
		}
		next, err := r.flipMap(ctx, pending)
		if err != nil {
			return err
		}
		r.timed(topo.PhaseFlip, ph)
		r.crashHook(crashFlipped)
		ph = r.mark()
		r.ownAfterFlip(ctx, pending, next)
		r.timed(topo.PhaseOwn, ph)
	}
	pauseEnd := r.flippedPauseEnd(ctx)
	release := r.mark()
	if err := r.settleFences(ctx); err != nil {
		return err
	}
	r.timed(topo.PhaseRelease, release)
	r.recordFlipPause(pauseEnd)
	return r.enter(ctx, after)
}

// flipPending is the target's ownership for the flip to commit: the one
// the fence step prepared, or, for a move resumed in flip (a record
// written by an older mover), one prepared now: no pause to keep short any
// more.
func (r *run) flipPending(ctx context.Context) (*fence.Pending, error) {
	pending := r.pendingOwn
	r.pendingOwn = nil
	if pending != nil {
		return pending, nil
	}
	m, _, err := r.mv.st.Load(ctx)
	if err != nil {
		return nil, err
	}
	dst, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	if pending, err = fence.PrepareOwn(ctx, dst, r.rec.Lo, r.rec.Hi, m.Version+1); err != nil {
		return nil, fmt.Errorf("target fence: %w", err)
	}
	return pending, nil
}

// flipMap is the flip's ZooKeeper transaction: the map and the move record
// change in one, so the record says the flip happened (FlipVersion)
// exactly when the map does, whatever instant the mover dies at. The map
// half of the flip goes through ownership; its fence half is
// settleFences, after it. On success r.rec is the record as written.
func (r *run) flipMap(ctx context.Context, pending *fence.Pending) (*bucketmap.Map, error) {
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
		return nil, err
	}
	*r.rec, r.ver = rec, stats[0].Version
	return next, nil
}

// ownAfterFlip commits the target's prepared ownership right after the
// flip (the end of the pause this process measured) and hands the rest of
// the move the spare target connection.
func (r *run) ownAfterFlip(ctx context.Context, pending *fence.Pending, next *bucketmap.Map) {
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
	r.pauseGauge(false)
	if committed == nil && next.Version == pending.Change.ToVersion {
		r.targetOwned = true
	} else if committed != nil {
		r.mv.log.Warn("target fence: committing its ownership failed; owning it again", zap.String("move", r.rec.ID), zap.Error(committed))
	}
}

// flippedPauseEnd is, for a move resumed past the flip (its mover died
// right after it), when its pause ended: when the target came to own the
// range. If it owns it already, the dead mover committed that right after
// the flip, whose time the record keeps (the flip wrote it, nothing
// since); else (zero) this resume ends the pause now.
func (r *run) flippedPauseEnd(ctx context.Context) time.Time {
	if r.rec.Stats.PauseMS != 0 || r.rec.FreezeStartedAt == nil || r.targetOwned {
		return time.Time{}
	}
	if dst, err := r.target(ctx); err == nil {
		if f, err := fence.Read(ctx, dst); err == nil && ownsAll(f, r.rec.Lo, r.rec.Hi) && f.MapVersion >= r.rec.FlipVersion &&
			r.rec.UpdatedAt.After(*r.rec.FreezeStartedAt) {
			return r.rec.UpdatedAt
		}
	}
	return time.Time{}
}

// recordFlipPause records, if this process did not measure it, the pause
// from the freeze's recorded start to pauseEnd (now if zero), and reports
// it.
func (r *run) recordFlipPause(pauseEnd time.Time) {
	if r.rec.Stats.PauseMS == 0 && r.rec.FreezeStartedAt != nil {
		if pauseEnd.IsZero() {
			pauseEnd = time.Now()
		}
		r.rec.Stats.PauseMS = float64(pauseEnd.Sub(*r.rec.FreezeStartedAt).Microseconds()) / 1000
	}
	if r.rec.Stats.PauseMS > 0 {
		r.progress(fmt.Sprintf("flipped: write pause %.1f ms", r.rec.Stats.PauseMS))
	}
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

// endPause records the end of a write pause that did not end with a flip
// (a rollback), measured from the freeze's recorded start, so that a pause
// cut short by a crash is reported as long as it really was.
func (r *run) endPause(at time.Time) {
	if r.rec.FreezeStartedAt == nil || r.rec.PauseEndedAt != nil {
		return
	}
	end := at.UTC()
	r.rec.PauseEndedAt = &end
	r.pauseGauge(false)
	if d := end.Sub(*r.rec.FreezeStartedAt); d > 0 {
		r.rec.Stats.PauseMS = float64(d.Microseconds()) / 1000
	}
}

// pauseGauge puts this run's write pause in the frozen-bucket gauge (on),
// from just before the freeze, or takes it out. The orphan watcher keeps
// its own entry from the record (WatchOrphans), which outlives this
// process; this one is exact from the pause's first millisecond.
func (r *run) pauseGauge(on bool) {
	if on && r.rec.FreezeStartedAt != nil {
		r.mv.opts.Metrics.frozen("run:"+r.rec.ID, *r.rec.FreezeStartedAt)
	} else if !on {
		r.mv.opts.Metrics.unfrozen("run:" + r.rec.ID)
	}
}

// pauseOpen reports whether the record says a write pause began and has not
// ended: the source's fence may still freeze the range.
func pauseOpen(rec *topo.MoveRecord) bool {
	return rec.FreezeStartedAt != nil && rec.PauseEndedAt == nil && !pastFlip(rec) && !rec.Finished()
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
// process's thaw), else, if the fence has not changed since the freeze's
// start was saved, that start (a mover that died before sending its
// freeze: no pause at all), else now.
func (r *run) thawedBefore(f *fence.Fence) time.Time {
	if t, ok := r.mv.thawTime(r.rec.ID); ok {
		return t
	}
	if r.rec.FreezeStartedAt != nil && !f.UpdatedAt.After(*r.rec.FreezeStartedAt) {
		return *r.rec.FreezeStartedAt
	}
	now := time.Now()
	if r.rec.FreezeStartedAt != nil && f.UpdatedAt.After(*r.rec.FreezeStartedAt) && f.UpdatedAt.Before(now) {
		return f.UpdatedAt
	}
	return now
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
