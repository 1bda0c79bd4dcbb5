package supervisor

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/workerproto"
)

// The keeper (keeper.go) through startOSProcess, the supervisor's real
// process seam, with shell scripts as workers.

type keptProc struct {
	p      *osProcess
	exited chan string
	dir    string
}

// startKept starts script under /bin/sh through the keeper, with env
// added and one listening socket at fd 3.
func startKept(t *testing.T, script string, env ...string) *keptProc {
	t.Helper()
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lf, err := ln.(*net.TCPListener).File()
	ln.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	out, err := os.Create(filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	k := &keptProc{exited: make(chan string, 1), dir: dir}
	p, err := startOSProcess(procSpec{
		notifyPath: filepath.Join(dir, "n.sock"),
		path:       testExe(t),
		args:       []string{testExe(t), ShimArg, "/bin/sh", "-c", script},
		env:        append(os.Environ(), append([]string{"LISTEN_FDS=1"}, env...)...),
		dir:        dir,
		files:      []*os.File{lf},
		stdout:     out,
		stderr:     out,
	}, procEvents{notify: func(workerproto.Message) {}, rejected: func(string) {}, exited: func(s string) { k.exited <- s }})
	if err != nil {
		t.Fatal(err)
	}
	k.p = p.(*osProcess)
	t.Cleanup(func() {
		k.p.killGroup()
		testenv.WaitFor(t, 10*time.Second, k.p.exited.Load, "the keeper to exit")
	})
	return k
}

func (k *keptProc) waitExit(t *testing.T) string {
	t.Helper()
	return testenv.Receive(t, k.exited, 10*time.Second, "the keeper did not exit")
}

// file waits for a file the worker writes.
func (k *keptProc) file(t *testing.T, name string) string {
	t.Helper()
	var b []byte
	testenv.WaitFor(t, 10*time.Second, func() bool {
		var err error
		b, err = os.ReadFile(filepath.Join(k.dir, name))
		return err == nil && strings.HasSuffix(string(b), "\n")
	}, "the worker to write "+name)
	return strings.TrimSpace(string(b))
}

func TestKeeperRunsTheWorkerAsItsChild(t *testing.T) {
	k := startKept(t, `echo "$$ $PPID $LISTEN_PID ${SHARDVISOR_KEEPER_FD-unset}" > ids.tmp; mv ids.tmp ids
ls /proc/$$/fd | sort -n | tr '\n' ' ' > fds.tmp; echo >> fds.tmp; mv fds.tmp fds; exec sleep 3600`)
	f := strings.Fields(k.file(t, "ids"))
	worker, keeper := strconv.Itoa(k.p.pid()), strconv.Itoa(k.p.keeper.Pid)
	if !slices.Equal(f, []string{worker, keeper, worker, "unset"}) {
		t.Fatalf("worker pid, parent, LISTEN_PID, keeper fd variable = %q; want %s %s %s unset", f, worker, keeper, worker)
	}
	// The listen socket at fd 3; the keeper's control socket (fd 4 in
	// the keeper) is not passed on. (Other fds the test process inherited
	// without close-on-exec reach any child, keeper or not.)
	var sockets []string
	for _, fd := range strings.Fields(k.file(t, "fds")) {
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", k.p.pid(), fd)); strings.HasPrefix(l, "socket:") {
			sockets = append(sockets, fd)
		}
	}
	if !slices.Equal(sockets, []string{"3"}) {
		t.Fatalf("the worker has sockets at fds %v, want only 3", sockets)
	}
	st, err := readProcStat(k.p.pid())
	if err != nil || st.pgrp != k.p.pid() {
		t.Fatalf("worker's process group %d (%v), want its own", st.pgrp, err)
	}
	k.p.killGroup()
	if got := k.waitExit(t); got != "signal: killed" {
		t.Fatalf("exit %q, want signal: killed", got)
	}
}

func TestKeeperExitsAsTheWorker(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ script, want string }{
		{"exit 3", "exit status 3"},
		{"exit 0", "exit status 0"},
		{"kill -SEGV $$", "signal: segmentation fault"},
		{"kill -TERM $$", "signal: terminated"},
		{"kill -QUIT $$", "signal: quit"},
		{"exec /nonexistent/command", "exit status 127 (the command could not be executed; see the worker's stderr)"},
	} {
		k := startKept(t, tc.script)
		if got := k.waitExit(t); got != tc.want {
			t.Errorf("%q: exit %q, want %q", tc.script, got, tc.want)
		}
	}
}

