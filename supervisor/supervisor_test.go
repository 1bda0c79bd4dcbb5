package supervisor

import (
	"context"
	"errors"
	"fmt"
	"github.com/shardvisor/shardvisor/bucketmap"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/faultproxy"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// Config changes in ZooKeeper swap generations under a constant load
// without a single failed request; the member and status records follow.
// zkPool configures pool web in ZooKeeper with two test workers with env
// (edit, unless nil, changes the config before), runs a supervisor on it
// and waits until generation 1 serves. c is the config, for changes; the
// workers serve on port, at addr.
func zkPool(t *testing.T, env map[string]string, edit func(c *topo.PoolConfig)) (e *zkEnv, h *harness, c *topo.PoolConfig, port int, addr string) {
	t.Helper()
	e = startZK(t)
	port = testenv.FreePort(t)
	addr = fmt.Sprintf("127.0.0.1:%d", port)
	c = cfgFor(t, port, 2, env)
	if edit != nil {
		edit(c)
	}
	e.setConfig(t, c)
	h = run(t, e.opts(t, e.z.ConnectString+e.z.Root, 4*time.Second))
	h.waitFor(20*time.Second, "generation 1", serving(1, c.Workers))
	return e, h, c, port, addr
}

// writeConfig writes c to the pool's config file.
func writeConfig(t *testing.T, file string, c *topo.PoolConfig) {
	t.Helper()
	if err := os.WriteFile(file, encode(t, c), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestSwapUnderLoadZeroFailures(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "w.sock")
	e, h, c, _, addr := zkPool(t, map[string]string{"TW_TAG": "v1", "TW_DELAY": "300ms"}, func(c *topo.PoolConfig) {
		c.Listen = append(c.Listen, topo.Listen{Name: "local", Addr: "unix://" + sock})
		one := 1
		c.Surge = &one // one new worker at a time: the strictest rolling swap
	})
	r, err := get(addr)
	if err != nil || r.Tag != "v1" || strings.Join(r.FDNames, ",") != "http,local" {
		t.Fatalf("first request: %+v %v", r, err)
	}
	uc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	if resp, err := uc.Get("http://unix/"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("request over the unix socket: %v", err)
	} else {
		resp.Body.Close()
	}

	l := startLoad(addr, 4)
	for i, tag := range []string{"v2", "v3", "v4"} {
		c.Env["TW_TAG"] = tag
		e.setConfig(t, c)
		gen := int64(i + 2)
		h.waitFor(20*time.Second, "generation "+tag+" serving", serving(gen, 2))
		if r, err := get(addr); err != nil || r.Tag != tag {
			t.Fatalf("after swap to %s: %+v %v", tag, r, err)
		}
	}
	l.waitTag(t, "v4", 10)
	l.finish(t)

	st := e.waitStatus(t, "status of generation 4", func(st *topo.PoolStatus) bool { return st.Generation == 4 })
	if st.Result != topo.SwapOK || st.Member != "m1" || st.ConfigVersion != 3 {
		t.Fatalf("status record %+v", st)
	}
	testenv.WaitFor(t, 10*time.Second, func() bool {
		b, _, err := e.s.Get(context.Background(), e.paths.PoolMember("web", "m1"))
		if err != nil {
			return false
		}
		m, err := topo.DecodePoolMember("", b)
		return err == nil && m.Generation == 4 && len(m.Workers) == 2 && m.Accepting
	}, "member record at generation 4")
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("unix socket file: %v", err)
	}
	h.sv.Stop(false)
	if err := <-h.done; err != nil {
		t.Fatal(err)
	}
	h.done <- nil // for the cleanup
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("unix socket file left behind after stop: %v", err)
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Errorf("port still accepting after stop")
	}
}

