package supervisor

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/workerproto"
	"github.com/shardvisor/shardvisor/zksession"
)

// What each event, and each report from the executor, changes in the
// machine.

// handle applies one event and returns what to do about it.
func (m *machine) handle(ev any, now time.Time) []action {
	switch ev := ev.(type) {
	case evConfig:
		m.onConfig(ev, now)
	case evMap:
		m.onMap(ev, now)
	case evExit:
		m.onExit(ev, now)
	case evNotify:
		m.onNotify(ev, now)
	case evZK:
		m.onZK(ev.ch, now)
	case evSignal:
		m.onSignal(ev.sig, now)
	case evResync:
		m.onResync(ev, now)
	case evStop:
		m.beginStop(ev.fast, "stop requested", now)
	case evPeers:
		m.onPeers(ev.v, now)
	case evProbe:
		m.onProbe(ev, now)
	case evProcState:
		m.onProcState(ev, now)
	case evMemory:
		m.onMemory(ev, now)
	case evUpgrade:
		m.onUpgrade()
	case evUpgradeReady:
		m.onUpgradeReady(ev, now)
	case evUpgradeFailed:
		m.onUpgradeFailed(ev)
	case evUpgradeExited:
		m.onUpgradeExited(ev)
	}
	return m.take()
}

func (m *machine) onConfig(ev evConfig, now time.Time) {
	if ev.err != nil {
		m.m.configErrors.Inc()
		m.m.swaps.WithLabelValues(topo.SwapInvalidConfig).Inc()
		m.lastError = "config rejected: " + ev.err.Error()
		m.log.Warn("config rejected; the pool keeps running the previous one", zap.Error(ev.err))
		m.publish(topo.SwapInvalidConfig, nil, ev.err.Error(), 0, now)
		m.abandonFailedSwap()
		return
	}
	if ev.cfg == nil {
		if m.desired == nil && m.cfg.zk {
			// Say what creates it: the pool may never have been set up.
			m.log.Warn("no pool config yet; waiting for one (create it with `shardctl pool set "+m.cfg.pool+" --file CONFIG.json`)", zap.String("where", m.cfg.configWhere))
		} else if m.desired == nil {
			m.log.Warn("no pool config yet; waiting for one", zap.String("where", m.cfg.configWhere))
		} else {
			m.log.Warn("pool config disappeared; keeping the last one", zap.String("where", m.cfg.configWhere))
		}
		return
	}
	eff := ev.cfg.Effective()
	sp := &spec{cfg: eff, cfgVersion: ev.version, cfgHash: ev.hash, mp: m.curMap, reload: m.reloadSeq}
	if ev.force {
		m.reloadSeq++
		sp.reload = m.reloadSeq
	}
	if m.desired != nil && m.desired.key() == sp.key() {
		return
	}
	if m.bad != "" && !ev.force && sp.cfgID() == m.bad {
		m.log.Info("config is the one rolled back; not retried until it changes (HUP retries it)", zap.Int64("config_version", ev.version))
		return
	}
	m.bad = ""
	m.m.configRefused.Set(0)
	if ev.force {
		m.failedCfg, m.failedTries = "", 0 // HUP: every attempt again
	}
	if m.desired == nil || m.desired.cfgVersion != ev.version || m.desired.cfgHash != ev.hash {
		m.extra = 0 // a new config says how many workers; TTIN/TTOU adjust from there
	}
	m.desired = sp
	m.cfgVersion = ev.version
	m.log.Info("config received", zap.Int64("config_version", ev.version), zap.Int("workers", eff.Workers), zap.String("command", eff.Command))
	m.noteChange(now)
}

