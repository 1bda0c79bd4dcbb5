package migrate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// The reverse stream keeps a move's old owner in step after the flip, so
// that the move can be rolled back with every write made since (by an
// operator, `move rollback`, or by the mover itself when verification
// finds that the target's copy differs). Its life:
//
//   - catchup (before the write pause): a publication of the range on the
//     target, a subscription on the source (disabled), then a logical slot
//     on the target. Creating a slot waits for every transaction open on
//     the target, other buckets' included, so never inside the pause.
//   - barrier (inside the pause, once the forward apply has applied the
//     freeze): the target's WAL insert position, read in the statement
//     that opens the verification snapshot (no round trip of its own), is
//     written to the record by the flip's ZooKeeper transaction.
//   - reverse (after teardown dropped the forward stream): the slot is
//     advanced to that position, so that nothing the forward stream
//     applied is sent back (PostgreSQL 15 has no origin = none), and the
//     subscription is enabled. The source's fence refuses the
//     application's writes to the range (it owns it no more); the apply
//     runs as a replica, which the fence lets through.
//   - reversible: the window. GC keeps the source's rows (the move is not
//     finished).
//   - completing: the stream is dropped (`move complete`, or the window's
//     end), then done, and GC may prune the source's copy.
//
// A rollback is a move of its own (RollbackOf), from the target back to
// the source over the reverse stream: it starts in catchup (no copy), and
// its flip's ZooKeeper transaction also ends the rolled-back move
// (rolled_back).

// reverseSlotTimeout bounds the creation of the reverse slot, which waits
// for the transactions open on the target.
const reverseSlotTimeout = time.Minute

// errWindowOpen stops driving a move in its rollback window: nothing is
// due until the window ends or an operator acts.
var errWindowOpen = errors.New("the move's rollback window is open")

// ErrNoRollback: the move has no reverse stream to roll back over.
var ErrNoRollback = errors.New("the move cannot be rolled back")

// newReverse names a move's reverse stream.
func newReverse(name string, window time.Duration) *topo.ReverseStream {
	n := name + "_r"
	return &topo.ReverseStream{Publication: n, Slot: n, Subscription: n, WindowS: window.Seconds()}
}

// markerID is the move id a move's markers carry: a rollback's travel over
// the reverse stream, whose publication names the rolled-back move.
func (r *run) markerID() string {
	if r.rec.RollbackOf != "" {
		return r.rec.RollbackOf
	}
	return r.rec.ID
}

// forwardReverse: this run sets up and keeps a reverse stream (a forward
// move that copies; a rollback has none of its own).
func (r *run) forwardReverse() bool {
	return r.rec.Reverse != nil && r.rec.RollbackOf == ""
}

// setupReverse creates the reverse stream's objects, each only if it is
// not there (a resumed catchup), the subscription before the slot so that
// whoever drops the subscription drops the slot with it.
func (r *run) setupReverse(ctx context.Context, src, dst *pgx.Conn) error {
	rv := r.rec.Reverse
	// While the source is away, the target's slot keeps its WAL; only
	// max_slot_wal_keep_size bounds that (the slot is then invalidated,
	// and the way back with it). Said, not refused.
	var keep string
	if err := dst.QueryRow(ctx, "SELECT current_setting('max_slot_wal_keep_size')").Scan(&keep); err == nil && keep == "-1" {
		r.mv.log.Warn("the target keeps WAL for the move's reverse slot without bound while the source is away; set max_slot_wal_keep_size on the db nodes",
			zap.String("move", r.rec.ID), zap.String("target", r.rec.Target))
	}
	if err := createPublication(ctx, dst, rv.Publication, r.rec.ID, r.rec.Tables, r.rec.Lo, r.rec.Hi); err != nil {
		return fmt.Errorf("target: reverse publication: %w", err)
	}
	conninfo, err := dbnode.ConnString(r.dst)
	if err != nil {
		return err
	}
	// synchronous_commit on: the apply worker confirms a change to the
	// target's slot only once the source's synchronous standbys have it,
	// so a failover of the source inside the window loses none of the
	// writes the stream brought (off, the default, confirms on the local
	// flush alone).
	if err := createSubscription(ctx, src, rv.Subscription, rv.Slot, rv.Publication, conninfo, ", synchronous_commit = on"); err != nil {
		return fmt.Errorf("source: reverse subscription: %w", err)
	}
	ok, err := slotExists(ctx, dst, rv.Slot)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	if !ok {
		sctx, cancel := context.WithTimeout(ctx, reverseSlotTimeout)
		defer cancel()
		if _, err := dst.Exec(sctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", rv.Slot); err != nil {
			if ctx.Err() == nil && sctx.Err() != nil {
				return fmt.Errorf("target: creating the reverse slot waited over %s for transactions open on %s", reverseSlotTimeout, r.rec.Target)
			}
			return fmt.Errorf("target: creating the reverse slot: %w", err)
		}
	}
	return nil
}