// A broken command, a worker that exits at boot, a readiness timeout and an
// invalid config all leave the old generation serving, under load, and are
// published in the status record.
func TestBadChangesKeepOldGeneration(t *testing.T) {
	t.Parallel()
	e, h, c, port, addr := zkPool(t, map[string]string{"TW_TAG": "good"}, nil)
	before := h.pids()
	l := startLoad(addr, 3)

	bad := []struct {
		name  string
		apply func(c *topo.PoolConfig)
		err   string
	}{
		{"broken command", func(c *topo.PoolConfig) { c.Command = "/nonexistent/app" }, "exited before it was ready"},
		{"exit at boot", func(c *topo.PoolConfig) { c.Env["TW_MODE"] = "exit" }, "exited before it was ready"},
		{"readiness timeout", func(c *topo.PoolConfig) {
			c.Env["TW_MODE"] = "noready"
			c.Readiness.Timeout = topo.Duration(700 * time.Millisecond)
		}, "not ready after readiness.timeout"},
	}
	for _, b := range bad {
		bc := cfgFor(t, port, 2, map[string]string{"TW_TAG": "bad"})
		b.apply(bc)
		bc.Restart = topo.Backoff{Initial: topo.Duration(20 * time.Second), Max: topo.Duration(20 * time.Second)} // no retry during the test
		since := time.Now().UTC()
		e.setConfig(t, bc)
		st := e.waitStatus(t, b.name+" reported", func(st *topo.PoolStatus) bool {
			return st.Result == topo.SwapFailed && strings.Contains(st.Error, b.err) && st.At.After(since)
		})
		t.Logf("%s: %s", b.name, st.Error)
		m := h.waitFor(20*time.Second, "old generation alone after "+b.name, serving(1, 2))
		if m.LastError == "" {
			t.Errorf("%s: member record has no last_error", b.name)
		}
		if got := h.pids(); fmt.Sprint(got) != fmt.Sprint(before) {
			t.Fatalf("%s: workers changed from %v to %v", b.name, before, got)
		}
		if r, err := get(addr); err != nil || r.Tag != "good" {
			t.Fatalf("%s: old generation not serving: %+v %v", b.name, r, err)
		}
	}
	// Invalid config: rejected before any worker starts.
	since := time.Now().UTC()
	e.put(t, e.paths.PoolConfig("web"), []byte(`{"version":1,"command":"x","workers":2,"surge":0}`))
	st := e.waitStatus(t, "invalid config reported", func(st *topo.PoolStatus) bool { return st.Result == topo.SwapInvalidConfig && st.At.After(since) })
	if !strings.Contains(st.Error, "surge") {
		t.Errorf("invalid config error does not name the field: %s", st.Error)
	}
	// And a good change still goes through afterwards.
	c.Env["TW_TAG"] = "good2"
	e.setConfig(t, c)
	h.waitFor(20*time.Second, "a good change after the bad ones", func(m topo.PoolMember) bool {
		return serving(0, 2)(m) && m.Generation > 1
	})
	if r, err := get(addr); err != nil || r.Tag != "good2" {
		t.Fatalf("after the good change: %+v %v", r, err)
	}
	l.finish(t)
	if l.tags["bad"] > 0 {
		t.Errorf("%d requests were served by workers of failed generations", l.tags["bad"])
	}
}

// A change that arrives while a swap is in progress supersedes it: the
// pool converges on the newest config, the intermediate generation never
// serves, and the old one serves until then.
func TestSupersedeDuringSwap(t *testing.T) {
	t.Parallel()
	e, h, c, _, addr := zkPool(t, map[string]string{"TW_TAG": "a"}, nil)
	l := startLoad(addr, 3)
	c.Env = map[string]string{"TW_TAG": "b", "TW_DELAY": "1500ms"}
	e.setConfig(t, c)
	h.waitFor(10*time.Second, "generation 2 starting", func(m topo.PoolMember) bool {
		for _, w := range m.Workers {
			if w.Generation == 2 && w.State == "starting" {
				return true
			}
		}
		return false
	})
	c.Env = map[string]string{"TW_TAG": "c", "TW_DELAY": "500ms"}
	e.setConfig(t, c)
	h.waitFor(20*time.Second, "generation 3 serving", serving(3, 2))
	l.finish(t)
	if l.tags["b"] > 0 {
		t.Errorf("superseded generation served %d requests", l.tags["b"])
	}
	if got := testCounter(t, h, "shardvisor_supervisor_swaps_total", `result="superseded"`); got != 1 {
		t.Errorf("superseded swaps = %v, want 1", got)
	}
}

