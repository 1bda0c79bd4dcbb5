package supervisor

import (
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/topo"
)

// When the watchdog or the probe gives up on a worker, what it is sent
// depends on the process state the executor finds: a stopped or traced
// process (or a zombie) handles no signal, so it is killed at once; any
// other gets SIGQUIT for a stack dump and SIGKILL later.
func TestMachineGiveUpDependsOnTheProcessState(t *testing.T) {
	watchdog := func(c *topo.PoolConfig) { c.Watchdog = topo.Duration(time.Second) }
	probe := func(c *topo.PoolConfig) { c.Probe = &topo.WorkerProbe{Path: "/", Failures: 1} }
	for _, tc := range []struct {
		name      string
		by        string
		state     byte
		want      []string
		crashLike bool
	}{
		{"watchdog, running", "watchdog", 'S', []string{"inspect w1 watchdog", "quit w1", "start w2 g1"}, true},
		{"watchdog, stopped", "watchdog", 'T', []string{"inspect w1 watchdog", "kill w1 watchdog", "start w2 g1"}, false},
		{"watchdog, traced", "watchdog", 't', []string{"inspect w1 watchdog", "kill w1 watchdog", "start w2 g1"}, false},
		{"watchdog, uninterruptible", "watchdog", 'D', []string{"inspect w1 watchdog", "quit w1", "start w2 g1"}, true},
		{"watchdog, zombie", "watchdog", 'Z', []string{"inspect w1 watchdog", "kill w1 watchdog", "start w2 g1"}, true},
		{"watchdog, gone", "watchdog", '?', []string{"inspect w1 watchdog", "quit w1", "start w2 g1"}, true},
		{"probe, running", "probe", 'R', []string{"inspect w1 probe", "quit w1", "start w2 g1"}, true},
		{"probe, stopped", "probe", 'T', []string{"inspect w1 probe", "kill w1 probe", "start w2 g1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, false)
			s.procState[1] = tc.state
			var got []string
			if tc.by == "watchdog" {
				s.serving(1, watchdog)
				s.at(1001 * ms)
				got = s.tick()
			} else {
				s.expect("first config", s.send(poolCfg(1, 1, probe)), "prepare g1", "start w1 g1")
				s.ready(1)
				s.send(evProbe{w: s.w(1), ok: true})
				got = s.send(evProbe{w: s.w(1), why: "timeout"})
			}
			s.expect("give up", got, tc.want...)
			w := s.w(1)
			if w.crashLike != tc.crashLike || w.state != wStopping {
				t.Fatalf("worker after the give-up: crash-like %v, state %s; want crash-like %v, stopping", w.crashLike, w.state, tc.crashLike)
			}
			if n := counter(t, s, "shardvisor_supervisor_worker_kills_total", tc.by); n != 1 {
				t.Fatalf("kills{%s} = %v, want 1 (SIGQUIT and SIGKILL of one give-up count once)", tc.by, n)
			}
			s.at(1001*ms + WatchdogKillDelay)
			if tc.want[1] == "quit w1" {
				s.expect("SIGKILL after the stack dump's time", s.tick(), "kill w1 "+tc.by)
			} else {
				s.expect("killed already: nothing more", s.tick())
			}
			s.exit(1, "signal: killed")
			if crashed := !s.mc.respawnAt.IsZero(); crashed != tc.crashLike {
				t.Fatalf("exit counted as a crash: %v, want %v", crashed, tc.crashLike)
			}
		})
	}
}

// With neither watchdog nor probe, the sampler's report finds a stopped
// worker: a warning after stoppedWarn, a kill and an immediate
// replacement (not a crash) after stoppedReplace; SIGCONT before that
// ends it, and a worker stopped by a debugger is only warned about.
func TestMachineStoppedWorkerIsReplaced(t *testing.T) {
	s := newSim(t, false)
	s.serving(2)
	s.at(time.Second)
	s.expect("stopped: nothing yet", s.send(evProcState{w: s.w(1), state: 'T'}))
	if at := s.mc.stoppedWake(s.w(1)); !at.Equal(s.now.Add(stoppedWarnAfter)) {
		t.Fatalf("wake at %s, want the warning's %s", at, s.now.Add(stoppedWarnAfter))
	}
	s.at(time.Second + stoppedWarnAfter)
	s.expect("warned only", s.tick())
	if !s.w(1).stoppedWarned {
		t.Fatal("no warning recorded")
	}
	if at := s.mc.stoppedWake(s.w(1)); !at.Equal(s.t0.Add(time.Second + stoppedReplaceAfter)) {
		t.Fatalf("wake at %s, want the replacement's", at)
	}
	s.at(time.Second + stoppedReplaceAfter - ms)
	s.expect("not yet", s.tick())
	s.at(time.Second + stoppedReplaceAfter)
	s.expect("killed and replaced at once", s.tick(), "kill w1 stopped", "start w3 g1")
	s.expect("its exit is expected", s.exit(1, "signal: killed"), "clean-maps keep ")
	s.ready(3)
	if !s.mc.respawnAt.IsZero() || s.mc.crashCount != 0 {
		t.Fatalf("a stopped worker counted as a crash: respawn at %s, %d crashes", s.mc.respawnAt, s.mc.crashCount)
	}
	if n := counter(t, s, "shardvisor_supervisor_worker_kills_total", "stopped"); n != 1 {
		t.Fatalf("kills{stopped} = %v", n)
	}

	// SIGCONT in time: nothing happens.
	s.at(20 * time.Second)
	s.send(evProcState{w: s.w(2), state: 'T'})
	s.at(25 * time.Second)
	s.send(evProcState{w: s.w(2), state: 'S'})
	s.at(40 * time.Second)
	s.expect("resumed: kept", s.tick())

	// A debugger: warned, never killed for it.
	s.send(evProcState{w: s.w(2), state: 't'})
	s.at(40*time.Second + time.Hour)
	s.expect("traced: kept", s.tick())
	if !s.w(2).stoppedWarned {
		t.Fatal("no warning for the traced worker")
	}
	if at := s.mc.stoppedWake(s.w(2)); !at.IsZero() {
		t.Fatalf("wake at %s: a traced worker, once warned about, needs none", at)
	}
}

// A report for a worker that is gone, and a stopped worker that is
// starting (readiness.timeout bounds it), change nothing.
func TestMachineStoppedReportsOutsideTheCheck(t *testing.T) {
	s := newSim(t, false)
	s.serving(1)
	s.at(time.Second)
	s.expect("one more worker", s.send(evSignal{sig: syscall.SIGTTIN}), "start w2 g1")
	s.expect("stopped while starting", s.send(evProcState{w: s.w(2), state: 'T'}))
	s.at(time.Second + stoppedReplaceAfter)
	s.expect("starting: left to readiness.timeout", s.tick())
	gone := &worker{id: 99, gen: s.w(1).gen}
	s.expect("report for a gone worker", s.send(evProcState{w: gone, state: 'T'}))
	if got := s.mc.inspected(gone, 'T', s.now); len(got) != 0 {
		t.Fatalf("inspection of a gone worker: %v", got)
	}
}