// startReverse is the reverse step, after teardown: the source's snapshot
// for verification (its rows as the freeze left them, before the stream
// changes them), the slot advanced past the forward apply, the
// subscription enabled.
func (r *run) startReverse(ctx context.Context) error {
	rv := r.rec.Reverse
	src, dst, err := r.conns(ctx)
	if err != nil {
		return err
	}
	if rv.StartLSN == "" {
		// Flipped by a resume of an older record: where the forward
		// apply ended is not known, and a stream started anywhere else
		// could send the copied rows back. No way back then.
		return r.loseReverse(ctx, "the flip did not record the target's position (resumed from an older mover)")
	}
	if r.verifyTx != nil && r.srcVerifyTx == nil {
		c, err := dbnode.Connect(ctx, r.src)
		if err != nil {
			return fmt.Errorf("source: %w", err)
		}
		r.srcVerifyConn = c
		tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return fmt.Errorf("source: %w", err)
		}
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			tx.Rollback(ctx)
			return fmt.Errorf("source: %w", err)
		}
		r.srcVerifyTx = tx
	}
	have, err := slotExists(ctx, dst, rv.Slot)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	if !have {
		// A failover of the target since the slot was made: PostgreSQL
		// 15's slots do not survive one.
		return r.loseReverse(ctx, fmt.Sprintf("the reverse slot %s is gone from %s (a failover of the target?)", rv.Slot, r.rec.Target))
	}
	if err := startAt(ctx, src, dst, rv.Subscription, rv.Slot, rv.StartLSN); err != nil {
		return err
	}
	if err := enableSubscription(ctx, src, rv.Subscription); err != nil {
		return fmt.Errorf("source: enabling the reverse subscription: %w", err)
	}
	rv.Enabled = true
	r.progress(fmt.Sprintf("reverse stream from %s to %s started at %s", r.rec.Target, r.rec.Source, rv.StartLSN))
	return r.enter(ctx, topo.MoveVerify)
}

// loseReverse drops a reverse stream that cannot serve and goes on to
// verify: the move then ends as a move without one would.
func (r *run) loseReverse(ctx context.Context, why string) error {
	r.mv.log.Warn("move has no reverse stream: it cannot be rolled back", zap.String("move", r.rec.ID), zap.String("why", why))
	r.progress("no rollback possible: " + why)
	if problems := r.dropReverse(ctx); len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	r.rec.Reverse.Lost = why
	r.rec.Reverse.Enabled = false
	return r.enter(ctx, topo.MoveVerify)
}

// canRollBack: the reverse stream runs.
func canRollBack(rec *topo.MoveRecord) bool {
	rv := rec.Reverse
	return rv != nil && rv.Enabled && rv.Lost == "" && rec.RollbackOf == ""
}

// WindowDue reports whether a move in its rollback window has something to
// do now: its window ended, its way back was lost (Reverse.Lost: the
// window ends at once), or its verification found a difference (it is
// rolled back, never completed). A watcher resumes a reversible move only
// then.
func WindowDue(rec *topo.MoveRecord) bool {
	if rec.State != topo.MoveReversible {
		return true
	}
	if rec.Verify != nil && !rec.Verify.OK {
		return true
	}
	rv := rec.Reverse
	return rv == nil || rv.Until == nil || rv.RollbackWanted != "" || rv.Lost != "" || !time.Now().Before(*rv.Until)
}