// TTIN and TTOU add and remove a worker without a new generation; a config
// change resets the count to the config's.
func TestFaultsTTINTTOU(t *testing.T) {
	// make test-faults: the machine tests cover the same decisions, and make
	// test stays within its budget.
	testenv.Faults(t)
	dir := t.TempDir()
	port := testenv.FreePort(t)
	file := filepath.Join(dir, "pool.json")
	c := cfgFor(t, port, 2, map[string]string{"TW_TAG": "x"})
	writeConfig(t, file, c)
	h := run(t, Options{ConfigFile: file, ConfigPoll: 100 * time.Millisecond})
	h.waitFor(20*time.Second, "2 workers", serving(1, 2))
	h.sv.Signal(syscall.SIGTTIN)
	h.sv.Signal(syscall.SIGTTIN)
	m := h.waitFor(20*time.Second, "4 workers", serving(1, 4))
	if m.Target != 4 {
		t.Fatalf("target %d", m.Target)
	}
	h.sv.Signal(syscall.SIGTTOU)
	h.waitFor(20*time.Second, "3 workers", serving(1, 3))
	for i := 0; i < 5; i++ {
		h.sv.Signal(syscall.SIGTTOU)
	}
	h.waitFor(20*time.Second, "never below 1 worker", serving(1, 1))
	c.Env["TW_TAG"] = "y"
	writeConfig(t, file, c)
	h.waitFor(20*time.Second, "config change resets to the config's 2 workers", serving(2, 2))
}