func (m *machine) onMap(ev evMap, now time.Time) {
	first := !m.mapKnown
	m.mapKnown = true
	if ev.err == nil && !ev.exists {
		if m.curMap != nil {
			m.log.Warn("bucket map disappeared; keeping the last good one", zap.Uint64("map_version", m.curMap.version))
		} else if first {
			m.log.Info("no bucket map; workers start without SHARDVISOR_MAP_FILE", zap.String("path", m.cfg.mapWhere))
		}
		return
	}
	err := ev.err
	if err == nil && m.curMap != nil && !ev.force {
		switch {
		case ev.version < m.curMap.version:
			err = fmt.Errorf("map_version %d is older than the applied %d", ev.version, m.curMap.version)
		case ev.version == m.curMap.version && string(ev.data) != string(m.curMap.data):
			err = fmt.Errorf("map_version %d changed content without a new version", ev.version)
		case ev.version == m.curMap.version:
			return
		}
	}
	if err != nil {
		m.m.mapErrors.Inc()
		m.m.swaps.WithLabelValues(topo.SwapInvalidMap).Inc()
		m.lastError = "bucket map rejected: " + err.Error()
		m.log.Warn("bucket map rejected; keeping the last good one", zap.Error(err))
		m.publish(topo.SwapInvalidMap, nil, err.Error(), 0, now)
		return
	}
	m.curMap = &mapData{version: ev.version, data: ev.data, doc: ev.doc}
	m.log.Info("bucket map received", zap.Uint64("map_version", ev.version), zap.Int("bytes", len(ev.data)))
	if m.desired != nil {
		m.desired = m.desired.withMap(m.curMap)
		if m.desired.cfg.MapDelivery.Reload() {
			return // delivered in place by reconcile (deliverMap), no swap
		}
	}
	m.noteChange(now)
}

func (m *machine) noteChange(now time.Time) {
	if m.changeFirst.IsZero() {
		m.changeFirst = now
	}
	m.changeLast = now
}

func (m *machine) onNotify(ev evNotify, now time.Time) {
	w := ev.w
	if !m.hasWorker(w) {
		return
	}
	if ev.msg.Watchdog {
		w.lastPing = now
	}
	if ev.msg.Status != "" {
		m.log.Debug("worker status", zap.Int64("worker", w.id), zap.String("status", ev.msg.Status))
	}
	if ev.msg.Requests > 0 {
		m.onRequests(w, ev.msg.Requests, now)
	}
	if ev.msg.MapVersion > 0 && w.gen.spec.cfg.MapDelivery.Reload() {
		m.onMapAck(w, ev.msg.MapVersion, now)
	}
	if ev.msg.Ready && w.state == wStarting && w.notified.IsZero() {
		w.notified = now
		m.tryReady(w, now)
	}
}

// tryReady marks a starting worker ready once every readiness condition
// holds: READY=1 plus readiness.delay (notify mode) or the delay alive
// (timer mode), and a passed HTTP probe when the pool has one.
func (m *machine) tryReady(w *worker, now time.Time) {
	cfg := w.gen.spec.cfg
	var how string
	switch {
	case cfg.Readiness.Mode == topo.ReadinessTimer && !w.notified.IsZero():
		how = "READY=1 (timer mode)" // the app can notify after all: its word is better than the timer's guess
	case cfg.Readiness.Mode == topo.ReadinessTimer:
		if now.Before(w.started.Add(cfg.Readiness.Delay.D())) {
			return
		}
		how = "timer"
	case w.notified.IsZero() || now.Before(w.notified.Add(cfg.Readiness.Delay.D())):
		return
	case cfg.Readiness.Delay > 0:
		how = "READY=1 + readiness.delay"
	default:
		how = "READY=1"
	}
	if cfg.Probe != nil {
		if !w.probeOK {
			if w.claimed.IsZero() {
				// It accepts from now on: probe it at once (canary.go).
				w.claimed = now
				m.do(actProbeNow{w})
			}
			return
		}
		how += " + probe"
	}
	m.markReady(w, now, how)
}

