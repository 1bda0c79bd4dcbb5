package supervisor

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
)

// The process-tree guarantee (docs/supervisor.md): SIGKILL of a real
// supervisor binary takes every process of every worker tree down within
// 1 s, gunicorn's own workers and setsid'd daemons included, and a
// supervisor restarted on the same address binds it at once.

// supervisorBinary is cmd/supervisor's path, built once per test process.
func supervisorBinary(t *testing.T) string { return svBuilt.get(t) }

// realSV is a cmd/supervisor process in local mode.
type realSV struct {
	t     *testing.T
	cmd   *exec.Cmd
	log   string
	admin string
}

func startRealSV(t *testing.T, c *topo.PoolConfig) *realSV {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "pool.json")
	writeConfig(t, file, c)
	r := &realSV{t: t, log: filepath.Join(dir, "sv.log"), admin: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))}
	logf, err := os.Create(r.log)
	if err != nil {
		t.Fatal(err)
	}
	r.cmd = exec.Command(supervisorBinary(t), "--config", file, "--config-poll", "100ms", "--admin", r.admin,
		"--state-dir", filepath.Join(dir, "state"), "--pool", "tree")
	r.cmd.Stdout, r.cmd.Stderr = logf, logf
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	t.Cleanup(func() {
		_ = r.cmd.Process.Signal(syscall.SIGQUIT)
		done := make(chan struct{})
		go func() { _ = r.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = r.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(r.log)
			t.Logf("supervisor log:\n%s", b)
		}
	})
	return r
}

func (r *realSV) status() topo.PoolMember {
	var body struct{ Member topo.PoolMember }
	resp, err := client.Get("http://" + r.admin + "/status")
	if err != nil {
		return topo.PoolMember{}
	}
	defer resp.Body.Close()
	_ = jsonDecode(resp.Body, &body)
	return body.Member
}

func (r *realSV) waitFor(timeout time.Duration, what string, cond func(topo.PoolMember) bool) topo.PoolMember {
	r.t.Helper()
	var m topo.PoolMember
	testenv.WaitFor(r.t, timeout, func() bool { m = r.status(); return cond(m) }, what)
	return m
}

// killAndCheck SIGKILLs the supervisor and requires every process of
// tree (collected before, with start times against pid reuse) to be dead
// within 1 s: gone, or a zombie.
func (r *realSV) killAndCheck(tree []procStat) {
	r.t.Helper()
	t0 := time.Now()
	if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		r.t.Fatal(err)
	}
	took := deadWithin(r.t, tree, t0, time.Second)
	r.t.Logf("all %d processes of the worker trees dead %s after the supervisor's SIGKILL", len(tree), took.Round(100*time.Microsecond))
}

// keeperMemory logs the keepers' (the supervisor's children's) memory.
func keeperMemory(t *testing.T, sv int, tree []procStat) {
	t.Helper()
	for _, p := range tree {
		if p.ppid != sv {
			continue
		}
		rss := procField(fmt.Sprintf("/proc/%d/status", p.pid), "VmRSS:")
		pss := procField(fmt.Sprintf("/proc/%d/smaps_rollup", p.pid), "Pss:")
		t.Logf("keeper %d: RSS %s, PSS %s", p.pid, rss, pss)
	}
}

func procField(file, key string) string {
	b, _ := os.ReadFile(file)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, key) {
			return strings.Join(strings.Fields(strings.TrimPrefix(line, key)), " ")
		}
	}
	return "?"
}