// Workers die with the supervisor even when it is SIGKILLed; signals work
// on the real binary; the Go example worker serves from the inherited
// socket.
func TestRealBinarySignalsAndSIGKILL(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sv, hello := supervisorBinary(t), filepath.Join(dir, "hello") // the supervisor as the package's other tests built it
	goBuild(t, "./examples/hello", hello)
	port, adminPort := testenv.FreePort(t), testenv.FreePort(t)
	file := filepath.Join(dir, "pool.json")
	off := topo.Duration(0) // HUP's swap completes at readiness: the window is stability_test.go's
	c := &topo.PoolConfig{Version: 1, Command: hello, Workers: 2, Env: map[string]string{"GREETING": "hi"},
		Listen:    []topo.Listen{{Name: "http", Addr: fmt.Sprintf("tcp://127.0.0.1:%d", port)}},
		Stability: topo.Stability{Window: &off, RollbackWithin: &off}}
	writeConfig(t, file, c)
	logf, _ := os.Create(filepath.Join(dir, "sv.log"))
	cmd := execCommand(sv, "--config", file, "--config-poll", "100ms", "--admin", fmt.Sprintf("127.0.0.1:%d", adminPort),
		"--state-dir", filepath.Join(dir, "state"), "--pool", "hello")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("supervisor log:\n%s", b)
		}
	})
	admin := fmt.Sprintf("http://127.0.0.1:%d", adminPort)
	status := func() topo.PoolMember {
		var body struct{ Member topo.PoolMember }
		resp, err := client.Get(admin + "/status")
		if err != nil {
			return topo.PoolMember{}
		}
		defer resp.Body.Close()
		_ = jsonDecode(resp.Body, &body)
		return body.Member
	}
	waitM := func(what string, cond func(topo.PoolMember) bool) topo.PoolMember {
		t.Helper()
		var m topo.PoolMember
		testenv.WaitFor(t, 20*time.Second, func() bool { m = status(); return cond(m) }, what)
		return m
	}
	waitM("2 workers", serving(1, 2))
	body := httpBody(t, fmt.Sprintf("http://127.0.0.1:%d/", port))
	if !strings.HasPrefix(body, "hi from pid") {
		t.Fatalf("hello worker said %q", body)
	}
	_ = cmd.Process.Signal(syscall.SIGTTIN)
	waitM("TTIN: 3 workers", serving(1, 3))
	_ = cmd.Process.Signal(syscall.SIGTTOU)
	waitM("TTOU: 2 workers", serving(1, 2))
	_ = cmd.Process.Signal(syscall.SIGHUP)
	m := waitM("HUP: a new generation", serving(2, 2))
	if code := httpCode(admin + "/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	metrics := httpBody(t, admin+"/metrics")
	for _, want := range []string{"shardvisor_supervisor_generation 2", `shardvisor_supervisor_workers{state="ready"} 2`, "shardvisor_supervisor_swap_duration_seconds_count 2"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	var pids []int
	for _, w := range m.Workers {
		pids = append(pids, w.PID)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	testenv.WaitFor(t, time.Second, func() bool {
		for _, p := range pids {
			if alive(p) {
				return false
			}
		}
		return true
	}, fmt.Sprintf("workers %v to die with the SIGKILLed supervisor (parent-death signal)", pids))
}

// Workers survive OS threads of the supervisor process exiting: a
// parent-death signal is tied to the forking thread. The keeper has none
// (it watches its control socket instead); the worker's is tied to the
// keeper's main thread, which never exits.
func TestWorkersSurviveThreadExits(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	port := testenv.FreePort(t)
	file := filepath.Join(dir, "pool.json")
	c := cfgFor(t, port, 3, nil)
	writeConfig(t, file, c)
	h := run(t, Options{ConfigFile: file})
	go lockedThreadChurn(50) // threads come and go while workers are forked
	h.waitFor(20*time.Second, "3 workers", serving(1, 3))
	pids := h.pids()
	lockedThreadChurn(200)
	time.Sleep(300 * time.Millisecond) // deliberate: a worker killed by a thread exit would be dead by now
	for _, p := range pids {
		if !alive(p) {
			t.Fatalf("worker %d died when supervisor threads exited", p)
		}
	}
	h.waitFor(5*time.Second, "same workers still serving", serving(1, 3))
}

// A crash outside a swap is respawned with backoff; a crash loop does not
// become a fork storm. A hung worker is killed by the watchdog.
func TestCrashBackoffAndWatchdog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	port := testenv.FreePort(t)
	file := filepath.Join(dir, "pool.json")
	c := cfgFor(t, port, 1, map[string]string{})
	// Max is long so that no crash resets the count (a worker ready for
	// restart.max does): the waits are 100, 200, 400 ms.
	c.Restart = topo.Backoff{Initial: topo.Duration(100 * time.Millisecond), Max: topo.Duration(5 * time.Second)}
	writeConfig(t, file, c)
	h := run(t, Options{ConfigFile: file, ConfigPoll: 100 * time.Millisecond})
	h.waitFor(20*time.Second, "1 worker", serving(1, 1))
	// Generation 2 crashes 100ms after becoming ready, forever.
	c.Env = map[string]string{"TW_CRASH_AFTER": "100ms"}
	writeConfig(t, file, c)
	var gaps []time.Duration
	testenv.WaitFor(t, 60*time.Second, func() bool {
		gaps = crashGaps(t, h)
		return len(gaps) >= 3
	}, "3 respawns of the crashing generation")
	if r := testCounter(t, h, "shardvisor_supervisor_worker_restarts_total", ""); r < 3 {
		t.Fatalf("restarts counter %v after 3 respawns", r)
	}
	// The gaps from each crash to the next start, read off the
	// supervisor's log: a slow machine lengthens a worker's life and
	// perhaps a gap, never shortens one, so only lower bounds are
	// asserted. Without backoff every gap would be about 0.
	t.Logf("crash loop: gaps from crash to respawn %v", gaps)
	for i, want := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond} {
		// -20% jitter, and 2 ms for the log's millisecond timestamps.
		if floor := want*8/10 - 2*time.Millisecond; gaps[i] < floor {
			t.Fatalf("crash %d: respawned %v after the crash, want >= %v (backoff %v -20%%): %v", i+1, gaps[i], floor, want, gaps)
		}
	}

	c.Env = map[string]string{"TW_MODE": "hang"}
	c.Watchdog = topo.Duration(300 * time.Millisecond)
	writeConfig(t, file, c)
	testenv.WaitFor(t, 20*time.Second, func() bool {
		return testCounter(t, h, "shardvisor_supervisor_worker_kills_total", `reason="watchdog"`) >= 1
	}, "the watchdog to fire on a worker that sends no WATCHDOG=1")
}

// crashGaps reads the gaps between each "worker crashed" line and the
// next "starting worker" line of h's log: the supervisor's decision, not
// the fork, whose cost on a loaded machine would hide a missing backoff.
func crashGaps(t *testing.T, h *harness) []time.Duration {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(h.dir, "test.log"))
	if err != nil {
		t.Fatal(err)
	}
	var gaps []time.Duration
	var crashed time.Time
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, "\t", 4)
		if len(f) < 3 {
			continue
		}
		at, err := time.Parse("2006-01-02T15:04:05.000Z0700", f[0])
		if err != nil {
			continue
		}
		switch {
		case f[2] == "worker crashed":
			crashed = at
		case f[2] == "starting worker" && !crashed.IsZero():
			gaps = append(gaps, at.Sub(crashed))
			crashed = time.Time{}
		}
	}
	return gaps
}

