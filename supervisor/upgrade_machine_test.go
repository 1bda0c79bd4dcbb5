package supervisor

import (
	"strings"
	"syscall"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// The upgrade's decisions (upgrade_machine.go), as table tests: the sim
// plays the executor, and reports the new supervisor's pid as the
// executor does once it has started it.

const newPid = 5000

// upgradeSim is a sim serving one worker whose machine logs to an
// observer, so that refusals can be checked.
func upgradeSim(t *testing.T, takeOverFrom int) (*sim, *observer.ObservedLogs) {
	t.Helper()
	s := newSim(t, false)
	core, logs := observer.New(zap.InfoLevel)
	s.mc.log = zap.New(core)
	s.mc.up.from = takeOverFrom
	return s, logs
}

// upgrading is a supervisor serving n workers whose upgrade to newPid
// has started.
func upgrading(t *testing.T, n int) (*sim, *observer.ObservedLogs) {
	t.Helper()
	s, logs := upgradeSim(t, 0)
	s.serving(n)
	s.startUpgrade(newPid)
	return s, logs
}

// startUpgrade sends SIGUSR2 and, as the executor does, reports the new
// supervisor as started.
func (s *sim) startUpgrade(pid int) {
	s.t.Helper()
	s.expect("USR2", s.send(evUpgrade{}), "upgrade-start")
	s.mc.upgradeStarted(pid)
}

func refusals(logs *observer.ObservedLogs) []string {
	var out []string
	for _, e := range logs.TakeAll() {
		if strings.HasPrefix(e.Message, "upgrade refused: ") {
			out = append(out, strings.TrimPrefix(e.Message, "upgrade refused: "))
		}
	}
	return out
}

func TestMachineUpgradeHandsOverOnceTheNewOneIsReady(t *testing.T) {
	s, logs := upgrading(t, 2)
	if !s.mc.sharesState() {
		t.Fatal("the state directory is not shared with the new supervisor")
	}
	s.expect("a second USR2", s.send(evUpgrade{}))
	s.expect("another pid's ready", s.send(evUpgradeReady{pid: newPid + 1}))
	if got := refusals(logs); len(got) != 1 || !strings.HasPrefix(got[0], "an upgrade is already under way (new supervisor pid 5000)") {
		t.Fatalf("refusals %q", got)
	}
	// Ready: hand over first (the admin server stops before the health
	// could turn to stopping), then the graceful stop.
	s.expect("ready", s.send(evUpgradeReady{pid: newPid}),
		"hand-over p5000", "notify STOPPING=1", "close-sockets all", "term w1 shutdown", "term w2 shutdown")
	s.expect("ready again", s.send(evUpgradeReady{pid: newPid}))
	s.expect("USR2 while draining", s.send(evUpgrade{}))
	if got := refusals(logs); len(got) != 1 || got[0] != "this supervisor already handed over to pid 5000 and is draining" {
		t.Fatalf("refusals %q", got)
	}
	// The new one's map files are not removed, and it is not stopped
	// with this one.
	s.expect("first worker gone", s.exit(1, "exit status 0"))
	s.expect("the new one exits while this one drains", s.send(evUpgradeExited{pid: newPid, status: "exit status 1"}))
	s.expect("last worker gone", s.exit(2, "exit status 0"))
	if !s.mc.stopDone || !s.mc.sharesState() {
		t.Fatalf("stop done %v, shares state %v", s.mc.stopDone, s.mc.sharesState())
	}
}

func TestMachineUpgradeFailures(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail any      // what the executor reports of the new supervisor
		want []string // the actions it makes
		gone bool     // the failure was its exit: it is forgotten at once
	}{
		{"not ready in time", evUpgradeFailed{pid: newPid, why: "it did not establish its first generation within 1m0s"}, []string{"upgrade-stop p5000"}, false},
		{"closed the pipe", evUpgradeFailed{pid: newPid, why: "it closed the ready pipe without being ready"}, []string{"upgrade-stop p5000"}, false},
		{"exited before ready", evUpgradeExited{pid: newPid, status: "exit status 1"}, []string{"upgrade-stop p5000"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, logs := upgrading(t, 1)
			s.expect("another pid fails", s.send(evUpgradeFailed{pid: newPid + 1, why: "x"}))
			s.expect("failure", s.send(tc.fail), tc.want...)
			s.expect("ready after failing", s.send(evUpgradeReady{pid: newPid}))
			if s.mc.up.handedOver || s.mc.mode != modeRunning {
				t.Fatalf("handed over %v, mode %s: this one must keep serving", s.mc.up.handedOver, s.mc.mode)
			}
			if !tc.gone {
				// One at a time: not before the failed one is gone.
				s.expect("USR2 while it stops", s.send(evUpgrade{}))
				if got := refusals(logs); len(got) != 1 || got[0] != "the new supervisor of the failed upgrade (pid 5000) is still stopping" {
					t.Fatalf("refusals %q", got)
				}
				s.expect("it exits", s.send(evUpgradeExited{pid: newPid, status: "signal: terminated"}))
			}
			if s.mc.sharesState() {
				t.Fatal("the state directory is still shared once the failed new supervisor is gone")
			}
			s.startUpgrade(newPid + 1)
		})
	}
}

