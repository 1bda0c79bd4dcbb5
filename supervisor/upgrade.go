package supervisor

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/shardvisor/shardvisor/workerproto"
)

// Upgrading the supervisor binary without dropping a connection, in the
// spirit of cloudflare/tableflip and gunicorn's USR2 (docs/supervisor.md,
// "Upgrading the supervisor"):
//
//  1. SIGUSR2: the running (old) supervisor starts the new binary as its
//     child, handing over, as inherited fds, every listening socket it
//     holds (named by address in SHARDVISOR_INHERIT_FDS), its admin
//     listener, the pool lock and the write end of a "ready" pipe
//     (SHARDVISOR_UPGRADE). The child gets no parent-death signal: it
//     outlives the old one.
//  2. The new supervisor reads its config as usual, serves on the inherited
//     sockets instead of binding, and starts a generation of its own
//     workers. Until its first generation is established it stays quiet:
//     it does not serve the admin address, does not talk to systemd, and
//     leaves the state directory's shared files alone.
//  3. Once established it serves the admin address, tells systemd
//     MAINPID=<its pid> and READY=1, and writes one byte to the pipe.
//  4. Only then does the old one drain: it closes its admin listener, stops
//     its workers gracefully (closing its copies of the sockets, which the
//     new one keeps open) and exits.
//
// A new binary that cannot be started, exits, or is not ready within
// Options.UpgradeTimeout is stopped (SIGTERM, SIGKILL after another
// UpgradeTimeout); the old one never stopped serving, and a later USR2 may
// try again. One upgrade at a time.

// Environment of the handover, set by the old supervisor for the new one and
// removed from the new one's environment as soon as it is read.
const (
	// EnvInheritFDs names the handed-over listening sockets:
	// "<listen addr>=<fd>,..." with '%', ',' and '=' in an address
	// percent-encoded.
	EnvInheritFDs = "SHARDVISOR_INHERIT_FDS"
	// EnvUpgrade is the rest of the handover: "seq=N,parent=PID,ready=FD,
	// lock=FD[,admin=FD]".
	EnvUpgrade = "SHARDVISOR_UPGRADE"
)

// DefaultUpgradeTimeout is how long the new supervisor of an upgrade has to
// establish its first generation.
const DefaultUpgradeTimeout = 60 * time.Second

// upgrade is a supervisor's part in upgrades, as the new one and as the old
// one. Owned by the loop, except where noted.
type upgrade struct {
	// As the new supervisor of an upgrade (seq > 0).
	seq       int                 // upgrades since the chain's first supervisor started fresh
	parent    int                 // the old supervisor's pid
	inherited map[string]*os.File // handed-over listening sockets no generation uses yet
	ready     *os.File            // the old one's ready pipe, until written
	// notifySocket is NOTIFY_SOCKET, kept out of the environment until
	// this supervisor has taken over: a new one that fails must not tell
	// systemd STOPPING=1 about a service that goes on.
	notifySocket string

	lock    *os.File     // the pool lock (lock.go)
	adminLn net.Listener // the admin listener, own or inherited
	served  bool         // adminLn is served

	// As the old supervisor: the new supervisor last started (nil:
	// none). The machine decides what becomes of it (upgrade_machine.go).
	child *upgradeChild
}

type upgradeChild struct {
	pid    int
	exited chan struct{}
	status chan string // its exit status, once
}

// Events of an upgrade, posted to the loop; the machine decides on them
// (upgrade_machine.go).
type (
	evUpgrade       struct{} // SIGUSR2
	evUpgradeReady  struct{ pid int }
	evUpgradeFailed struct {
		pid int
		why string
	}
	evUpgradeExited struct {
		pid    int
		status string
	}
)

// handover is what SHARDVISOR_UPGRADE says.
type handover struct {
	seq, parent, ready, lock, admin int // admin 0: none
}

