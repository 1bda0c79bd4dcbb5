package supervisor

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
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

// inheritSocket takes over a listening socket an upgrade's old supervisor
// handed over (upgrade.go) instead of binding addr: the same socket, so
// the connections in its backlog and those the old workers have not
// accepted yet are served by whoever accepts next, and nothing is refused.
func inheritSocket(addr string, f *os.File) (*boundSocket, error) {
	network, address, err := topo.ParseListenAddr(addr)
	if err != nil {
		return nil, err
	}
	b := &boundSocket{addr: addr, network: network, address: address, file: f, boundAt: time.Now()}
	if network == "unix" {
		// Its file is this socket's: unlink it when it is closed for good.
		b.unixPath, b.boundAt = address, time.Time{}
	}
	return b, nil
}

// listensOn reports whether the listening socket f is bound to addr (as
// configured, "tcp://..." or "unix://..."): an upgrade hands sockets over
// by the old config's spelling, and the new config may spell the same
// address another way ("tcp://:8080" and "tcp://0.0.0.0:8080").
func listensOn(f *os.File, addr string) bool {
	network, address, err := topo.ParseListenAddr(addr)
	if err != nil {
		return false
	}
	sa, err := unix.Getsockname(int(f.Fd()))
	if err != nil {
		return false
	}
	switch a := sa.(type) {
	case *unix.SockaddrUnix:
		return network == "unix" && filepath.Clean(a.Name) == filepath.Clean(address)
	case *unix.SockaddrInet4:
		return network == "tcp" && sameTCP(address, net.IP(a.Addr[:]), a.Port)
	case *unix.SockaddrInet6:
		return network == "tcp" && sameTCP(address, net.IP(a.Addr[:]), a.Port)
	}
	return false
}

// sameTCP reports whether host:port names ip:port; every unspecified
// address ("", 0.0.0.0, ::) is the same wildcard.
func sameTCP(hostport string, ip net.IP, port int) bool {
	host, p, err := net.SplitHostPort(hostport)
	if err != nil || p != strconv.Itoa(port) {
		return false
	}
	if host == "" || ip.IsUnspecified() {
		want := net.ParseIP(host)
		return (host == "" || (want != nil && want.IsUnspecified())) && ip.IsUnspecified()
	}
	want := net.ParseIP(host)
	if want == nil {
		addrs, err := net.LookupIP(host)
		if err != nil {
			return false
		}
		for _, a := range addrs {
			if a.Equal(ip) {
				return true
			}
		}
		return false
	}
	return want.Equal(ip)
}

// fileNoPoll wraps an inherited fd in an *os.File that Go's network poller
// does not watch, without changing the socket's blocking mode for good.
// os.NewFile registers a non-blocking fd with the poller (and its Fd
// method, which exec calls, would then make the socket blocking: the
// flag belongs to the open file description, so that would change it
// under every worker sharing the socket). So the flag is cleared for the
// NewFile call and put back at once. A worker calling accept in exactly
// that window blocks in it until the next connection, which it serves.
func fileNoPoll(fd int, name string) (*os.File, error) {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return nil, fmt.Errorf("fd %d: %w", fd, err)
	}
	if fl&unix.O_NONBLOCK != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^unix.O_NONBLOCK); err != nil {
			return nil, fmt.Errorf("fd %d: %w", fd, err)
		}
		defer func() { _, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl) }()
	}
	return os.NewFile(uintptr(fd), name), nil
}