// window is the reversible step: roll back a move whose copy differs,
// complete one whose window ended, else nothing (errWindowOpen).
func (r *run) window(ctx context.Context) error {
	rv := r.rec.Reverse
	if r.rec.Verify != nil && !r.rec.Verify.OK {
		return r.rollback(ctx, "verification found a difference")
	}
	if rv != nil && rv.RollbackWanted != "" {
		return r.rollback(ctx, rv.RollbackWanted)
	}
	if rv != nil && rv.Rollback != "" {
		rrec, _, err := topo.ReadMove(ctx, r.mv.s, r.mv.p, rv.Rollback)
		if err == nil && !rrec.Finished() {
			// A rollback in flight is finished, never overtaken.
			return r.rollback(ctx, "resuming the rollback")
		}
	}
	if r.holdWindow {
		return errWindowOpen
	}
	if r.completeNow || WindowDue(r.rec) {
		return r.enter(ctx, topo.MoveCompleting)
	}
	return errWindowOpen
}

// complete drops the reverse stream; the move is then done and GC may
// prune the source's copy.
func (r *run) complete(ctx context.Context) error {
	if problems := r.dropReverse(ctx); len(problems) > 0 {
		_ = r.save(ctx)
		return fmt.Errorf("dropping the reverse stream: %s", strings.Join(problems, "; "))
	}
	return r.enter(ctx, topo.MoveDone)
}

// dropReverse removes the reverse stream's objects, each part idempotent,
// and returns what is left to do. The target's slot goes even when the
// source cannot be reached: it would hold the target's WAL for as long as
// the source is away.
func (r *run) dropReverse(ctx context.Context) (problems []string) {
	rv := r.rec.Reverse
	if rv == nil {
		return nil
	}
	src, srcErr := r.source(ctx)
	dst, dstErr := r.target(ctx)
	if srcErr == nil {
		onTarget := false
		if dstErr == nil {
			ok, err := slotExists(ctx, dst, rv.Slot)
			onTarget = err != nil || ok
		}
		if err := dropSubscription(ctx, src, rv.Subscription, onTarget); err != nil {
			problems = append(problems, "source: dropping the reverse subscription: "+err.Error())
		} else if dstErr != nil {
			rv.SlotPending = true
		}
	} else {
		problems = append(problems, "source unreachable (its reverse subscription stays until it answers): "+srcErr.Error())
	}
	if dstErr == nil {
		// Whatever the subscription's drop did (a mover that died after
		// detaching it never saved SlotPending): the slot must not stay.
		if srcErr != nil || len(problems) == 0 {
			if err := dropSlotNow(ctx, dst, rv.Slot); err != nil {
				problems = append(problems, "target: dropping the reverse slot: "+err.Error())
			} else {
				rv.SlotPending = false
			}
		}
		if err := dropPublication(ctx, dst, rv.Publication); err != nil {
			problems = append(problems, "target: dropping the reverse publication: "+err.Error())
		}
	} else {
		rv.SlotPending = true
		problems = append(problems, "target unreachable (its reverse slot stays until it answers): "+dstErr.Error())
	}
	return problems
}