func TestKeeperForwardsSignals(t *testing.T) {
	// Every signal the keeper forwards is trapped and written down; TERM
	// ends the worker.
	sigs := []string{"HUP", "INT", "QUIT", "USR1", "USR2", "ALRM", "TTIN", "TTOU", "WINCH", "TSTP"}
	var traps strings.Builder
	for _, s := range sigs {
		fmt.Fprintf(&traps, "trap 'echo %s >> got' %s; ", s, s)
	}
	k := startKept(t, traps.String()+`trap 'exit 42' TERM; echo > up; while :; do sleep 0.02; done`)
	k.file(t, "up")
	for _, s := range sigs {
		sig := unix.SignalNum("SIG" + s)
		k.p.signal(sig)
		testenv.WaitFor(t, 10*time.Second, func() bool {
			b, _ := os.ReadFile(filepath.Join(k.dir, "got"))
			return strings.Contains(string(b), s+"\n")
		}, "the worker to get SIG"+s)
	}
	k.p.signal(syscall.SIGTERM)
	if got := k.waitExit(t); got != "exit status 42" {
		t.Fatalf("exit %q after TERM, want exit status 42", got)
	}
}

// liveBelow is every live process below root.
func liveBelow(t *testing.T, root int) []procStat {
	t.Helper()
	procs, err := readProcs()
	if err != nil {
		t.Fatal(err)
	}
	var out []procStat
	for _, p := range descendants(root, procs) {
		if p.live() {
			out = append(out, p)
		}
	}
	return out
}

