package supervisor

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The keeper is one small process per worker, between the supervisor and
// the worker, that makes the worker's whole process tree die with the
// supervisor (docs/supervisor.md, "The process-tree guarantee"). A
// parent-death signal reaches only a direct child: a forking server's own
// children (gunicorn's workers) outlived a SIGKILLed supervisor and held
// its port. So the keeper:
//
//   - is a child subreaper: anything the worker's tree orphans, setsid'd
//     daemons included, is reparented to it and stays its descendant;
//   - holds one end of a socket pair whose other end only the supervisor
//     holds (close-on-exec, never passed to a worker). The kernel closes
//     it however the supervisor ends, SIGKILL included, and the keeper's
//     read returns EOF at once: then it SIGKILLs the worker's process
//     group and every descendant it finds in /proc, until none is left,
//     and exits. Closing that end is also how the supervisor kills a
//     worker (osProcess.killGroup);
//   - forwards every signal it gets to the worker, so the supervisor (and
//     an operator) can keep signalling "the worker" through it;
//   - exits as the worker did: the same exit code, or the same signal,
//     re-raised, so exit strings (exit status 127...) stay right;
//   - starts the worker with a parent-death SIGKILL, so a SIGKILLed
//     keeper still takes its worker down.
//
// The worker is the keeper re-executed in its second mode (childArg),
// which sets LISTEN_PID to its own pid and execs the command, so the
// worker keeps the pid the environment names.

// keeperFDEnv names the keeper's end of its control socket; the keeper
// removes it from the worker's environment.
const keeperFDEnv = "SHARDVISOR_KEEPER_FD"

// keeperKillTimeout bounds how long the keeper keeps killing a tree that
// will not die (a process stuck in uninterruptible sleep) before it exits
// anyway.
const keeperKillTimeout = 5 * time.Second

// forwardedSignals are passed on to the worker: everything the
// supervisor sends (TERM, QUIT, the map signals) and what servers such as
// gunicorn and Puma understand. TSTP too, so the keeper is never stopped
// while the worker runs on.
var forwardedSignals = []os.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2,
	syscall.SIGALRM, syscall.SIGTERM, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGWINCH, syscall.SIGTSTP}

func runKeeper(e *env, argv []string) int {
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "shardvisor keeper: no command given")
		return 127
	}
	ctl, err := keeperControlFD(e.getenv(keeperFDEnv))
	if err != nil {
		fmt.Fprintf(os.Stderr, "shardvisor keeper: %v\n", err)
		return 127
	}
	_ = e.unsetenv(keeperFDEnv)
	// The worker gets fds 0-2 and the listen sockets, which come right
	// before the control socket; the control socket is the keeper's alone
	// (a worker holding it would not change when EOF comes, but it is not
	// the worker's to see).
	nfd := 3
	if ctl >= 0 {
		syscall.CloseOnExec(ctl)
		_ = unix.SetNonblock(ctl, false)
		nfd = ctl
	} else if n, err := strconv.Atoi(e.getenv("LISTEN_FDS")); err == nil && n > 0 {
		nfd = 3 + n
	}
	files := make([]uintptr, nfd)
	for i := range files {
		files[i] = uintptr(i)
	}
	// The worker's parent-death signal is tied to the thread that forks
	// it: this one, which never exits before the process does.
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "shardvisor keeper: cannot become a subreaper, orphans of the worker escape: %v\n", err)
	}
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, forwardedSignals...)
	w := &keptWorker{pidfd: -1}
	w.pid, err = syscall.ForkExec("/proc/self/exe", append([]string{os.Args[0], childArg}, argv...), &syscall.ProcAttr{
		Env:   e.environ(),
		Files: files,
		// Its own process group, as every worker had: signals it sends
		// to its group, and the keeper's kill of it, spare the keeper.
		Sys: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, PidFD: &w.pidfd},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "shardvisor keeper: starting the worker: %v\n", err)
		return 127
	}
	exits := make(chan syscall.WaitStatus, 1)
	go reapChildren(w.pid, exits)
	gone := make(chan struct{})
	if ctl >= 0 {
		// The supervisor reports and signals the worker by its own pid.
		// A failed write means the supervisor is already gone: the read
		// below says so too.
		_, _ = syscall.Write(ctl, []byte(strconv.Itoa(w.pid)+"\n"))
		go func() {
			waitEOF(ctl)
			close(gone)
		}()
	}
	var st syscall.WaitStatus
	func() {
		for {
			select {
			case s := <-sigs:
				w.signal(s.(syscall.Signal))
			case st = <-exits:
				return
			case <-gone:
				w.signal(syscall.SIGKILL)
				_ = syscall.Kill(-w.pid, syscall.SIGKILL)
				killDescendants(os.Getpid(), keeperKillTimeout)
				st = <-exits
				return
			}
		}
	}()
	// What the worker left behind (its children, daemons it started) dies
	// with it, as its process group did when the supervisor reaped it.
	killDescendants(os.Getpid(), keeperKillTimeout)
	return exitLike(st)
}

