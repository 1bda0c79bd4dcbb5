package migrate

// The drive loop: each state's step, in turn, and what a failed step
// means (roll back before the flip, stop after it).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/backoff"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

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
		if pastFlip(r.rec) {
			// The target owns the bucket: an abort would take it back
			// from the map's owner (topo.MoveTransitions refuses it).
			r.rec.Error = hint.Text(err)
			_ = r.save(ctx)
			return hint.New(fmt.Errorf("move %s stopped in %s (the bucket is already on %s): %w", id, r.rec.State, r.rec.Target, err),
				"add the node back (shardctl node add), then finish the move: shardctl move resume "+id)
		}
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
		r.stepMark = r.mark()
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
			r.rec.Error = hint.Text(err)
			_ = r.save(ctx)
			return hint.New(fmt.Errorf("move %s stopped in %s (the bucket is already on %s): %w", id, r.rec.State, r.rec.Target, err), "finish it: shardctl move resume "+id)
		}
		return r.stopped(ctx, r.abort(ctx, err))
	}
}