// onProbe applies one HTTP probe of a worker: a pass is a condition of
// readiness; probe.failures failures in a row of a ready worker replace
// it, as an expired watchdog does (a worker can send WATCHDOG=1 from a
// thread of its own while every request hangs; the probe sees that).
func (m *machine) onProbe(ev evProbe, now time.Time) {
	w := ev.w
	p := w.gen.spec.cfg.Probe
	if !m.hasWorker(w) || w.state == wStopping || p == nil {
		return
	}
	if ev.ok {
		w.probeFails = 0
		if !w.probeOK {
			w.probeOK = true
			if w.state == wStarting {
				m.tryReady(w, now)
			}
		}
		return
	}
	m.m.probeFailures.Inc()
	if ev.first && w.state == wStarting && !w.claimed.IsZero() {
		if w.notified.IsZero() && !ev.answered {
			// Timer mode without READY=1: the timer is a guess, and a
			// worker that answers nothing may still be booting (it takes
			// no connection either); readiness.timeout bounds it. One that
			// answers a failure is up and broken.
			return
		}
		m.onFirstProbeFailure(w, ev.why, now)
		return
	}
	if w.state != wReady {
		return // still booting: readiness.timeout bounds it
	}
	w.probeFails++
	if w.probeFails < p.Failures {
		m.log.Warn("worker HTTP probe failed", zap.Int64("worker", w.id), zap.Int("pid", w.pid), zap.String("why", ev.why),
			zap.Int("in_a_row", w.probeFails), zap.Int("replace_at", p.Failures))
		return
	}
	m.giveUp(w, "probe", "worker HTTP probe failed too often in a row", now, zap.String("why", ev.why), zap.Int("failures", w.probeFails))
}

// quitWorker stops a ready worker that stopped answering (watchdog,
// probe): SIGQUIT now for a stack dump, SIGKILL after WatchdogKillDelay.
// It counts as a crash.
func (m *machine) quitWorker(w *worker, reason string, now time.Time) {
	w.state = wStopping
	w.stopReason = reason
	w.crashLike = true
	w.killAt = now.Add(WatchdogKillDelay)
	m.m.kills.WithLabelValues(reason).Inc()
	m.do(actQuit{w})
}

// abandonFailedSwap is what an invalid config does to a swap that had
// already failed: the config it was retrying is no longer the newest, so
// it is dropped. The serving generation stays (nothing serves if none).
func (m *machine) abandonFailedSwap() {
	if m.latest == nil || !m.latest.failed {
		return
	}
	f := m.latest
	if m.desired != nil && m.desired.key() != f.spec.key() {
		return // a newer valid change is pending: it supersedes the failed swap
	}
	if m.good != nil {
		m.latest = m.good
		m.desired = m.good.spec.withMap(m.curMap)
		m.log.Warn("the failed swap is not retried: a newer config arrived and is invalid; serving the previous generation until a valid config arrives",
			zap.Int64("failed_generation", f.id), zap.Int64("failed_config_version", f.spec.cfgVersion), zap.Int64("serving_generation", m.good.id),
			zap.Int64("serving_config_version", m.good.spec.cfgVersion))
		return
	}
	m.desired = nil
	m.log.Warn("the failed config is not retried: a newer config arrived and is invalid; nothing serves until a valid config arrives",
		zap.Int64("failed_generation", f.id), zap.Int64("failed_config_version", f.spec.cfgVersion))
}

func (m *machine) markReady(w *worker, now time.Time, how string) {
	w.state = wReady
	w.readyAt = now
	w.lastPing = now
	m.m.readiness.Observe(now.Sub(w.started).Seconds())
	cfg := w.gen.spec.cfg
	if cfg.MaxLifetime > 0 {
		life := cfg.MaxLifetime.D()
		if j := cfg.MaxLifetimeJitter.D(); j > 0 {
			life += time.Duration(m.randN(int64(j)))
		}
		w.retireAt = w.started.Add(life)
	}
	m.canaryReady(w)
	m.log.Info("worker ready", zap.Int64("worker", w.id), zap.Int("pid", w.pid), zap.Int64("generation", w.gen.id),
		zap.Duration("after", now.Sub(w.started).Round(time.Millisecond)), zap.String("by", how))
	// A map that arrived while it booted: it may have read the file
	// before the change, and a signal before READY=1 could find no
	// handler installed yet, so it is asked now.
	if cfg.MapDelivery.Reload() && m.liveMap != nil && w.mapVersion < m.liveMap.version {
		m.askMap(w, now)
	}
}