// Complete ends a move's rollback window now: the reverse stream is
// dropped and the move is done. A move whose verification found a
// difference is never completed (it is rolled back), nor one whose
// rollback is in flight.
func (mv *Mover) Complete(ctx context.Context, id string) (*topo.MoveRecord, error) {
	return mv.withRun(ctx, id, func(ctx context.Context, r *run) error {
		switch {
		case r.rec.State == topo.MoveFailed:
			return hint.New(fmt.Errorf("move %s failed (%s)", id, r.rec.Error), fmt.Sprintf("shardctl move abort %s --after-failure", id))
		case !pastFlip(r.rec):
			return hint.New(fmt.Errorf("move %s has not flipped yet (%s): nothing to complete", id, r.rec.State), "run it: shardctl move resume "+id)
		case r.rec.Verify != nil && !r.rec.Verify.OK:
			return hint.New(fmt.Errorf("move %s: its verification found a difference, so the target's copy is never kept: it is rolled back", id), "shardctl move rollback "+id)
		}
		if rv := r.rec.Reverse; rv != nil && rv.Rollback != "" {
			if rrec, _, err := topo.ReadMove(ctx, r.mv.s, r.mv.p, rv.Rollback); err == nil && !rrec.Finished() {
				return hint.New(fmt.Errorf("move %s is being rolled back (move %s, %s): a rollback in flight is finished, never overtaken", id, rrec.ID, rrec.State),
					"finish it: shardctl move resume "+rrec.ID)
			}
		}
		r.completeNow = true
		if rv := r.rec.Reverse; rv != nil && rv.RollbackWanted != "" {
			// An operator's complete overrides a rollback asked for
			// earlier that did not get through (never one for a copy
			// that differs: refused above).
			rv.RollbackWanted = ""
		}
		return r.drive(ctx)
	})
}

// Rollback gives a move's bucket back to its source, with every write made
// on the target since the flip, over the move's reverse stream: a move of
// its own (RollbackOf), whose write pause is a forward move's. It returns
// the rolled-back move's record.
func (mv *Mover) Rollback(ctx context.Context, id string) (*topo.MoveRecord, error) {
	if err := mv.checkOptions(); err != nil {
		return nil, err
	}
	rec, err := mv.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	switch rec.State {
	case topo.MoveRolledBack:
		return rec, nil
	case topo.MoveDone, topo.MoveAborted:
		return rec, fmt.Errorf("%w: move %s is %s", ErrNoRollback, id, rec.State)
	}
	return mv.withRun(ctx, id, func(ctx context.Context, r *run) error {
		if r.rec.State != topo.MoveReversible {
			// A move on its way to the window (its mover died in reverse
			// or verify) gets there first.
			if pastFlip(r.rec) && r.rec.State != topo.MoveCompleting && r.rec.State != topo.MoveFailed && canRollBackLater(r.rec) {
				r.holdWindow = true
				if err := r.drive(ctx); err != nil {
					return err
				}
			}
		}
		switch r.rec.State {
		case topo.MoveRolledBack:
			// Its verification found a difference on the way: rolled
			// back already.
			return nil
		case topo.MoveReversible:
		default:
			return fmt.Errorf("%w: move %s is %s; only a move in its rollback window (reversible) rolls back", ErrNoRollback, id, r.rec.State)
		}
		// An operator's request gets a fresh count of attempts.
		if rv := r.rec.Reverse; rv != nil && rv.Rollback != "" {
			if rrec, _, err := topo.ReadMove(ctx, r.mv.s, r.mv.p, rv.Rollback); err != nil || rrec.Finished() {
				rv.RollbackAttempts = 0
			}
		}
		return r.rollback(ctx, "requested by an operator")
	})
}

// canRollBackLater: a move past its flip whose reverse stream is, or will
// be, running.
func canRollBackLater(rec *topo.MoveRecord) bool {
	rv := rec.Reverse
	return rv != nil && rv.Lost == "" && rec.RollbackOf == ""
}