// parseInheritFDs reads EnvInheritFDs.
func parseInheritFDs(v string) (map[string]int, error) {
	out := map[string]int{}
	if v == "" {
		return out, nil
	}
	seen := map[int]string{}
	for _, item := range strings.Split(v, ",") {
		i := strings.LastIndexByte(item, '=')
		if i <= 0 {
			return nil, fmt.Errorf("%s: %q is not <listen address>=<fd>", EnvInheritFDs, item)
		}
		addr, err := url.PathUnescape(item[:i])
		if err != nil {
			return nil, fmt.Errorf("%s: address %q: %v", EnvInheritFDs, item[:i], err)
		}
		fd, err := parseFD(item[i+1:])
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %v", EnvInheritFDs, addr, err)
		}
		if _, dup := out[addr]; dup {
			return nil, fmt.Errorf("%s: address %s is given twice", EnvInheritFDs, addr)
		}
		if other, dup := seen[fd]; dup {
			return nil, fmt.Errorf("%s: fd %d is given for both %s and %s", EnvInheritFDs, fd, other, addr)
		}
		out[addr], seen[fd] = fd, addr
	}
	return out, nil
}

func formatInheritFDs(fds map[string]int) string {
	esc := strings.NewReplacer("%", "%25", ",", "%2C", "=", "%3D")
	var parts []string
	for _, addr := range slices.Sorted(maps.Keys(fds)) {
		parts = append(parts, esc.Replace(addr)+"="+strconv.Itoa(fds[addr]))
	}
	return strings.Join(parts, ",")
}

// parseHandover reads EnvUpgrade.
func parseHandover(v string) (handover, error) {
	var h handover
	seen := map[string]bool{}
	for _, item := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(item, "=")
		if !ok {
			return h, fmt.Errorf("%s: %q is not key=value", EnvUpgrade, item)
		}
		if seen[k] {
			return h, fmt.Errorf("%s: %s is given twice", EnvUpgrade, k)
		}
		seen[k] = true
		var err error
		switch k {
		case "seq", "parent":
			var n int
			if n, err = strconv.Atoi(val); err == nil && n <= 0 {
				err = errors.New("not positive")
			}
			if k == "seq" {
				h.seq = n
			} else {
				h.parent = n
			}
		case "ready":
			h.ready, err = parseFD(val)
		case "lock":
			h.lock, err = parseFD(val)
		case "admin":
			h.admin, err = parseFD(val)
		default:
			return h, fmt.Errorf("%s: unknown key %q (an old supervisor newer than this binary?)", EnvUpgrade, k)
		}
		if err != nil {
			return h, fmt.Errorf("%s: %s=%q: %v", EnvUpgrade, k, val, err)
		}
	}
	for _, k := range []string{"seq", "parent", "ready", "lock"} {
		if !seen[k] {
			return h, fmt.Errorf("%s: %s is missing", EnvUpgrade, k)
		}
	}
	// Each fd is wrapped (and closed) once.
	if h.ready == h.lock || (h.admin > 0 && (h.admin == h.ready || h.admin == h.lock)) {
		return h, fmt.Errorf("%s: ready, lock and admin must be different fds (ready=%d lock=%d admin=%d)", EnvUpgrade, h.ready, h.lock, h.admin)
	}
	return h, nil
}

func parseFD(s string) (int, error) {
	fd, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("fd %q is not a number", s)
	}
	if fd < 3 {
		return 0, fmt.Errorf("fd %d is a standard stream, not a handed-over one", fd)
	}
	return fd, nil
}

// checkListening makes sure fd is a listening stream socket.
func checkListening(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fd %d is not open (%v)", fd, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fmt.Errorf("fd %d is not a socket", fd)
	}
	if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || v != 1 {
		return fmt.Errorf("fd %d is not a listening socket", fd)
	}
	return nil
}