func (m *machine) onExit(ev evExit, now time.Time) {
	w := ev.w
	if !m.hasWorker(w) {
		return
	}
	m.removeWorker(w)
	g := w.gen
	switch {
	case w.state == wStopping && !w.crashLike:
		m.m.exits.WithLabelValues("expected").Inc()
		m.log.Info("worker exited", zap.Int64("worker", w.id), zap.Int("pid", w.pid), zap.Int64("generation", g.id),
			zap.String("status", ev.status), zap.String("stop_reason", w.stopReason))
	case g == m.latest && !g.established && !g.failed && !w.readyAt.IsZero() && m.windowFor(g) > 0:
		// Ready, then dead, before the new config held: roll back.
		m.m.exits.WithLabelValues("crash").Inc()
		m.rejectInWindow(g, w, ev.status, now)
	case w.state == wStarting && !g.established && !g.failed && g == m.latest:
		m.m.exits.WithLabelValues("boot_failure").Inc()
		m.failGeneration(g, fmt.Sprintf("worker %d (pid %d) exited before it was ready: %s", w.id, w.pid, ev.status), now)
	case g == m.latest && !g.established:
		// A worker of a swap that already failed, or one that became ready
		// and then crashed mid-swap: fail the swap.
		m.m.exits.WithLabelValues("crash").Inc()
		if !g.failed {
			m.failGeneration(g, fmt.Sprintf("worker %d (pid %d) exited during the swap: %s", w.id, w.pid, ev.status), now)
		}
	default:
		m.m.exits.WithLabelValues("crash").Inc()
		if !w.crashNoted {
			m.noteCrash(w, now)
		}
		m.log.Warn("worker crashed", zap.Int64("worker", w.id), zap.Int("pid", w.pid), zap.Int64("generation", g.id),
			zap.String("status", ev.status), zap.Stringer("was", w.state), zap.Duration("respawn_in", m.respawnAt.Sub(now).Round(time.Millisecond)))
		m.noteConfigCrash(w, ev.status, now)
	}
	m.cleanMapFiles()
}

// noteCrash schedules the respawn of a crashed worker: restart.initial,
// doubling per consecutive crash up to restart.max, with jitter. A worker
// that stayed ready for restart.max resets the count.
func (m *machine) noteCrash(w *worker, now time.Time) {
	b := w.gen.spec.cfg.Restart
	if !w.readyAt.IsZero() && now.Sub(w.readyAt) >= b.Max.D() {
		m.crashCount = 0
	}
	m.crashCount++
	m.respawnAt = now.Add(m.backoff(b, m.crashCount))
}

// failGeneration abandons a swap: the previous good generation keeps (or
// goes back to) serving; the same spec is retried after a backoff unless a
// newer change arrives first.
func (m *machine) failGeneration(g *generation, reason string, now time.Time) {
	g.failed = true
	if id := g.spec.ident(); id != m.failCfg {
		// Another config's failures (or before a HUP) say nothing about
		// this one: its backoff starts again.
		m.failCount, m.failCfg = 0, id
	}
	m.failCount++
	m.retryAt = now.Add(m.backoff(g.spec.cfg.Restart, m.failCount))
	m.m.swaps.WithLabelValues(topo.SwapFailed).Inc()
	m.lastError = "swap failed: " + reason
	if m.noteSwapFailure(g, reason, now) {
		m.publish(topo.SwapFailed, g, m.lastError, 0, now)
		m.endReload(g, "failed")
		m.stopStarting(g, "swap_failed", now)
		return
	}
	fields := []zap.Field{zap.Int64("generation", g.id), zap.String("reason", reason), zap.Duration("retry_in", m.retryAt.Sub(now).Round(time.Millisecond)),
		zap.Int("attempt", m.failedTries)}
	// Say that the previous generation keeps serving only when one does.
	serving := m.readyOutside(g)
	switch {
	case m.good != nil && serving > 0:
		fields = append(fields, zap.Int64("serving_generation", m.good.id), zap.Int("serving_workers", serving))
		m.log.Warn("swap failed; the previous generation keeps serving", fields...)
	case m.good != nil:
		fields = append(fields, zap.Int64("previous_generation", m.good.id))
		m.log.Error("swap failed, and the previous generation has no ready worker either: nothing serves until one is", fields...)
	default:
		m.log.Error("swap failed; nothing serves: no generation has held yet", fields...)
	}
	m.publish(topo.SwapFailed, g, reason, 0, now)
	m.endReload(g, "failed")
	m.stopStarting(g, "swap_failed", now)
}

