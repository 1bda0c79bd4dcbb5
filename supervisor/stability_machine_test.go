package supervisor

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/workerproto"
	"github.com/shardvisor/shardvisor/zksession"
)

// The stability checks (stability.go) and health semantics, as machine
// table tests.

func withStability(window, within time.Duration) func(*topo.PoolConfig) {
	return func(c *topo.PoolConfig) {
		w, r := topo.Duration(window), topo.Duration(within)
		c.Stability = topo.Stability{Window: &w, RollbackWithin: &r}
	}
}

// readyInWindow is how most stability tests start: two workers serving
// under a stability window, a swap to generation 2 at 1 s, and its
// workers w3 and w4 ready at 2 s, so the window runs.
func readyInWindow(t *testing.T, window time.Duration) (*sim, func(*topo.PoolConfig)) {
	s := newSim(t, false)
	st := withStability(window, time.Minute)
	s.serving(2, st)
	s.swapAt(time.Second, poolCfg(2, 2, st))
	s.at(2 * time.Second)
	s.ready(3, 4)
	return s, st
}

func counter(t *testing.T, s *sim, name, label string) float64 {
	t.Helper()
	mfs, err := s.mc.m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" || (len(m.GetLabel()) > 0 && m.GetLabel()[0].GetValue() == label) {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no metric %s{%s}", name, label)
	return 0
}

func TestMachineWindowKeepsTheOldGenerationUntilTheNewHolds(t *testing.T) {
	s := newSim(t, false)
	st := withStability(10*time.Second, time.Minute)
	s.serving(2, st)
	s.expect("swap starts", s.swapAt(time.Second, poolCfg(2, 2, st)), "prepare g2", "notify RELOADING=1 STATUS=swapping to generation 2", "start w3 g2", "start w4 g2")
	s.at(2 * time.Second)
	s.expect("new workers ready: the old stay, both serve", s.ready(3, 4))
	if d := s.mc.nextWake(s.now); d != time.Second {
		t.Fatalf("next wake in %s", d) // the 1s housekeeping tick is sooner than the window's end
	}
	_, h, _ := s.mc.snapshot()
	if !h.serving || !h.ready || h.readyN != 4 {
		t.Fatalf("health inside the window: %+v", h)
	}
	s.at(11999 * ms)
	s.expect("just inside the window", s.tick())
	s.at(12 * time.Second)
	s.expect("window over: the old retire, the swap completes", s.tick(),
		"term w1 replaced", "term w2 replaced", "publish ok g2", "notify READY=1 STATUS=serving generation 2", "clean-maps keep ")
}

func TestMachineCrashInsideTheWindowRollsBackAndIsNotRetried(t *testing.T) {
	s, st := readyInWindow(t, 10*time.Second)
	// Two seconds after READY=1, one of them exits 1: the finding.
	s.at(4 * time.Second)
	got := s.exit(3, "exit status 1")
	s.expect("crash inside the window: rolled back, the other new one retired", got,
		"publish rolled_back g2", "notify READY=1 STATUS=swap to generation 2 rolled back; generation 1 serves", "clean-maps keep ", "term w4 replaced")
	if s.mc.good.id != 1 || s.mc.latest.id != 1 {
		t.Fatalf("serving g%d latest g%d, want g1", s.mc.good.id, s.mc.latest.id)
	}
	mem, h, _ := s.mc.snapshot()
	if mem.RolledBack == nil || mem.RolledBack.ConfigVersion != 2 || mem.RolledBack.ToConfigVersion != 1 ||
		!strings.Contains(mem.RolledBack.Reason, "inside the stability window") || !strings.HasPrefix(mem.LastError, "rolled back: ") {
		t.Fatalf("member record: %+v", mem)
	}
	if !h.serving || h.readyN != 2 {
		t.Fatalf("health after the rollback: %+v", h)
	}
	if n := counter(t, s, "shardvisor_supervisor_rollbacks_total", "window"); n != 1 {
		t.Fatalf("rollbacks{window} = %v", n)
	}
	s.exit(4, "exit status 0")
	// Not retried, however long we wait...
	s.at(time.Minute)
	s.expect("no retry of the rolled-back config", s.tick())
	// ...nor when the same config is delivered again (a resync, a watch).
	s.expect("same config again", s.send(poolCfg(2, 2, st)))
	s.at(61 * time.Second)
	s.expect("still no retry", s.tick())
	// A HUP asks for it again.
	ev := poolCfg(2, 2, st)
	ev.force = true
	s.send(ev)
	s.at(62 * time.Second)
	s.expect("HUP retries it", s.tick(), "prepare g3", "notify RELOADING=1 STATUS=swapping to generation 3", "start w5 g3", "start w6 g3")
}

