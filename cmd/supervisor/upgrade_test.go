package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/testkit"
)

// These tests run the real binary with a real worker (examples/hello) under
// HTTP load and upgrade it with SIGUSR2. They assert behaviour only: no
// failed request or health check, who serves afterwards.

type upgradeEnv struct {
	t          *testing.T
	dir        string
	bin, hello string
	config     string
	stateDir   string
	port       int
	admin      string
	log        *os.File
}

var buildOnce struct {
	sync.Once
	dir        string
	bin, hello string
	err        error
}

// TestMain removes the binaries built once per test binary: a temporary
// directory per run would otherwise pile up in /tmp.
func TestMain(m *testing.M) {
	code := m.Run()
	if buildOnce.dir != "" {
		_ = os.RemoveAll(buildOnce.dir)
	}
	os.Exit(code)
}

// binaries builds cmd/supervisor and examples/hello once per test binary.
func binaries(t *testing.T) (string, string) {
	t.Helper()
	buildOnce.Do(func() {
		buildOnce.dir, buildOnce.err = os.MkdirTemp("", "shardvisor-upgrade-bin-")
		if buildOnce.err != nil {
			return
		}
		buildOnce.bin = filepath.Join(buildOnce.dir, "supervisor")
		buildOnce.hello = filepath.Join(buildOnce.dir, "hello")
		for _, b := range [][2]string{{".", buildOnce.bin}, {"../../examples/hello", buildOnce.hello}} {
			args := []string{"build", "-o", b[1]}
			if os.Getenv("SHARDVISOR_TEST_RACE_BINARY") != "" && b[0] == "." {
				args = append(args, "-race") // the supervisors' upgrade paths under the race detector
			}
			if out, err := exec.Command("go", append(args, b[0])...).CombinedOutput(); err != nil {
				buildOnce.err = fmt.Errorf("go build %s: %v\n%s", b[0], err, out)
				return
			}
		}
	})
	if buildOnce.err != nil {
		t.Fatal(buildOnce.err)
	}
	return buildOnce.bin, buildOnce.hello
}

func newUpgradeEnv(t *testing.T) *upgradeEnv {
	bin, hello := binaries(t)
	dir := t.TempDir()
	e := &upgradeEnv{t: t, dir: dir, bin: bin, hello: hello, stateDir: filepath.Join(dir, "state"),
		port: testenv.FreePort(t), admin: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))}
	e.config = filepath.Join(dir, "pool.json")
	cfg := fmt.Sprintf(`{"version": 1, "command": %q, "workers": 2,
  "listen": [{"name": "http", "addr": "tcp://127.0.0.1:%d"}],
  "graceful_timeout": "10s", "readiness": {"mode": "notify", "timeout": "30s"}}`, hello, e.port)
	if err := os.WriteFile(e.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "supervisor.log"))
	if err != nil {
		t.Fatal(err)
	}
	e.log = f
	t.Cleanup(func() {
		e.stopAll()
		if e.logged("WARNING: DATA RACE") {
			t.Error("a supervisor reported a data race")
		}
		testkit.LogTail(t, f.Name(), "supervisor log")
		f.Close()
	})
	return e
}

// start runs the supervisor binary (the old one of an upgrade) with args.
func (e *upgradeEnv) start(extra ...string) (*exec.Cmd, chan error) {
	e.t.Helper()
	args := append([]string{"--config", e.config, "--config-poll", "100ms", "--pool", "upg", "--state-dir", e.stateDir, "--admin", e.admin}, extra...)
	cmd := exec.Command(e.bin, args...)
	cmd.Stdout, cmd.Stderr = e.log, e.log
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	e.waitServing(cmd.Process.Pid)
	return cmd, done
}

type memberStatus struct {
	Member struct {
		PID     int    `json:"pid"`
		State   string `json:"state"`
		Workers []struct {
			PID   int    `json:"pid"`
			State string `json:"state"`
		} `json:"workers"`
	} `json:"member"`
}

