package supervisor

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/workerproto"
)

// The notify channel is a trust boundary: READY=1 completes a swap and
// stops the serving generation. These tests play the attacker with real
// processes against workers that never become ready by themselves
// (/bin/sleep), and check that only the worker's own process tree is
// heard.

// sleepPool is a pool of one /bin/sleep worker: it never sends READY=1.
// stateDir "" is the test's own (inside a directory only root may enter).
func sleepPool(t *testing.T, stateDir string) (*harness, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "pool.json")
	writeConfig(t, file, &topo.PoolConfig{Version: 1, Command: "/bin/sleep", Args: []string{"3600"}, Workers: 1,
		Readiness: topo.Readiness{Timeout: topo.Duration(5 * time.Minute)}})
	h := run(t, Options{ConfigFile: file, ConfigPoll: 50 * time.Millisecond, StateDir: stateDir})
	m := h.waitFor(20*time.Second, "the sleep worker started", func(m topo.PoolMember) bool {
		return len(m.Workers) == 1 && m.Workers[0].PID > 0
	})
	return h, notifySocketPath(h.sv.opts.StateDir, m.Workers[0].ID)
}

// send runs an sd_notify client sending msg to sock: the test binary as
// this process's user, or, with cred, Debian's systemd-notify as that user
// (the test binary sits in a directory only root may enter).
func send(t *testing.T, sock, msg string, cred *syscall.Credential) (string, error) {
	t.Helper()
	cmd := exec.Command(testExe(t), "__notify-send", msg)
	if cred != nil {
		k, v, _ := strings.Cut(msg, "=")
		cmd = exec.Command(systemdNotify(t), "--"+strings.ToLower(k)) // --ready, --watchdog...
		if k == "READY" && v != "1" {
			t.Fatalf("cannot send %q as another user", msg)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	cmd.Env = append(os.Environ(), workerproto.EnvNotifySocket+"="+sock)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func systemdNotify(t *testing.T) string { return lookTool(t, "systemd-notify") }

// stillStarting checks, for a while, that the worker was not made ready
// and that the refusals were counted.
func stillStarting(t *testing.T, h *harness, refused float64) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		m := h.sv.Status()
		if m.State == "serving" || m.Generation != 0 || len(m.Workers) != 1 || m.Workers[0].State != "starting" {
			t.Fatalf("a datagram from outside the worker's tree was heard: %+v", m)
		}
		time.Sleep(50 * time.Millisecond) // deliberate: it must stay so for a second
	}
	if got := testCounter(t, h, "shardvisor_supervisor_notify_rejected_total", ""); got < refused {
		t.Fatalf("notify_rejected_total = %v, want at least %v", got, refused)
	}
}

func TestNotifyFromOutsideTheWorkersTreeIsIgnored(t *testing.T) {
	t.Parallel()
	h, sock := sleepPool(t, "")
	// Same uid, but not a process of the worker's tree: the test's own
	// child. The datagram arrives and is refused.
	for _, msg := range []string{workerproto.Ready, workerproto.Watchdog} {
		if out, err := send(t, sock, msg, nil); err != nil {
			t.Fatalf("sending %s: %v %s", msg, err, out)
		}
	}
	refused(t, h, 2, "not in the worker's process tree")
}

func TestNotifyFromAnotherUserIsIgnored(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a process as another user (CI runs as root)")
	}
	// A state directory every user can reach, as /run/<service> is.
	top, err := os.MkdirTemp("", "shardvisor-notify-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	if err := os.Chmod(top, 0o755); err != nil {
		t.Fatal(err)
	}
	h, sock := sleepPool(t, filepath.Join(top, "state"))
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
	// The socket's directory is the supervisor user's alone: another user
	// cannot even address it (the abstract socket of before accepted it).
	out, err := send(t, sock, workerproto.Ready, nobody)
	if err == nil || !strings.Contains(strings.ToLower(out), "permission denied") {
		t.Fatalf("uid 65534 reached the notify socket: %v %s", err, out)
	}
	if fi, err := os.Stat(filepath.Dir(sock)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("notify directory mode %v (%v), want 0700", fi.Mode(), err)
	}
	// With the directory and socket opened up by mistake, the sender's
	// credentials still keep it out.
	if err := os.Chmod(filepath.Dir(sock), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	if out, err := send(t, sock, workerproto.Ready, nobody); err != nil {
		t.Fatalf("uid 65534 could not send through the opened directory: %v %s", err, out)
	}
	refused(t, h, 1, "runs as uid 65534")
}

func TestSystemdNotifyFromTheWorkersTreeIsAccepted(t *testing.T) {
	t.Parallel()
	notify := systemdNotify(t)
	// The worker is a shell that has a grandchild tell the supervisor it
	// is ready, then sleeps: the sender is in the worker's tree.
	file := filepath.Join(t.TempDir(), "pool.json")
	script := fmt.Sprintf(`(sleep 0.2; %s --ready --status="from a grandchild") & exec sleep 3600`, notify)
	writeConfig(t, file, &topo.PoolConfig{Version: 1, Command: "/bin/sh", Args: []string{"-c", script}, Workers: 2,
		Readiness: topo.Readiness{Timeout: topo.Duration(time.Minute)}})
	h := run(t, Options{ConfigFile: file, ConfigPoll: 50 * time.Millisecond})
	h.waitFor(30*time.Second, "systemd-notify's READY=1 from the worker's tree", serving(1, 2))
	if got := testCounter(t, h, "shardvisor_supervisor_notify_rejected_total", ""); got != 0 {
		t.Fatalf("%v datagrams of the workers' own trees refused", got)
	}
}

// refused checks that notify messages were refused: the worker is still
// starting, at least n refusals were counted, and the log says why.
func refused(t *testing.T, h *harness, n float64, why string) {
	t.Helper()
	stillStarting(t, h, n)
	b, _ := os.ReadFile(filepath.Join(h.dir, "test.log"))
	if !strings.Contains(string(b), why) {
		t.Fatalf("refusal not logged (want %q):\n%s", why, b)
	}
}
