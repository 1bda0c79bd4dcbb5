package migrate

// The copy and catchup steps: the forward stream set up and its rows
// copied (copy.go holds the initial copy itself), then lag probed with
// markers until it is low enough to fence.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/topo"
)

func (r *run) copy(ctx context.Context) error {
	src, err := r.source(ctx)
	if err != nil {
		return err
	}
	dst, err := r.target(ctx)
	if err != nil {
		return err
	}
	setup := r.mark()
	// Again, for a move resumed in copy: nothing is copied across a
	// difference that appeared since prepare. A run that compared them in
	// prepare itself entered copy through the schema gate
	// (topo.EnterMoveData), and a schema change waits for moves in copy:
	// nothing can have changed since.
	if !r.comparedHere {
		if err := r.compareSchemas(ctx, src, dst); err != nil {
			return err
		}
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
	r.timed(topo.PhaseSetup, setup)
	copying := r.mark()
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
	// copyRange's first part, until every stream holds the slot's
	// snapshot, is the slot's (PhaseSlot); the rest is the copy's.
	r.rec.Stats.AddPhase(topo.PhaseSlot, r.slotTook)
	copying.at = copying.at.Add(r.slotTook)
	r.timed(topo.PhaseCopy, copying)
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
	r.markerSeq++
	start := time.Now()
	if _, err := insertMarker(ctx, src, r.markerID(), r.markerSeq); err != nil {
		return 0, fmt.Errorf("source: marker: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := waitMarker(wctx, dst, r.markerID(), r.markerSeq, 20*time.Millisecond); err != nil {
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
		reverse := r.mark()
		src, dst, err := r.conns(ctx)
		if err != nil {
			return err
		}
		if err := r.setupReverse(ctx, src, dst); err != nil {
			return err
		}
		r.timed(topo.PhaseReverseSetup, reverse)
	}
	deadline := time.Now().Add(r.mv.opts.CatchupTimeout)
	probing := r.mark()
	for {
		lag, err := r.probe(ctx, 10*r.mv.opts.MaxLag)
		if err != nil {
			return err
		}
		r.rec.Stats.LagAtFenceMS = float64(lag.Microseconds()) / 1000
		if lag <= r.mv.opts.MaxLag {
			r.timed(topo.PhaseCatchup, probing)
			checks := r.mark()
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
			r.timed(topo.PhaseChecks, checks)
			return r.enter(ctx, topo.MoveFence)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replication lag %s stayed above %s for %s: refusing to fence", lag.Round(time.Millisecond), r.mv.opts.MaxLag, r.mv.opts.CatchupTimeout)
		}
		r.progress(fmt.Sprintf("catching up: lag %s above %s", lag.Round(time.Millisecond), r.mv.opts.MaxLag))
	}
}