// readyOutside counts the ready workers of other generations than g.
func (m *machine) readyOutside(g *generation) int {
	n := 0
	for _, w := range m.workers {
		if w.state == wReady && w.gen != g {
			n++
		}
	}
	return n
}

// stopStarting stops g's workers that are not ready yet; one never
// started is dropped (its start action is skipped).
func (m *machine) stopStarting(g *generation, reason string, now time.Time) {
	for _, w := range append([]*worker(nil), m.workers...) {
		if w.gen == g && w.state == wStarting {
			if w.pid == 0 {
				m.removeWorker(w)
				continue
			}
			m.stopWorker(w, reason, now)
		}
	}
}

// prepareFailed is the executor's report that a generation's sockets or
// map file could not be set up: the swap fails.
func (m *machine) prepareFailed(g *generation, err error, now time.Time) []action {
	if !g.failed {
		m.failGeneration(g, err.Error(), now)
	}
	return m.take()
}

// started is the executor's report that w runs as pid.
func (m *machine) started(w *worker, pid int) {
	w.pid = pid
	m.m.spawns.Inc()
}

// startFailed is the executor's report that w could not be started (fork,
// exec of the shim, the notify socket). Like a loop that stops at its
// first failure, the other starts still pending in this batch are dropped.
func (m *machine) startFailed(w *worker, err error, now time.Time) []action {
	if !m.hasWorker(w) {
		return nil
	}
	for _, x := range append([]*worker(nil), m.workers...) {
		if x.pid == 0 && x.gen == w.gen {
			m.removeWorker(x)
		}
	}
	g := w.gen
	switch {
	case g.established:
		m.crashCount++
		m.respawnAt = now.Add(m.backoff(g.spec.cfg.Restart, m.crashCount))
		m.log.Error("starting a worker failed; retrying with backoff", zap.Error(err), zap.Duration("retry_in", m.respawnAt.Sub(now)))
	case g == m.latest && !g.failed:
		m.failGeneration(g, "starting a worker: "+err.Error(), now)
	}
	return m.take()
}

// skip reports whether a from an earlier batch no longer applies: a start
// that a failure earlier in the batch dropped.
func (m *machine) skip(a action) bool {
	switch a := a.(type) {
	case actStart:
		return !m.hasWorker(a.w)
	case actMapSignal:
		// The live map file write before it failed: nothing new to load.
		return !m.hasWorker(a.w) || m.liveMap == nil || m.liveMap.version != a.version
	}
	return false
}

func (m *machine) onSignal(sig os.Signal, now time.Time) {
	m.log.Info("signal", zap.String("signal", sig.String()))
	switch sig {
	case syscall.SIGHUP:
		if m.mode == modeFailStatic || m.mode == modeChecking {
			m.log.Warn("HUP ignored: config changes are refused while ZooKeeper is unreachable (fail-static)")
			return
		}
		m.do(actReload{})
	case syscall.SIGTERM, syscall.SIGINT:
		m.beginStop(m.mode == modeStopping, "signal "+sig.String(), now) // a second one is a fast stop
	case syscall.SIGQUIT:
		m.beginStop(true, "signal "+sig.String(), now)
	case syscall.SIGTTIN:
		m.extra++
		m.log.Info("one more worker", zap.Int("target", m.target()))
	case syscall.SIGTTOU:
		if m.target() > 1 {
			m.extra--
		}
		m.log.Info("one worker fewer", zap.Int("target", m.target()))
	}
}

