package supervisor

import (
	"fmt"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/topo"
)

// reconcile looks at the state at time now and returns the actions that
// move the pool towards it: deadlines of workers (kill, readiness,
// watchdog, max lifetime), a new generation when the desired spec
// changed, starts within the surge, and retiring old workers only while
// enough are ready. It is called after every event and timer.
func (m *machine) reconcile(now time.Time) []action {
	m.reconcileWorkers(now)
	switch m.mode {
	case modeStopping:
		if len(m.workers) == 0 && !m.stopDone {
			m.stopDone = true
			m.upgradeStopDone()
		}
		return m.take()
	case modeLost:
		return m.take()
	case modeChecking:
		// Keep the pool whole (a crashed worker is respawned) while the
		// peers answer; no new generation: nothing can have changed.
		m.reconcileShared(now)
		if m.mode == modeChecking {
			m.reconcilePool(now)
		}
		return m.take()
	case modeFailStatic:
		m.reconcileFailStatic(now)
		m.reconcilePool(now)
		return m.take()
	case modeHolddown:
		if !now.Before(m.holdUntil) && !m.resyncing {
			m.resyncing = true
			m.do(actResync{})
		}
		return m.take()
	}
	if m.desired != nil && m.desired.cfg.MapDelivery.Reload() && m.curMap != nil && (m.liveMap == nil || m.liveMap.version != m.curMap.version) && !now.Before(m.liveRetryAt) {
		m.deliverMap(m.curMap, now)
	}
	m.maybeNewGeneration(now)
	m.reconcilePool(now)
	return m.take()
}

// reconcileWorkers applies the deadlines of workers in any mode: kills,
// readiness, watchdog, max lifetime.
func (m *machine) reconcileWorkers(now time.Time) {
	for _, w := range append([]*worker(nil), m.workers...) {
		switch w.state {
		case wStopping:
			if !w.killed && !now.Before(w.killAt) {
				m.killWorker(w, "graceful_timeout")
			}
		case wStarting:
			m.tryReady(w, now)
			if w.state == wStarting && !now.Before(w.started.Add(w.gen.spec.cfg.Readiness.Timeout.D())) {
				m.onReadinessTimeout(w, now)
			}
		case wReady:
			m.checkStopped(w, now)
			if w.state != wReady {
				continue
			}
			if wd := w.gen.spec.cfg.Watchdog.D(); wd > 0 && now.Sub(w.lastPing) > wd {
				m.giveUp(w, "watchdog", "worker watchdog expired", now, zap.Duration("silent_for", now.Sub(w.lastPing).Round(time.Millisecond)))
			} else if !w.retireAt.IsZero() && !w.retiring && !now.Before(w.retireAt) {
				w.retiring = true
				w.retireWhy = "max_lifetime"
				m.log.Info("worker reached max_lifetime; replacing it", zap.Int64("worker", w.id), zap.Int("pid", w.pid))
			} else if d := w.gen.spec.cfg.MapDelivery; d.Reload() && !w.mapAsked.IsZero() && !w.retiring && now.Sub(w.mapAsked) >= d.AckTimeout.D() {
				w.retiring = true
				w.retireWhy = "map_ack_timeout"
				m.m.mapAckTimeouts.Inc()
				live := uint64(0)
				if m.liveMap != nil {
					live = m.liveMap.version
				}
				m.log.Warn("worker did not acknowledge the new map in time; replacing it with one that starts on it",
					zap.Int64("worker", w.id), zap.Int("pid", w.pid), zap.Uint64("routes_by", w.mapVersion), zap.Uint64("live_map", live),
					zap.Duration("ack_timeout", d.AckTimeout.D()))
			}
		}
	}
}

