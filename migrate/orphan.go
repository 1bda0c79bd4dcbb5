package migrate

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

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

// OrphanGrace is how long a move's runner lock must stay absent before the
// orphan watcher takes the move over: a mover creates a move's record a
// moment before it takes its lock.
const OrphanGrace = time.Second

// orphanRescan is how often the orphan watcher lists the moves again, and
// re-reads a followed move's record, without being told of a change: a
// missed watch event (a reconnect) costs at most this long.
const orphanRescan = 30 * time.Second

// reverseProbeEvery is how often the orphan watcher reads the state of a
// reverse stream in its rollback window from the servers: a way back
// lost (a failover of the target) is seen, and the window ended, within
// this and a probe's time.
const reverseProbeEvery = 2 * time.Second

// WatchOrphans gives every unfinished move an owner, until ctx ends: a move
// whose mover is gone (its ZooKeeper session expired, or it stopped), in
// any state, is resumed, which finishes it or rolls it back (see Resume).
// It follows the list of move records (one children watch) and, for each
// unfinished move, the move's runner lock (one data watch); when the lock
// has been gone for OrphanGrace it resumes the move, retrying with backoff
// until the move is finished: another mover taking the lock first
// (ErrBusy) only makes it wait for that one. So an orphaned move is taken
// over within the dead mover's session timeout plus OrphanGrace, whatever
// its state; what the resume then does (an abort's cleanup waiting for a
// node that is away, a copy) takes as long as it takes, with nobody
// needed. Failed moves (a verification mismatch after the flip) are left
// to a person: `shardctl move abort ID --after-failure`.
//
// A move in its rollback window has its reverse stream probed from the
// servers every reverseProbeEvery (Options.Metrics gets its state and
// lag); one found lost (the target failed over, the slot was
// invalidated) gets the reason recorded and its window ended at once
// (EndLostWindow), so that nobody counts on a way back that is gone.
//
// It needs ZooKeeper only to see and take moves: it never exits on a lost
// session or connection; its watches come back with the session. Moves
// run by this process hold their lock and are left alone. Several watchers
// (rebalancers on standby) may run at once: the runner lock decides which
// one resumes. Options.Metrics, if set, gets the age of the oldest frozen
// bucket and the resumes' outcomes.
func (mv *Mover) WatchOrphans(ctx context.Context) {
	log := mv.log.With(zap.String("component", "orphan-watcher"))
	var (
		mu      sync.Mutex
		tracked = map[string]bool{}
		done    = map[string]bool{} // finished records never change again
		wg      sync.WaitGroup
	)
	defer wg.Wait()
	follow := func(id string) {
		mu.Lock()
		defer mu.Unlock()
		if tracked[id] || done[id] {
			return
		}
		tracked[id] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			finished := mv.followOrphan(ctx, id, log)
			mu.Lock()
			delete(tracked, id)
			if finished {
				done[id] = true
			}
			mu.Unlock()
		}()
	}
	scan := func() {
		ids, err := topo.ListMoves(ctx, mv.s, mv.p)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("listing moves", zap.Error(err))
			}
			return
		}
		for _, id := range ids {
			mu.Lock()
			skip := tracked[id] || done[id]
			mu.Unlock()
			if skip {
				continue
			}
			rec, _, err := topo.ReadMove(ctx, mv.s, mv.p, id)
			switch {
			case errors.Is(err, zksession.ErrNoNode):
			case err != nil:
				if ctx.Err() == nil {
					log.Warn("reading move record", zap.String("move", id), zap.Error(err))
				}
			case rec.Finished() || rec.State == topo.MoveFailed:
				mu.Lock()
				done[id] = true
				mu.Unlock()
			default:
				follow(id)
			}
		}
	}
	w := topo.WatchMoves(ctx, mv.s, mv.p)
	defer w.Stop()
	tick := time.NewTicker(orphanRescan)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.C:
		case <-tick.C:
		}
		scan()
	}
}

