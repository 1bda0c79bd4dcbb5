package supervisor

import (
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// Findings of the review of the stability window, health and probe.

// A new worker whose window has passed while another new one is still in
// its window (they became ready at different times, or surge < workers)
// puts nextWake in the past: the loop spins at 1 ms for the rest of the
// swap.
func TestMachineReviewNextWakeDoesNotSpinAfterAWorkersWindow(t *testing.T) {
	s := newSim(t, false)
	st := withStability(10*time.Second, time.Minute)
	s.serving(2, st)
	s.swapAt(time.Second, poolCfg(2, 2, st))
	s.at(2 * time.Second)
	s.ready(3)
	s.at(5 * time.Second)
	s.ready(4)
	s.at(12 * time.Second)
	s.tick() // w3 proven: w1 retired; w4 proven only at 15s
	s.at(12500 * ms)
	s.tick()
	if d := s.mc.nextWake(s.now); d < 100*ms {
		t.Fatalf("next wake in %s at 12.5s: the loop spins until w4's window ends at 15s", d)
	}
}

// A map change (swap mode) during the window supersedes the generation in
// its window; its ready workers, which never held, then count as proven
// (proven() is true for any worker not of the newest generation), so the
// generation that held is retired before the new config has held.
func TestMachineReviewMapChangeInsideTheWindowKeepsTheOldGeneration(t *testing.T) {
	s := newSim(t, true)
	s.send(evZK{zksession.StateChange{To: zksession.StateConnected}})
	st := withStability(10*time.Second, time.Minute)
	s.send(evMap{exists: true, version: 1, data: []byte("m1"), doc: []byte("d1")})
	s.serving(2, st)
	s.swapAt(time.Second, poolCfg(2, 2, st))
	s.at(2 * time.Second)
	s.ready(3, 4)
	s.at(3 * time.Second)
	s.send(evMap{exists: true, version: 2, data: []byte("m2"), doc: []byte("d2")})
	s.at(3250 * ms)
	got := s.tick()
	for _, a := range got {
		if strings.HasPrefix(a, "term w1") || strings.HasPrefix(a, "term w2") {
			t.Fatalf("config 2 has not held, yet the generation of config 1 is retired: %v\nworkers: %s", got, s.workers())
		}
	}
}

// Same with a HUP (or any newer config) inside the window, and what it
// leads to: a crash of the newest generation inside its window "rolls
// back" to a generation with no worker left.
func TestMachineReviewHUPInsideTheWindowThenCrashRollsBackToNothing(t *testing.T) {
	s, st := readyInWindow(t, 10*time.Second)
	s.at(3 * time.Second)
	hup := poolCfg(2, 2, st)
	hup.force = true
	s.send(hup)
	s.at(3250 * ms)
	got := s.tick()
	for _, id := range []int64{1, 2} {
		if w := s.w(id); w.state == wStopping {
			s.exit(id, "exit status 0")
		}
	}
	s.at(4 * time.Second)
	s.ready(5, 6)
	s.at(5 * time.Second)
	got = append(got, s.exit(5, "exit status 1")...)
	n := 0
	for _, w := range s.mc.workers {
		if w.gen == s.mc.good && w.state == wReady {
			n++
		}
	}
	if n == 0 {
		t.Fatalf("rolled back to g%d, which has no ready worker (the old generation was retired at the HUP): %v\nworkers: %s",
			s.mc.good.id, got, s.workers())
	}
}

// A session loss inside the window: after the resync the unproven config
// becomes a "first generation" (no window), and since prevCfg is not set
// its crash loop is never rolled back to the config that held.
func TestMachineReviewSessionLossInsideTheWindowLosesTheRollback(t *testing.T) {
	s := newSim(t, true)
	s.send(evZK{zksession.StateChange{To: zksession.StateConnected}})
	st := withStability(10*time.Second, time.Minute)
	mp := evMap{exists: true, version: 1, data: []byte("m1"), doc: []byte("d1")}
	s.send(mp)
	s.serving(2, st, restart(100*ms, 100*ms))
	s.swapAt(time.Second, poolCfg(2, 2, st, restart(100*ms, 100*ms)))
	s.at(2 * time.Second)
	s.ready(3, 4)
	s.at(3 * time.Second)
	s.send(evZK{zksession.StateChange{To: zksession.StateLost, Reason: "expired"}})
	for _, w := range append([]*worker(nil), s.mc.workers...) {
		s.exit(w.id, "signal: killed")
	}
	s.at(4 * time.Second)
	s.send(evZK{zksession.StateChange{To: zksession.StateConnected, NewSession: true}})
	s.at(7 * time.Second)
	s.tick()
	s.send(evResync{cfg: poolCfg(2, 2, st, restart(100*ms, 100*ms)), mp: mp})
	s.ready(5, 6)
	if s.mc.good == nil || s.mc.good.spec.cfgVersion != 2 {
		t.Fatalf("good: %+v", s.mc.good)
	}
	// config 2 crash-loops right after READY=1, for good.
	for i := 0; i < 6; i++ {
		s.at(s.now.Sub(s.t0) + time.Second)
		for _, w := range append([]*worker(nil), s.mc.workers...) {
			if w.state == wReady {
				s.exit(w.id, "exit status 1")
			}
		}
		s.at(s.now.Sub(s.t0) + 200*ms)
		s.tick()
		for _, w := range append([]*worker(nil), s.mc.workers...) {
			if w.state == wStarting {
				s.ready(w.id)
			}
		}
	}
	if s.mc.latest.spec.cfgVersion != 1 {
		t.Fatalf("config 2 (never held) crash-loops on after a session loss inside its window; config 1 (held) is never restarted; rollbacks=%v",
			counter(t, s, "shardvisor_supervisor_rollbacks_total", "crash_loop"))
	}
}

// An invalid config while a failed swap waits for its retry drops a valid
// config that arrived between the two (pending in the debounce). Without
// the failed swap the same sequence applies it.
func TestMachineReviewInvalidConfigDropsAPendingValidOne(t *testing.T) {
	s := newSim(t, false)
	s.serving(1)
	s.swapAt(time.Second, poolCfg(2, 1))
	s.exit(2, "exit status 3") // swap to 2 failed; retry pending
	s.at(2 * time.Second)
	s.send(poolCfg(3, 1)) // valid, newer
	s.at(2100 * ms)
	s.send(evConfig{err: errorString("workers: 0 is out of range")})
	s.at(5 * time.Second)
	s.tick()
	if s.mc.latest.spec.cfgVersion != 3 {
		t.Fatalf("valid config 3 dropped by the invalid one (latest config %d, desired %d)", s.mc.latest.spec.cfgVersion, s.mc.desired.cfgVersion)
	}
}

// A rollback inside the window does not close a listen socket only the
// rolled-back config had: it stays bound (accepting into a backlog nobody
// reads) until some later swap completes.
func TestMachineReviewRollbackClosesTheRolledBackConfigsSockets(t *testing.T) {
	s := newSim(t, false)
	st := withStability(10*time.Second, time.Minute)
	s.serving(1, st)
	s.at(time.Second)
	s.send(poolCfg(2, 1, st, func(c *topo.PoolConfig) {
		c.Listen = append(c.Listen, topo.Listen{Name: "admin", Addr: "tcp://127.0.0.1:9090"})
	}))
	s.at(1250 * ms)
	s.tick()
	s.at(2 * time.Second)
	s.ready(2)
	s.at(3 * time.Second)
	s.exit(2, "exit status 1")
	s.at(time.Minute)
	s.tick()
	if s.mc.bound["tcp://127.0.0.1:9090"] {
		t.Fatalf("the rolled-back config's socket 9090 is still bound a minute after the rollback")
	}
}
