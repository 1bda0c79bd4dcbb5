package supervisor

import (
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"
)

// The machine's part in upgrades of the supervisor binary (upgrade.go has
// the handover and the executor's part): whether a SIGUSR2 starts one,
// what a new supervisor's readiness, failure or exit means, when this one
// hands over and drains, and when a new one takes over. The executor
// starts and signals the new binary and reports what it sees as events
// (evUpgradeReady, evUpgradeFailed, evUpgradeExited).

// upgradeState is the machine's view of the upgrades this supervisor
// takes part in.
type upgradeState struct {
	// As the new supervisor: the old one's pid until this one has taken
	// over (0: this one is not taking over).
	from int
	// As the old supervisor: the new supervisor of the upgrade under way
	// or failed (0: none), whether it was ready or failed, and whether
	// this one handed over to it and drains.
	child      int
	decided    bool
	handedOver bool
}

// sharesState reports whether another supervisor of this pool runs on the
// same state directory: the old or new one of an upgrade. Its workers use
// the map files and the unix socket paths too, so neither is removed.
func (m *machine) sharesState() bool {
	return m.up.from != 0 || m.up.handedOver || m.up.child != 0
}

// onUpgrade starts an upgrade (SIGUSR2), unless one is under way, this
// one is still taking over, or it is stopping. One upgrade at a time.
func (m *machine) onUpgrade() {
	refuse := func(why string) { m.log.Warn("upgrade refused: "+why, zap.Int("pid", os.Getpid())) }
	switch {
	case m.up.child != 0 && !m.up.decided:
		refuse(fmt.Sprintf("an upgrade is already under way (new supervisor pid %d)", m.up.child))
	case m.up.child != 0 && m.up.handedOver:
		refuse(fmt.Sprintf("this supervisor already handed over to pid %d and is draining", m.up.child))
	case m.up.child != 0:
		refuse(fmt.Sprintf("the new supervisor of the failed upgrade (pid %d) is still stopping", m.up.child))
	case m.up.from != 0:
		refuse(fmt.Sprintf("this supervisor is still taking over from pid %d", m.up.from))
	case m.mode == modeStopping:
		refuse("this supervisor is stopping")
	default:
		m.do(actStartUpgrade{})
	}
}

// upgradeStarted is the executor's report that the new supervisor of an
// upgrade runs as pid. (One that could not be started is not reported:
// nothing changed, and a new SIGUSR2 may try again.)
func (m *machine) upgradeStarted(pid int) {
	m.up.child, m.up.decided, m.up.handedOver = pid, false, false
}

// onUpgradeReady: the new supervisor is serving, so this one gives way to
// it and stops gracefully.
func (m *machine) onUpgradeReady(ev evUpgradeReady, now time.Time) {
	if m.up.child == 0 || m.up.child != ev.pid || m.up.decided {
		return
	}
	m.up.decided, m.up.handedOver = true, true
	m.log.Info("upgrade: the new supervisor is serving; draining this one", zap.Int("new_pid", ev.pid), zap.Int("pid", os.Getpid()))
	m.do(actHandOver{ev.pid})
	m.beginStop(false, "stop requested", now)
}

// onUpgradeFailed: the new supervisor did not become ready in time, or
// closed the ready pipe; it is stopped, and this one keeps serving.
func (m *machine) onUpgradeFailed(ev evUpgradeFailed) {
	if m.up.child == 0 || m.up.child != ev.pid || m.up.decided {
		return
	}
	m.upgradeFailed(ev.why)
}

func (m *machine) onUpgradeExited(ev evUpgradeExited) {
	if m.up.child == 0 || m.up.child != ev.pid {
		return
	}
	if m.up.handedOver {
		m.log.Error("upgrade: the new supervisor exited while this one drains", zap.Int("new_pid", ev.pid), zap.String("status", ev.status))
		return
	}
	if !m.up.decided {
		m.upgradeFailed("it exited before it was ready: " + ev.status)
	}
	m.log.Info("upgrade: the failed new supervisor is gone; a new SIGUSR2 may try again", zap.Int("new_pid", ev.pid), zap.String("status", ev.status))
	m.up.child, m.up.decided = 0, false
}

func (m *machine) upgradeFailed(why string) {
	m.up.decided = true
	m.log.Error("upgrade failed; this supervisor keeps serving, and a new SIGUSR2 may try again once the new one is gone",
		zap.Int("new_pid", m.up.child), zap.String("why", why), zap.String("exec", m.cfg.upgradeExec))
	m.do(actStopUpgrade{pid: m.up.child})
}

// upgradeTakeOver is called with every snapshot: the new supervisor of an
// upgrade takes over once its first generation is established and its
// sockets accept.
func (m *machine) upgradeTakeOver(accepting bool) {
	if m.up.from == 0 || m.good == nil || !accepting {
		return
	}
	m.up.from = 0
	m.do(actTakeOver{gen: m.good.id})
}

// upgradeStopDone is called once this supervisor's workers are gone: a
// new supervisor that has not taken over is stopped with this one.
func (m *machine) upgradeStopDone() {
	if m.up.child != 0 && !m.up.handedOver {
		m.do(actStopUpgrade{pid: m.up.child, withThis: true})
	}
}