// prepareState takes the pool lock and prepares the state directory, taking
// over from an old supervisor when this process is the new one of an
// upgrade (its handover in the environment). Called by New before anything
// is bound or published.
func prepareState(e *env, opts *Options) (_ *upgrade, err error) {
	up := &upgrade{notifySocket: e.getenv(workerproto.EnvNotifySocket)}
	hv, inh, err := readHandover(e)
	if err != nil {
		return nil, fmt.Errorf("supervisor: taking over from the old supervisor: %w", err)
	}
	var inheritedLock *os.File
	defer func() {
		if err == nil {
			return
		}
		// Closed now, not by a finalizer at some later garbage
		// collection, when the fd number may belong to another file.
		for _, f := range append([]*os.File{up.ready, inheritedLock}, slices.Collect(maps.Values(up.inherited))...) {
			if f != nil {
				f.Close()
			}
		}
		if up.adminLn != nil {
			up.adminLn.Close()
		}
	}()
	if hv.seq > 0 {
		up.seq, up.parent = hv.seq, hv.parent
		// Not ours to pass on: set close-on-exec before any worker starts.
		for _, fd := range append([]int{hv.ready, hv.lock, hv.admin}, slices.Collect(maps.Values(inh))...) {
			if fd > 0 {
				unix.CloseOnExec(fd)
			}
		}
		up.ready = os.NewFile(uintptr(hv.ready), "upgrade-ready")
		inheritedLock = os.NewFile(uintptr(hv.lock), "supervisor.lock")
		up.inherited = map[string]*os.File{}
		for addr, fd := range inh {
			if err := checkListening(fd); err != nil {
				return nil, fmt.Errorf("supervisor: %s: %s: %w", EnvInheritFDs, addr, err)
			}
			f, err := fileNoPoll(fd, addr)
			if err != nil {
				return nil, fmt.Errorf("supervisor: %s: %s: %w", EnvInheritFDs, addr, err)
			}
			up.inherited[addr] = f
		}
		if hv.admin > 0 {
			if err := checkListening(hv.admin); err != nil {
				return nil, fmt.Errorf("supervisor: %s: admin: %w", EnvUpgrade, err)
			}
			if up.adminLn, err = inheritAdmin(hv.admin, opts.AdminAddr); err != nil {
				return nil, err
			}
		}
		// Quiet towards systemd until this one has taken over.
		_ = e.unsetenv(workerproto.EnvNotifySocket)
	}
	lock, _, err := lockStateDir(opts.Pool, opts.StateDir, inheritedLock)
	inheritedLock = nil // lockStateDir took it as the lock, or closed it
	if err != nil {
		return nil, err
	}
	up.lock = lock
	if up.seq == 0 {
		// Sole supervisor of the state directory: clear what a dead one left.
		err = prepareNotifyDir(opts.StateDir)
	} else {
		err = checkNotifyDir(opts.StateDir, up.seq)
	}
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("supervisor: %w", err)
	}
	return up, nil
}

// readHandover reads and removes the handover from the environment, so
// that no worker inherits it.
func readHandover(e *env) (handover, map[string]int, error) {
	v, inh := e.getenv(EnvUpgrade), e.getenv(EnvInheritFDs)
	_ = e.unsetenv(EnvUpgrade)
	_ = e.unsetenv(EnvInheritFDs)
	if v == "" {
		if inh != "" {
			return handover{}, nil, fmt.Errorf("%s is set without %s", EnvInheritFDs, EnvUpgrade)
		}
		return handover{}, nil, nil
	}
	hv, err := parseHandover(v)
	if err != nil {
		return hv, nil, err
	}
	fds, err := parseInheritFDs(inh)
	if err != nil {
		return hv, nil, err
	}
	for addr, fd := range fds {
		if fd == hv.ready || fd == hv.lock || fd == hv.admin {
			return hv, nil, fmt.Errorf("%s: fd %d of %s is also in %s", EnvInheritFDs, fd, addr, EnvUpgrade)
		}
	}
	return hv, fds, nil
}

// inheritAdmin is the old supervisor's admin listener, if this one is to
// serve the same address; nil (the inherited fd closed) otherwise.
func inheritAdmin(fd int, want string) (net.Listener, error) {
	f, err := fileNoPoll(fd, "admin")
	if err != nil {
		return nil, fmt.Errorf("supervisor: inherited admin listener: %w", err)
	}
	defer f.Close()
	if want == "" || !listensOn(f, "tcp://"+want) {
		return nil, nil
	}
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("supervisor: inherited admin listener: %w", err)
	}
	return ln, nil
}