func TestMachineUpgradeRefusedWhileStopping(t *testing.T) {
	s, logs := upgradeSim(t, 0)
	s.serving(1)
	s.send(evSignal{syscall.SIGTERM})
	s.expect("USR2 while stopping", s.send(evUpgrade{}))
	if got := refusals(logs); len(got) != 1 || got[0] != "this supervisor is stopping" {
		t.Fatalf("refusals %q", got)
	}
}

// A new supervisor that has not taken over when this one stops is
// stopped with it; one of a failed upgrade too (it may not have stopped).
func TestMachineUpgradeStoppedWithThisOne(t *testing.T) {
	s, _ := upgrading(t, 1)
	s.expect("TERM", s.send(evSignal{syscall.SIGTERM}), "notify STOPPING=1", "close-sockets all", "term w1 shutdown")
	s.expect("last worker gone", s.exit(1, "exit status 0"), "upgrade-stop p5000 with-this")
	s.expect("once", s.tick())

	s, _ = upgrading(t, 1)
	s.send(evUpgradeFailed{pid: newPid, why: "x"})
	s.send(evSignal{syscall.SIGTERM})
	s.expect("last worker gone", s.exit(1, "exit status 0"), "upgrade-stop p5000 with-this")

	// Nothing to stop once the failed one is gone.
	s, _ = upgrading(t, 1)
	s.send(evUpgradeExited{pid: newPid, status: "exit status 1"})
	s.send(evSignal{syscall.SIGTERM})
	s.expect("last worker gone", s.exit(1, "exit status 0"), "clean-maps keep ")
}

// The new supervisor of an upgrade takes over once its first generation
// holds and its sockets accept; until then it refuses to upgrade itself
// and leaves the shared files alone.
func TestMachineUpgradeNewSupervisorTakesOverOnceServing(t *testing.T) {
	s, logs := upgradeSim(t, 4000)
	s.expect("before any config", s.tick())
	s.expect("USR2 while taking over", s.send(evUpgrade{}))
	if got := refusals(logs); len(got) != 1 || got[0] != "this supervisor is still taking over from pid 4000" {
		t.Fatalf("refusals %q", got)
	}
	s.expect("first config", s.send(poolCfg(1, 2)), "prepare g1", "start w1 g1", "start w2 g1")
	s.expect("one ready: not established yet", s.ready(1))
	s.expect("both ready: generation 1 established; the old one's map files kept", s.ready(2),
		"publish ok g1", "notify READY=1 STATUS=serving generation 1", "take-over g1")
	if s.mc.sharesState() {
		t.Fatal("the state directory is still shared after the take-over")
	}
	s.expect("once", s.tick())
	s.startUpgrade(newPid)
}

// A stop during an upgrade: a new supervisor that becomes ready while this
// one drains still gets the handover (no second stop: beginStop once), and
// is not stopped with this one; as the executor did before the machine
// decided upgrades.
func TestMachineUpgradeReadyWhileStopping(t *testing.T) {
	s, _ := upgrading(t, 2)
	s.expect("TERM", s.send(evSignal{syscall.SIGTERM}), "notify STOPPING=1", "close-sockets all", "term w1 shutdown", "term w2 shutdown")
	s.expect("first worker gone", s.exit(1, "exit status 0"))
	s.expect("ready while draining", s.send(evUpgradeReady{pid: newPid}), "hand-over p5000")
	s.expect("last worker gone", s.exit(2, "exit status 0"))
	if !s.mc.stopDone || !s.mc.sharesState() {
		t.Fatalf("stop done %v, shares state %v", s.mc.stopDone, s.mc.sharesState())
	}
}
