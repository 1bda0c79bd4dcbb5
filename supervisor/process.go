package supervisor

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardvisor/shardvisor/workerproto"
)

// procSpec is one worker process to start.
type procSpec struct {
	notifyPath     string // the worker's own NOTIFY_SOCKET (notify.go)
	path           string
	args           []string
	env            []string // all but NOTIFY_SOCKET, which the starter adds
	dir            string
	files          []*os.File // fds 3...
	stdout, stderr *os.File
}

// process is a started worker process.
type process interface {
	pid() int
	signal(sig syscall.Signal) // to the worker's main process
	killGroup()                // SIGKILL to its whole process tree
}

// procEvents are how a started worker reports back, each called from
// another goroutine: every sd_notify datagram its process tree sends,
// every datagram refused (and why), and its exit status, once.
type procEvents struct {
	notify   func(workerproto.Message)
	rejected func(why string)
	exited   func(status string)
}

// startProcess is the executor's one seam to the operating system for
// workers, in the spirit of cloudflare/tableflip's env: it starts spec and
// reports through ev. Tests replace it with a fake (process_test.go).
type startProcess func(spec procSpec, ev procEvents) (process, error)

// keeperStartTimeout bounds the wait for a keeper to report its worker's
// pid (normally a few milliseconds: a Go start and a fork+exec).
const keeperStartTimeout = 10 * time.Second

// keeperExitGrace is how long a keeper told to kill its tree may take
// before it is SIGKILLed itself (the worker then dies of its parent-death
// signal; only orphans could be left).
const keeperExitGrace = 2 * time.Second

// startOSProcess is the real startProcess: a per-worker notify socket and
// fork+exec of the worker's keeper (keeper.go), which starts the worker
// and reports its pid on the control socket.
func startOSProcess(spec procSpec, ev procEvents) (process, error) {
	ns, err := listenNotify(spec.notifyPath)
	if err != nil {
		return nil, err
	}
	// Close-on-exec from the start: no other worker's keeper may inherit
	// the supervisor's end, or this keeper would not see EOF when the
	// supervisor dies.
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		ns.close()
		return nil, fmt.Errorf("keeper control socket: %w", err)
	}
	_ = unix.SetNonblock(fds[0], true) // pollable, for the read deadline
	ctl, theirs := os.NewFile(uintptr(fds[0]), "keeper-control"), os.NewFile(uintptr(fds[1]), "keeper-control")
	files := append(spec.files[:len(spec.files):len(spec.files)], theirs)
	cmd := &exec.Cmd{
		Path: spec.path,
		Args: spec.args,
		Env: append(spec.env[:len(spec.env):len(spec.env)], workerproto.EnvNotifySocket+"="+ns.path,
			keeperFDEnv+"="+strconv.Itoa(2+len(files))),
		Dir:        spec.dir,
		Stdout:     spec.stdout,
		Stderr:     spec.stderr,
		ExtraFiles: files,
		// Own process group: a terminal's ^C reaches only the supervisor,
		// which drains workers itself. No parent-death signal: the
		// keeper must outlive the supervisor to kill the worker's tree;
		// it learns of the death from the control socket.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	err = cmd.Start()
	theirs.Close()
	if err != nil {
		ctl.Close()
		ns.close()
		return nil, err
	}
	o := &osProcess{keeper: cmd.Process, ctl: ctl}
	o.worker, err = readWorkerPID(ctl, keeperStartTimeout)
	if err != nil {
		_ = cmd.Process.Kill()
		werr := cmd.Wait()
		ctl.Close()
		ns.close()
		return nil, fmt.Errorf("the worker's keeper did not start it: %v (keeper: %s)", err, exitString(cmd.ProcessState, werr))
	}
	go func() {
		err := cmd.Wait()
		o.exited.Store(true)
		o.closeCtl()
		ns.close()
		ev.exited(exitString(cmd.ProcessState, err))
	}()
	keeper := cmd.Process.Pid
	go ns.read(func(m workerproto.Message, sender unix.Ucred) {
		if why := fromWorker(keeper, o.worker, sender); why != "" {
			ev.rejected(why)
			return
		}
		ev.notify(m)
	})
	return o, nil
}

// readWorkerPID reads the keeper's one line: the worker's pid.
func readWorkerPID(ctl *os.File, timeout time.Duration) (int, error) {
	_ = ctl.SetReadDeadline(time.Now().Add(timeout))
	defer ctl.SetReadDeadline(time.Time{})
	var line []byte
	buf := make([]byte, 32)
	for !bytes.Contains(line, []byte("\n")) {
		n, err := ctl.Read(buf)
		line = append(line, buf[:n]...)
		if err != nil {
			return 0, err
		}
		if len(line) > 32 {
			break
		}
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(line)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("keeper said %q, not a pid", line)
	}
	return pid, nil
}

// osProcess is a worker started through its keeper. The supervisor's
// view is the worker's: its pid, signals to it (the keeper forwards
// them), a kill of its tree.
type osProcess struct {
	keeper  *os.Process
	worker  int
	ctl     *os.File
	ctlOnce sync.Once
	exited  atomic.Bool // the keeper was reaped
}

func (o *osProcess) pid() int { return o.worker }

// signal goes through the keeper, which never signals a reaped worker's
// pid; the keeper itself cannot be reused before the supervisor reaps it.
func (o *osProcess) signal(sig syscall.Signal) { _ = o.keeper.Signal(sig) }

// killGroup closes the control socket, which makes the keeper SIGKILL the
// worker's group and every descendant, orphans included, and exit; the
// worker's group is also killed from here at once, as before keepers.
// After the keeper has exited this only kills what a keeper that was
// itself SIGKILLed could leave in the worker's group.
func (o *osProcess) killGroup() {
	_ = syscall.Kill(-o.worker, syscall.SIGKILL)
	if o.exited.Load() {
		return
	}
	o.closeCtl()
	time.AfterFunc(keeperExitGrace, func() {
		if !o.exited.Load() {
			_ = o.keeper.Signal(syscall.SIGKILL)
		}
	})
}

func (o *osProcess) closeCtl() { o.ctlOnce.Do(func() { o.ctl.Close() }) }

func exitString(st *os.ProcessState, err error) string {
	if st == nil {
		if err != nil {
			return err.Error()
		}
		return "unknown"
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Exited() && ws.ExitStatus() == 127 {
		return "exit status 127 (the command could not be executed; see the worker's stderr)"
	}
	return st.String()
}