// reconcilePool runs the generation that should serve (the newest, or the
// good one while the newest failed) at its target.
func (m *machine) reconcilePool(now time.Time) {
	d := m.latest
	if d != nil && d.failed {
		d = m.good
	}
	// Workers that are not of d and not ready serve nobody: stop them.
	for _, w := range m.workers {
		if w.state == wStarting && w.gen != d && !m.keepBooting(w, d) {
			reason := "superseded"
			if w.gen.failed {
				reason = "swap_failed"
			}
			m.stopWorker(w, reason, now)
		}
	}
	if d == nil {
		return
	}
	target, surge := max(1, d.spec.cfg.Workers+m.extra), *d.spec.cfg.Surge
	// readyTotal counts only proven workers: a new config's worker counts
	// once it has been ready for the stability window (stability.go), so
	// the previous generation serves on until the new one has held.
	var live, countD, readyD, readyTotal int
	for _, w := range m.workers {
		if w.state == wStopping {
			continue
		}
		live++
		ok := w.state == wReady && m.proven(w, now)
		if ok {
			readyTotal++
		}
		if w.gen == d && !w.retiring {
			countD++
			if ok {
				readyD++
			}
		}
	}
	// Retire ready workers that are not of d (or are past their lifetime)
	// only while more than target are ready: oldest generation first.
	// Decided before the starts below, which change no ready count, so
	// that a failed start can drop the starts after it and nothing else,
	// and so that a retired worker's place in the surge is taken in the
	// same pass (a draining worker is not live), not a timer tick later.
	var old []*worker
	for _, w := range m.workers {
		if w.state == wReady && (w.gen != d || w.retiring) {
			old = append(old, w)
		}
	}
	sort.SliceStable(old, func(i, j int) bool {
		if old[i].gen.id != old[j].gen.id {
			return old[i].gen.id < old[j].gen.id
		}
		return old[i].started.Before(old[j].started)
	})
	for _, w := range old {
		if !m.proven(w, now) {
			// Ready but unproven (a generation superseded or rolled back
			// inside its window): it counts for nothing, and goes once the
			// proven ones are enough.
			if readyTotal >= target {
				m.stopWorker(w, "replaced", now)
				live--
			}
			continue
		}
		if readyTotal <= target {
			continue
		}
		reason := "replaced"
		if w.retiring && w.gen == d {
			reason = w.retireWhy
		}
		m.stopWorker(w, reason, now)
		readyTotal--
		live--
	}
	// Too many of d (TTOU, or a config with fewer workers): starting ones
	// first, then the newest ready ones while enough stay ready.
	if countD > target {
		var mine []*worker
		for _, w := range m.workers {
			if w.gen == d && !w.retiring && w.state != wStopping {
				mine = append(mine, w)
			}
		}
		sort.SliceStable(mine, func(i, j int) bool {
			if (mine[i].state == wStarting) != (mine[j].state == wStarting) {
				return mine[i].state == wStarting
			}
			return mine[i].started.After(mine[j].started)
		})
		for _, w := range mine {
			if countD <= target {
				break
			}
			if w.state == wReady && readyTotal <= target {
				break
			}
			if w.state == wReady {
				readyTotal--
			}
			m.stopWorker(w, "scale_down", now)
			countD--
			live--
		}
	}
	if !d.established && readyD >= target {
		othersLive := false
		for _, w := range m.workers {
			if w.gen != d && w.state != wStopping {
				othersLive = true
			}
		}
		if !othersLive {
			m.establish(d, now)
		}
	}
	// Start workers of d, within the surge, and (for a generation that is
	// already serving) not faster than the crash backoff allows. Last, so
	// that a start failing drops only the starts after it.
	for countD < m.startLimit(d, target) && live < target+surge {
		if d.established && now.Before(m.respawnAt) {
			break
		}
		m.spawn(d, now)
		if d.established && !m.respawnAt.IsZero() {
			m.m.restarts.Inc()
			m.respawnAt = time.Time{}
		}
		live++
		countD++
	}
	m.respawnServing(d, now)
}

// spawn adds a worker of g, to be started by the executor.
func (m *machine) spawn(g *generation, now time.Time) {
	m.nextWorker++
	w := &worker{id: m.nextWorker, gen: g, started: now, state: wStarting}
	if g.spec.cfg.MapDelivery.Reload() && m.liveMap != nil {
		w.mapVersion = m.liveMap.version // what the live file holds as it starts
	}
	m.workers = append(m.workers, w)
	m.do(actStart{w})
}

