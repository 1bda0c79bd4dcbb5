package supervisor

import (
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
)

// Review of issue 24 (2): a worker stopped with SIGSTOP and then attached
// to by a debugger (`kill -STOP pid; gdb -p pid`, the usual way to catch a
// process where it is) is in tracing stop ('t'), which the check only
// warns about. The sampler posted a state only when stopped/running
// flipped, so the machine kept 'T' and killed the worker being debugged.
func TestFaultsStoppedWorkerThenTracedIsNotKilled(t *testing.T) {
	// make test-faults: a real ptrace attach and 3 s of sampling, and make
	// test stays within its budget.
	testenv.Faults(t)
	shortStopBounds(t, 100*time.Millisecond, 1500*time.Millisecond)
	h, pid := stoppedWorker(t, 1, nil)
	testenv.WaitFor(t, 10*time.Second, func() bool {
		return strings.Contains(logText(t, h), "worker is stopped (SIGSTOP): it accepts nothing")
	}, "the stop warning")
	// The debugger attaches (ptrace requests come from the tracer's thread).
	attached := make(chan error)
	detach := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := syscall.PtraceAttach(pid)
		attached <- err
		if err != nil {
			return
		}
		<-detach
		_ = syscall.PtraceDetach(pid)
	}()
	if err := <-attached; err != nil {
		t.Skipf("ptrace not permitted here: %v", err)
	}
	t.Cleanup(func() { close(detach); _ = syscall.Kill(pid, syscall.SIGCONT) })
	testenv.WaitFor(t, 10*time.Second, func() bool { return procStateOf(pid) == procTraced }, "tracing stop")
	// Deliberate wait, past the replace bound counted from the SIGSTOP:
	// nothing is to happen in it.
	time.Sleep(2 * stoppedReplaceAfter)
	if strings.Contains(logText(t, h), "SIGKILL now") || !alive(pid) {
		t.Fatalf("the worker being debugged (state %q) was killed as stopped", procStateOf(pid))
	}
}