// restartBindsAtOnce starts a second supervisor on c, whose address the
// killed one's workers held: its first swap binds and serves.
func restartBindsAtOnce(t *testing.T, c *topo.PoolConfig, addr string) {
	t.Helper()
	// Nothing holds the port any more.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the killed supervisor's port is still held: %v", err)
	}
	ln.Close()
	r := startRealSV(t, c)
	m := r.waitFor(60*time.Second, "the restarted supervisor serving", serving(1, 2))
	if m.LastError != "" {
		t.Fatalf("restarted supervisor: last error %q", m.LastError)
	}
	if b, _ := os.ReadFile(r.log); strings.Contains(string(b), "address already in use") {
		t.Fatalf("the restarted supervisor's bind failed:\n%s", b)
	}
	if _, err := get(addr); err != nil {
		t.Fatalf("the restarted supervisor's workers do not serve: %v", err)
	}
}

// gunicorn --preload --workers 2: the supervisor's worker is gunicorn's
// arbiter, whose own workers are the supervisor's grandchildren and
// inherit no parent-death signal. They used to outlive a SIGKILLed
// supervisor by up to 6.4 s, holding the port.
func TestSupervisorSIGKILLTakesGunicornTreesDown(t *testing.T) {
	gunicorn := lookTool(t, "gunicorn")
	appDir, err := filepath.Abs("../examples/python")
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	c := &topo.PoolConfig{Version: 1, Command: gunicorn, Workers: 2,
		Args:      []string{"--preload", "--workers", "2", "--chdir", appDir, "--graceful-timeout", "5", "--log-level", "warning", "wsgi_app:application"},
		Env:       map[string]string{"APP_STARTUP_DELAY": "0", "APP_TAG": "first"},
		Listen:    []topo.Listen{{Name: "http", Addr: "tcp://" + addr}},
		Readiness: topo.Readiness{Timeout: topo.Duration(60 * time.Second)}}
	r := startRealSV(t, c)
	m := r.waitFor(60*time.Second, "gunicorn serving", serving(1, 2))
	// gunicorn's arbiter says READY=1 before it forks its workers: wait
	// for the whole tree, 2 keepers, 2 arbiters, 4 gunicorn workers.
	sv := r.cmd.Process.Pid
	var tree []procStat
	testenv.WaitFor(t, 30*time.Second, func() bool { tree = liveBelow(t, sv); return len(tree) == 8 }, "8 processes below the supervisor")
	for _, w := range m.Workers {
		st, err := readProcStat(w.PID)
		if err != nil || st.ppid == sv || !strings.Contains(procField(fmt.Sprintf("/proc/%d/status", w.PID), "Name:"), "gunicorn") {
			t.Fatalf("worker_pid %d is not gunicorn's arbiter under a keeper: %+v %v", w.PID, st, err)
		}
	}
	if _, err := get(addr); err != nil {
		t.Fatal(err)
	}
	keeperMemory(t, sv, tree)
	r.killAndCheck(tree)
	c.Env["APP_TAG"] = "second"
	restartBindsAtOnce(t, c, addr)
}

// A worker that double-forks a setsid'd daemon holding the listen socket:
// the daemon leaves the worker's process group and session, so killing
// the group missed it; the keeper, its subreaper, does not.
func TestSupervisorSIGKILLTakesDaemonsDown(t *testing.T) {
	port := testenv.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	c := cfgFor(t, port, 2, map[string]string{"TW_MODE": "daemon"})
	r := startRealSV(t, c)
	r.waitFor(30*time.Second, "2 workers serving", serving(1, 2))
	sv := r.cmd.Process.Pid
	var tree []procStat
	testenv.WaitFor(t, 30*time.Second, func() bool {
		tree = liveBelow(t, sv)
		daemons := 0
		for _, p := range tree {
			// The daemon, orphaned by its shell, is a keeper's child.
			if pp, err := readProcStat(p.ppid); err == nil && pp.ppid == sv && procField(fmt.Sprintf("/proc/%d/status", p.pid), "Name:") == "sleep" {
				daemons++
			}
		}
		return len(tree) == 6 && daemons == 2
	}, "2 keepers, 2 workers and their 2 daemons below the supervisor")
	r.killAndCheck(tree)
	delete(c.Env, "TW_MODE")
	restartBindsAtOnce(t, c, addr)
}