// Killing the ZooKeeper leader suspends the session; the workers keep
// serving through the election, untouched.
func TestZKLeaderKillKeepsWorkers(t *testing.T) {
	skipUnderRace(t)
	e := startZK(t)
	testenv.Exclusive(t)
	port := testenv.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	e.setConfig(t, cfgFor(t, port, 2, map[string]string{"TW_TAG": "x"}))
	h := run(t, e.opts(t, e.z.ConnectString+e.z.Root, 8*time.Second))
	h.waitFor(20*time.Second, "generation 1", serving(1, 2))
	pids := h.pids()
	l := startLoad(addr, 2)
	leader, err := e.z.Leader()
	if err != nil {
		t.Fatal(err)
	}
	sub := h.sv.opts.Session.Subscribe()
	defer sub.Close()
	if err := e.z.Kill(leader); err != nil {
		t.Fatal(err)
	}
	sawSuspended := false
	deadline := time.After(40 * time.Second)
	for back := false; !back; {
		select {
		case ch := <-sub.C:
			switch ch.To {
			case zksession.StateSuspended:
				sawSuspended = true
			case zksession.StateLost:
				t.Fatalf("session lost during a leader election: %+v", ch)
			case zksession.StateConnected:
				back = sawSuspended
			}
		case <-deadline:
			t.Fatal("session did not come back within 40s of the leader kill")
		}
	}
	l.finish(t)
	if fmt.Sprint(h.pids()) != fmt.Sprint(pids) {
		t.Fatalf("workers changed across a leader election: %v -> %v", pids, h.pids())
	}
	h.waitFor(5*time.Second, "still serving generation 1", serving(1, 2))
}

// A client partition from ZooKeeper makes the session lost: the workers
// are killed and connections refused within the documented bound (5/6 of
// the session timeout after the last successful call, plus a little);
// healing restores service after the holddown.
func TestZKPartitionKillsWorkersAndHeals(t *testing.T) {
	skipUnderRace(t)
	e := startZK(t)
	port := testenv.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	e.setConfig(t, cfgFor(t, port, 2, map[string]string{"TW_TAG": "x"}))
	proxy, err := faultproxy.New(e.z.Servers[0])
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	const timeout = 2 * time.Second
	opts := e.opts(t, proxy.Addr()+e.z.Root, timeout)
	opts.Holddown = 500 * time.Millisecond
	h := run(t, opts)
	h.waitFor(20*time.Second, "generation 1", serving(1, 2))
	pids := h.pids()
	admin := "http://" + h.sv.AdminAddr()
	if code := httpCode(admin + "/healthz"); code != 200 {
		t.Fatalf("/healthz %d before the partition", code)
	}

	start := time.Now()
	proxy.SetMode(faultproxy.Blackhole)
	bound := timeout*5/6 + 2*time.Second // the documented bound plus slack for a loaded 2-core CI machine
	testenv.WaitFor(t, bound+5*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return false
		}
		return true
	}, "connections refused after the partition")
	took := time.Since(start)
	t.Logf("refusing connections %s after the partition (bound %s)", took.Round(time.Millisecond), bound)
	if took > bound {
		t.Errorf("took %s to stop accepting, more than the documented bound %s", took, bound)
	}
	for _, p := range pids {
		testenv.WaitFor(t, 2*time.Second, func() bool { return !alive(p) }, fmt.Sprintf("worker %d killed", p))
	}
	if code := httpCode(admin + "/healthz"); code != 503 {
		t.Fatalf("/healthz %d while lost, want 503", code)
	}
	if m := h.sv.Status(); m.State != "lost" || m.Accepting {
		t.Fatalf("member state while lost: %+v", m)
	}

	proxy.SetMode(faultproxy.Pass)
	m := h.waitFor(30*time.Second, "serving again after healing", serving(0, 2))
	if r, err := get(addr); err != nil || r.Tag != "x" {
		t.Fatalf("after healing: %+v %v", r, err)
	}
	if code := httpCode(admin + "/healthz"); code != 200 {
		t.Fatalf("/healthz %d after healing", code)
	}
	for _, w := range m.Workers {
		for _, p := range pids {
			if w.PID == p {
				t.Fatalf("old worker %d is back?", p)
			}
		}
	}
}