func (m *machine) onReadinessTimeout(w *worker, now time.Time) {
	g := w.gen
	reason := fmt.Sprintf("worker %d (pid %d) not ready after readiness.timeout %s", w.id, w.pid, g.spec.cfg.Readiness.Timeout.D())
	m.m.kills.WithLabelValues("readiness_timeout").Inc()
	w.crashLike = !(g == m.latest && !g.established) // during a swap the generation fails instead
	m.stopWorker(w, "readiness_timeout", now)
	if g == m.latest && !g.established && !g.failed {
		m.failGeneration(g, reason, now)
	} else {
		m.log.Warn("worker readiness timeout", zap.String("reason", reason))
	}
}

// maybeNewGeneration starts a swap when the desired spec differs from the
// newest generation (after the debounce), or retries a failed one.
func (m *machine) maybeNewGeneration(now time.Time) {
	if m.desired == nil || !m.mapKnown {
		return
	}
	want := m.desired
	switch {
	case m.latest == nil:
	case m.latest.spec.key() != want.key():
		if !m.debounced(now) {
			return
		}
		if m.good != nil && m.good != m.latest && m.good.spec.key() == want.key() {
			// Changed back to what is serving: drop the swap in progress.
			abandoned := m.latest
			m.supersede(abandoned)
			m.latest = m.good
			m.changeFirst = time.Time{}
			m.log.Info("change reverted to the serving generation; swap abandoned", zap.Int64("generation", m.good.id))
			m.endReload(abandoned, "abandoned")
			return
		}
	case m.latest.failed && !now.Before(m.retryAt):
		// Retry the same spec.
	default:
		m.changeFirst = time.Time{} // a change that needs no swap (a map, in reload mode)
		return
	}
	m.changeFirst = time.Time{}
	if m.latest != nil && !m.latest.established && !m.latest.failed {
		m.supersede(m.latest)
	}
	m.nextGen++
	g := &generation{id: m.nextGen, spec: want, created: now, canary: m.wantsCanary(want)}
	m.gens = append(m.gens, g)
	m.latest = g
	m.do(actPrepare{g})
}

// prepared is the executor's report that g's sockets are bound and its
// map file written: the swap is under way.
func (m *machine) prepared(g *generation) []action {
	for _, l := range g.spec.cfg.Listen {
		m.bound[l.Addr] = true
	}
	m.log.Info("generation created", zap.Int64("generation", g.id), zap.Int64("config_version", g.spec.cfgVersion), zap.Uint64("map_version", g.spec.mapVersion()),
		zap.Int("workers", max(1, g.spec.cfg.Workers+m.extra)), zap.Int("surge", *g.spec.cfg.Surge), zap.Bool("canary", g.canary))
	if m.good != nil {
		m.reloading = true
		m.do(actNotify{fmt.Sprintf("RELOADING=1\nSTATUS=swapping to generation %d", g.id)})
	}
	return m.take()
}

// endReload closes the RELOADING=1 of a swap to g that ends without g
// taking over (how: failed, rolled back, abandoned): systemd's convention is
// READY=1 once a reload is over, whatever came of it. Without it the unit
// would stay "reloading" until its TimeoutStartSec. While a newer swap is
// under way the reload is not over: that one's READY=1 ends it.
func (m *machine) endReload(g *generation, how string) {
	if !m.reloading || m.good == nil {
		return
	}
	if l := m.latest; l != nil && l.id > g.id && !l.established && !l.failed {
		return
	}
	m.reloading = false
	m.do(actNotify{fmt.Sprintf("READY=1\nSTATUS=swap to generation %d %s; generation %d serves", g.id, how, m.good.id)})
}

func (m *machine) supersede(g *generation) {
	g.superseded = true
	m.supersedes++
	m.m.swaps.WithLabelValues("superseded").Inc()
	m.log.Info("swap superseded by a newer change", zap.Int64("generation", g.id), zap.Duration("next_debounce", m.debounce()))
}

