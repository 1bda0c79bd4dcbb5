package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
)

// TestLongSystemdRealUnit (make test-faults: a whole systemd's boot) runs
// deploy/systemd/shardvisor-supervisor@.service, unchanged but for a
// drop-in naming a local pool config, under a real
// systemd (PID 1 of new PID, mount, cgroup and network namespaces, in a
// root of its own) and drives start, `systemctl reload`, the USR2 upgrade
// and `systemctl stop`, checking what systemd itself saw and did: the
// notifications in order, the main PID handed over with no restart, the
// watchdog fed by the new process, and a graceful stop (the supervisor
// drains and exits; nothing is SIGKILLed). It needs root and a host whose
// cgroups are the hybrid layout (this machine's); elsewhere it skips, and
// TestSystemdNotifyProtocol checks the same messages on a recording socket.
func TestLongSystemdRealUnit(t *testing.T) {
	testenv.Long(t)
	t.Parallel()
	e := newUpgradeEnv(t)
	sd := startSystemd(t, e)

	const unit = "shardvisor-supervisor@web.service"
	sd.systemctl("start", "systemd-journald.socket", "systemd-journald.service")
	// Type=notify: start returns once the supervisor said READY=1.
	sd.systemctl("start", unit)
	st := sd.show(unit)
	if st["ActiveState"] != "active" || st["MainPID"] == "0" {
		t.Fatalf("after start: %v", st)
	}
	first := st["MainPID"]

	sd.systemctl("reload", unit)
	sd.waitJournal("the reload's READY=1", func(n []sdNotification) bool {
		n = withoutPings(n)
		return len(n) >= 3 && n[1].has("RELOADING=1") && n[2].has("READY=1")
	})
	sd.waitState(unit, "active after the reload", func(st map[string]string) bool { return st["ActiveState"] == "active" })

	sd.systemctl("kill", "--kill-whom=main", "--signal=SIGUSR2", unit)
	var second string
	sd.waitState(unit, "a new main PID", func(st map[string]string) bool {
		second = st["MainPID"]
		return st["ActiveState"] == "active" && second != first && second != "0"
	})
	sd.waitJournal("the old supervisor's exit and a watchdog ping from the new one", func(n []sdNotification) bool {
		return strings.Contains(sd.journal(), "Child "+first+" belongs to "+unit) &&
			len(n) > 0 && n[len(n)-1].pid == second && n[len(n)-1].has("WATCHDOG=1")
	})
	if st := sd.show(unit); st["NRestarts"] != "0" || st["MainPID"] != second || st["ActiveState"] != "active" {
		t.Fatalf("after the upgrade: %v (want the new pid %s, active, no restart)", st, second)
	}

	sd.systemctl("stop", unit)
	st = sd.show(unit)
	if st["ActiveState"] != "inactive" || st["Result"] != "success" {
		t.Errorf("after stop: %v (want inactive, result success)", st)
	}

	// What systemd heard, watchdog pings aside, in order.
	var got []string
	for _, n := range withoutPings(sd.notifications()) {
		who := map[string]string{first: "first", second: "second"}[n.pid]
		var tags []string
		for _, tag := range n.tags {
			switch {
			case strings.HasPrefix(tag, "STATUS="):
			case strings.HasPrefix(tag, "MONOTONIC_USEC="):
				tags = append(tags, "MONOTONIC_USEC")
			case tag == "MAINPID="+second:
				tags = append(tags, "MAINPID=second")
			default:
				tags = append(tags, tag)
			}
		}
		got = append(got, who+": "+strings.Join(tags, " "))
	}
	want := []string{"first: READY=1", "first: RELOADING=1 MONOTONIC_USEC", "first: READY=1", "second: MAINPID=second READY=1", "second: STOPPING=1"}
	j := sd.journal()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("notifications systemd got, watchdog pings aside:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(j, "New main PID "+second+" belongs to service") {
		t.Errorf("the journal does not say that systemd took pid %s for the main one", second)
	}
	// Graceful: the new supervisor drained its workers and exited 0.
	if !regexp.MustCompile(`shardvisor-supervisor@web\[`+second+`\]: .*supervisor stopped`).MatchString(j) ||
		!strings.Contains(j, "Main process exited, code=exited, status=0/SUCCESS") {
		t.Errorf("the journal does not say that supervisor %s stopped and exited 0", second)
	}
	if strings.Contains(j, "with signal SIGKILL") {
		t.Errorf("systemd SIGKILLed processes of the unit: the stop was not graceful")
	}

	// The router's unit, whose sandbox is the strict one the watchers
	// share (a system call filter, no W+X memory, a dynamic user's
	// kind of hardening): the Go binary runs under it, and serves with
	// ZooKeeper away (none answers in this network namespace).
	sd.systemctl("start", "shardvisor-router.service")
	sd.waitJournal("the router listening", func([]sdNotification) bool {
		return regexp.MustCompile(`shardvisor-router\[\d+\]: .*router listening`).MatchString(sd.journal())
	})
	if st := sd.show("shardvisor-router.service"); st["ActiveState"] != "active" || st["NRestarts"] != "0" {
		t.Errorf("router: %v", st)
	}
	if t.Failed() {
		t.Logf("journal:\n%s", sd.journal())
	}
}

