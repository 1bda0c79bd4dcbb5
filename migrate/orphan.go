package migrate

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/backoff"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// FrozenSince says whether a move record shows a write pause that has not
// ended, and since when: the source's fence froze the range (or was asked
// to) and neither a flip that settled the fences nor a rollback that gave
// the range back to the source followed. A mover that dies there leaves
// the bucket refusing writes on every node until the move is resumed.
func FrozenSince(rec *topo.MoveRecord) (time.Time, bool) {
	if rec == nil || rec.FreezeStartedAt == nil || rec.Finished() || rec.State == topo.MoveFailed {
		return time.Time{}, false
	}
	if rec.FlipVersion != 0 {
		// Flipped, but the fences may not have followed (the target's
		// ownership was committed by the dead mover, or not): until the
		// record leaves flip, count it as frozen.
		return *rec.FreezeStartedAt, rec.State == topo.MoveFlip
	}
	return *rec.FreezeStartedAt, rec.PauseEndedAt == nil
}

// WatchOrphans resumes moves whose mover died while their bucket was in the
// write pause or marked moving (orphaned moves), until ctx ends. It follows
// the map: for every bucket marked moving it watches the move's runner
// lock, and when the lock is gone (its mover's ZooKeeper session expired,
// or the mover stopped) and the move is not finished, it resumes the move
// (which rolls it back or finishes it, see Resume), retrying with backoff
// until the move is finished or no longer orphaned: another mover taking
// the lock first (ErrBusy) only makes it wait for that one. So an orphaned
// move ends within the dead mover's session timeout plus a resume.
//
// Moves run by this process hold their lock and are left alone. Several
// watchers (rebalancers on standby) may run at once: the runner lock
// decides which one resumes. Options.Metrics, if set, gets the age of the
// oldest frozen bucket and the resumes' outcomes.
func (mv *Mover) WatchOrphans(ctx context.Context) {
	log := mv.log.With(zap.String("component", "orphan-watcher"))
	var (
		mu      sync.Mutex
		tracked = map[string]bool{}
		wg      sync.WaitGroup
	)
	defer wg.Wait()
	follow := func(id string) {
		mu.Lock()
		defer mu.Unlock()
		if tracked[id] {
			return
		}
		tracked[id] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			mv.followOrphan(ctx, id, log)
			mu.Lock()
			delete(tracked, id)
			mu.Unlock()
		}()
	}
	// Once at the start: moves orphaned before this watcher ran, whose
	// bucket the map may no longer mark moving (a mover that died right
	// after its flip).
	if list, err := mv.List(ctx); err != nil {
		log.Warn("listing moves", zap.Error(err))
	} else {
		for _, rec := range list {
			if _, frozen := FrozenSince(rec); frozen {
				follow(rec.ID)
			}
		}
	}
	w := topo.WatchMap(ctx, mv.s, mv.p)
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.C:
		}
		m, _, err := mv.st.Load(ctx)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("reading the map", zap.Error(err))
			}
			continue
		}
		for _, b := range m.NonActive() {
			if bm := m.Meta(b); bm.State == bucketmap.BucketMoving && bm.Move != "" {
				follow(bm.Move)
			}
		}
	}
}

// followOrphan follows one move until it is finished or no longer needs a
// runner: it resumes it whenever no mover holds it.
func (mv *Mover) followOrphan(ctx context.Context, id string, log *zap.Logger) {
	met := mv.opts.Metrics
	defer met.unfrozen(id)
	rw := topo.WatchMoveRunner(ctx, mv.s, mv.p, id)
	defer rw.Stop()
	held := true
	select {
	case <-ctx.Done():
		return
	case n := <-rw.C:
		held = n.Exists
	}
	retry := backoff.New(200*time.Millisecond, 5*time.Second)
	for {
		rec, _, err := topo.ReadMove(ctx, mv.s, mv.p, id)
		if errors.Is(err, zksession.ErrNoNode) || ctx.Err() != nil {
			return
		}
		if err == nil {
			if since, frozen := FrozenSince(rec); frozen {
				met.frozen(id, since)
			} else {
				met.unfrozen(id)
			}
			if rec.Finished() || rec.State == topo.MoveFailed || !mv.orphanable(ctx, rec) {
				return
			}
		} else {
			log.Warn("reading move record", zap.String("move", id), zap.Error(err))
		}
		// Take the latest runner state without waiting.
		select {
		case n := <-rw.C:
			held = n.Exists
		default:
		}
		var wait <-chan time.Time
		if err == nil && !held {
			since, frozen := FrozenSince(rec)
			fields := []zap.Field{zap.String("move", id), zap.String("state", rec.State), zap.String("last_runner", rec.Runner)}
			if frozen {
				fields = append(fields, zap.Duration("frozen_for", time.Since(since)))
			}
			log.Warn("orphaned move: its mover is gone; resuming it", fields...)
			out, rerr := mv.Resume(ctx, id)
			switch {
			case rerr == nil || (out != nil && out.Finished()):
				state, pause := "", 0.0
				if out != nil {
					state, pause = out.State, out.Stats.PauseMS
				}
				met.orphanResumed("finished")
				log.Info("orphaned move resumed", zap.String("move", id), zap.String("state", state), zap.Float64("pause_ms", pause))
				continue // re-read: finished, so return
			case errors.Is(rerr, ErrBusy):
				// Another mover (a person's resume, another watcher) took
				// it first: follow that one's lock.
				met.orphanResumed("busy")
				held = true
				continue
			default:
				met.orphanResumed("error")
				d := retry.Next()
				log.Warn("resuming orphaned move failed; trying again", zap.String("move", id), zap.Duration("in", d), zap.Error(rerr))
				wait = time.After(d)
			}
		} else if err != nil {
			wait = time.After(retry.Next())
		}
		// Wait for the runner to change (its session expiring deletes
		// it), a retry's turn, or now and then a re-read.
		if wait == nil {
			wait = time.After(30 * time.Second)
		}
		select {
		case <-ctx.Done():
			return
		case n := <-rw.C:
			held = n.Exists
		case <-wait:
		}
	}
}

// orphanable reports whether an unfinished move would leave a bucket
// unwritable without a runner: its pause is open, or the map still marks
// its bucket moving for it. Other unfinished moves (aborting with the map
// already cleared, say) hurt no writer and are left to the rebalancer's
// next run or `shardctl move resume`.
func (mv *Mover) orphanable(ctx context.Context, rec *topo.MoveRecord) bool {
	if _, frozen := FrozenSince(rec); frozen {
		return true
	}
	m, _, err := mv.st.Load(ctx)
	if err != nil {
		return true // unknown: keep following
	}
	if rec.Level != m.Level {
		return false
	}
	bm := m.Meta(rec.Bucket)
	return bm.State == bucketmap.BucketMoving && bm.Move == rec.ID
}