func (m *machine) establish(g *generation, now time.Time) {
	g.established = true
	prev := m.good
	m.good = g
	m.failCount = 0
	m.failedCfg, m.failedTries = "", 0
	m.supersedes = 0
	m.crashCount = 0
	m.lastError = ""
	took := now.Sub(g.created)
	m.onEstablished(g, prev, now)
	m.m.swapDuration.Observe(took.Seconds())
	m.m.swaps.WithLabelValues(topo.SwapOK).Inc()
	m.m.generation.Set(float64(g.id))
	m.m.configVersion.Set(float64(g.spec.cfgVersion))
	m.m.mapVersion.Set(float64(g.spec.mapVersion()))
	fields := []zap.Field{zap.Int64("generation", g.id), zap.Int64("config_version", g.spec.cfgVersion),
		zap.Uint64("map_version", g.spec.mapVersion()), zap.Duration("took", took.Round(time.Millisecond))}
	if prev != nil {
		fields = append(fields, zap.Int64("previous", prev.id))
	}
	m.log.Info("swap complete", fields...)
	if m.rollingBackTo != "" && m.rollingBackTo == g.spec.cfgID() && m.rollback != nil {
		m.publish(topo.SwapRolledBack, g, fmt.Sprintf("serving config version %d again after rolling back config version %d: %s",
			g.spec.cfgVersion, m.rollback.ConfigVersion, m.rollback.Reason), took.Seconds(), now)
	} else {
		m.publish(topo.SwapOK, g, "", took.Seconds(), now)
	}
	m.rollingBackTo = ""
	m.notifiedUp, m.reloading = true, false
	m.do(actNotify{fmt.Sprintf("READY=1\nSTATUS=serving generation %d", g.id)})
	// Forget generations with no workers left.
	var keep []*generation
	for _, x := range m.gens {
		if x == g || m.genHasWorkers(x) {
			keep = append(keep, x)
		}
	}
	m.gens = keep
	m.closeUnusedSockets()
	m.cleanMapFiles()
}

func (m *machine) genHasWorkers(g *generation) bool {
	for _, w := range m.workers {
		if w.gen == g {
			return true
		}
	}
	return false
}

// nextWake is how long the loop may sleep before it must look again
// without an event.
func (m *machine) nextWake(now time.Time) time.Duration {
	next := now.Add(time.Second) // watchdog and housekeeping granularity
	at := func(t time.Time) {
		if !t.IsZero() && t.Before(next) {
			next = t
		}
	}
	if !m.changeFirst.IsZero() {
		at(m.debounceAt())
	}
	if m.latest != nil && m.latest.failed {
		at(m.retryAt)
	}
	at(m.respawnAt)
	if m.mode == modeHolddown {
		at(m.holdUntil)
	}
	if m.mode == modeFailStatic {
		at(m.peerCheckAt)
		at(m.loudAt)
	}
	if m.mode == modeChecking {
		at(m.sharedUntil)
	}
	at(m.liveRetryAt)
	for _, w := range m.workers {
		cfg := w.gen.spec.cfg
		switch w.state {
		case wStopping:
			if !w.killed {
				at(w.killAt)
			}
		case wStarting:
			if cfg.Readiness.Mode == topo.ReadinessTimer {
				at(w.started.Add(cfg.Readiness.Delay.D()))
			}
			if !w.notified.IsZero() {
				at(w.notified.Add(cfg.Readiness.Delay.D()))
			}
			at(w.started.Add(cfg.Readiness.Timeout.D()))
		case wReady:
			if wd := cfg.Watchdog.D(); wd > 0 {
				at(w.lastPing.Add(wd + time.Millisecond))
			}
			// The end of its stability window, once: a time already past
			// would make the loop spin until the swap completes.
			if win := m.windowFor(w.gen); win > 0 && w.readyAt.Add(win).After(now) {
				at(w.readyAt.Add(win))
			}
			at(w.retireAt)
			at(m.stoppedWake(w))
			if d := cfg.MapDelivery; d.Reload() && !w.mapAsked.IsZero() {
				at(w.mapAsked.Add(d.AckTimeout.D()))
			}
		}
	}
	return max(time.Millisecond, next.Sub(now))
}