// deadWithin polls until every process of tree is dead (gone, a zombie,
// or its pid reused by a process started later), failing after bound.
func deadWithin(t *testing.T, tree []procStat, since time.Time, bound time.Duration) time.Duration {
	t.Helper()
	for {
		var alive []string
		for _, p := range tree {
			if st, err := readProcStat(p.pid); err == nil && st.start == p.start && st.live() {
				cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.pid))
				alive = append(alive, fmt.Sprintf("%d (ppid %d, %q)", p.pid, st.ppid, strings.ReplaceAll(string(cmd), "\x00", " ")))
			}
		}
		took := time.Since(since)
		if len(alive) == 0 {
			return took
		}
		if took > bound {
			for _, p := range tree {
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
			}
			t.Fatalf("%d of %d processes still alive %s after: %s", len(alive), len(tree), took.Round(time.Millisecond), strings.Join(alive, "; "))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// treeWithDaemon waits for the keeper's tree to be the worker, a child
// of it and a double-forked daemon reparented to the keeper.
func (k *keptProc) treeWithDaemon(t *testing.T) []procStat {
	t.Helper()
	var tree []procStat
	testenv.WaitFor(t, 10*time.Second, func() bool {
		tree = liveBelow(t, k.p.keeper.Pid)
		daemon := false
		for _, p := range tree {
			daemon = daemon || (p.ppid == k.p.keeper.Pid && p.pid != k.p.pid())
		}
		return daemon && len(tree) >= 3
	}, "the worker, a child and a daemon reparented to the keeper")
	return tree
}

// The supervisor's end of the control socket closing (as when it dies)
// kills the worker, its children and a daemon it double-forked into a new
// session, which only the keeper, as subreaper, still sees.
func TestKeeperKillsTheTreeWhenTheSupervisorGoes(t *testing.T) {
	k := startKept(t, `sleep 3600 & (setsid sleep 3600 </dev/null >/dev/null 2>&1 &); echo > up; wait`)
	k.file(t, "up")
	tree := k.treeWithDaemon(t)
	t0 := time.Now()
	k.p.closeCtl()
	took := deadWithin(t, tree, t0, time.Second)
	t.Logf("tree of %d dead %s after the control socket closed", len(tree), took.Round(100*time.Microsecond))
	if got := k.waitExit(t); got != "signal: killed" {
		t.Fatalf("exit %q, want signal: killed", got)
	}
}

// A SIGKILLed keeper still takes its worker down (parent-death signal).
func TestKeeperKilledTakesTheWorker(t *testing.T) {
	k := startKept(t, `echo > up; exec sleep 3600`)
	k.file(t, "up")
	tree := liveBelow(t, k.p.keeper.Pid)
	if len(tree) != 1 {
		t.Fatalf("tree %+v", tree)
	}
	_ = k.p.keeper.Signal(syscall.SIGKILL)
	deadWithin(t, tree, time.Now(), time.Second)
	k.waitExit(t)
}

// When the worker exits, what it left behind dies with it.
func TestKeeperKillsLeftoversOnWorkerExit(t *testing.T) {
	k := startKept(t, `(setsid sleep 3600 </dev/null >/dev/null 2>&1 &); sleep 3600 & echo > up; while [ ! -e stop ]; do sleep 0.02; done; exit 5`)
	k.file(t, "up")
	tree := k.treeWithDaemon(t)
	if err := os.WriteFile(filepath.Join(k.dir, "stop"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := k.waitExit(t); got != "exit status 5" {
		t.Fatalf("exit %q, want exit status 5", got)
	}
	// The keeper exits only once its tree is dead.
	deadWithin(t, tree, time.Now(), 0)
}

func TestParseStat(t *testing.T) {
	line := "4242 (we) (ird) S 12 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 987654 1000 10 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
	p, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if want := (procStat{pid: 4242, ppid: 12, pgrp: 4242, state: 'S', threads: 3, start: 987654, rss: 10}); p != want {
		t.Fatalf("%+v, want %+v", p, want)
	}
	for _, bad := range []string{"", "1 (x)", "1 (x) S 1 1", "x (y) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	self, err := readProcStat(os.Getpid())
	if err != nil || self.ppid != os.Getppid() || !self.live() {
		t.Fatalf("own stat %+v %v", self, err)
	}
}

func TestDescendantsAndLiveness(t *testing.T) {
	procs := []procStat{
		{pid: 1, ppid: 0}, {pid: 10, ppid: 1}, {pid: 11, ppid: 10}, {pid: 12, ppid: 11},
		{pid: 13, ppid: 10, state: 'Z', threads: 1}, {pid: 20, ppid: 1}, {pid: 21, ppid: 20},
	}
	var got []int
	for _, p := range descendants(10, procs) {
		got = append(got, p.pid)
	}
	if !slices.Equal(got, []int{11, 13, 12}) {
		t.Fatalf("descendants of 10: %v", got)
	}
	if len(descendants(12, procs)) != 0 {
		t.Fatal("a leaf has descendants")
	}
	for _, tc := range []struct {
		p    procStat
		live bool
	}{{procStat{state: 'S', threads: 1}, true}, {procStat{state: 'Z', threads: 1}, false},
		{procStat{state: 'X'}, false}, {procStat{state: 'Z', threads: 4}, true}, {procStat{state: 'D', threads: 1}, true}} {
		if tc.p.live() != tc.live {
			t.Errorf("%+v live=%v", tc.p, tc.p.live())
		}
	}
}

func TestKeeperControlFDAndExitCodes(t *testing.T) {
	for v, want := range map[string]int{"": -1, "3": 3, "17": 17} {
		if fd, err := keeperControlFD(v); err != nil || fd != want {
			t.Errorf("%q: %d %v", v, fd, err)
		}
	}
	for _, v := range []string{"2", "x", "-1"} {
		if _, err := keeperControlFD(v); err == nil {
			t.Errorf("%q accepted", v)
		}
	}
	// Exit codes (a signal is mirrored by dying of it: tested above).
	if got := exitLike(syscall.WaitStatus(3 << 8)); got != 3 {
		t.Errorf("exit 3 -> %d", got)
	}
	if got := exitLike(syscall.WaitStatus(127 << 8)); got != 127 {
		t.Errorf("exit 127 -> %d", got)
	}
}

// The notify check accepts the worker's tree and the keeper's other
// descendants (orphans of the tree), and refuses the keeper itself.
func TestFromWorkerWithKeeper(t *testing.T) {
	kid, err := os.StartProcess("/bin/sleep", []string{"sleep", "60"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = kid.Kill(); _, _ = kid.Wait() }()
	me, uid := os.Getpid(), uint32(os.Geteuid())
	cred := func(pid int) unix.Ucred { return unix.Ucred{Pid: int32(pid), Uid: uid} }
	for _, tc := range []struct {
		keeper, worker, sender int
		ok                     bool
	}{
		{me, 1 << 30, kid.Pid, true},               // a descendant of the keeper
		{1 << 30, kid.Pid, kid.Pid, true},          // the worker itself
		{1 << 30, me, kid.Pid, true},               // a descendant of the worker
		{kid.Pid, 1 << 30, kid.Pid, false},         // the keeper itself
		{1<<30 + 1, 1 << 30, kid.Pid, false},       // unrelated
		{1 << 30, os.Getppid(), os.Getpid(), true}, // in the worker's tree
	} {
		why := fromWorker(tc.keeper, tc.worker, cred(tc.sender))
		if (why == "") != tc.ok {
			t.Errorf("keeper %d worker %d sender %d: %q, want accepted=%v", tc.keeper, tc.worker, tc.sender, why, tc.ok)
		}
	}
	if why := fromWorker(me, me, unix.Ucred{Pid: int32(kid.Pid), Uid: uid + 1}); !strings.Contains(why, "runs as uid") {
		t.Errorf("another uid: %q", why)
	}
}

// BenchmarkWorkerStart is what a worker start costs the supervisor's loop:
// through the keeper (startOSProcess returns once the keeper reports the
// worker's pid: a Go start and a second exec) against the old path, one
// fork+exec of the shim that execs the command in place.
func BenchmarkWorkerStart(b *testing.B) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	b.Run("keeper", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			exited := make(chan string, 1)
			p, err := startOSProcess(procSpec{notifyPath: filepath.Join(dir, "n.sock"), path: exe,
				args: []string{exe, ShimArg, "/bin/sleep", "60"}, env: os.Environ()},
				procEvents{notify: func(workerproto.Message) {}, rejected: func(string) {}, exited: func(s string) { exited <- s }})
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			p.killGroup()
			<-exited
			b.StartTimer()
		}
	})
	b.Run("exec-in-place", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			cmd := execCommand(exe, childArg, "/bin/sleep", "60")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			b.StartTimer()
		}
	})
}