var plain = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func (e *upgradeEnv) status() (memberStatus, error) {
	var st memberStatus
	resp, err := plain.Get("http://" + e.admin + "/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// waitServing waits until the supervisor pid answers the admin address
// with its workers ready.
func (e *upgradeEnv) waitServing(pid int) memberStatus {
	e.t.Helper()
	var st memberStatus
	e.waitFor(90*time.Second, fmt.Sprintf("supervisor pid %d serving", pid), func() bool {
		var err error
		st, err = e.status()
		if err != nil || st.Member.PID != pid || st.Member.State != "serving" || len(st.Member.Workers) != 2 {
			return false
		}
		for _, w := range st.Member.Workers {
			if w.State != "ready" {
				return false
			}
		}
		return true
	})
	return st
}

func (e *upgradeEnv) waitFor(timeout time.Duration, what string, cond func() bool) {
	e.t.Helper()
	testenv.WaitFor(e.t, timeout, cond, what)
}

func (e *upgradeEnv) logged(s string) bool {
	b, _ := os.ReadFile(e.log.Name())
	return bytes.Contains(b, []byte(s))
}

func (e *upgradeEnv) logCount(s string) int {
	b, _ := os.ReadFile(e.log.Name())
	return bytes.Count(b, []byte(s))
}

// lockHolder is the pid in the pool's lock file.
func (e *upgradeEnv) lockHolder() int {
	b, _ := os.ReadFile(filepath.Join(e.stateDir, "supervisor.lock"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// stopAll stops whatever supervisor holds the lock (the new one of an
// upgrade is not the test's child) and waits for it to go.
func (e *upgradeEnv) stopAll() {
	pid := e.lockHolder()
	if pid <= 0 || !alive(pid) {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for deadline := time.Now().Add(30 * time.Second); alive(pid); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			e.t.Errorf("supervisor %d did not stop within 30s of SIGTERM", pid)
			return
		}
	}
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return !(i >= 0 && i+2 < len(b) && b[i+2] == 'Z')
}

// load is steady HTTP traffic from a few clients, with or without
// keep-alive, plus a health checker on /healthz as a load balancer's.
type load struct {
	ok, failed, healthFailed atomic.Int64
	mu                       sync.Mutex
	errs                     []string
	pids                     map[int]int // worker pid -> requests, since mark
	stop                     chan struct{}
	wg                       sync.WaitGroup
}

func startLoad(addr, admin string, clients int) *load {
	l := &load{stop: make(chan struct{}), pids: map[int]int{}}
	fail := func(err error) {
		l.mu.Lock()
		if len(l.errs) < 10 {
			l.errs = append(l.errs, time.Now().UTC().Format("15:04:05.000000")+" "+err.Error())
		}
		l.mu.Unlock()
	}
	for i := 0; i < clients; i++ {
		// Half the clients reuse connections: a draining worker must
		// close idle ones cleanly.
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: i%2 == 0}}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			testkit.Until(l.stop, func(int) bool {
				pid, err := hello(c, addr)
				if err != nil {
					l.failed.Add(1)
					fail(err)
				} else {
					l.ok.Add(1)
					l.mu.Lock()
					l.pids[pid]++
					l.mu.Unlock()
				}
				time.Sleep(2 * time.Millisecond)
				return true
			})
		}()
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for {
			select {
			case <-l.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			resp, err := plain.Get("http://" + admin + "/healthz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode != 200 {
					err = fmt.Errorf("/healthz: %s", resp.Status)
				}
			}
			if err != nil {
				l.healthFailed.Add(1)
				fail(fmt.Errorf("health check: %w", err))
			}
		}
	}()
	return l
}

// hello does one request and returns the pid of the worker that answered
// ("hello from pid N generation G map M").
func hello(c *http.Client, addr string) (int, error) {
	resp, err := c.Get("http://" + addr + "/")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != 200 {
		return 0, fmt.Errorf("status %s", resp.Status)
	}
	var pid int
	if _, err := fmt.Sscanf(string(b), "hello from pid %d", &pid); err != nil {
		return 0, fmt.Errorf("unexpected answer %q", b)
	}
	return pid, nil
}

// mark forgets the pids seen so far and returns the count of successes.
func (l *load) mark() int64 {
	l.mu.Lock()
	l.pids = map[int]int{}
	l.mu.Unlock()
	return l.ok.Load()
}

func (l *load) waitMore(t *testing.T, n int64) {
	t.Helper()
	for base, deadline := l.ok.Load(), time.Now().Add(60*time.Second); l.ok.Load() < base+n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("load stalled: %d ok, %d failed", l.ok.Load(), l.failed.Load())
		}
	}
}

func (l *load) finish(t *testing.T) {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	t.Logf("load: %d ok, %d failed, %d failed health checks", l.ok.Load(), l.failed.Load(), l.healthFailed.Load())
	if n := l.failed.Load() + l.healthFailed.Load(); n > 0 {
		t.Errorf("%d requests and %d health checks failed, e.g. %v", l.failed.Load(), l.healthFailed.Load(), l.errs)
	}
}

// upgradeOK sends SIGUSR2 to the old supervisor and checks that it exits,
// that the new one serves, and that every request after the old one is
// gone is answered by the new one's workers.
func (e *upgradeEnv) upgradeOK(l *load, old *exec.Cmd, oldDone chan error) {
	t := e.t
	t.Helper()
	oldPid := old.Process.Pid
	if err := old.Process.Signal(syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-oldDone:
		if err != nil {
			t.Fatalf("old supervisor %d: %v", oldPid, err)
		}
	case <-time.After(120 * time.Second):
		t.Fatalf("old supervisor %d did not exit after SIGUSR2", oldPid)
	}
	newPid := e.lockHolder()
	if newPid == oldPid || !alive(newPid) {
		t.Fatalf("the lock file names pid %d after the upgrade (old %d); want a live new supervisor", newPid, oldPid)
	}
	st := e.waitServing(newPid)
	workers := map[int]bool{}
	for _, w := range st.Member.Workers {
		workers[w.PID] = true
	}
	l.mark()
	l.waitMore(t, 200)
	l.mu.Lock()
	defer l.mu.Unlock()
	for pid, n := range l.pids {
		if !workers[pid] {
			t.Errorf("%d requests after the upgrade answered by pid %d, not a worker of the new supervisor %d (%v)", n, pid, newPid, workers)
		}
	}
	t.Logf("upgrade: supervisor %d -> %d; answered after it by %v", oldPid, newPid, l.pids)
}

