package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardvisor/shardvisor/internal/testkit"
)

// TestSystemdNotifyProtocol runs the supervisor binary as systemd runs a
// Type=notify unit with WatchdogSec= (deploy/systemd) and records, with
// each sender's pid, every message on its NOTIFY_SOCKET through start,
// reload (HUP), a USR2 upgrade and a stop. The messages must come in the
// order systemd needs: READY=1 first; RELOADING=1 with a MONOTONIC_USEC
// taken after the HUP, then READY=1; MAINPID=<new pid> with READY=1 from
// the new process itself before the old one exits, and nothing from the
// old one after it; STOPPING=1 from the new one on stop; WATCHDOG=1 from
// whichever process is the main one, and only from it.
func TestSystemdNotifyProtocol(t *testing.T) {
	t.Parallel()
	e := newUpgradeEnv(t)
	// No stability window: the reload's READY=1 comes when its generation
	// is ready.
	cfg := fmt.Sprintf(`{"version": 1, "command": %q, "workers": 2,
  "listen": [{"name": "http", "addr": "tcp://127.0.0.1:%d"}],
  "graceful_timeout": "10s", "readiness": {"mode": "notify", "timeout": "30s"}, "stability": {"window": "0s"}}`, e.hello, e.port)
	if err := os.WriteFile(e.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	sock, msgs := testkit.NotifySocketFrom(t)
	l := &notifyLog{t: t, c: msgs, sock: sock}

	// As systemd starts it: NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID
	// naming the main process (the shell execs the supervisor in place).
	args := []string{"-c", `WATCHDOG_PID=$$ exec "$0" "$@"`, e.bin, "--config", e.config, "--config-poll", "100ms",
		"--pool", "upg", "--state-dir", e.stateDir, "--admin", e.admin}
	old := exec.Command("/bin/sh", args...)
	old.Env = append(environWithout("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"), "NOTIFY_SOCKET="+sock, "WATCHDOG_USEC=400000")
	old.Stdout, old.Stderr = e.log, e.log
	if err := old.Start(); err != nil {
		t.Fatal(err)
	}
	oldDone := make(chan error, 1)
	go func() { oldDone <- old.Wait() }()
	oldPid := old.Process.Pid

	// Start.
	l.until("READY=1 at start", func(n testkit.Notification) bool { return n.Has("READY", "1") })
	l.until("a WATCHDOG=1 from the first supervisor", func(n testkit.Notification) bool { return n.PID == oldPid && n.Has("WATCHDOG", "1") })

	// Reload.
	hupAt := monotonicUsec()
	if err := syscall.Kill(oldPid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	reloading := l.until("RELOADING=1 after HUP", func(n testkit.Notification) bool { return n.Has("RELOADING", "1") })
	l.until("READY=1 after the reload", func(n testkit.Notification) bool { return n.Has("READY", "1") })
	if usec, err := strconv.ParseInt(reloading.Get("MONOTONIC_USEC"), 10, 64); err != nil || usec < hupAt {
		t.Errorf("RELOADING=1 came with MONOTONIC_USEC=%q, want a CLOCK_MONOTONIC time (µs) from after the HUP (%d)", reloading.Get("MONOTONIC_USEC"), hupAt)
	}

	// Upgrade. The marker, sent once the old supervisor has exited, comes
	// after everything that was sent before the exit (a socket's datagrams
	// stay in order): MAINPID= must come before it.
	if err := syscall.Kill(oldPid, syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-oldDone:
		if err != nil {
			t.Fatalf("old supervisor: %v", err)
		}
	case <-time.After(120 * time.Second):
		t.Fatal("the old supervisor did not exit after SIGUSR2")
	}
	l.mark("old-exited")
	newPid := e.lockHolder()
	if newPid == oldPid || !alive(newPid) {
		t.Fatalf("lock file names pid %d after the upgrade (old %d)", newPid, oldPid)
	}
	l.until("the marker after the old supervisor's exit", func(n testkit.Notification) bool { return n.Has("X_TEST_MARK", "old-exited") })
	l.until("a WATCHDOG=1 from the new supervisor", func(n testkit.Notification) bool { return n.PID == newPid && n.Has("WATCHDOG", "1") })

	// Stop.
	if err := syscall.Kill(newPid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	e.waitFor(60*time.Second, "the new supervisor to exit after SIGTERM", func() bool { return !alive(newPid) })
	l.mark("new-exited")
	l.until("the marker after the new supervisor's exit", func(n testkit.Notification) bool { return n.Has("X_TEST_MARK", "new-exited") })

	// The whole record, watchdog pings aside, in order.
	who := map[int]string{oldPid: "old", newPid: "new", os.Getpid(): "test"}
	var got []string
	for _, n := range l.all {
		name := who[n.PID]
		if name == "" {
			name = "pid " + strconv.Itoa(n.PID)
		}
		switch {
		case n.Has("WATCHDOG", "1") && len(n.Fields()) == 1:
			// Only the main process of the moment pings.
			if n.PID != oldPid && n.PID != newPid {
				t.Errorf("WATCHDOG=1 from %s", name)
			}
			continue
		case n.Has("MAINPID", strconv.Itoa(newPid)):
			got = append(got, name+": MAINPID=new READY="+n.Get("READY"))
		case n.Has("RELOADING", "1"):
			got = append(got, name+": RELOADING=1")
		default:
			var keys []string
			for _, f := range n.Fields() {
				if k, v, _ := strings.Cut(f, "="); k != "STATUS" {
					keys = append(keys, k+"="+v)
				}
			}
			got = append(got, name+": "+strings.Join(keys, " "))
		}
	}
	want := []string{"old: READY=1", "old: RELOADING=1", "old: READY=1", "new: MAINPID=new READY=1",
		"test: X_TEST_MARK=old-exited", "new: STOPPING=1", "test: X_TEST_MARK=new-exited"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("messages on NOTIFY_SOCKET, watchdog pings aside:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Pings: the new process pings only once it is the main process
	// (after its MAINPID=), and the old one stops once it has read the
	// handover. Between the new one's MAINPID= and the old one reading the
	// ready pipe, the old one may still send a ping it had due: systemd
	// takes WATCHDOG=1 from any process of the unit under NotifyAccess=all
	// and it only says the service is alive, which it is. Anything else
	// from the old process after the handover fails the list above.
	handover, late := -1, 0
	for i, n := range l.all {
		if n.Has("MAINPID", strconv.Itoa(newPid)) {
			handover = i
		}
		if n.Has("WATCHDOG", "1") && n.PID == newPid && handover < 0 {
			t.Errorf("WATCHDOG=1 from the new pid %d at message %d, before its MAINPID=", n.PID, i)
		}
		if n.Has("WATCHDOG", "1") && n.PID == oldPid && handover >= 0 {
			late++
		}
	}
	t.Logf("%d messages, %d of them watchdog pings, %d from the old process after the handover; upgrade %d -> %d", len(l.all), len(l.all)-len(got), late, oldPid, newPid)
}

// notifyLog reads a recording NOTIFY_SOCKET in order and keeps all it read.
type notifyLog struct {
	t    *testing.T
	c    <-chan testkit.Notification
	sock string
	all  []testkit.Notification
}

// until reads messages until one satisfies pred, and returns it.
func (l *notifyLog) until(what string, pred func(testkit.Notification) bool) testkit.Notification {
	l.t.Helper()
	return testkit.Await(l.t, l.c, 90*time.Second, what, func(n testkit.Notification) bool {
		l.all = append(l.all, n)
		return pred(n)
	})
}

// mark sends a message of the test's own to the socket.
func (l *notifyLog) mark(name string) {
	l.t.Helper()
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: l.sock, Net: "unixgram"})
	if err != nil {
		l.t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("X_TEST_MARK=" + name)); err != nil {
		l.t.Fatal(err)
	}
}

func monotonicUsec() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Sec*1e6 + ts.Nsec/1e3
}

// environWithout is this process's environment without the names given.
func environWithout(names ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, n := range names {
			drop = drop || k == n
		}
		if !drop {
			env = append(env, kv)
		}
	}
	return env
}