func (m *machine) onZK(ch zksession.StateChange, now time.Time) {
	m.zkState = ch.To
	m.m.setZK(ch.To.String())
	switch ch.To {
	case zksession.StateLost:
		switch {
		case m.mode == modeRunning && m.cfg.failStatic && m.good != nil:
			m.beginPeerCheck(ch.Reason, now)
		case m.mode == modeRunning || m.mode == modeHolddown:
			m.enterLost(ch.Reason)
		}
	case zksession.StateSuspended:
		if m.mode == modeHolddown {
			m.mode = modeLost
			m.log.Warn("session suspended during holddown; waiting again")
		} else {
			m.log.Warn("zookeeper session suspended; serving on with the last good config and map", zap.String("reason", ch.Reason))
		}
	case zksession.StateConnected:
		if m.mode == modeLost && !m.connectedOnce {
			// The first session of this process: nothing was lost, and
			// the watches are about to deliver config and map.
			m.connectedOnce = true
			m.mode = modeRunning
			m.log.Info("zookeeper session connected")
			return
		}
		m.connectedOnce = true
		if m.mode == modeChecking || m.mode == modeFailStatic {
			m.leaveFailStatic(now)
			return
		}
		if m.mode == modeLost {
			m.mode = modeHolddown
			m.holdUntil = now.Add(m.cfg.holddown)
			m.log.Info("zookeeper session back; holding down before serving", zap.Duration("holddown", m.cfg.holddown), zap.Bool("new_session", ch.NewSession))
		}
	}
}

// startState is the mode a ZooKeeper-mode machine starts in, from the
// session's state when the supervisor starts: nothing is served until a
// session proves it may.
func (m *machine) startState(st zksession.State) {
	m.zkState = st
	m.m.setZK(st.String())
	if st != zksession.StateConnected {
		m.mode = modeLost
	} else {
		m.connectedOnce = true
	}
}

// enterLost takes this host out of service: every worker is killed and the
// sockets are closed, so connections are refused and /healthz fails.
func (m *machine) enterLost(reason string) {
	m.mode = modeLost
	n := 0
	for _, w := range m.workers {
		if !w.killed {
			m.killWorker(w, "zk_lost")
			n++
		}
	}
	m.closeAllSockets()
	if m.good != nil {
		m.lostFrom = m.good.spec
	}
	m.latest, m.good, m.gens = nil, nil, nil
	m.lastError = "zookeeper session lost: " + reason
	m.log.Warn("zookeeper session lost; killed workers and closed the listen sockets", zap.Int("killed", n), zap.String("reason", reason))
	m.do(actNotify{"STATUS=zookeeper session lost; not serving"})
}

func (m *machine) onResync(ev evResync, now time.Time) {
	m.resyncing = false
	if m.mode != modeHolddown {
		return
	}
	if ev.err != nil {
		m.log.Warn("re-reading config and map after the session came back failed; retrying", zap.Error(ev.err))
		m.holdUntil = now.Add(time.Second)
		return
	}
	m.mode = modeRunning
	m.crashCount, m.failCount = 0, 0
	m.retryAt, m.respawnAt = time.Time{}, time.Time{}
	m.onMap(ev.mp, now)
	m.onConfig(ev.cfg, now)
	m.changeFirst, m.changeLast = time.Time{}, time.Time{} // start at once: nothing is serving
	m.log.Info("serving again after the session loss; re-binding the listen sockets")
}

