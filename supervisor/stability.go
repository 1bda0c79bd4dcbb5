package supervisor

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/topo"
)

// A swap is done only when the new generation holds (the pool config's
// "stability"):
//
//   - Window: a new config's workers count towards retiring the previous
//     generation only once each has stayed ready for the window. Until
//     then both generations serve, and a crash of a new worker after its
//     READY=1 rolls the swap back: the previous generation never stopped.
//   - RollbackWithin: after the window, a crash loop of the new config's
//     workers (as many crashes as the pool has workers, at least 2)
//     restarts the previous config at once, with the current map.
//
// A rolled-back config is refused until the config changes (or a HUP asks
// for it again). A config change back to one that already held, and a
// swap for a new map only, need no window: that config has proven itself,
// and a map cannot be rolled back (the old map routes to the wrong node).

// windowFor is the stability window generation d must pass before it
// may retire the serving generation (0: none).
func (m *machine) windowFor(d *generation) time.Duration {
	if d == nil || m.good == nil || d == m.good || d.established {
		return 0 // nothing else to keep serving, or already done
	}
	if d.spec.ident() == m.good.spec.ident() || m.held[d.spec.ident()] {
		return 0
	}
	return d.spec.cfg.Stability.WindowD()
}

// proven reports whether w, ready, counts towards retiring others: its
// generation needs no window (it held, or its config did), or w has been
// ready for that window. A worker of a generation superseded inside its
// window (a map change, a HUP, a newer config) has not proven anything
// either: it must not retire the generation that held.
func (m *machine) proven(w *worker, now time.Time) bool {
	win := m.windowFor(w.gen)
	return win == 0 || !now.Before(w.readyAt.Add(win))
}

// onEstablished records what the stability checks need when g took over
// from prev.
func (m *machine) onEstablished(g, prev *generation, now time.Time) {
	if prev == nil && m.lostFrom != nil && m.lostFrom.ident() != g.spec.ident() && !m.held[g.spec.ident()] {
		// The first generation after a session loss runs a config that
		// never held (the loss came inside its window): no window is
		// possible with nothing else running, but a crash loop still
		// goes back to the config that served before the loss.
		m.prevCfg, m.cfgSince, m.cfgCrashes = m.lostFrom, now, 0
	}
	m.lostFrom = nil
	if prev != nil && prev.spec.ident() != g.spec.ident() {
		if m.held[g.spec.ident()] {
			m.prevCfg = nil // a change back to a config that held: nothing to roll back to
		} else {
			m.prevCfg, m.cfgSince, m.cfgCrashes = prev.spec, now, 0
		}
	}
	if len(m.held) > 64 {
		m.held = map[string]bool{} // bounded: only recent configs matter
	}
	m.held[g.spec.ident()] = true
}

// rejectInWindow rolls back a swap whose worker w crashed after READY=1
// inside the stability window: the serving generation still runs at its
// target, so it simply stays.
func (m *machine) rejectInWindow(g *generation, w *worker, status string, now time.Time) {
	win := g.spec.cfg.Stability.WindowD()
	reason := fmt.Sprintf("worker %d (pid %d) of generation %d (config version %d) died %s after READY=1, inside the stability window of %s: %s",
		w.id, w.pid, g.id, g.spec.cfgVersion, now.Sub(w.readyAt).Round(time.Millisecond), win, status)
	g.failed = true
	m.noteRollback(g, m.good.spec, "window", reason, now)
	m.endReload(g, "rolled back")
	m.log.Warn("new config crashed after READY=1 inside the stability window; rolled back: the previous generation never stopped serving, and this config is not retried until it changes (or HUP)",
		zap.Int64("generation", g.id), zap.Int64("config_version", g.spec.cfgVersion), zap.Int64("serving_generation", m.good.id),
		zap.Int64("serving_config_version", m.good.spec.cfgVersion), zap.String("reason", reason))
	if m.desired != nil && m.desired.ident() == g.spec.ident() {
		m.desired = m.good.spec.withMap(m.curMap)
	}
	m.latest = m.good
	m.stopStarting(g, "rolled_back", now)
	// Sockets only the rolled-back config listed: nothing will accept on
	// them again (its ready workers keep their own copies until retired).
	m.closeUnusedSockets()
}

// noteConfigCrash counts a crash of a worker of the serving generation
// and rolls back to the previous config when the new one crash-loops
// within stability.rollback_within of taking over.
func (m *machine) noteConfigCrash(w *worker, status string, now time.Time) {
	g := m.good
	if m.prevCfg == nil || g == nil || w.gen.spec.ident() != g.spec.ident() || m.latest != g {
		return
	}
	within := g.spec.cfg.Stability.RollbackWithinD()
	if within <= 0 || now.After(m.cfgSince.Add(within)) {
		m.prevCfg = nil // held long enough: crashes from now on are only respawned
		return
	}
	m.cfgCrashes++
	need := max(2, m.target())
	if m.cfgCrashes < need {
		m.log.Warn("a worker of the new config crashed soon after it took over; one more crash loop rolls it back",
			zap.Int64("config_version", g.spec.cfgVersion), zap.Int("crashes", m.cfgCrashes), zap.Int("roll_back_at", need),
			zap.Duration("since_took_over", now.Sub(m.cfgSince).Round(time.Millisecond)))
		return
	}
	to := m.prevCfg
	reason := fmt.Sprintf("%d worker crashes of config version %d within %s of it taking over (rollback_within %s; last: worker %d, pid %d: %s)",
		m.cfgCrashes, g.spec.cfgVersion, now.Sub(m.cfgSince).Round(time.Millisecond), within, w.id, w.pid, status)
	m.noteRollback(g, to, "crash_loop", reason, now)
	m.log.Warn("new config crash-loops; rolling back: restarting the previous config now, and not retrying this one until it changes (or HUP)",
		zap.Int64("generation", g.id), zap.Int64("config_version", g.spec.cfgVersion), zap.Int64("to_config_version", to.cfgVersion), zap.String("reason", reason))
	if m.desired != nil && m.desired.ident() == g.spec.ident() {
		m.desired = to.withMap(m.curMap)
	}
	m.prevCfg = nil
	m.rollingBackTo = to.cfgID()
	// Start the previous config at once: no debounce, no crash backoff.
	m.changeFirst, m.respawnAt, m.crashCount = time.Time{}, time.Time{}, 0
}

// noteRollback records a rollback from g's config to the config of to:
// metrics, the member record, the pool status, and the refusal of g's
// config until it changes.
func (m *machine) noteRollback(g *generation, to *spec, kind, reason string, now time.Time) {
	m.bad = g.spec.cfgID()
	m.m.configRefused.Set(1)
	m.rollback = &topo.Rollback{ConfigVersion: g.spec.cfgVersion, ToConfigVersion: to.cfgVersion, Reason: reason, At: now.UTC()}
	m.m.rollbacks.WithLabelValues(kind).Inc()
	m.m.swaps.WithLabelValues(topo.SwapRolledBack).Inc()
	m.lastError = "rolled back: " + reason
	m.publish(topo.SwapRolledBack, g, reason, 0, now)
}