// followOrphan follows one unfinished move until it is finished (true) or
// ctx ends: it resumes it whenever no mover has held it for OrphanGrace.
func (mv *Mover) followOrphan(ctx context.Context, id string, log *zap.Logger) bool {
	met := mv.opts.Metrics
	// A run of this process that stopped inside the pause (its lock lost)
	// left its own entry (run.pauseGauge): the record decides from here.
	unfrozen := func() { met.unfrozen(id); met.unfrozen("run:" + id) }
	defer unfrozen()
	defer met.reverseGone(id)
	var reverse reverseSeen
	rw := topo.WatchMoveRunner(ctx, mv.s, mv.p, id)
	defer rw.Stop()
	// The record too, for the frozen-bucket gauge: a mover saves
	// freeze_started_at before it freezes, so the gauge is up from the
	// freeze on, whether that mover lives (in another process) or dies.
	recw := topo.WatchMove(ctx, mv.s, mv.p, id)
	defer recw.Stop()
	gauge := func(rec *topo.MoveRecord) {
		switch since, frozen := FrozenSince(rec); {
		case frozen:
			met.frozen(id, since)
		case rec.FreezeStartedAt != nil:
			unfrozen() // a pause began and ended
		default:
			// No pause yet, as far as this (maybe older) record says:
			// the run's own entry stays.
			met.unfrozen(id)
		}
	}
	held, ours := true, false
	var (
		absentSince time.Time
		last        zksession.Node
	)
	observe := func(n zksession.Node) {
		last = n
		// A runner node of this very session that no run of this process
		// holds is a lock this process lost while ZooKeeper was away
		// (its session survived on the servers, so the node did too, but
		// the run stopped): nobody runs the move.
		ours = n.Exists && n.Stat.EphemeralOwner == mv.s.SessionID()
		exists := n.Exists && !(ours && !mv.runs(id))
		held = exists
		if exists {
			absentSince = time.Time{}
		} else if absentSince.IsZero() {
			absentSince = time.Now()
		}
	}
	select {
	case <-ctx.Done():
		return false
	case n := <-rw.C:
		observe(n)
	}
	retry := backoff.New(200*time.Millisecond, 5*time.Second)
	for {
		rec, _, err := topo.ReadMove(ctx, mv.s, mv.p, id)
		if errors.Is(err, zksession.ErrNoNode) {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if err == nil {
			gauge(rec)
			if rec.Finished() || rec.State == topo.MoveFailed {
				return true
			}
		} else {
			log.Warn("reading move record", zap.String("move", id), zap.Error(err))
		}
		// Take the latest runner state without waiting (a run of this
		// process may have ended since: judge the last node again).
		select {
		case n := <-rw.C:
			observe(n)
		default:
			observe(last)
		}
		var wait <-chan time.Time
		var lost bool
		if err == nil {
			lost = mv.watchReverse(ctx, rec, &reverse, log)
		}
		switch {
		case err != nil:
			wait = time.After(retry.Next())
		case !held && lost:
			out, rerr := mv.EndLostWindow(ctx, id)
			// A step after the record was written (a cleanup) may fail: the
			// window ended all the same, and is counted once, here (the
			// record is finished, so no later round sees it).
			ended := out != nil && out.Finished() && out.Reverse != nil && out.Reverse.Lost != ""
			if rerr != nil && ended {
				log.Warn("the move's rollback window ended (its way back is lost), then a step failed", zap.String("move", id), zap.Error(rerr))
				rerr = nil
			}
			switch {
			case rerr == nil && ended:
				met.reverseLost()
				log.Error("the move's way back is lost: its rollback window ended", zap.String("move", id), zap.String("state", out.State),
					zap.String("why", out.Reverse.Lost), zap.String("target", out.Target))
				continue
			case errors.Is(rerr, ErrBusy):
				held, absentSince = true, time.Time{}
			case rerr != nil:
				log.Warn("ending the rollback window of a move whose way back is lost; trying again", zap.String("move", id), zap.Error(rerr))
			}
			wait = time.After(reverseProbeEvery)
		case !held && rec.State == topo.MoveReversible && !WindowDue(rec):
			// In its rollback window nothing is due before the window
			// ends (an operator's rollback or complete takes the lock)
			// but the probes of its reverse stream.
			d := min(time.Until(*rec.Reverse.Until)+10*time.Millisecond, orphanRescan, reverseProbeEvery)
			wait = time.After(d)
		case !held && time.Since(absentSince) < OrphanGrace:
			// A mover that just created the move takes its lock now.
			wait = time.After(OrphanGrace - time.Since(absentSince))
		case !held:
			since, frozen := FrozenSince(rec)
			fields := []zap.Field{zap.String("move", id), zap.String("state", rec.State), zap.String("last_runner", rec.Runner),
				zap.Duration("runner_gone_for", time.Since(absentSince).Round(time.Millisecond))}
			if frozen {
				fields = append(fields, zap.Duration("frozen_for", time.Since(since)))
			}
			log.Warn("orphaned move: its mover is gone; resuming it", fields...)
			out, rerr := mv.Resume(ctx, id)
			switch {
			case rerr == nil && out != nil && out.State == topo.MoveReversible:
				// Left in its window: wait for its end.
				met.orphanResumed("window")
				continue
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
				held, absentSince = true, time.Time{}
				continue
			default:
				met.orphanResumed("error")
				d := retry.Next()
				log.Warn("resuming orphaned move failed; trying again", zap.String("move", id), zap.String("state", stateOf(out)), zap.Duration("in", d), zap.Error(rerr))
				wait = time.After(d)
			}
		}
		// Wait for the runner to change (its session expiring deletes
		// it), a retry's turn, or now and then a re-read.
		if wait == nil {
			wait = time.After(orphanRescan)
			if ours {
				// A run of this process: its end changes no znode
				// when ZooKeeper is away, so look again soon.
				wait = time.After(time.Second)
			}
		}
	waiting:
		for {
			select {
			case <-ctx.Done():
				return false
			case n := <-rw.C:
				observe(n)
				break waiting
			case n := <-recw.C:
				// A record change decides nothing by itself (the runner
				// lock does): only the gauge follows it, at once.
				if !n.Exists {
					return true
				}
				if rec, err := topo.DecodeMove(mv.p.Move(id), n.Data); err == nil {
					gauge(rec)
					if rec.Finished() || rec.State == topo.MoveFailed {
						return true
					}
				}
			case <-wait:
				break waiting
			}
		}
	}
}

// reversePublishEvery bounds how often a probe whose state and reason did
// not change is published again (for its lag and its age): a change is
// published at once.
const reversePublishEvery = 10 * time.Second

// reverseSeen is what a watcher last saw and published of one move's
// reverse stream.
type reverseSeen struct {
	state     string
	published *ReverseProbe
}

// watchReverse probes the reverse stream of a move in its rollback window
// for the metrics and the status page (topo.WriteReverseState), logs a
// change of its state, and reports whether it is lost.
func (mv *Mover) watchReverse(ctx context.Context, rec *topo.MoveRecord, seen *reverseSeen, log *zap.Logger) bool {
	met := mv.opts.Metrics
	if rec.State != topo.MoveReversible || !probed(rec) {
		met.reverseGone(rec.ID)
		*seen = reverseSeen{}
		return false
	}
	p := mv.ProbeReverse(ctx, rec)
	if p == nil || ctx.Err() != nil {
		return false
	}
	met.reverseProbed(rec.ID, p)
	if p.State != seen.state {
		fields := []zap.Field{zap.String("move", rec.ID), zap.String("state", p.State), zap.String("was", seen.state), zap.String("why", p.Reason)}
		if p.LagBytes != nil {
			fields = append(fields, zap.Int64("lag_bytes", *p.LagBytes))
		}
		switch p.State {
		case ReverseRunning:
			log.Info("reverse stream", fields...)
		case ReverseLost:
			log.Error("reverse stream lost: the move can no longer be rolled back", fields...)
		default:
			log.Warn("reverse stream not running", fields...)
		}
		seen.state = p.State
	}
	if last := seen.published; last == nil || last.State != p.State || last.Reason != p.Reason || p.At.Sub(last.At) >= reversePublishEvery {
		p.By = mv.runner
		if err := topo.WriteReverseState(ctx, mv.s, mv.p, rec.ID, *p); err != nil {
			log.Warn("publishing the reverse stream's state for the status page", zap.String("move", rec.ID), zap.Error(err))
		} else {
			seen.published = p
		}
	}
	return p.State == ReverseLost
}

func stateOf(rec *topo.MoveRecord) string {
	if rec == nil {
		return ""
	}
	return rec.State
}
