package supervisor

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"

	"github.com/shardvisor/shardvisor/workerproto"
)

// procSpec is one worker process to start.
type procSpec struct {
	notifyName     string // prefix of the worker's own NOTIFY_SOCKET name
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

// startProcess is the executor's one seam to the operating system for
// workers, in the spirit of cloudflare/tableflip's env: it starts spec,
// then calls notify for every sd_notify datagram the worker sends and
// exited once, with its exit status, when it is gone. Both are called from
// other goroutines. Tests replace it with a fake (process_test.go).
type startProcess func(spec procSpec, notify func(workerproto.Message), exited func(status string)) (process, error)

// startOSProcess is the real startProcess: a per-worker notify socket and
// fork+exec of the exec shim on the spawner thread.
func startOSProcess(spec procSpec, notify func(workerproto.Message), exited func(status string)) (process, error) {
	ns, err := listenNotify(spec.notifyName)
	if err != nil {
		return nil, err
	}
	cmd := &exec.Cmd{
		Path:       spec.path,
		Args:       spec.args,
		Env:        append(spec.env[:len(spec.env):len(spec.env)], workerproto.EnvNotifySocket+"="+ns.addr),
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
	go func() {
		err := cmd.Wait()
		ns.close()
		exited(exitString(cmd.ProcessState, err))
	}()
	go ns.read(notify)
	return &osProcess{cmd.Process.Pid}, nil
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

// notifySocket is the NOTIFY_SOCKET of one worker.
//
// Each worker gets its own socket, in the abstract namespace (no file to
// clean up, no path-length limit from a long state directory), named with
// a random part. Whatever arrives on it is that worker's, whichever process
// of the worker's tree sent it: a forking server such as gunicorn may send
// READY=1 from the master or a child. Identifying senders by
// SCM_CREDENTIALS pid on one shared socket would reject such servers.
type notifySocket struct {
	conn *net.UnixConn
	addr string // "@shardvisor/..."
}

func listenNotify(prefix string) (*notifySocket, error) {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	addr := "@" + prefix + "/" + hex.EncodeToString(rnd[:])
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("notify socket %s: %w", addr, err)
	}
	return &notifySocket{conn: conn, addr: addr}, nil
}

// read delivers messages until the socket is closed.
func (n *notifySocket) read(deliver func(workerproto.Message)) {
	buf := make([]byte, 4096)
	for {
		k, _, err := n.conn.ReadFromUnix(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		deliver(workerproto.ParseMessage(buf[:k]))
	}
}

func (n *notifySocket) close() { _ = n.conn.Close() }