// snapshot is the pool as the member record, /healthz and the gauges show
// it. The executor adds what only it knows (host, pid, admin address).
func (m *machine) snapshot() (topo.PoolMember, healthState, []action) {
	mem := topo.PoolMember{Version: topo.PoolMemberVersion, Target: m.target(), LastError: m.lastError, ZK: m.zkState.String()}
	if m.rollback != nil {
		rb := *m.rollback
		mem.RolledBack = &rb
	}
	if m.failStatic != nil {
		fs := *m.failStatic // the publisher encodes it on another goroutine
		mem.FailStatic = &fs
	}
	if !m.cfg.zk {
		mem.ZK = ""
	}
	if m.good != nil {
		mem.Generation, mem.ConfigVersion, mem.MapVersion = m.good.id, m.good.spec.cfgVersion, m.good.spec.mapVersion()
		mem.MapDelivery = m.good.spec.cfg.MapDelivery.Mode
	}
	counts := map[wstate]int{}
	lowest, anyReady := uint64(0), false
	for _, w := range m.workers {
		counts[w.state]++
		mem.Workers = append(mem.Workers, topo.WorkerInfo{ID: w.id, PID: w.pid, Generation: w.gen.id, State: w.state.String(), StartedAt: w.started.UTC(), MapVersion: w.routes()})
		if w.state == wReady && (!anyReady || w.routes() < lowest) {
			lowest, anyReady = w.routes(), true
		}
	}
	// The lowest map any ready worker routes by, so that a mover waiting
	// for this member waits for its slowest worker. With no ready worker
	// nothing routes yet: the map the newest generation starts on (so a
	// host stuck booting is not a straggler forever, and does not hold
	// GC back).
	switch {
	case anyReady:
		mem.MapVersion = lowest
	case m.latest != nil:
		mem.MapVersion = m.latest.spec.mapVersion()
	case m.curMap != nil:
		mem.MapVersion = m.curMap.version
	}
	m.m.workerMapVersion.Set(float64(mem.MapVersion))
	ready := counts[wReady]
	accepting := len(m.bound) > 0 || (m.good != nil && len(m.good.spec.cfg.Listen) == 0)
	accepting = accepting && m.mode.serving()
	mem.Accepting = accepting
	switch {
	case m.mode == modeStopping:
		mem.State = "stopping"
	case m.mode == modeLost || m.mode == modeHolddown:
		mem.State = "lost"
	case m.mode == modeFailStatic:
		mem.State = "fail-static"
	case m.good == nil:
		mem.State = "starting"
	case ready < mem.Target:
		mem.State = "degraded"
	default:
		mem.State = "serving"
	}
	for _, st := range []wstate{wStarting, wReady, wStopping} {
		m.m.workers.WithLabelValues(st.String()).Set(float64(counts[st]))
	}
	m.m.target.Set(float64(mem.Target))
	if accepting {
		m.m.accepting.Set(1)
	} else {
		m.m.accepting.Set(0)
	}
	// serving (/healthz, what a load balancer probes) needs one ready
	// worker: with none, connections would only queue in the backlog. It
	// does not flap during a swap: the old generation stays ready until
	// the new one is. ready (/readyz) needs the whole target.
	h := healthState{accepting: accepting, serving: accepting && ready >= 1, ready: accepting && m.good != nil && ready >= mem.Target,
		readyN: ready, failStatic: m.mode == modeFailStatic}
	switch {
	case m.mode == modeFailStatic:
		h.reason = fmt.Sprintf("fail-static: ZooKeeper is unreachable for the whole fleet (%d peers agree since %s); serving config version %d and map version %d; config changes are refused",
			m.failStatic.Peers, m.failStatic.Since.Format(time.RFC3339), m.good.spec.cfgVersion, m.good.spec.mapVersion())
	case m.mode == modeChecking && !m.sharedUntil.IsZero():
		h.reason = "zookeeper session lost: the peers reconnected after this host's last answer (a shared disruption); waiting for this host's own session"
	case m.mode == modeChecking:
		h.reason = "zookeeper session lost: asking the peers whether the whole ensemble is down"
	case !m.mode.serving():
		h.reason = "not serving: " + m.mode.String()
	case !accepting:
		h.reason = "listen sockets not open yet"
	case !h.serving:
		h.reason = "no ready worker: connections would wait in the backlog"
	case !h.ready:
		h.reason = "fewer ready workers than the target"
	}
	if m.good != nil && !m.notifiedUp && h.ready {
		m.notifiedUp = true
		m.do(actNotify{"READY=1"})
	}
	m.upgradeTakeOver(accepting)
	return mem, h, m.take()
}
