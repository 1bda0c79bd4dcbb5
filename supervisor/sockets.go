package supervisor

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardvisor/shardvisor/topo"
)

// boundSocket is one listening socket. The supervisor never accepts on it:
// it only holds the fd so that the socket outlives every worker, and passes
// it to each worker as fd 3+i. While it is open the kernel queues new
// connections in its backlog whenever no worker happens to be accepting,
// so nothing is refused during a swap.
type boundSocket struct {
	addr     string // as configured, "tcp://..." or "unix://..."
	network  string
	address  string
	file     *os.File
	unixPath string // "" for TCP
	boundAt  time.Time
}

// bindSocket binds and listens. A unix socket file left by a dead process
// is removed first; one with a live listener is an error.
func bindSocket(addr string) (*boundSocket, error) {
	network, address, err := topo.ParseListenAddr(addr)
	if err != nil {
		return nil, err
	}
	b := &boundSocket{addr: addr, network: network, address: address, boundAt: time.Now()}
	if network == "unix" {
		if err := removeStaleUnixSocket(address); err != nil {
			return nil, err
		}
		b.unixPath = address
	}
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, fmt.Errorf("bind %s: %w", addr, err)
	}
	if ul, ok := ln.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false) // we unlink when the socket is closed for good
	}
	f, err := detach(ln)
	_ = ln.Close()
	if err != nil {
		return nil, fmt.Errorf("bind %s: %w", addr, err)
	}
	b.file = f
	return b, nil
}

// detach returns the supervisor's own copy of a listener's socket, one that
// Go's network poller does not watch. The listener's File method would not
// do: its copy is non-blocking, so os.NewFile registers it with the poller,
// and the supervisor, which never accepts, was woken by every connection
// the workers accepted (6% of a core at 10,000 connections/s, measured by
// the supervisor benchmark against gunicorn bound directly). Closing the
// listener takes its poller registration with it; the copy is made
// blocking, the systemd convention for passed sockets (workers choose
// their own mode), so it is never registered again.
func detach(ln net.Listener) (*os.File, error) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("unexpected listener type %T", ln)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	nfd := -1
	var dupErr error
	if err := raw.Control(func(fd uintptr) {
		nfd, dupErr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, err
	}
	if dupErr != nil {
		return nil, fmt.Errorf("duplicating the socket: %w", dupErr)
	}
	if err := unix.SetNonblock(nfd, false); err != nil {
		_ = unix.Close(nfd)
		return nil, fmt.Errorf("making the socket blocking: %w", err)
	}
	return os.NewFile(uintptr(nfd), ln.Addr().String()), nil
}

func removeStaleUnixSocket(p string) error {
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("unix socket %s: %w", p, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("unix socket %s: a file that is not a socket is in the way", p)
	}
	if c, err := net.DialTimeout("unix", p, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("unix socket %s: another process is listening on it", p)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unix socket %s: removing the stale socket file: %w", p, err)
	}
	return nil
}

// close closes the supervisor's copy. Connections are refused once every
// worker holding a copy has exited too.
func (b *boundSocket) close() {
	if b.file != nil {
		_ = b.file.Close()
		b.file = nil
	}
	if b.unixPath != "" {
		// Remove only our own socket file: another supervisor may have
		// bound a new one at the same path meanwhile.
		if fi, err := os.Lstat(b.unixPath); err == nil && fi.Mode()&os.ModeSocket != 0 {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && time.Unix(st.Ctim.Sec, st.Ctim.Nsec).Before(b.boundAt.Add(-time.Second)) {
				return
			}
			_ = os.Remove(b.unixPath)
		}
	}
}