// rollback runs (or resumes) the rollback move of the move r runs, which
// must be in its window. On success r.rec is the rolled-back record.
func (r *run) rollback(ctx context.Context, reason string) error {
	if !canRollBack(r.rec) {
		why := "it has no reverse stream"
		if rv := r.rec.Reverse; rv != nil && rv.Lost != "" {
			if r.rec.State == topo.MoveReversible && r.rec.RollbackOf == "" {
				// Lost in the window, and its end did not finish: finish it.
				return r.endWithoutWayBack(ctx, rv.Lost)
			}
			why = rv.Lost
		}
		return fmt.Errorf("%w: move %s: %s", ErrNoRollback, r.rec.ID, why)
	}
	rv := r.rec.Reverse
	rid := ""
	if rv.Rollback != "" {
		rrec, _, err := topo.ReadMove(ctx, r.mv.s, r.mv.p, rv.Rollback)
		switch {
		case errors.Is(err, zksession.ErrNoNode):
		case err != nil:
			return err
		case !rrec.Finished():
			rid = rrec.ID
		case rrec.State == topo.MoveDone:
			return r.reload(ctx)
		}
	}
	if rid == "" {
		if why, err := r.reverseBroken(ctx); err != nil {
			return err
		} else if why != "" {
			return r.endWithoutWayBack(ctx, why)
		}
		if rv.RollbackAttempts >= MaxRollbackAttempts {
			why := fmt.Sprintf("%d rollback moves aborted (the last: %s)", rv.RollbackAttempts, rv.Rollback)
			if v := r.rec.Verify; v != nil && !v.OK {
				// A copy that differs is never kept without a person.
				return r.endWithoutWayBack(ctx, why)
			}
			// Asked for by an operator: the wish ends, the window stays.
			rv.RollbackWanted = ""
			if err := r.save(ctx); err != nil {
				return err
			}
			return hint.New(fmt.Errorf("%w: move %s: %s; the bucket stays on %s and the window stays open", ErrNoRollback, r.rec.ID, why, r.rec.Target),
				"try again: shardctl move rollback "+r.rec.ID)
		}
		m, _, err := r.mv.st.Load(ctx)
		if err != nil {
			return err
		}
		now := time.Now().UTC()
		rrec := &topo.MoveRecord{Version: topo.MoveVersion, ID: moveID(r.rec.Bucket, r.rec.Level, m.Version), Bucket: r.rec.Bucket,
			Level: r.rec.Level, Lo: r.rec.Lo, Hi: r.rec.Hi, Source: r.rec.Target, Target: r.rec.Source, State: topo.MoveCatchup,
			Tables: r.rec.Tables, Publication: rv.Publication, Subscription: rv.Subscription, Slot: rv.Slot,
			RollbackOf: r.rec.ID, StartVersion: m.Version, CreatedAt: now, UpdatedAt: now,
			Steps: []topo.MoveStep{{State: topo.MoveCatchup, At: now}}, Runner: r.mv.runner}
		// The link first: a mover that dies between the two leaves a
		// name that does not exist, which the next attempt replaces.
		rv.Rollback = rrec.ID
		rv.RollbackWanted = reason
		rv.RollbackAttempts++
		if err := r.save(ctx); err != nil {
			return err
		}
		if err := topo.CreateMove(ctx, r.mv.s, r.mv.p, rrec); err != nil {
			return err
		}
		rid = rrec.ID
		r.mv.log.Info("rolling back move", zap.String("move", r.rec.ID), zap.String("rollback", rid), zap.String("reason", reason),
			zap.String("from", r.rec.Target), zap.String("to", r.rec.Source))
	}
	r.progress(fmt.Sprintf("rolling back (%s): move %s gives bucket %d back to %s", reason, rid, r.rec.Bucket, r.rec.Source))
	out, err := r.mv.drive(ctx, rid)
	if errors.Is(err, ErrBusy) {
		out, err = r.mv.await(ctx, rid)
	}
	if rerr := r.reload(ctx); rerr != nil {
		return rerr
	}
	if r.rec.State == topo.MoveRolledBack {
		return nil
	}
	state := stateOf(out)
	if err == nil {
		err = fmt.Errorf("it ended %s", state)
	}
	return hint.New(fmt.Errorf("rollback %s of move %s: %w; the bucket stays on %s and the window stays open", rid, r.rec.ID, err, r.rec.Target),
		"try again: shardctl move rollback "+r.rec.ID)
}

// reload reads the run's record again: a rollback's flip changed it.
func (r *run) reload(ctx context.Context) error {
	rec, ver, err := topo.ReadMove(ctx, r.mv.s, r.mv.p, r.rec.ID)
	if err != nil {
		return err
	}
	r.rec, r.ver = rec, ver
	return nil
}