// systemdNS is a systemd running as PID 1 of namespaces of its own.
type systemdNS struct {
	t    *testing.T
	pid1 int
}

// inner builds the root systemd runs in, inside the new namespaces: every
// directory of the host in it is read-only (a bind), and what systemd may
// write is tmpfs, so nothing it starts can touch the host's files (a
// systemd booted on the host's own /tmp once ran systemd-tmpfiles-setup,
// which empties /tmp). Args: root, units, bin.
const systemdInner = `set -euo pipefail
R=$1 UNITS=$2 BIN=$3
ip link set lo up
mount -t tmpfs -o mode=0755 tmpfs "$R"
mkdir -p "$R"/usr "$R"/etc "$R"/proc "$R"/sys "$R"/dev "$R"/run "$R"/tmp "$R"/var
for d in bin sbin lib lib64; do
	if [ -L /$d ]; then ln -s "$(readlink /$d)" "$R/$d"
	elif [ -d /$d ]; then mkdir "$R/$d"; mount --bind /$d "$R/$d"; mount -o remount,bind,ro "$R/$d"; fi
done
for d in usr etc sys; do mount --bind /$d "$R/$d"; mount -o remount,bind,ro "$R/$d"; done
mkdir -p "$R/opt/shardvisor/bin"
mount --bind "$BIN" "$R/opt/shardvisor/bin"; mount -o remount,bind,ro "$R/opt/shardvisor/bin"
mount --bind "$UNITS" "$R/etc/systemd/system"; mount -o remount,bind,ro "$R/etc/systemd/system"
for f in passwd group; do mount --bind "$UNITS/$f" "$R/etc/$f"; done
mount --rbind /dev "$R/dev"
mount --bind "$UNITS/console" "$R/dev/console"   # systemd's console is a file here, not the host's
mount -t proc proc "$R/proc"
mount -t tmpfs -o mode=0755 tmpfs "$R/sys/fs/cgroup"
mkdir "$R/sys/fs/cgroup/systemd" "$R/sys/fs/cgroup/unified"
mount -t cgroup -o none,name=systemd cgroup "$R/sys/fs/cgroup/systemd"
mount -t cgroup2 cgroup2 "$R/sys/fs/cgroup/unified"
for d in run var; do mount -t tmpfs -o mode=0755 tmpfs "$R/$d"; done
mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
export container=shardvisor-test
exec chroot "$R" /lib/systemd/systemd --system --log-level=debug --log-target=journal --log-color=no
`

// systemdOuter puts the process into cgroups of its own (so that the
// cgroup namespace's root holds only this tree), then unshares.
const systemdOuter = `set -euo pipefail
CG=$1; shift
for h in systemd unified; do mkdir -p /sys/fs/cgroup/$h/$CG; echo $$ >/sys/fs/cgroup/$h/$CG/cgroup.procs; done
exec unshare --fork --kill-child=SIGKILL --pid --mount --cgroup --net --propagation private bash -c "$0" systemd-inner "$@"
`

