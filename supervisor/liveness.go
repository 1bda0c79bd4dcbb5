package supervisor

import (
	"fmt"
	"time"

	"go.uber.org/zap"
)

// A worker that stopped answering (issue 24): the watchdog or the HTTP
// probe gives up on it, or it sits stopped (SIGSTOP) with neither
// configured. What the process is doing decides what helps: a stopped or
// traced process handles no signal, so the SIGQUIT stack dump would never
// come and only delay the SIGKILL by WatchdogKillDelay. The executor reads
// the state from /proc/<pid>/stat (actInspect, and the sampler every
// second, sampler.go); the machine decides here.

// Process states of /proc/<pid>/stat the machine acts on.
const (
	procStopped       = 'T' // stopped by a signal (SIGSTOP, SIGTSTP...)
	procTraced        = 't' // stopped by a debugger (ptrace)
	procUninterrupted = 'D' // uninterruptible sleep: in the kernel, signals wait
	procZombie        = 'Z' // exited, not reaped yet
)

// Defaults of the stopped-worker check: a ready worker stopped by a signal
// this long is logged, and this long is replaced. Variables so that a test
// with real processes can shorten them (copied into machineConfig by New).
var (
	stoppedWarnAfter    = 3 * time.Second
	stoppedReplaceAfter = 10 * time.Second
)

type (
	// evProcState is the sampler's report that a worker's process state
	// (/proc/<pid>/stat) changed: state is its letter, 0 when the
	// process could not be read (it is exiting).
	evProcState struct {
		w     *worker
		state byte
	}
	// actInspect reads the worker's process state now; the executor
	// reports it back (machine.inspected) before the next action.
	actInspect struct{ w *worker }
)

func (a actInspect) String() string { return fmt.Sprintf("inspect w%d %s", a.w.id, a.w.stopReason) }

// isStopped reports a state in which a process runs no code of its own.
func isStopped(st byte) bool { return st == procStopped || st == procTraced }

// stateWords says what a state means, for logs.
func stateWords(st byte) string {
	switch st {
	case procStopped:
		return "stopped (SIGSTOP)"
	case procTraced:
		return "stopped by a debugger (ptrace)"
	case procUninterrupted:
		return "in uninterruptible sleep (D: blocked in the kernel, e.g. on disk or a dead network mount)"
	case procZombie:
		return "a zombie (its main process exited and is not reaped yet)"
	case 0:
		return "unknown (its /proc entry could not be read)"
	}
	return "state " + string(rune(st))
}

// giveUp is the end of a ready worker that stopped answering: the
// watchdog expired (reason "watchdog") or the probe failed too often
// ("probe"). The worker leaves service now; what it is sent depends on
// its process state, which the executor reads (actInspect → inspected).
func (m *machine) giveUp(w *worker, reason, msg string, now time.Time, fields ...zap.Field) {
	w.state = wStopping
	w.stopReason = reason
	w.crashLike = true
	// If the inspection never came back, the quit path's SIGKILL.
	w.killAt = now.Add(WatchdogKillDelay)
	w.giveUpMsg, w.giveUpFields = msg, fields
	m.do(actInspect{w})
}

// inspected is the executor's report of w's process state after giveUp.
func (m *machine) inspected(w *worker, st byte, now time.Time) []action {
	if !m.hasWorker(w) || w.killed || w.giveUpMsg == "" {
		return nil
	}
	msg, fields := w.giveUpMsg, w.giveUpFields
	w.giveUpMsg, w.giveUpFields = "", nil
	w.procState = st
	fields = append([]zap.Field{zap.Int64("worker", w.id), zap.Int("pid", w.pid), zap.Int64("generation", w.gen.id),
		zap.String("process_state", string(rune(max(st, '?'))))}, fields...)
	switch {
	case isStopped(st) || st == procZombie:
		// No signal handler runs: no stack dump can come. Not a crash of
		// the config when something else stopped it: no backoff, and no
		// rollback counts it.
		w.crashLike = st == procZombie
		m.log.Error(msg+"; the worker is "+stateWords(st)+", so it cannot dump its stacks: SIGKILL now, a replacement starts", fields...)
		m.killWorker(w, w.stopReason)
	case st == procUninterrupted:
		m.log.Error(msg+"; the worker is "+stateWords(st)+": SIGQUIT for a stack dump, which comes only if it wakes; SIGKILL follows", fields...)
		m.quitWorker(w, w.stopReason, now)
	default:
		m.log.Error(msg+"; sending SIGQUIT for a stack dump, SIGKILL follows", fields...)
		m.quitWorker(w, w.stopReason, now)
	}
	return m.take()
}

// onProcState records the sampler's report of w's process state.
func (m *machine) onProcState(ev evProcState, now time.Time) {
	w := ev.w
	if !m.hasWorker(w) {
		return
	}
	was := w.procState
	w.procState = ev.state
	switch {
	case isStopped(ev.state) && !isStopped(was):
		w.stoppedSince = now
	case !isStopped(ev.state) && isStopped(was):
		if w.stoppedWarned && w.state != wStopping {
			m.log.Info("worker runs again", zap.Int64("worker", w.id), zap.Int("pid", w.pid),
				zap.Duration("was_stopped_for", now.Sub(w.stoppedSince).Round(time.Millisecond)))
		}
		w.stoppedSince, w.stoppedWarned = time.Time{}, false
	}
}

// checkStopped applies the stopped-worker check to a ready worker: a
// warning after stoppedWarn, and after stoppedReplace a worker stopped by
// a signal is killed and replaced at once (it accepts nothing, and the
// connections it had accepted wait for nothing). One stopped by a
// debugger is only warned about: someone is looking at it (the watchdog
// and the probe, when configured, still apply).
func (m *machine) checkStopped(w *worker, now time.Time) {
	if !isStopped(w.procState) || w.stoppedSince.IsZero() {
		return
	}
	d := now.Sub(w.stoppedSince)
	fields := []zap.Field{zap.Int64("worker", w.id), zap.Int("pid", w.pid), zap.Int64("generation", w.gen.id),
		zap.Duration("stopped_for", d.Round(time.Millisecond))}
	if w.procState == procStopped && m.cfg.stoppedReplace > 0 && d >= m.cfg.stoppedReplace {
		m.log.Error("worker is stopped (SIGSTOP) and serves nothing; SIGKILL now, a replacement starts", fields...)
		m.killWorker(w, "stopped")
		return
	}
	if !w.stoppedWarned && d >= m.cfg.stoppedWarn {
		w.stoppedWarned = true
		if w.procState == procStopped {
			m.log.Warn("worker is stopped (SIGSTOP): it accepts nothing; SIGCONT resumes it, or it is replaced", append(fields,
				zap.Duration("replaced_after", m.cfg.stoppedReplace))...)
		} else {
			m.log.Warn("worker is stopped by a debugger (ptrace): it accepts nothing; it is not replaced for this (the watchdog and probe still apply)", fields...)
		}
	}
}

// stoppedWake is when checkStopped must look at w again (zero: never).
func (m *machine) stoppedWake(w *worker) time.Time {
	if w.state != wReady || !isStopped(w.procState) || w.stoppedSince.IsZero() {
		return time.Time{}
	}
	if !w.stoppedWarned {
		return w.stoppedSince.Add(m.cfg.stoppedWarn)
	}
	if w.procState == procStopped && m.cfg.stoppedReplace > 0 {
		return w.stoppedSince.Add(m.cfg.stoppedReplace)
	}
	return time.Time{}
}