func TestMachineNewConfigAfterRollbackSwaps(t *testing.T) {
	s := newSim(t, false)
	st := withStability(10*time.Second, time.Minute)
	s.serving(1, st)
	s.swapAt(time.Second, poolCfg(2, 1, st))
	s.ready(2)
	s.at(3 * time.Second)
	s.exit(2, "exit status 1")
	s.at(4 * time.Second)
	s.send(poolCfg(3, 1, st))
	s.at(4250 * ms)
	s.expect("a new config swaps", s.tick(), "prepare g3", "notify RELOADING=1 STATUS=swapping to generation 3", "start w3 g3")
	if s.mc.bad != "" {
		t.Fatalf("bad %q still set", s.mc.bad)
	}
}

func TestMachineCrashLoopAfterTheWindowRestartsThePreviousConfig(t *testing.T) {
	s, st := readyInWindow(t, 3*time.Second)
	s.at(5 * time.Second)
	s.expect("window over", s.tick(), "term w1 replaced", "term w2 replaced", "publish ok g2", "notify READY=1 STATUS=serving generation 2", "clean-maps keep ")
	s.exit(1, "exit status 0")
	s.exit(2, "exit status 0")
	// Ten seconds after READY=1 both crash: the old workers are gone.
	s.at(12 * time.Second)
	got := s.exit(3, "exit status 1")
	if strings.Contains(strings.Join(got, ";"), "rolled_back") {
		t.Fatalf("rolled back after one crash of two workers: %v", got)
	}
	got = s.exit(4, "exit status 1")
	s.expect("crash loop: the previous config restarts at once", got,
		"publish rolled_back g2", "clean-maps keep ", "prepare g3", "notify RELOADING=1 STATUS=swapping to generation 3", "start w5 g3", "start w6 g3")
	if sp := s.mc.latest.spec; sp.cfgVersion != 1 {
		t.Fatalf("rolled back to config %d, want 1", sp.cfgVersion)
	}
	s.at(13 * time.Second)
	s.expect("the previous config held before: no window", s.ready(5, 6), "publish rolled_back g3", "notify READY=1 STATUS=serving generation 3", "clean-maps keep ")
	if n := counter(t, s, "shardvisor_supervisor_rollbacks_total", "crash_loop"); n != 1 {
		t.Fatalf("rollbacks{crash_loop} = %v", n)
	}
	// The bad config delivered again is refused.
	s.expect("bad config again", s.send(poolCfg(2, 2, st)))
	s.at(20 * time.Second)
	s.expect("not retried", s.tick())
}

func TestMachineCrashesAfterRollbackWithinAreOnlyRespawned(t *testing.T) {
	s := newSim(t, false)
	st := withStability(time.Second, 5*time.Second)
	s.serving(1, st)
	s.swapAt(time.Second, poolCfg(2, 1, st))
	s.ready(2)
	s.at(2250 * ms)
	s.tick()
	s.exit(1, "exit status 0")
	s.at(20 * time.Second)
	got := s.exit(2, "exit status 1")
	s.at(30 * time.Second)
	got = append(got, s.tick()...)
	s.expect("a crash long after the swap: respawned, no rollback", got, "clean-maps keep ", "start w3 g2")
}