// checkNotifyDir is the new supervisor's prepareNotifyDir: the old one's
// workers' sockets are in use, so nothing is removed.
func checkNotifyDir(stateDir string, seq int) error {
	if n := len(filepath.Join(notifyDir(stateDir), fmt.Sprintf("u%d-w%d.sock", seq, int64(1)<<40))); n > maxSocketPath {
		return fmt.Errorf("state directory %s is too long for the workers' notify sockets (%d bytes of at most %d in a socket path); set a shorter --state-dir", stateDir, n, maxSocketPath)
	}
	fi, err := os.Lstat(notifyDir(stateDir))
	if errors.Is(err, os.ErrNotExist) {
		return prepareNotifyDir(stateDir) // a state directory of its own
	}
	if err != nil {
		return fmt.Errorf("notify directory: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || fi.Mode().Perm() != 0o700 || !ok || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("notify directory %s is not a directory only this user (uid %d) may enter; remove it", notifyDir(stateDir), os.Geteuid())
	}
	return nil
}

// notifyPath is worker id's notify socket. Both supervisors of an upgrade
// number their workers from 1 in the same state directory, so the new
// one's names carry the upgrade's sequence number.
func (s *Supervisor) notifyPath(id int64) string {
	if s.up.seq == 0 {
		return notifySocketPath(s.opts.StateDir, id)
	}
	return filepath.Join(notifyDir(s.opts.StateDir), fmt.Sprintf("u%d-w%d.sock", s.up.seq, id))
}

// bindOrInherit is prepare's bind: a socket the old supervisor handed over
// if it listens on addr, a new one otherwise.
func (s *Supervisor) bindOrInherit(addr string) (*boundSocket, error) {
	f := s.up.inherited[addr]
	if f == nil {
		for a, g := range s.up.inherited {
			if listensOn(g, addr) {
				f = g
				delete(s.up.inherited, a)
				break
			}
		}
	}
	delete(s.up.inherited, addr)
	if f == nil {
		return bindSocket(addr)
	}
	b, err := inheritSocket(addr, f)
	if err != nil {
		return nil, err
	}
	s.log.Info("using the listen socket handed over by the old supervisor", zap.String("addr", addr), zap.Int("old_pid", s.up.parent))
	return b, nil
}

// adminListener is the admin server's listener (admin.go): the old
// supervisor's during an upgrade, served only once this one has taken
// over (nil until then), so that a health check never reaches a
// supervisor that is not serving yet.
func (s *Supervisor) adminListener() (net.Listener, error) {
	if s.up.adminLn != nil {
		s.snapMu.Lock()
		s.admin = s.up.adminLn.Addr().String()
		s.snapMu.Unlock()
		if s.up.ready != nil {
			return nil, nil
		}
		s.up.served = true
		return s.up.adminLn, nil
	}
	ln, err := net.Listen("tcp", s.opts.AdminAddr)
	if err != nil {
		return nil, fmt.Errorf("admin address %s: %w", s.opts.AdminAddr, err)
	}
	s.up.adminLn, s.up.served = ln, true
	return ln, nil
}

// closeSocket closes a listen socket; its unix socket file stays while the
// other supervisor of an upgrade may serve on it.
func (s *Supervisor) closeSocket(b *boundSocket) {
	if s.mc.sharesState() {
		b.unixPath = ""
	}
	b.close()
}

// startUpgrade starts the new binary with the handover (actStartUpgrade)
// and reports its pid to the machine.
func (s *Supervisor) startUpgrade() {
	exe := s.opts.UpgradeExec
	log := s.log.With(zap.String("exec", exe), zap.Int("seq", s.up.seq+1))
	log.Info("upgrade: starting the new supervisor", zap.Strings("args", s.opts.UpgradeArgs))
	r, w, err := os.Pipe()
	if err != nil {
		log.Error("upgrade failed: ready pipe; still serving", zap.Error(err))
		return
	}
	// Raw fds, not *os.File: exec's Fd() call would make a polled
	// descriptor blocking, under the workers and the admin server.
	files := []uintptr{0, 1, 2}
	add := func(fd uintptr) int { files = append(files, fd); return len(files) - 1 }
	socks := map[string]int{}
	for _, addr := range slices.Sorted(maps.Keys(s.sockets)) {
		socks[addr] = add(s.sockets[addr].file.Fd())
	}
	ctl := fmt.Sprintf("seq=%d,parent=%d,ready=%d,lock=%d", s.up.seq+1, os.Getpid(), add(w.Fd()), add(s.up.lock.Fd()))
	adminFD := -1
	if s.up.adminLn != nil && s.up.served {
		if adminFD, err = dupListener(s.up.adminLn); err != nil {
			log.Warn("upgrade: cannot hand over the admin listener; the new supervisor binds its own", zap.Error(err))
		} else {
			ctl += fmt.Sprintf(",admin=%d", add(uintptr(adminFD)))
		}
	}
	env := upgradeEnv(s.env.environ(), s.up.notifySocket, formatInheritFDs(socks), ctl)
	pid, err := syscall.ForkExec(exe, append([]string{exe}, s.opts.UpgradeArgs...), &syscall.ProcAttr{Env: env, Files: files, Sys: &syscall.SysProcAttr{}})
	w.Close()
	if adminFD >= 0 {
		_ = unix.Close(adminFD)
	}
	if err != nil {
		r.Close()
		log.Error("upgrade failed: the new supervisor could not be started; this one keeps serving", zap.Error(err))
		return
	}
	c := &upgradeChild{pid: pid, exited: make(chan struct{}), status: make(chan string, 1)}
	s.up.child = c
	s.mc.upgradeStarted(pid)
	log.Info("upgrade: new supervisor started; waiting for its first generation", zap.Int("new_pid", pid),
		zap.Duration("timeout", s.opts.UpgradeTimeout), zap.Strings("sockets", slices.Sorted(maps.Keys(socks))))
	go func() {
		st := "unknown"
		if p, err := os.FindProcess(pid); err == nil {
			if ps, err := p.Wait(); err == nil {
				st = ps.String()
			} else {
				st = err.Error()
			}
		}
		c.status <- st
		close(c.exited)
		s.post(evUpgradeExited{pid, st})
	}()
	go func() {
		defer r.Close()
		_ = r.SetReadDeadline(time.Now().Add(s.opts.UpgradeTimeout))
		n, err := r.Read(make([]byte, 1))
		switch {
		case n == 1:
			s.post(evUpgradeReady{pid})
		case errors.Is(err, os.ErrDeadlineExceeded):
			s.post(evUpgradeFailed{pid, fmt.Sprintf("it did not establish its first generation within %s (--upgrade-timeout)", s.opts.UpgradeTimeout)})
		default:
			why := "it closed the ready pipe without being ready"
			select {
			case st := <-c.status:
				c.status <- st
				why = "it exited before it was ready: " + st
			case <-time.After(3 * time.Second):
			}
			s.post(evUpgradeFailed{pid, why})
		}
	}()
}

// upgradeEnv is the new supervisor's environment: this one's, with the
// handover, NOTIFY_SOCKET as systemd gave it, and no WATCHDOG_PID (which
// names this process: without it the new one pings the watchdog itself
// once it is the main process).
func upgradeEnv(base []string, notifySocket, inherit, ctl string) []string {
	var env []string
	for _, kv := range base {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case EnvInheritFDs, EnvUpgrade, workerproto.EnvNotifySocket, workerproto.EnvWatchdogPID,
			workerproto.EnvListenFDs, workerproto.EnvListenFDNames, workerproto.EnvListenPID:
			continue
		}
		env = append(env, kv)
	}
	if notifySocket != "" {
		env = append(env, workerproto.EnvNotifySocket+"="+notifySocket)
	}
	if inherit != "" {
		env = append(env, EnvInheritFDs+"="+inherit)
	}
	return append(env, EnvUpgrade+"="+ctl)
}

