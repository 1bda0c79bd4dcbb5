package supervisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardvisor/shardvisor/internal/testenv"
)

func TestParseInheritFDs(t *testing.T) {
	got, err := parseInheritFDs("tcp://127.0.0.1:8080=3,unix:///run/a%2Cb%3Dc%25d.sock=4")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["tcp://127.0.0.1:8080"] != 3 || got["unix:///run/a,b=c%d.sock"] != 4 {
		t.Errorf("got %v", got)
	}
	// What the old supervisor writes, the new one reads.
	in := map[string]int{"tcp://[::1]:80": 5, "unix:///x,y=z%.sock": 6, "tcp://:9": 7}
	back, err := parseInheritFDs(formatInheritFDs(in))
	if err != nil || fmt.Sprint(back) != fmt.Sprint(in) {
		t.Errorf("round trip of %v: %v, %v", in, back, err)
	}
	if got, err := parseInheritFDs(""); err != nil || len(got) != 0 {
		t.Errorf("empty: %v, %v", got, err)
	}
	for _, tc := range []struct{ in, want string }{
		{"tcp://127.0.0.1:8080", "is not <listen address>=<fd>"},
		{"=3", "is not <listen address>=<fd>"},
		{"tcp://127.0.0.1:8080=x", `fd "x" is not a number`},
		{"tcp://127.0.0.1:8080=", `fd "" is not a number`},
		{"tcp://127.0.0.1:8080=2", "fd 2 is a standard stream"},
		{"tcp://127.0.0.1:8080=3,tcp://127.0.0.1:8080=4", "tcp://127.0.0.1:8080 is given twice"},
		{"tcp://127.0.0.1:8080=3,tcp://127.0.0.1:8081=3", "fd 3 is given for both"},
		{"tcp://a%zz=3", "address"},
	} {
		_, err := parseInheritFDs(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), EnvInheritFDs) {
			t.Errorf("%q: %v, want an error naming %s saying %q", tc.in, err, EnvInheritFDs, tc.want)
		}
	}
}

func TestParseHandover(t *testing.T) {
	h, err := parseHandover("seq=2,parent=100,ready=5,lock=6,admin=7")
	if err != nil || h != (handover{seq: 2, parent: 100, ready: 5, lock: 6, admin: 7}) {
		t.Errorf("got %+v, %v", h, err)
	}
	if h, err := parseHandover("seq=1,parent=100,ready=5,lock=6"); err != nil || h.admin != 0 {
		t.Errorf("without admin: %+v, %v", h, err)
	}
	for _, tc := range []struct{ in, want string }{
		{"", "is not key=value"},
		{"seq=1,parent=100,ready=5", "lock is missing"},
		{"seq=0,parent=100,ready=5,lock=6", "not positive"},
		{"seq=1,parent=x,ready=5,lock=6", `parent="x"`},
		{"seq=1,parent=100,ready=1,lock=6", "fd 1 is a standard stream"},
		{"seq=1,seq=2,parent=100,ready=5,lock=6", "seq is given twice"},
		{"seq=1,parent=100,ready=5,lock=6,color=blue", `unknown key "color"`},
		{"seq=1,parent=100,ready=5,lock=5", "must be different fds"},
		{"seq=1,parent=100,ready=5,lock=6,admin=6", "must be different fds"},
	} {
		_, err := parseHandover(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), EnvUpgrade) {
			t.Errorf("%q: %v, want an error naming %s saying %q", tc.in, err, EnvUpgrade, tc.want)
		}
	}
}