// readRolledBack reads, in a rollback's fence step, the move it rolls back,
// for the flip's transaction (which ends it rolled_back by compare-and-swap
// on this version).
func (r *run) readRolledBack(ctx context.Context) error {
	rec, ver, err := topo.ReadMove(ctx, r.mv.s, r.mv.p, r.rec.RollbackOf)
	if err != nil {
		return fmt.Errorf("the move it rolls back, %s: %w", r.rec.RollbackOf, err)
	}
	if rec.State != topo.MoveReversible || rec.Reverse == nil || rec.Reverse.Rollback != r.rec.ID {
		return fmt.Errorf("move %s is %s and no longer waits for this rollback", rec.ID, rec.State)
	}
	r.undo, r.undoVer = rec, ver
	return nil
}

// rolledBackOp is the update, in a rollback's flip, that ends the move it
// rolls back.
func (r *run) rolledBackOp(at time.Time) (zksession.Op, error) {
	rec := *r.undo
	if err := checkTransition(&rec, topo.MoveRolledBack); err != nil {
		return zksession.Op{}, err
	}
	rec.State = topo.MoveRolledBack
	rec.Steps = append(append([]topo.MoveStep(nil), rec.Steps...), topo.MoveStep{State: topo.MoveRolledBack, At: at})
	rec.UpdatedAt = at
	rec.Runner = r.mv.runner
	return topo.UpdateMoveOp(r.mv.p, &rec, r.undoVer)
}

// moveID names a new move.
func moveID(bucket uint32, level int, version uint64) string {
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	return fmt.Sprintf("b%d-l%d-v%d-%s", bucket, level, version, hex.EncodeToString(suffix))
}

// cleanupRollback is a rollback's abort: the map stops saying moving once
// its source (the rolled-back move's target) owns the range again, and its
// target's prepared ownership is gone; nothing else changes.
func (r *run) cleanupRollback(ctx context.Context, m *bucketmap.Map, src *pgx.Conn, srcErr, dstErr error) (problems []string, unreachable bool, _ error) {
	sourceOwns := true
	if srcErr == nil {
		if r.rec.FenceVersion != 0 {
			if err := r.thawSource(ctx, src, m.Version); err != nil {
				sourceOwns = false
				problems = append(problems, "source fence: "+err.Error())
			}
		}
	} else if r.rec.FenceVersion != 0 {
		problems = append(problems, "source unreachable: "+srcErr.Error())
		unreachable = true
		sourceOwns = false
	}
	if sourceOwns {
		if err := r.clearMoving(ctx); err != nil {
			problems = append(problems, "map: "+err.Error())
		}
	}
	_ = dstErr // the target's fence never owned the range: nothing to undo there
	return problems, unreachable, nil
}

// startAt makes the reverse subscription (disabled) start from lsn: its
// replication origin's progress is set there, and the walsender skips
// every transaction that committed before it. Only forward, so that a
// resumed step never sends again what was applied. The slot is advanced
// too, so that it holds no WAL from before; that part may fall short
// (pg_replication_slot_advance stops at the WAL flushed so far, and the
// forward apply commits without flushing), which the origin makes
// harmless.
func startAt(ctx context.Context, src, dst *pgx.Conn, sub, slot, lsn string) error {
	if _, err := src.Exec(ctx, `SELECT pg_replication_origin_advance('pg_' || s.oid, $2::pg_lsn)
		FROM pg_subscription s WHERE s.subname = $1 AND s.subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND coalesce(pg_replication_origin_progress('pg_' || s.oid, false) < $2::pg_lsn, true)`, sub, lsn); err != nil {
		return fmt.Errorf("source: setting where the reverse subscription starts (%s): %w", lsn, err)
	}
	var ok bool
	if err := src.QueryRow(ctx, `SELECT coalesce(pg_replication_origin_progress('pg_' || s.oid, false) >= $2::pg_lsn, false)
		FROM pg_subscription s WHERE s.subname = $1 AND s.subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())`, sub, lsn).Scan(&ok); err != nil {
		return fmt.Errorf("source: the reverse subscription %s: %w", sub, err)
	}
	if !ok {
		return fmt.Errorf("source: the reverse subscription %s does not start at %s", sub, lsn)
	}
	if _, err := dst.Exec(ctx, `SELECT pg_replication_slot_advance(slot_name, $2::pg_lsn) FROM pg_replication_slots
		WHERE slot_name = $1 AND confirmed_flush_lsn < $2::pg_lsn`, slot, lsn); err != nil {
		return fmt.Errorf("target: advancing the reverse slot to %s: %w", lsn, err)
	}
	return nil
}

