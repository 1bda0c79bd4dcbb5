package supervisor

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
)

// A worker stopped with SIGSTOP, with real processes (issue 24, part 1).

func logText(t *testing.T, h *harness) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(h.dir, "test.log"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// replaced waits until old is no longer a worker and n workers are ready.
func replaced(h *harness, old int, n int) {
	h.t.Helper()
	h.waitFor(20*time.Second, "the stopped worker replaced", func(m topo.PoolMember) bool {
		ready := 0
		for _, w := range m.Workers {
			if w.PID == old {
				return false
			}
			if w.State == "ready" {
				ready++
			}
		}
		return ready == n
	})
}

// stoppedWorker runs a local-mode pool of n test workers (c edits its
// config), SIGSTOPs the first and returns its pid.
func stoppedWorker(t *testing.T, n int, edit func(*topo.PoolConfig)) (*harness, int) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "pool.json")
	c := cfgFor(t, testenv.FreePort(t), n, nil)
	if edit != nil {
		edit(c)
	}
	writeConfig(t, file, c)
	h := run(t, Options{ConfigFile: file})
	h.waitFor(20*time.Second, fmt.Sprintf("%d workers", n), serving(1, n))
	pid := h.pids()[0]
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	return h, pid
}

// shortStopBounds shortens the sampler's stopped-worker bounds for a test.
func shortStopBounds(t *testing.T, warn, replace time.Duration) {
	w, r, e := stoppedWarnAfter, stoppedReplaceAfter, stateEvery
	stoppedWarnAfter, stoppedReplaceAfter, stateEvery = warn, replace, 50*time.Millisecond
	t.Cleanup(func() { stoppedWarnAfter, stoppedReplaceAfter, stateEvery = w, r, e })
}

// The finding: a stopped worker was detected only at the SIGKILL 5 s
// after the watchdog's SIGQUIT, which it never handled, and the log
// spoke of a stack dump. The watchdog's give-up now reads the state,
// says the worker is stopped and kills it at once.
func TestStoppedWorkerWatchdogKillsAtOnce(t *testing.T) {
	h, pid := stoppedWorker(t, 1, func(c *topo.PoolConfig) { c.Watchdog = topo.Duration(500 * time.Millisecond) })
	replaced(h, pid, 1)
	log := logText(t, h)
	if !strings.Contains(log, "worker watchdog expired; the worker is stopped (SIGSTOP), so it cannot dump its stacks: SIGKILL now") {
		t.Errorf("the log does not say the worker was stopped and killed at once")
	}
	if strings.Contains(log, "SIGQUIT") {
		t.Errorf("the log speaks of a SIGQUIT a stopped worker never handles")
	}
	if n := testCounter(t, h, "shardvisor_supervisor_worker_kills_total", `reason="watchdog"`); n != 1 {
		t.Errorf("kills{watchdog} = %v, want 1", n)
	}
	if alive(pid) {
		t.Errorf("the stopped worker %d is still alive", pid)
	}
}

// With neither watchdog nor probe, the sampler finds the stopped worker:
// a warning, then a kill and a replacement (bounds shortened here).
func TestStoppedWorkerWithoutWatchdogIsReplaced(t *testing.T) {
	shortStopBounds(t, 200*time.Millisecond, 600*time.Millisecond)
	h, pid := stoppedWorker(t, 2, nil)
	replaced(h, pid, 2)
	log := logText(t, h)
	for _, want := range []string{"worker is stopped (SIGSTOP): it accepts nothing", "worker is stopped (SIGSTOP) and serves nothing; SIGKILL now"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log does not say %q", want)
		}
	}
	if n := testCounter(t, h, "shardvisor_supervisor_worker_kills_total", `reason="stopped"`); n != 1 {
		t.Errorf("kills{stopped} = %v, want 1", n)
	}
	if n := testCounter(t, h, "shardvisor_supervisor_worker_exits_total", `kind="crash"`); n != 0 {
		t.Errorf("the stopped worker's end counted as %v crashes", n)
	}
}