// dupListener is a close-on-exec copy of ln's fd, its flags untouched.
func dupListener(ln net.Listener) (int, error) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return -1, fmt.Errorf("unexpected listener type %T", ln)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	nfd, dupErr := -1, error(nil)
	if err := raw.Control(func(fd uintptr) { nfd, dupErr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 3) }); err != nil {
		return -1, err
	}
	return nfd, dupErr
}

// stopUpgrade stops the new supervisor of an upgrade (actStopUpgrade), if
// it has not exited yet.
func (s *Supervisor) stopUpgrade(a actStopUpgrade) {
	c := s.up.child
	if c == nil || c.pid != a.pid {
		return
	}
	select {
	case <-c.exited:
		return
	default:
	}
	if a.withThis {
		s.log.Warn("upgrade: stopping the new supervisor, which has not taken over, with this one", zap.Int("new_pid", c.pid))
		_ = syscall.Kill(c.pid, syscall.SIGTERM)
		return
	}
	// A graceful stop: its workers may already serve connections.
	_ = syscall.Kill(c.pid, syscall.SIGTERM)
	kill := s.opts.UpgradeTimeout
	go func() {
		select {
		case <-c.exited:
		case <-time.After(kill):
			s.log.Warn("upgrade: the failed new supervisor did not stop; killing it", zap.Int("new_pid", c.pid))
			_ = syscall.Kill(c.pid, syscall.SIGKILL)
		}
	}()
}