func TestMachineMapOnlySwapHasNoWindow(t *testing.T) {
	s := newSim(t, true)
	s.send(evZK{zksession.StateChange{To: zksession.StateConnected}})
	st := withStability(10*time.Second, time.Minute)
	s.send(evMap{exists: true, version: 1, data: []byte("m1"), doc: []byte("d1")})
	s.serving(1, st)
	s.at(time.Second)
	s.send(evMap{exists: true, version: 2, data: []byte("m2"), doc: []byte("d2")})
	s.at(1250 * ms)
	s.tick()
	s.expect("a map-only swap completes at READY=1", s.ready(2), "term w1 replaced", "publish ok g2", "notify READY=1 STATUS=serving generation 2", "clean-maps keep 1,2")
}

func TestMachineFirstGenerationHasNoWindow(t *testing.T) {
	s := newSim(t, false)
	s.expect("first config", s.send(poolCfg(1, 1, withStability(10*time.Second, time.Minute))), "prepare g1", "start w1 g1")
	s.expect("ready", s.ready(1), "publish ok g1", "notify READY=1 STATUS=serving generation 1", "clean-maps keep ")
}

func TestMachineHealthNeedsAReadyWorker(t *testing.T) {
	s := newSim(t, false)
	s.serving(2, restart(time.Second, 30*time.Second))
	_, h, _ := s.mc.snapshot()
	if !h.serving || !h.ready {
		t.Fatalf("2/2: %+v", h)
	}
	s.exit(1, "exit status 1")
	_, h, _ = s.mc.snapshot()
	if !h.serving || h.ready {
		t.Fatalf("1/2: healthz must pass, readyz fail: %+v", h)
	}
	s.exit(2, "exit status 1")
	_, h, _ = s.mc.snapshot()
	if h.serving || h.ready || !h.accepting || !strings.Contains(h.reason, "no ready worker") {
		t.Fatalf("0/2: the load balancer's probe must fail: %+v", h)
	}
}

func TestMachineHealthDoesNotFlapDuringASwap(t *testing.T) {
	s := newSim(t, false)
	s.serving(2, surge(1))
	check := func(what string) {
		t.Helper()
		if _, h, _ := s.mc.snapshot(); !h.serving {
			t.Fatalf("%s: /healthz would fail: %+v", what, h)
		}
	}
	for v := int64(2); v <= 4; v++ {
		base := time.Duration(v) * 10 * time.Second
		s.at(base)
		s.send(poolCfg(v, 2, surge(1)))
		check("change")
		s.at(base + 250*ms)
		s.tick()
		check("swap started")
		for _, w := range append([]*worker(nil), s.mc.workers...) {
			if w.state == wStarting {
				s.ready(w.id)
				check("one new ready")
			}
		}
		for _, w := range append([]*worker(nil), s.mc.workers...) {
			if w.state == wStarting {
				s.ready(w.id)
				check("second new ready")
			}
			if w.state == wStopping {
				s.exit(w.id, "exit status 0")
				check("old exited")
			}
		}
		for _, w := range append([]*worker(nil), s.mc.workers...) {
			if w.state == wStopping {
				s.exit(w.id, "exit status 0")
				check("old exited")
			}
		}
		if s.mc.good.spec.cfgVersion != v {
			t.Fatalf("config %d not serving: %s", v, s.workers())
		}
	}
}

