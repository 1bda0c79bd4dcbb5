package supervisor

import (
	"os"
	"os/exec"
	"syscall"

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
	killGroup()                // SIGKILL to its process group and itself
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

// startOSProcess is the real startProcess: a per-worker notify socket and
// fork+exec of the exec shim on the spawner thread.
func startOSProcess(spec procSpec, ev procEvents) (process, error) {
	ns, err := listenNotify(spec.notifyPath)
	if err != nil {
		return nil, err
	}
	cmd := &exec.Cmd{
		Path:       spec.path,
		Args:       spec.args,
		Env:        append(spec.env[:len(spec.env):len(spec.env)], workerproto.EnvNotifySocket+"="+ns.path),
		Dir:        spec.dir,
		Stdout:     spec.stdout,
		Stderr:     spec.stderr,
		ExtraFiles: spec.files,
		// Own process group: a terminal's ^C reaches only the supervisor,
		// which drains workers itself; and SIGKILL of the group also gets
		// a forking server's children.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
	}
	if err := startOnSpawnerThread(cmd); err != nil {
		ns.close()
		return nil, err
	}
	pid := cmd.Process.Pid
	go func() {
		err := cmd.Wait()
		ns.close()
		ev.exited(exitString(cmd.ProcessState, err))
	}()
	go ns.read(func(m workerproto.Message, sender unix.Ucred) {
		if why := fromWorker(pid, sender); why != "" {
			ev.rejected(why)
			return
		}
		ev.notify(m)
	})
	return &osProcess{pid}, nil
}

type osProcess struct{ p int }

func (o *osProcess) pid() int                  { return o.p }
func (o *osProcess) signal(sig syscall.Signal) { _ = syscall.Kill(o.p, sig) }
func (o *osProcess) killGroup() {
	_ = syscall.Kill(-o.p, syscall.SIGKILL)
	_ = syscall.Kill(o.p, syscall.SIGKILL)
}

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