// handOver makes this, the old supervisor, give way to the new one, which
// is serving (actHandOver): no more word to systemd (the service goes on),
// the unix socket files and map files are the new one's, and the admin
// address is served by the new one alone. The machine's graceful stop
// follows.
func (s *Supervisor) handOver() {
	_ = s.env.unsetenv(workerproto.EnvNotifySocket)
	for _, b := range s.sockets {
		b.unixPath = ""
	}
	// On the loop, before the stop: the health this one's admin server
	// reports cannot turn to "stopping" (503) for a check it has already
	// accepted. Its last requests take milliseconds; at most 2s.
	s.stopAdmin()
}

// takeOver makes the new supervisor of an upgrade take over once its
// first generation, gen, is established (actTakeOver).
func (s *Supervisor) takeOver(gen int64) {
	if s.up.ready == nil {
		return
	}
	for addr, f := range s.up.inherited {
		s.log.Info("closing a handed-over listen socket the config does not use", zap.String("addr", addr))
		f.Close()
	}
	s.up.inherited = nil
	if s.up.adminLn != nil && !s.up.served {
		s.up.served = true
		s.serveAdmin(s.up.adminLn)
	}
	if s.up.notifySocket != "" {
		_ = s.env.setenv(workerproto.EnvNotifySocket, s.up.notifySocket)
		// MAINPID first: systemd must follow this process before the old
		// one exits (NotifyAccess=all lets it accept this from us).
		s.sdNotify(fmt.Sprintf("MAINPID=%d\nREADY=1\nSTATUS=serving generation %d (took over from pid %d)", os.Getpid(), gen, s.up.parent))
	}
	if err := writeLockPid(s.up.lock); err != nil {
		s.log.Warn("recording this pid in the lock file failed", zap.Error(err))
	}
	_, err := s.up.ready.Write([]byte{1})
	s.up.ready.Close()
	s.up.ready = nil
	if err != nil {
		s.log.Warn("upgrade: could not tell the old supervisor this one is serving (is it gone?)", zap.Int("old_pid", s.up.parent), zap.Error(err))
		return
	}
	s.log.Info("upgrade: serving; the old supervisor drains", zap.Int("old_pid", s.up.parent), zap.Int64("generation", gen))
}

// releaseUpgrade is the end of Run: the pool lock is closed, never
// unlocked (a new supervisor may hold it through its own copy). (A new
// supervisor that has not taken over was stopped with this one when its
// last worker was gone: machine.upgradeStopDone.)
func (s *Supervisor) releaseUpgrade() {
	for _, f := range s.up.inherited {
		f.Close()
	}
	s.up.inherited = nil
	if s.up.ready != nil {
		s.up.ready.Close()
		s.up.ready = nil
	}
	if s.up.adminLn != nil && !s.up.served {
		s.up.adminLn.Close()
	}
	if s.up.lock != nil {
		s.up.lock.Close()
		s.up.lock = nil
	}
}
