package supervisor

import (
	"fmt"
	"time"

	"go.uber.org/zap"
)

// A broken deploy that boots: workers that say READY=1 and then answer
// every request with an error. Workers accept on the shared sockets from
// the moment they start, so such a worker can only be kept short, and few:
//
//   - Canary: a new config's generation with a probe, while another one
//     serves, starts one worker; the rest start only once that one is ready
//     (READY=1, readiness.delay and a passed probe).
//   - First probe: from READY=1 on, a worker is probed at once and every
//     100 ms until its first pass, and the first failure kills it
//     (SIGKILL, no failures in a row): the swap fails, the serving
//     generation never stopped.
//   - Attempts: a config that fails its swap is retried after the restart
//     backoff (restart.initial doubling up to restart.max), and after
//     MaxSwapAttempts swaps whose canary failed its first probe it is
//     refused until it changes (HUP retries it), as a rolled-back config
//     is. Only those count: a worker that exits before READY=1, or a bind
//     that fails, took no traffic, and may work once what it needs (a
//     database, a port) is back. Only while another generation serves:
//     with nothing serving, retrying costs nothing. A config that already
//     held is retried for ever (a new map in swap mode cannot be refused:
//     the old map routes to the wrong node).

// MaxSwapAttempts is how many swaps in a row to one config may fail
// before it is refused until it changes.
const MaxSwapAttempts = 3

// wantsCanary reports whether a generation of sp, created now, starts
// with one canary worker: a config with a probe that never held, while a
// generation that held runs (its workers may be respawning: they keep
// booting beside the canary, keepBooting). Without a probe the canary
// would pass at READY=1, which a broken worker says too: it would only
// cost a boot time.
func (m *machine) wantsCanary(sp *spec) bool {
	return sp.cfg.Probe != nil && m.good != nil && sp.ident() != m.good.spec.ident() && !m.held[sp.ident()]
}

// startLimit is how many workers of d may run (starting or ready): one
// while its canary has not passed.
func (m *machine) startLimit(d *generation, target int) int {
	if d.canary && !d.canaryPassed && !d.established {
		return 1
	}
	return target
}

// canaryReady notes that a worker of g is ready: the rest of a canary
// generation may start.
func (m *machine) canaryReady(w *worker) {
	g := w.gen
	if g.canaryPassed {
		return
	}
	g.canaryPassed = true
	if g.canary {
		m.log.Info("canary worker ready; starting the rest of the generation", zap.Int64("generation", g.id), zap.Int64("worker", w.id),
			zap.Int("pid", w.pid), zap.Int("workers", max(1, g.spec.cfg.Workers+m.extra)))
	}
}

// onFirstProbeFailure kills a worker whose probe failed after it said
// READY=1 and before its first pass: it takes connections from the shared
// sockets and fails them. A worker of a swap fails the swap; one of the
// serving generation is a crash (respawned with backoff).
func (m *machine) onFirstProbeFailure(w *worker, why string, now time.Time) {
	g := w.gen
	reason := fmt.Sprintf("worker %d (pid %d) failed its first probe %s after READY=1: %s", w.id, w.pid,
		now.Sub(w.claimed).Round(time.Millisecond), why)
	inSwap := g == m.latest && !g.established
	w.crashLike = !inSwap
	m.m.probeFirstFailures.Inc()
	m.killWorker(w, "probe_first")
	if inSwap && !g.failed {
		g.servedBroken = true
		m.failGeneration(g, reason, now)
		return
	}
	// Its replacement waits for the crash backoff: started at once, a
	// broken respawn would take traffic again a boot later.
	m.noteCrash(w, now)
	w.crashNoted = true
	m.log.Warn("worker failed its first probe after READY=1; killed", zap.Int64("generation", g.id), zap.String("reason", reason),
		zap.Duration("respawn_in", m.respawnAt.Sub(now).Round(time.Millisecond)))
}

// keepBooting reports whether w, starting, of another generation than d,
// keeps booting: a worker of the generation that held, respawned after a
// crash, while d's canary has not passed. Stopping it would leave the
// pool with nothing to serve if the canary fails.
func (m *machine) keepBooting(w *worker, d *generation) bool {
	return d.canary && !d.canaryPassed && w.gen == m.good && m.good != d
}

// respawnServing keeps the generation that held at its target while d's
// canary boots: a crash of its workers meanwhile (an OOM kill, a bad
// dependency of both) is respawned with the crash backoff as outside a
// swap, or the pool would have nothing to serve if the canary fails.
func (m *machine) respawnServing(d *generation, now time.Time) {
	g := m.good
	if g == nil || g == d || !d.canary || d.canaryPassed || d.established {
		return
	}
	n := 0
	for _, w := range m.workers {
		if w.gen == g && w.state != wStopping && !w.retiring {
			n++
		}
	}
	for ; n < max(1, g.spec.cfg.Workers+m.extra) && !now.Before(m.respawnAt); n++ {
		m.spawn(g, now)
		if !m.respawnAt.IsZero() {
			m.m.restarts.Inc()
			m.respawnAt = time.Time{}
		}
	}
}

// noteSwapFailure counts a failed swap to g's config whose canary failed
// its first probe, and refuses the config once MaxSwapAttempts such swaps
// failed while another generation serves. It reports whether it refused
// it.
func (m *machine) noteSwapFailure(g *generation, reason string, now time.Time) bool {
	if !g.servedBroken {
		return false
	}
	id := g.spec.cfgID()
	if m.failedCfg != id {
		m.failedCfg, m.failedTries = id, 0
	}
	m.failedTries++
	if m.failedTries < MaxSwapAttempts || m.good == nil || m.readyOutside(g) == 0 || m.held[g.spec.ident()] || g.spec.ident() == m.good.spec.ident() {
		return false
	}
	m.bad = id
	m.failedCfg, m.failedTries = "", 0
	m.m.configRefused.Set(1)
	if m.desired != nil && m.desired.cfgID() == id {
		m.desired = m.good.spec.withMap(m.curMap)
	}
	m.latest = m.good
	m.closeUnusedSockets() // sockets only the refused config listed
	m.lastError = fmt.Sprintf("config version %d refused after %d swaps whose canary failed its first probe; not retried until it changes (HUP retries it): %s",
		g.spec.cfgVersion, MaxSwapAttempts, reason)
	m.log.Error("config refused after swaps whose canary failed its first probe; the serving generation stays, and this config is not retried until it changes (or HUP)",
		zap.Int64("config_version", g.spec.cfgVersion), zap.Int("attempts", MaxSwapAttempts), zap.Int64("serving_generation", m.good.id),
		zap.Int64("serving_config_version", m.good.spec.cfgVersion), zap.String("last_reason", reason))
	return true
}