func (m *machine) beginStop(fast bool, why string, now time.Time) {
	if m.mode == modeStopping && (!fast || m.stopFast) {
		return
	}
	m.mode = modeStopping
	m.stopFast = m.stopFast || fast
	m.log.Info("stopping", zap.Bool("fast", m.stopFast), zap.String("why", why), zap.Int("workers", len(m.workers)))
	m.do(actNotify{workerproto.Stopping})
	m.closeAllSockets()
	for _, w := range m.workers {
		if m.stopFast {
			if !w.killed {
				m.killWorker(w, "fast_stop")
			}
		} else {
			m.stopWorker(w, "shutdown", now)
		}
	}
}

// Reload mode: a new map reaches the running workers in place. The
// supervisor rewrites the live map file (one per supervisor, shared by
// every generation, named by SHARDVISOR_MAP_FILE), sends the configured
// signal to each ready worker (or lets them notice the file change), and
// each acknowledges with MAPVERSION=N. A worker that has not caught up
// within map_delivery.ack_timeout is replaced, as max_lifetime replaces
// one: its successor starts on the new file and it drains once that is
// ready.

// deliverMap writes mp to the live map file and asks every ready worker
// that routes by an older map to reload.
func (m *machine) deliverMap(mp *mapData, now time.Time) {
	prev := m.liveMap
	m.liveMap = mp
	m.do(actWriteLiveMap{mp})
	for _, g := range m.gens {
		if g.spec.cfg.MapDelivery.Reload() {
			g.spec = g.spec.withMap(mp)
		}
	}
	asked := 0
	for _, w := range m.workers {
		if w.state == wReady && w.pid != 0 && w.gen.spec.cfg.MapDelivery.Reload() && w.mapVersion < mp.version {
			m.askMap(w, now)
			asked++
		}
	}
	if prev != nil {
		m.m.mapDeliveries.Inc()
		m.log.Info("bucket map delivered in place", zap.Uint64("map_version", mp.version), zap.Uint64("previous", prev.version), zap.Int("workers_asked", asked))
	}
}

// askMap asks w to load the live map: a signal when the pool names one.
// The acknowledgement is timed from the first ask it has not answered.
func (m *machine) askMap(w *worker, now time.Time) {
	if w.mapAsked.IsZero() {
		w.mapAsked = now
	}
	if sig := w.gen.spec.cfg.MapDelivery.Signal; sig != "" {
		m.do(actMapSignal{w: w, sig: sig, version: m.liveMap.version})
	}
}

// onMapAck records that w routes by map version v.
func (m *machine) onMapAck(w *worker, v uint64, now time.Time) {
	if m.liveMap != nil && v > m.liveMap.version {
		m.log.Warn("worker acknowledged a map version newer than the live map; counting the live one", zap.Int64("worker", w.id),
			zap.Uint64("acknowledged", v), zap.Uint64("live", m.liveMap.version))
		v = m.liveMap.version
	}
	w.mapVersion = v
	if !w.mapAsked.IsZero() && m.liveMap != nil && v >= m.liveMap.version {
		m.m.mapAcks.Inc()
		m.m.mapAckSeconds.Observe(now.Sub(w.mapAsked).Seconds())
		m.log.Debug("worker routes by the new map", zap.Int64("worker", w.id), zap.Uint64("map_version", v),
			zap.Duration("after", now.Sub(w.mapAsked).Round(time.Millisecond)))
		w.mapAsked = time.Time{}
	}
}

// liveMapFailed is the executor's report that the live map file could not
// be written: the workers keep the old one, nothing they were asked in
// this pass counts against them, and the write is retried in a second.
func (m *machine) liveMapFailed(mp *mapData, err error, now time.Time) []action {
	if m.liveMap == mp {
		m.liveMap = nil
		m.liveRetryAt = now.Add(time.Second)
	}
	for _, w := range m.workers {
		if w.mapAsked.Equal(now) {
			w.mapAsked = time.Time{}
		}
	}
	m.lastError = "writing the live map file: " + err.Error()
	m.log.Error("writing the live map file failed; workers keep the previous map, retrying", zap.Uint64("map_version", mp.version), zap.Error(err))
	return m.take()
}
