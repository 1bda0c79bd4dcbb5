package migrate

// After the flip: teardown of the forward stream, verification, and the
// entry into the rollback window (reverse.go holds the window itself).

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/topo"
)

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