func TestUpgradeUnderLoad(t *testing.T) {
	t.Parallel()
	e := newUpgradeEnv(t)
	old, oldDone := e.start()
	l := startLoad(fmt.Sprintf("127.0.0.1:%d", e.port), e.admin, 4)
	l.waitMore(t, 200)
	e.upgradeOK(l, old, oldDone)
	// And once more: the new supervisor upgrades like the first one (its
	// notify socket names, lock and ready pipe are its own).
	mid := e.lockHolder()
	if err := syscall.Kill(mid, syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	e.waitFor(120*time.Second, "the second upgrade", func() bool { h := e.lockHolder(); return h != mid && !alive(mid) })
	e.waitServing(e.lockHolder())
	l.waitMore(t, 200)
	l.finish(t)
	if !e.logged("upgrade: serving; the old supervisor drains") {
		t.Error("the log does not say the new supervisor took over")
	}
}

func TestUpgradeFailureKeepsServing(t *testing.T) {
	t.Parallel()
	e := newUpgradeEnv(t)
	exe := filepath.Join(e.dir, "upgrade-exec")
	point := func(target string) {
		t.Helper()
		tmp := exe + ".tmp"
		_ = os.Remove(tmp)
		if err := os.Symlink(target, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, exe); err != nil {
			t.Fatal(err)
		}
	}
	script := func(name, body string) string {
		p := filepath.Join(e.dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	point(script("broken", `echo "broken build" >&2; exit 1`))
	old, oldDone := e.start("--upgrade-exec", exe, "--upgrade-timeout", "10s")
	oldPid := old.Process.Pid
	l := startLoad(fmt.Sprintf("127.0.0.1:%d", e.port), e.admin, 4)
	l.waitMore(t, 100)

	gone := "the failed new supervisor is gone"
	// 1. The new binary exits at once.
	_ = old.Process.Signal(syscall.SIGUSR2)
	e.waitFor(60*time.Second, "the failed upgrade to be logged", func() bool { return e.logCount(gone) == 1 })
	if !e.logged("it exited before it was ready: exit status 1") {
		t.Error("the log does not say why the upgrade failed (exit status 1)")
	}
	l.waitMore(t, 100)

	// 2. The new binary never becomes ready; a USR2 meanwhile is refused.
	point(script("hang", `exec sleep 600`))
	_ = old.Process.Signal(syscall.SIGUSR2)
	e.waitFor(30*time.Second, "the second upgrade to start", func() bool { return e.logCount("upgrade: new supervisor started") == 2 })
	_ = old.Process.Signal(syscall.SIGUSR2)
	e.waitFor(60*time.Second, "the hung upgrade to fail", func() bool { return e.logCount(gone) == 2 })
	if !e.logged("upgrade refused: an upgrade is already under way") {
		t.Error("a USR2 during an upgrade was not refused")
	}
	if !e.logged("did not establish its first generation within 10s") {
		t.Error("the log does not say the new supervisor timed out")
	}
	if st, err := e.status(); err != nil || st.Member.PID != oldPid || e.lockHolder() != oldPid {
		t.Errorf("after the failed upgrades the admin address answers for pid %d (%v) and the lock names %d; want the old supervisor %d",
			st.Member.PID, err, e.lockHolder(), oldPid)
	}
	l.waitMore(t, 100)

	// 3. The real binary: the upgrade goes through.
	point(e.bin)
	e.upgradeOK(l, old, oldDone)
	l.finish(t)
}

func TestSecondSupervisorRefused(t *testing.T) {
	t.Parallel()
	e := newUpgradeEnv(t)
	first, _ := e.start()
	before, err := e.status()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	// Another admin address, so the refusal cannot come from a bind.
	cmd := exec.Command(e.bin, "--config", e.config, "--pool", "upg", "--state-dir", e.stateDir, "--admin", fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)))
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the second supervisor did not exit: it must refuse at once")
	}
	lock := filepath.Join(e.stateDir, "supervisor.lock")
	for _, want := range []string{`pool "upg"`, lock, fmt.Sprintf("pid %d", first.Process.Pid)} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the refusal does not name %s: %s", want, out.String())
		}
	}
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("exit code %d, want 1; output %s", code, out.String())
	}
	// Nothing of it reached the running one: same workers, still serving,
	// no swap recorded since.
	after := e.waitServing(first.Process.Pid)
	if fmt.Sprint(after.Member.Workers) != fmt.Sprint(before.Member.Workers) {
		t.Errorf("workers changed: %v -> %v", before.Member.Workers, after.Member.Workers)
	}
	if strings.Count(out.String(), "\n") > 3 || strings.Contains(out.String(), "listening") {
		t.Errorf("the second supervisor did more than refuse: %s", out.String())
	}
}