// A map change starts a new generation whose workers get the new map file;
// old map files are removed; an invalid map never replaces a good one.
func TestMapChangeDeliversNewMapFile(t *testing.T) {
	t.Parallel()
	e := startZK(t)
	port := testenv.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	// A real cluster: the workers' map file carries its seed.
	crec := topo.ClusterRecord{Version: topo.ClusterVersion, Name: e.paths.ClusterName(), Seed: "5eed0000000000000000000000000001", CreatedAt: time.Now().UTC()}
	cdata, _ := topo.Encode(crec)
	e.put(t, e.paths.Cluster(), cdata)
	bm, err := bucketmap.New(2, []bucketmap.Node{{ID: "n1", DSN: "postgres://h/d", Weight: 1, State: bucketmap.NodeActive}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	raw1, _ := bucketmap.Encode(bm)
	map1 := mustDoc(t, crec, raw1)
	e.put(t, e.paths.Map(), raw1)
	e.setConfig(t, cfgFor(t, port, 2, nil))
	h := run(t, e.opts(t, e.z.ConnectString+e.z.Root, 4*time.Second))
	h.waitFor(20*time.Second, "generation 1", serving(1, 2))
	r, err := get(addr)
	if err != nil || r.MapVersion != "1" || r.Map != map1 {
		t.Fatalf("worker of generation 1 got %+v %v", r, err)
	}
	file1 := r.MapFile
	l := startLoad(addr, 2)
	bm2 := bm.Clone()
	bm2.Version = 2
	if err := bm2.Split(); err != nil {
		t.Fatal(err)
	}
	raw2, _ := bucketmap.Encode(bm2)
	map2 := mustDoc(t, crec, raw2)
	e.put(t, e.paths.Map(), raw2)
	m := h.waitFor(20*time.Second, "generation 2 after the map change", serving(2, 2))
	if m.MapVersion != 2 {
		t.Fatalf("member map version %d", m.MapVersion)
	}
	r, err = get(addr)
	if err != nil || r.MapVersion != "2" || r.Map != map2 || r.MapFile == file1 {
		t.Fatalf("worker of generation 2 got %+v %v", r, err)
	}
	testenv.WaitFor(t, 10*time.Second, func() bool { _, err := os.Stat(file1); return errors.Is(err, os.ErrNotExist) },
		"the old map file to be removed once no worker uses it")

	e.put(t, e.paths.Map(), []byte(`{"version":1,"map_version":3,"level":3}`)) // not a valid map
	e.waitStatus(t, "invalid map reported", func(st *topo.PoolStatus) bool { return st.Result == topo.SwapInvalidMap })
	time.Sleep(300 * time.Millisecond) // deliberate: nothing may change after the invalid map, for a while
	h.waitFor(5*time.Second, "generation 2 still serving", serving(2, 2))
	if r, err := get(addr); err != nil || r.Map != map2 {
		t.Fatalf("after an invalid map: %+v %v", r, err)
	}
	l.finish(t)
}

func mustDoc(t *testing.T, c topo.ClusterRecord, raw []byte) string {
	t.Helper()
	_, doc, err := MapDocument(&c, "/m", raw)
	if err != nil {
		t.Fatal(err)
	}
	return string(doc)
}

// max_lifetime recycles workers through the same zero-drop path.
func TestFaultsMaxLifetimeRecycles(t *testing.T) {
	// make test-faults: the machine tests cover the same decisions, and make
	// test stays within its budget.
	testenv.Faults(t)
	dir := t.TempDir()
	port := testenv.FreePort(t)
	file := filepath.Join(dir, "pool.json")
	c := cfgFor(t, port, 2, nil)
	c.MaxLifetime = topo.Duration(2 * time.Second)
	c.MaxLifetimeJitter = topo.Duration(500 * time.Millisecond)
	writeConfig(t, file, c)
	h := run(t, Options{ConfigFile: file})
	h.waitFor(20*time.Second, "2 workers", serving(1, 2))
	first := h.pids()
	l := startLoad(fmt.Sprintf("127.0.0.1:%d", port), 3)
	h.waitFor(30*time.Second, "all first workers recycled", func(m topo.PoolMember) bool {
		ready := 0
		for _, w := range m.Workers {
			for _, p := range first {
				if w.PID == p {
					return false
				}
			}
			if w.State == "ready" {
				ready++
			}
		}
		return ready >= 2
	})
	l.finish(t)
	if got := testCounter(t, h, "shardvisor_supervisor_worker_stops_total", `reason="max_lifetime"`); got < 2 {
		t.Errorf("max_lifetime stops = %v", got)
	}
}

// gunicorn, unmodified, works as a worker: it takes the sockets from
// LISTEN_FDS and reports READY=1; a swap under load drops nothing.
func TestGunicornWorker(t *testing.T) {
	t.Parallel()
	gunicorn := lookTool(t, "gunicorn")
	appDir, err := filepath.Abs("../examples/python")
	if err != nil {
		t.Fatal(err)
	}
	swapsUnderLoad(t, &topo.PoolConfig{Version: 1, Command: gunicorn, Workers: 2,
		Args: []string{"--preload", "--workers", "2", "--chdir", appDir, "--graceful-timeout", "5", "--log-level", "warning", "wsgi_app:application"},
		Env:  map[string]string{"APP_STARTUP_DELAY": "0.2"},
		// gunicorn serves every socket in LISTEN_FDS, so the HTTP probe
		// on each worker's private socket works unchanged: without an
		// answer there no worker would become ready.
		Probe: &topo.WorkerProbe{Path: "/", Interval: topo.Duration(500 * time.Millisecond)}})
}

// Puma, unmodified from Debian, is a worker: it takes the supervisor's
// socket (--bind-to-activated-sockets only) and says READY=1 through the
// ruby-sd-notify gem, which cannot address an abstract socket; a config
// change swaps its generations with no failed request.
func TestPumaWorker(t *testing.T) {
	t.Parallel()
	puma := lookTool(t, "puma")
	dir, err := filepath.Abs("../examples/ruby")
	if err != nil {
		t.Fatal(err)
	}
	h := swapsUnderLoad(t, &topo.PoolConfig{Version: 1, Command: puma, Workers: 2,
		Args: []string{"--config", filepath.Join(dir, "puma.rb"), "--bind-to-activated-sockets", "only", "--workers", "2",
			"--threads", "1:4", "--quiet", filepath.Join(dir, "config.ru")}})
	if got := testCounter(t, h, "shardvisor_supervisor_notify_rejected_total", ""); got != 0 {
		t.Fatalf("%v of puma's datagrams refused", got)
	}
}

// lookTool finds a third-party program the test needs: in CI its absence
// is a failure (scripts/install-deps installs it), elsewhere a skip.
func lookTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed (scripts/install-deps installs it): %v", name, err)
		}
		t.Skipf("%s is not installed; run scripts/install-deps: %v", name, err)
	}
	return p
}

