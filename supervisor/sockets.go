package supervisor

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/shardvisor/shardvisor/internal/topo"
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
	var f *os.File
	switch l := ln.(type) {
	case *net.TCPListener:
		f, err = l.File()
	case *net.UnixListener:
		l.SetUnlinkOnClose(false) // we unlink when the socket is closed for good
		f, err = l.File()
	default:
		err = fmt.Errorf("unexpected listener type %T", ln)
	}
	// The dup in f keeps the socket listening; the net.Listener is not
	// needed because the supervisor never accepts.
	_ = ln.Close()
	if err != nil {
		return nil, fmt.Errorf("bind %s: %w", addr, err)
	}
	b.file = f
	return b, nil
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