// keeperControlFD parses the control socket's fd ("" when the keeper was
// started without one, e.g. by hand: then nothing watches the supervisor).
func keeperControlFD(v string) (int, error) {
	if v == "" {
		return -1, nil
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return -1, fmt.Errorf("%s=%q is not a file descriptor above 2", keeperFDEnv, v)
	}
	return fd, nil
}

type keptWorker struct {
	pid   int
	pidfd int // -1 on kernels without pidfds
}

// signal sends sig to the worker. Through its pidfd it cannot reach
// another process that reused the pid after the worker was reaped.
func (w *keptWorker) signal(sig syscall.Signal) {
	if w.pidfd >= 0 {
		_ = unix.PidfdSendSignal(w.pidfd, sig, nil, 0)
		return
	}
	_ = syscall.Kill(w.pid, sig)
}

// reapChildren waits for every child of the keeper, the worker and the
// orphans reparented to it, and sends the worker's status. It ends when
// no child is left.
func reapChildren(worker int, exits chan<- syscall.WaitStatus) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return
		}
		if pid == worker {
			exits <- ws
		}
	}
}

// waitEOF returns when the supervisor's end of the control socket is
// closed (it sends nothing).
func waitEOF(fd int) {
	buf := make([]byte, 64)
	for {
		n, err := syscall.Read(fd, buf)
		if n > 0 || err == syscall.EINTR {
			continue
		}
		if err == syscall.EAGAIN {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		return
	}
}

// exitLike is the keeper's exit code for a worker that ended with ws; a
// worker killed by a signal is mirrored by the keeper dying of the same
// signal, so the supervisor's exit strings read as the worker's.
func exitLike(ws syscall.WaitStatus) int {
	switch {
	case ws.Exited():
		return ws.ExitStatus()
	case ws.Signaled():
		raise(ws.Signal())
		return 128 + int(ws.Signal())
	}
	return 1
}

// raise kills the keeper with sig. The Go runtime handles or ignores some
// signals (a SIGSEGV sent by kill is ignored, SIGQUIT dumps goroutines),
// so the default action is restored by the system call itself. No core
// file: the worker wrote its own if it was to.
func raise(sig syscall.Signal) {
	_ = unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{})
	// A zeroed struct sigaction is SIG_DFL with no flags and an empty mask
	// whatever the architecture's layout; 32 bytes covers the largest.
	var act [4]uint64
	_, _, _ = unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0)
	var set unix.Sigset_t
	set.Val[(sig-1)/64] |= 1 << ((uint(sig) - 1) % 64)
	_ = unix.PthreadSigmask(unix.SIG_UNBLOCK, &set, nil)
	// To this thread (the locked main one): delivered before the call
	// returns to user space.
	_ = unix.Tgkill(unix.Getpid(), unix.Gettid(), sig)
}