// swapsUnderLoad runs the app c describes (it echoes APP_TAG and the
// generation) under a supervisor, then changes APP_TAG under load: the
// second generation must take over with no failed request.
func swapsUnderLoad(t *testing.T, c *topo.PoolConfig) *harness {
	t.Helper()
	file := filepath.Join(t.TempDir(), "pool.json")
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	if c.Env == nil {
		c.Env = map[string]string{}
	}
	c.Env["APP_TAG"] = "t1"
	c.Listen = []topo.Listen{{Name: "http", Addr: "tcp://" + addr}}
	c.GracefulTimeout = topo.Duration(10 * time.Second)
	c.Readiness = topo.Readiness{Timeout: topo.Duration(60 * time.Second)}
	// A swap completes at readiness, as cfgFor's do: what these tests
	// check is the handover under load, not the stability window
	// (stability_test.go), which would add 10 s to each.
	off := topo.Duration(0)
	c.Stability = topo.Stability{Window: &off, RollbackWithin: &off}
	writeConfig(t, file, c)
	h := run(t, Options{ConfigFile: file, ConfigPoll: 100 * time.Millisecond})
	h.waitFor(60*time.Second, c.Command+" generation 1", serving(1, 2))
	if r, err := get(addr); err != nil || r.Tag != "t1" || r.Gen != "1" {
		t.Fatalf("%s answered %+v %v", c.Command, r, err)
	}
	l := startLoad(addr, 3)
	c.Env["APP_TAG"] = "t2"
	writeConfig(t, file, c)
	h.waitFor(60*time.Second, c.Command+" generation 2", serving(2, 2))
	l.waitTag(t, "t2", 10)
	l.finish(t)
	if r, err := get(addr); err != nil || r.Tag != "t2" {
		t.Fatalf("after the swap %s answered %+v %v", c.Command, r, err)
	}
	return h
}