func startSystemd(t *testing.T, e *upgradeEnv) *systemdNS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: systemd runs as PID 1 of namespaces of its own")
	}
	for _, p := range []string{"/lib/systemd/systemd", "/sys/fs/cgroup/systemd/cgroup.procs", "/sys/fs/cgroup/unified/cgroup.procs"} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("no %s: this test knows the hybrid cgroup layout only", p)
		}
	}
	for _, c := range []string{"unshare", "nsenter", "chroot", "ip", "bash"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("no %s", c)
		}
	}
	dir := t.TempDir()
	units, bin, root := filepath.Join(dir, "units"), filepath.Join(dir, "bin"), filepath.Join(dir, "root")
	for _, d := range []string{units, bin, root, filepath.Join(units, "shardvisor-supervisor@web.service.d"), filepath.Join(units, "shardvisor-router.service.d")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{dir, units, bin} {
		if err := os.Chmod(d, 0o755); err != nil { // the unit's user reads and runs from them
			t.Fatal(err)
		}
	}
	copyFile(t, e.bin, filepath.Join(bin, "supervisor"), 0o755)
	copyFile(t, e.hello, filepath.Join(bin, "hello"), 0o755)
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "router"), "../router").CombinedOutput(); err != nil {
		t.Fatalf("go build ../router: %v\n%s", err, out)
	}
	for _, u := range []string{"shardvisor-supervisor@.service", "shardvisor-router.service"} {
		copyFile(t, "../../deploy/systemd/"+u, filepath.Join(units, u), 0o644)
	}
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(units, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("default.target", "[Unit]\nDescription=shardvisor test: only what is started by hand\n")
	write("console", "")
	// The test's pool, and the drop-in an operator's env file would be.
	// DefaultDependencies=no: the boot targets are masked below.
	write("pool.json", `{"version": 1, "command": "/opt/shardvisor/bin/hello", "workers": 2,
  "listen": [{"name": "http", "addr": "tcp://127.0.0.1:8080"}],
  "graceful_timeout": "10s", "readiness": {"mode": "notify", "timeout": "30s"}, "stability": {"window": "0s"}}`)
	write("shardvisor-supervisor@web.service.d/test.conf", `[Unit]
DefaultDependencies=no

[Service]
Environment=SHARDVISOR_SUPERVISOR_CONFIG=/etc/systemd/system/pool.json SHARDVISOR_SUPERVISOR_CONFIG_POLL=100ms
WatchdogSec=2
`)
	write("shardvisor-router.service.d/test.conf", "[Unit]\nDefaultDependencies=no\n")
	// The units' user.
	for _, f := range []string{"passwd", "group"} {
		b, err := os.ReadFile("/etc/" + f)
		if err != nil {
			t.Fatal(err)
		}
		line := "shardvisor:x:64977:\n"
		if f == "passwd" {
			line = "shardvisor:x:64977:64977:shardvisor:/nonexistent:/usr/sbin/nologin\n"
		}
		write(f, string(b)+line)
	}
	// Nothing starts but what the test starts: every unit a target of
	// this systemd wants is masked, the boot targets too (journald aside,
	// started by hand).
	wanted, _ := filepath.Glob("/lib/systemd/system/*.wants/*")
	for _, w := range append(wanted, "sysinit.target", "basic.target", "local-fs.target", "swap.target", "sockets.target", "timers.target", "paths.target") {
		name := filepath.Base(w)
		if strings.HasPrefix(name, "systemd-journald") {
			continue
		}
		if err := os.Symlink("/dev/null", filepath.Join(units, name)); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}

	cg := fmt.Sprintf("shardvisor-test-%d", os.Getpid())
	cmd := exec.Command("bash", "-c", systemdOuter, systemdInner, cg, root, units, bin)
	log, err := os.Create(filepath.Join(dir, "systemd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	sd := &systemdNS{t: t}
	t.Cleanup(func() {
		// SIGKILL to PID 1 of the namespace ends every process in it.
		if sd.pid1 > 0 {
			_ = syscall.Kill(sd.pid1, syscall.SIGKILL)
		}
		_ = cmd.Process.Kill()
		<-done
		for _, h := range []string{"systemd", "unified"} {
			removeCgroup(t, filepath.Join("/sys/fs/cgroup", h, cg))
		}
		log.Close()
	})
	e.waitFor(60*time.Second, "systemd to run as PID 1 of its namespace", func() bool {
		select {
		case <-done:
			b, _ := os.ReadFile(log.Name())
			t.Fatalf("the namespace's setup failed: %s", b)
		default:
		}
		if sd.pid1 == 0 {
			sd.pid1 = unshareChild(cmd.Process.Pid)
			return false
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", sd.pid1))
		if strings.TrimSpace(string(comm)) != "systemd" {
			return false
		}
		out, _ := sd.run("systemctl", "is-system-running")
		return strings.TrimSpace(out) == "running" || strings.TrimSpace(out) == "degraded"
	})
	return sd
}

// run runs a command inside the namespaces and root of systemd.
func (s *systemdNS) run(args ...string) (string, error) {
	cmd := exec.Command("nsenter", append([]string{"-t", strconv.Itoa(s.pid1), "-m", "-p", "-n", "-r", "-w"}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (s *systemdNS) systemctl(args ...string) {
	s.t.Helper()
	if out, err := s.run(append([]string{"systemctl"}, args...)...); err != nil {
		s.t.Fatalf("systemctl %s: %v\n%s\njournal:\n%s", strings.Join(args, " "), err, out, s.journal())
	}
}

func (s *systemdNS) show(unit string) map[string]string {
	s.t.Helper()
	out, err := s.run("systemctl", "show", unit, "-p", "ActiveState,SubState,MainPID,NRestarts,Result")
	if err != nil {
		s.t.Fatalf("systemctl show: %v\n%s", err, out)
	}
	st := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			st[k] = v
		}
	}
	return st
}

func (s *systemdNS) waitState(unit, what string, cond func(map[string]string) bool) {
	s.t.Helper()
	var last map[string]string
	deadline := time.Now().Add(90 * time.Second)
	for last = s.show(unit); !cond(last); last = s.show(unit) {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out waiting for %s: %v\njournal:\n%s", what, last, s.journal())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *systemdNS) journal() string {
	out, _ := s.run("journalctl", "--no-pager", "-o", "short-precise")
	return out
}

func (s *systemdNS) waitJournal(what string, cond func([]sdNotification) bool) {
	s.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond(s.notifications()) {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out waiting for %s\njournal:\n%s", what, s.journal())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sdNotification is one notification systemd logged receiving.
type sdNotification struct {
	pid  string
	tags []string
}

func (n sdNotification) has(tag string) bool {
	for _, t := range n.tags {
		if t == tag {
			return true
		}
	}
	return false
}

// withoutPings leaves out the notifications that are only WATCHDOG=1.
func withoutPings(all []sdNotification) []sdNotification {
	var out []sdNotification
	for _, n := range all {
		if len(n.tags) != 1 || !n.has("WATCHDOG=1") {
			out = append(out, n)
		}
	}
	return out
}

var gotNotification = regexp.MustCompile(`shardvisor-supervisor@web\.service: Got notification message from PID (\d+) \((.*)\)$`)

// notifications are the unit's, as systemd logged them (debug level), in
// order.
func (s *systemdNS) notifications() []sdNotification {
	var out []sdNotification
	sc := bufio.NewScanner(strings.NewReader(s.journal()))
	for sc.Scan() {
		if m := gotNotification.FindStringSubmatch(sc.Text()); m != nil {
			out = append(out, sdNotification{pid: m[1], tags: strings.Split(m[2], ", ")})
		}
	}
	return out
}

// unshareChild is the process unshare --fork started (PID 1 of the
// namespace), or 0 while there is none yet.
func unshareChild(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 1 {
		return 0
	}
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if strings.TrimSpace(string(comm)) != "unshare" {
		return 0 // still the outer shell
	}
	n, _ := strconv.Atoi(f[0])
	return n
}

// removeCgroup removes a cgroup and the ones systemd made under it, once
// their processes are gone.
func removeCgroup(t *testing.T, dir string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var dirs []string
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		left := 0
		for i := len(dirs) - 1; i >= 0; i-- { // children first
			if os.Remove(dirs[i]) != nil {
				left++
			}
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("cgroup %s could not be removed", dir)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, mode); err != nil {
		t.Fatal(err)
	}
}