// MaxRollbackAttempts bounds the rollback moves started for one move: one
// that keeps aborting (a node refused as a target, a map that changed
// under it) ends the wish instead of looping.
const MaxRollbackAttempts = 5

// reverseBroken checks, before a rollback starts, that the reverse stream
// still runs: the source's subscription enabled (an apply error disables
// it) and the target's slot there and not invalidated (a failover of the
// target, max_slot_wal_keep_size). An unreachable node is an error (try
// again later), not a broken stream.
func (r *run) reverseBroken(ctx context.Context) (string, error) {
	rv := r.rec.Reverse
	if _, err := r.nodes(ctx); err != nil {
		return "", err
	}
	src, dst, err := r.conns(ctx)
	if err != nil {
		return "", err
	}
	enabled, err := dbnode.SubscriptionEnabled(ctx, src, rv.Subscription)
	if err != nil {
		return "", fmt.Errorf("source: %w", err)
	}
	switch {
	case enabled == nil:
		return fmt.Sprintf("the reverse subscription %s is gone from %s", rv.Subscription, r.rec.Source), nil
	case !*enabled:
		// disable_on_error also stops it on a transient error (a
		// deadlock, a lock timeout): enabled again, it retries that
		// transaction; one that fails for good fails the rollback's
		// catch-up, which counts as an attempt.
		r.mv.log.Warn("the reverse subscription was disabled by an apply error; enabling it again for the rollback", zap.String("move", r.rec.ID), zap.String("subscription", rv.Subscription))
		if err := enableSubscription(ctx, src, rv.Subscription); err != nil {
			return "", fmt.Errorf("source: enabling the reverse subscription: %w", err)
		}
	}
	slot, err := dbnode.ReplicationSlot(ctx, dst, rv.Slot)
	if err != nil {
		return "", fmt.Errorf("target: %w", err)
	}
	switch {
	case slot == nil:
		return fmt.Sprintf("the reverse slot %s is gone from %s (a failover of the target?)", rv.Slot, r.rec.Target), nil
	case slot.WALStatus == "lost":
		return fmt.Sprintf("the reverse slot %s on %s was invalidated (max_slot_wal_keep_size)", rv.Slot, r.rec.Target), nil
	}
	return "", nil
}

// endWithoutWayBack ends a move whose reverse stream cannot serve a
// rollback: the stream is dropped; a move whose verification found a
// difference is failed (a person decides: move abort --after-failure),
// any other is done, on its target.
func (r *run) endWithoutWayBack(ctx context.Context, why string) error {
	r.mv.log.Error("move cannot be rolled back", zap.String("move", r.rec.ID), zap.String("why", why))
	// The reason first: a drop that cannot finish (a node away) leaves
	// the record saying that the way back is lost, and the window due
	// (WindowDue), so that whoever resumes the move ends it.
	rv := r.rec.Reverse
	rv.Lost, rv.Enabled, rv.RollbackWanted = why, false, ""
	if problems := r.dropReverse(ctx); len(problems) > 0 {
		_ = r.save(ctx)
		return fmt.Errorf("move %s: %s, and dropping its reverse stream: %s", r.rec.ID, why, strings.Join(problems, "; "))
	}
	if v := r.rec.Verify; v != nil && !v.OK {
		r.rec.Error = fmt.Sprintf("verification mismatch: %s; no rollback possible: %s (the bucket is on %s; see shardctl move abort %s --after-failure)", describe(v), why, r.rec.Target, r.rec.ID)
		if err := r.enter(ctx, topo.MoveFailed); err != nil {
			return err
		}
		return fmt.Errorf("%w: %s", ErrNoRollback, r.rec.Error)
	}
	if err := r.enter(ctx, topo.MoveDone); err != nil {
		return err
	}
	return fmt.Errorf("%w: move %s: %s; the move is done, its bucket on %s", ErrNoRollback, r.rec.ID, why, r.rec.Target)
}
