package supervisor

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

func withProbe(c *topo.PoolConfig) {
	c.Probe = &topo.WorkerProbe{Path: "/healthz", Failures: 3}
}

// probeServing is a pool of n ready, probed workers (w1..wn) on config 1.
func probeServing(t *testing.T, n int) *sim {
	t.Helper()
	s := newSim(t, false)
	mut := []func(*topo.PoolConfig){withProbe, restart(time.Second, 8*time.Second)}
	var want []string
	want = append(want, "prepare g1")
	for i := int64(1); i <= int64(n); i++ {
		want = append(want, "start w"+itoa(i)+" g1")
	}
	s.expect("first generation: no canary, nothing else serves", s.send(poolCfg(1, n, mut...)), want...)
	for i := int64(1); i <= int64(n); i++ {
		s.expect("READY=1: probe now", s.ready(i), "probe w"+itoa(i))
		acts := s.send(evProbe{w: s.w(i), ok: true})
		if i == int64(n) {
			s.expect("last probe passes", acts, "publish ok g1", "notify READY=1 STATUS=serving generation 1", "clean-maps keep ")
		}
	}
	return s
}

func itoa(i int64) string { return fmt.Sprint(i) }

func gaugeValue(t *testing.T, s *sim, name string) float64 {
	t.Helper()
	mfs, err := s.mc.m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestMachineCanaryStartsTheRestOnlyOnceItIsReady(t *testing.T) {
	s := probeServing(t, 3)
	s.expect("a new config starts one canary", s.swapAt(time.Second, poolCfg(2, 3, withProbe, restart(time.Second, 8*time.Second))),
		"prepare g2", "notify RELOADING=1 STATUS=swapping to generation 2", "start w4 g2")
	s.at(1500 * ms)
	s.expect("nothing more while it boots", s.tick())
	s.expect("READY=1: probe it now", s.ready(4), "probe w4")
	s.expect("probe passes: the canary is ready, one old retires, the rest start", s.send(evProbe{w: s.w(4), ok: true}),
		"term w1 replaced", "start w5 g2", "start w6 g2")
}

func TestMachineFirstProbeFailureKillsTheCanaryAndTheConfigIsRefusedAfterThreeAttempts(t *testing.T) {
	s := probeServing(t, 2)
	cfg := poolCfg(2, 2, withProbe, restart(time.Second, 8*time.Second))
	s.expect("canary", s.swapAt(time.Second, cfg), "prepare g2", "notify RELOADING=1 STATUS=swapping to generation 2", "start w3 g2")
	s.expect("a failure before READY=1 is a worker still booting", s.send(evProbe{w: s.w(3), why: "status 503"}))
	s.at(1300 * ms)
	s.expect("READY=1", s.ready(3), "probe w3")
	s.expect("first probe after READY=1 fails: killed at once, the swap fails",
		s.send(evProbe{w: s.w(3), why: "status 500", first: true}), "kill w3 probe_first", "publish failed g2",
		"notify READY=1 STATUS=swap to generation 2 failed; generation 1 serves")
	if w := s.w(3); w.crashLike {
		t.Fatalf("a canary of a failed swap is no crash of the serving pool: %+v", w)
	}
	for _, id := range []int64{1, 2} {
		if s.w(id).state != wReady {
			t.Fatalf("w%d of the serving generation is %s", id, s.w(id).state)
		}
	}
	s.exit(3, "signal: killed")
	if n := counter(t, s, "shardvisor_supervisor_worker_kills_total", "probe_first"); n != 1 {
		t.Fatalf("kills{probe_first} = %v", n)
	}

	// Attempt 2 after restart.initial, attempt 3 after twice that.
	s.at(2300 * ms)
	s.expect("attempt 2, a canary again", s.tick(), "prepare g3", "notify RELOADING=1 STATUS=swapping to generation 3", "start w4 g3")
	s.ready(4)
	s.expect("fails", s.send(evProbe{w: s.w(4), why: "status 500", first: true}), "kill w4 probe_first", "publish failed g3", "notify READY=1 STATUS=swap to generation 3 failed; generation 1 serves")
	s.exit(4, "signal: killed")
	s.at(4299 * ms)
	s.expect("backoff doubled", s.tick())
	s.at(4300 * ms)
	s.expect("attempt 3", s.tick(), "prepare g4", "notify RELOADING=1 STATUS=swapping to generation 4", "start w5 g4")
	s.ready(5)
	s.expect("third failure: refused", s.send(evProbe{w: s.w(5), why: "status 500", first: true}), "kill w5 probe_first", "publish failed g4",
		"notify READY=1 STATUS=swap to generation 4 failed; generation 1 serves")
	s.exit(5, "signal: killed")
	mem, h, _ := s.mc.snapshot()
	if !strings.Contains(mem.LastError, "refused after 3 swaps whose canary failed") || mem.Generation != 1 || !h.ready {
		t.Fatalf("member %+v health %+v", mem, h)
	}
	if g := gaugeValue(t, s, "shardvisor_supervisor_config_refused"); g != 1 {
		t.Fatalf("config_refused = %v", g)
	}
	s.at(time.Hour)
	s.expect("never retried", s.tick())
	s.expect("the same config again (a resync, a watch)", s.send(cfg))
	s.expect("still not", s.tick())

	// HUP asks for it again: all attempts again.
	hup := cfg
	hup.force = true
	s.send(hup)
	s.at(time.Hour + time.Second)
	s.expect("HUP retries it", s.tick(), "prepare g5", "notify RELOADING=1 STATUS=swapping to generation 5", "start w6 g5")
	if s.mc.failedTries != 0 {
		t.Fatalf("tries after HUP: %d", s.mc.failedTries)
	}
	// A new config swaps as usual, and the gauge clears.
	s.send(poolCfg(3, 2, withProbe, restart(time.Second, 8*time.Second)))
	if g := gaugeValue(t, s, "shardvisor_supervisor_config_refused"); g != 0 {
		t.Fatalf("config_refused = %v after a new config", g)
	}
}

func TestMachineFirstProbeFailureOfTheServingGenerationIsACrash(t *testing.T) {
	s := probeServing(t, 2)
	s.at(time.Second)
	s.exit(1, "signal: segmentation fault")
	s.at(3 * time.Second)
	s.expect("respawned after the backoff", s.tick(), "start w3 g1")
	s.ready(3)
	s.expect("its first probe fails: killed, a crash", s.send(evProbe{w: s.w(3), why: "timeout", first: true}), "kill w3 probe_first")
	if !s.w(3).crashLike || s.mc.latest.failed {
		t.Fatalf("worker %+v, generation failed %v", s.w(3), s.mc.latest.failed)
	}
	s.exit(3, "signal: killed")
	if !s.mc.respawnAt.After(s.now) {
		t.Fatalf("respawn not backed off: %s", s.mc.respawnAt)
	}
}

// readyProbed is READY=1 and a passed probe for each worker.
func (s *sim) readyProbed(ids ...int64) {
	s.t.Helper()
	for _, id := range ids {
		s.ready(id)
		s.send(evProbe{w: s.w(id), ok: true})
	}
}

func TestMachineNoCanaryWithoutAProbeForAConfigThatHeldOrAMapSwap(t *testing.T) {
	s := newSim(t, true)
	s.send(evZK{zksession.StateChange{To: zksession.StateConnected}})
	s.send(mapEv(1))
	s.send(poolCfg(1, 2, withProbe))
	s.readyProbed(1, 2)
	s.at(time.Second)
	s.send(mapEv(2))
	s.at(1250 * ms)
	s.expect("a new map in swap mode: the config held, all at once", s.tick(),
		"prepare g2", "notify RELOADING=1 STATUS=swapping to generation 2", "start w3 g2", "start w4 g2")
	s.readyProbed(3, 4)
	s.exit(1, "exit status 0")
	s.exit(2, "exit status 0")
	s.expect("a new config with a probe: a canary", s.swapAt(2*time.Second, poolCfg(2, 2, withProbe)),
		"prepare g3", "notify RELOADING=1 STATUS=swapping to generation 3", "start w5 g3")
	s.readyProbed(5, 6)
	for _, w := range append([]*worker(nil), s.mc.workers...) {
		if w.state == wStopping {
			s.exit(w.id, "exit status 0")
		}
	}
	if s.mc.good.spec.cfgVersion != 2 {
		t.Fatalf("config 2 not serving: %s", s.workers())
	}
	s.expect("back to config 1, which held: all at once", s.swapAt(5*time.Second, poolCfg(1, 2, withProbe)),
		"prepare g4", "notify RELOADING=1 STATUS=swapping to generation 4", "start w7 g4", "start w8 g4")
	s.readyProbed(7, 8)
	for _, w := range append([]*worker(nil), s.mc.workers...) {
		if w.state == wStopping {
			s.exit(w.id, "exit status 0")
		}
	}
	s.expect("a new config without a probe: the canary would pass at READY=1, so none", s.swapAt(8*time.Second, poolCfg(3, 2)),
		"prepare g5", "notify RELOADING=1 STATUS=swapping to generation 5", "start w9 g5", "start w10 g5")
}

func TestMachineNothingServingRetriesForever(t *testing.T) {
	s := newSim(t, false)
	s.send(poolCfg(1, 1, restart(time.Second, 2*time.Second)))
	for i := 1; i <= 5; i++ {
		s.exit(int64(i), "exit status 3")
		s.at(time.Duration(i) * 3 * time.Second)
		acts := s.tick()
		if len(acts) == 0 || !strings.HasPrefix(acts[0], "prepare g") {
			t.Fatalf("attempt %d after failures with nothing serving: %v", i+1, acts)
		}
	}
}

// In timer mode READY=1 also counts, as the docs always said (the machine
// used to wait for the timer regardless).
func TestMachineTimerModeReadyOneAlsoCounts(t *testing.T) {
	s := newSim(t, false)
	s.expect("first config", s.send(poolCfg(1, 1, timerMode(10*time.Second))), "prepare g1", "start w1 g1")
	s.at(time.Second)
	s.expect("READY=1 before the timer: ready", s.ready(1), "publish ok g1", "notify READY=1 STATUS=serving generation 1", "clean-maps keep ")
	if s.w(1).state != wReady {
		t.Fatalf("worker %s", s.w(1).state)
	}
}