func TestMachineProbeGatesReadinessAndReplacesAHungWorker(t *testing.T) {
	s := newSim(t, false)
	probe := func(c *topo.PoolConfig) {
		c.Probe = &topo.WorkerProbe{Path: "/healthz", Failures: 3}
	}
	s.expect("first config", s.send(poolCfg(1, 1, probe)), "prepare g1", "start w1 g1")
	s.expect("READY=1 alone is not enough: probe it now", s.ready(1), "probe w1")
	s.expect("probe passes: ready", s.send(evProbe{w: s.w(1), ok: true}), "publish ok g1", "notify READY=1 STATUS=serving generation 1", "clean-maps keep ")
	s.at(time.Second)
	s.expect("one failure", s.send(evProbe{w: s.w(1), why: "timeout"}))
	s.expect("a pass resets the count", s.send(evProbe{w: s.w(1), ok: true}))
	s.expect("failure 1", s.send(evProbe{w: s.w(1), why: "timeout"}))
	s.expect("failure 2", s.send(evProbe{w: s.w(1), why: "timeout"}))
	s.expect("failure 3: quit, counted as a crash", s.send(evProbe{w: s.w(1), why: "timeout"}), "inspect w1 probe", "quit w1", "start w2 g1")
	if w := s.w(1); w.stopReason != "probe" || !w.crashLike {
		t.Fatalf("worker: %+v", w)
	}
	if n := counter(t, s, "shardvisor_supervisor_worker_kills_total", "probe"); n != 1 {
		t.Fatalf("kills{probe} = %v", n)
	}
}

func TestMachineInvalidConfigAfterAFailedOneStopsTheRetries(t *testing.T) {
	s := newSim(t, false)
	s.serving(1)
	s.swapAt(time.Second, poolCfg(2, 1))
	s.expect("boot failure", s.exit(2, "exit status 3"), "publish failed g2", "notify READY=1 STATUS=swap to generation 2 failed; generation 1 serves", "clean-maps keep ")
	s.at(2 * time.Second)
	got := s.send(evConfig{err: errorString("workers: 0 is out of range")})
	s.expect("invalid config", got, "publish invalid_config g1")
	s.at(time.Minute)
	s.expect("the failed config is not retried", s.tick())
	mem, _, _ := s.mc.snapshot()
	if mem.Generation != 1 || !strings.Contains(mem.LastError, "config rejected") {
		t.Fatalf("member: %+v", mem)
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }

func TestMachineCountersStartAtZero(t *testing.T) {
	s := newSim(t, false)
	for name, label := range map[string]string{"shardvisor_supervisor_worker_exits_total": "crash",
		"shardvisor_supervisor_worker_stops_total": "replaced", "shardvisor_supervisor_worker_kills_total": "watchdog",
		"shardvisor_supervisor_rollbacks_total": "window"} {
		if v := counter(t, s, name, label); v != 0 {
			t.Fatalf("%s{%s} = %v", name, label, v)
		}
	}
	_ = workerproto.Ready
}

// "swap failed; the previous generation keeps serving" is logged only when
// one does (issue 15): not for a first config, nor when the previous
// generation has no ready worker left.
func TestMachineSwapFailedSaysWhatServes(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	s := newSim(t, false)
	s.mc.log = zap.New(core)
	messages := func() []string {
		var out []string
		for _, e := range logs.TakeAll() {
			if strings.HasPrefix(e.Message, "swap failed") {
				out = append(out, e.Message)
			}
		}
		return out
	}
	s.send(poolCfg(1, 1))
	s.exit(1, "exit status 3")
	if got := messages(); len(got) != 1 || !strings.Contains(got[0], "nothing serves: no generation has held yet") {
		t.Fatalf("first config failing: %q", got)
	}
	s = newSim(t, false)
	s.mc.log = zap.New(core)
	s.serving(1, restart(time.Second, 30*time.Second))
	s.swapAt(time.Second, poolCfg(2, 1))
	s.exit(2, "exit status 3")
	if got := messages(); len(got) != 1 || got[0] != "swap failed; the previous generation keeps serving" {
		t.Fatalf("with the previous generation ready: %q", got)
	}
	// The serving worker crashes, then the next try fails too.
	s.at(2 * time.Second)
	s.exit(1, "exit status 1")
	s.at(10 * time.Second)
	s.tick()
	for _, w := range append([]*worker(nil), s.mc.workers...) {
		if w.gen == s.mc.latest && w.state == wStarting {
			s.exit(w.id, "exit status 3")
		}
	}
	if got := messages(); len(got) != 1 || !strings.Contains(got[0], "the previous generation has no ready worker either") {
		t.Fatalf("with nothing ready: %q (workers %s)", got, s.workers())
	}
}
