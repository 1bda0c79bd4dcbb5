package migrate

// Abort and cleanup: a move rolled back before its flip, the source
// owning the range again and the target's partial copy removed.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/backoff"
	"github.com/shardvisor/shardvisor/topo"
)

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
		r.rec.Error = hint.Text(cause) // the record keeps what to run, too
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
			return hint.New(fmt.Errorf("move %s: aborting after %v, but the cleanup is incomplete: %s", r.rec.ID, cause, strings.Join(problems, "; ")),
				fmt.Sprintf("run `shardctl move resume %s` when the nodes answer", r.rec.ID))
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

// claimsAny reports whether a fence has any state for keys in lo..hi.
func claimsAny(f *fence.Fence, lo, hi int64) bool {
	for _, sp := range f.Spans {
		if sp.Lo <= hi && sp.Hi >= lo {
			return true
		}
	}
	return false
}
