package supervisor

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shardvisor/shardvisor/workerproto"
)

// The notify channel: how a worker tells the supervisor it is ready (and
// pings the watchdog). A READY=1 completes a swap and stops the old
// generation, so it must come from the worker and from nobody else:
//
//   - Each worker gets its own datagram socket, a file in
//     <state dir>/notify, a directory only the supervisor's user may enter
//     (0700). Workers run as that user. (An abstract socket, as before,
//     accepts datagrams from any uid, and some sd_notify clients, Ruby's
//     sd_notify gem among them, cannot address one.)
//   - The socket has SO_PASSCRED, so the kernel attaches the sender's pid
//     and uid to every datagram. One is accepted only from the worker's
//     uid and from a process of the worker's tree: the worker itself, a
//     process in its process group (every worker leads its own), or a
//     descendant, as systemd's NotifyAccess=all accepts any process of the
//     service's cgroup. Anything else is dropped and logged.
//
// A sender that exits before its datagram is checked cannot be placed in
// the tree and is refused, as under systemd 252 (systemd-notify run by an
// unprivileged shell races it; run as root it sends as its parent, and a
// notify from the server process itself never races).

// notifyDir is where the workers' sockets live, created 0700.
func notifyDir(stateDir string) string { return filepath.Join(stateDir, "notify") }

// maxSocketPath is the longest path a unix socket address can hold
// (sun_path is 108 bytes with its terminating NUL).
const maxSocketPath = 107

// prepareNotifyDir creates the notify directory, or takes over one left by
// an earlier run, making sure only this user can enter it, and removes
// sockets left behind. The state directory's path must leave room for
// the sockets' names.
func prepareNotifyDir(stateDir string) error {
	dir := notifyDir(stateDir)
	if n := len(notifySocketPath(stateDir, 1<<40)); n > maxSocketPath {
		return fmt.Errorf("state directory %s is too long for the workers' notify sockets (%d bytes of at most %d in a socket path); set a shorter --state-dir", stateDir, n, maxSocketPath)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("notify directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("notify directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("notify directory %s is not a directory owned by this user (uid %d); remove it", dir, os.Geteuid())
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("notify directory: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("notify directory: %w", err)
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".sock") {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	return nil
}

func notifySocketPath(stateDir string, worker int64) string {
	return filepath.Join(notifyDir(stateDir), "w"+strconv.FormatInt(worker, 10)+".sock")
}

// notifySocket is the NOTIFY_SOCKET of one worker.
type notifySocket struct {
	conn   *net.UnixConn
	path   string
	closed atomic.Bool
}

func listenNotify(path string) (*notifySocket, error) {
	_ = os.Remove(path) // left by a worker of an earlier run with the same id
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("notify socket %s: %w", path, err)
	}
	ns := &notifySocket{conn: conn, path: path}
	raw, err := conn.SyscallConn()
	if err == nil {
		cerr := raw.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1) })
		if err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = os.Chmod(path, 0o600)
	}
	if err != nil {
		ns.close()
		return nil, fmt.Errorf("notify socket %s: %w", path, err)
	}
	return ns, nil
}

// read delivers every datagram with its sender's credentials until the
// socket is closed. A datagram without credentials (impossible with
// SO_PASSCRED) is delivered with pid 0, which no check accepts.
func (n *notifySocket) read(deliver func(workerproto.Message, unix.Ucred)) {
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred))
	for {
		k, oobn, _, _, err := n.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		var cred unix.Ucred
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if c, err := unix.ParseUnixCredentials(&m); err == nil {
					cred = *c
				}
			}
		}
		deliver(workerproto.ParseMessage(buf[:k]), cred)
	}
}

func (n *notifySocket) close() {
	if n.closed.CompareAndSwap(false, true) {
		_ = n.conn.Close()
		_ = os.Remove(n.path)
	}
}

// fromWorker says why a datagram with these credentials is not the
// worker's ("" if it is): the sender must run as this user and belong to
// the worker's tree: the worker, a process of its group, or a descendant
// of its keeper (keeper.go), whose descendants are the worker's tree and
// the orphans the tree left, reparented to it. The keeper itself sends
// nothing and is refused.
func fromWorker(keeper, worker int, c unix.Ucred) string {
	if c.Pid <= 0 {
		return "no sender credentials"
	}
	if int(c.Uid) != os.Geteuid() {
		return fmt.Sprintf("sender pid %d runs as uid %d, not the worker's uid %d", c.Pid, c.Uid, os.Geteuid())
	}
	pid := int(c.Pid)
	for depth := 0; depth < 64 && pid > 1; depth++ {
		if pid == worker || (pid == keeper && depth > 0) {
			return ""
		}
		p, err := readProcStat(pid)
		if err != nil {
			if depth == 0 {
				return fmt.Sprintf("sender pid %d is gone before it could be checked (%v)", c.Pid, err)
			}
			break
		}
		if p.pgrp == worker {
			return ""
		}
		pid = p.ppid
	}
	return fmt.Sprintf("sender pid %d is not in the worker's process tree (pid %d)", c.Pid, worker)
}