// A handover in the environment is checked before anything starts, and
// removed from it (workers must not inherit it).
func TestHandoverEnvironmentIsCheckedAndRemoved(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "pool.json")
	if err := os.WriteFile(file, encode(t, cfgFor(t, testenv.FreePort(t), 1, nil)), 0o644); err != nil {
		t.Fatal(err)
	}
	notSock, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer notSock.Close()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	udp, _ := conn.(*net.UDPConn).File()
	defer udp.Close()
	r, w, _ := os.Pipe()
	defer r.Close()
	defer w.Close()
	lock, _ := os.Create(filepath.Join(dir, "lockfile"))
	defer lock.Close()
	// The handover's fds become New's, which closes them when it fails:
	// each case hands over copies. (Handing over the test's own fds let
	// New's files close them at a later garbage collection, when their
	// numbers belonged to other files: a later test's t.TempDir cleanup
	// failed with EBADF.)
	handover := func() (ctl string, ready int) {
		ready, err1 := syscall.Dup(int(w.Fd()))
		lk, err2 := syscall.Dup(int(lock.Fd()))
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		return fmt.Sprintf("seq=1,parent=%d,ready=%d,lock=%d", os.Getpid(), ready, lk), ready
	}
	const ctlMark = "<ctl>"
	for _, tc := range []struct{ upgrade, inherit, want string }{
		{"", "tcp://127.0.0.1:1=3", EnvInheritFDs + " is set without " + EnvUpgrade},
		{"seq=1", "", "parent is missing"},
		{ctlMark, fmt.Sprintf("tcp://127.0.0.1:1=%d", notSock.Fd()), "is not a socket"},
		{ctlMark, fmt.Sprintf("tcp://127.0.0.1:1=%d", udp.Fd()), "is not a listening socket"},
		{ctlMark, "tcp://127.0.0.1:1=999", "fd 999 is not open"},
		{ctlMark, "tcp://127.0.0.1:1=<ready>", "is also in " + EnvUpgrade},
	} {
		if tc.upgrade == ctlMark {
			ctl, ready := handover()
			tc.upgrade = ctl
			tc.inherit = strings.ReplaceAll(tc.inherit, "<ready>", fmt.Sprint(ready))
		}
		t.Setenv(EnvUpgrade, tc.upgrade)
		t.Setenv(EnvInheritFDs, tc.inherit)
		_, err := New(Options{Pool: "web", ConfigFile: file, StateDir: filepath.Join(dir, "state")})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s=%q %s=%q: %v, want %q", EnvUpgrade, tc.upgrade, EnvInheritFDs, tc.inherit, err, tc.want)
		}
		for _, k := range []string{EnvUpgrade, EnvInheritFDs} {
			if v, ok := os.LookupEnv(k); ok {
				t.Errorf("%s=%q left in the environment", k, v)
			}
		}
	}
}

// One supervisor per pool per state directory: a second New is refused
// (naming the pool, the lock file and the holder), until the first stops.
func TestSecondSupervisorOfAPoolIsRefused(t *testing.T) {
	t.Parallel()
	port := testenv.FreePort(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "pool.json")
	if err := os.WriteFile(file, encode(t, cfgFor(t, port, 1, nil)), 0o644); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	h := run(t, Options{ConfigFile: file, StateDir: state})
	h.waitFor(30*time.Second, "serving", serving(0, 1))
	_, err := New(Options{Pool: "web", ConfigFile: file, StateDir: state})
	if !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("second New: %v, want ErrAlreadyRunning", err)
	}
	for _, want := range []string{`pool "web"`, filepath.Join(state, LockFileName), fmt.Sprintf("pid %d", os.Getpid())} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not name %s", err, want)
		}
	}
	// The refused one touched nothing: the worker's notify socket is there.
	if _, err := os.Stat(h.sv.notifyPath(h.sv.Status().Workers[0].ID)); err != nil {
		t.Errorf("the running worker's notify socket: %v", err)
	}
	h.sv.Stop(false)
	if err := <-h.done; err != nil {
		t.Fatal(err)
	}
	h.done <- nil // for the harness's cleanup
	sv, err := New(Options{Pool: "web", ConfigFile: file, StateDir: state, AdminAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("New after the first stopped: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = sv.Run(ctx) // releases the lock
}

func TestListensOn(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	f, _ := ln.(*net.TCPListener).File()
	defer f.Close()
	for addr, want := range map[string]bool{
		fmt.Sprintf("tcp://127.0.0.1:%d", port):   true,
		fmt.Sprintf("tcp://localhost:%d", port):   true,
		fmt.Sprintf("tcp://127.0.0.1:%d", port+1): false,
		fmt.Sprintf("tcp://:%d", port):            false,
		fmt.Sprintf("unix:///tmp/x%d", port):      false,
	} {
		if got := listensOn(f, addr); got != want {
			t.Errorf("listensOn(127.0.0.1:%d, %s) = %v", port, addr, got)
		}
	}
	any, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer any.Close()
	fa, _ := any.(*net.TCPListener).File()
	defer fa.Close()
	p := any.Addr().(*net.TCPAddr).Port
	for _, addr := range []string{fmt.Sprintf("tcp://:%d", p), fmt.Sprintf("tcp://0.0.0.0:%d", p)} {
		if !listensOn(fa, addr) {
			t.Errorf("the wildcard socket does not match %s", addr)
		}
	}
}

// fileNoPoll leaves the socket's blocking mode as it found it.
func TestFileNoPollKeepsTheBlockingMode(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fd, err := dupListener(ln)
	if err != nil {
		t.Fatal(err)
	}
	f, err := fileNoPoll(fd, "x")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_ = f.Fd() // what exec does: must not make it blocking
	fl, _ := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if fl&unix.O_NONBLOCK == 0 {
		t.Error("the shared socket became blocking")
	}
}
