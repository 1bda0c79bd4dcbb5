package supervisor

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/workerproto"
)

// The stability window, rollback, the HTTP probe and /healthz with real
// processes under load (issue 15, part 1).

// healthWatch polls /healthz every 20 ms until stopped and counts the
// answers that were not 200.
type healthWatch struct {
	bad, total atomic.Int64
	stop       chan struct{}
	wg         sync.WaitGroup
}

func watchHealth(admin string) *healthWatch {
	hw := &healthWatch{stop: make(chan struct{})}
	hw.wg.Add(1)
	go func() {
		defer hw.wg.Done()
		for {
			select {
			case <-hw.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			hw.total.Add(1)
			if httpCode("http://"+admin+"/healthz") != http.StatusOK {
				hw.bad.Add(1)
			}
		}
	}()
	return hw
}

func (hw *healthWatch) finish() (bad, total int64) {
	close(hw.stop)
	hw.wg.Wait()
	return hw.bad.Load(), hw.total.Load()
}

// The finding: a worker that says READY=1 and exits 1 two seconds later
// was swapped in, the old generation stopped, and the pool went 0/2. With
// the default stability window (10 s) the old generation never stops: the
// crash rolls the swap back, under load, with no failed request and no
// /healthz failure, and the config is not retried.
func TestStabilityCrashRightAfterReadyRollsBack(t *testing.T) {
	t.Parallel()
	e, h, c, port, addr := zkPool(t, map[string]string{"TW_TAG": "good"}, func(c *topo.PoolConfig) {
		c.Stability = topo.Stability{} // the defaults
	})
	before := h.pids()
	if got := testCounter(t, h, "shardvisor_supervisor_zk_session_timeout_seconds", ""); got != 4 {
		t.Errorf("zk_session_timeout_seconds = %v, want the negotiated 4", got)
	}
	l := startLoad(addr, 3)
	hw := watchHealth(h.sv.AdminAddr())

	bc := cfgFor(t, port, 2, map[string]string{"TW_TAG": "bad", "TW_CRASH_AFTER": "2s", "TW_CRASH_DRAIN": "1"})
	bc.Stability = topo.Stability{}
	since := time.Now().UTC()
	e.setConfig(t, bc)
	st := e.waitStatus(t, "rollback published", func(st *topo.PoolStatus) bool {
		return st.Result == topo.SwapRolledBack && st.At.After(since)
	})
	if !strings.Contains(st.Error, "inside the stability window of 10s") || st.ConfigVersion != 1 {
		t.Errorf("status record: %+v", st)
	}
	m := h.waitFor(20*time.Second, "the old generation alone", serving(1, 2))
	if m.RolledBack == nil || m.RolledBack.ConfigVersion != 1 || m.RolledBack.ToConfigVersion != 0 {
		t.Errorf("member record rolled_back: %+v", m.RolledBack)
	}
	if fmt.Sprint(h.pids()) != fmt.Sprint(before) {
		t.Errorf("the old workers changed from %v to %v: they must never stop", before, h.pids())
	}
	// Not retried: no worker starts for longer than the restart backoff
	// (200 ms, up to 2 s) would wait.
	spawns := testCounter(t, h, "shardvisor_supervisor_worker_spawns_total", "")
	time.Sleep(3 * time.Second) // deliberate: nothing may start for a while
	if n := testCounter(t, h, "shardvisor_supervisor_worker_spawns_total", ""); n != spawns {
		t.Errorf("%v workers started after the rollback: the rolled-back config was retried", n-spawns)
	}
	if m := h.sv.Status(); m.Generation != 1 {
		t.Errorf("serving generation %d", m.Generation)
	}
	if n := testCounter(t, h, "shardvisor_supervisor_rollbacks_total", `kind="window"`); n != 1 {
		t.Errorf("rollbacks{window} = %v", n)
	}
	bad, total := hw.finish()
	l.finish(t)
	if bad > 0 {
		t.Errorf("/healthz failed %d of %d times: the previous generation served throughout", bad, total)
	}
	// A new config still goes through (with a short window: the default
	// one would only add 10 s of waiting to make test).
	c.Env["TW_TAG"] = "good2"
	second := topo.Duration(time.Second)
	c.Stability = topo.Stability{Window: &second}
	e.setConfig(t, c)
	h.waitFor(30*time.Second, "a new config after the rollback", func(m topo.PoolMember) bool { return serving(3, 2)(m) })
	if r, err := get(addr); err != nil || r.Tag != "good2" {
		t.Fatalf("after the new config: %+v %v", r, err)
	}
}

// A config whose workers crash 7 s after READY=1, past a 3 s window:
// the old generation is gone, so the crash loop restarts the previous
// config at once. /healthz reports the moment with no ready worker.
func TestFaultsStabilityLateCrashLoop(t *testing.T) {
	// make test-faults: the machine tests cover the same decisions, and make
	// test stays within its budget.
	testenv.Faults(t)
	three, minute := topo.Duration(3*time.Second), topo.Duration(time.Minute)
	win := topo.Stability{Window: &three, RollbackWithin: &minute}
	e, h, _, port, addr := zkPool(t, map[string]string{"TW_TAG": "good"}, func(c *topo.PoolConfig) { c.Stability = win })
	l := startLoad(addr, 3)

	bc := cfgFor(t, port, 2, map[string]string{"TW_TAG": "bad", "TW_CRASH_AFTER": "7s", "TW_CRASH_DRAIN": "1"})
	bc.Stability = win
	since := time.Now().UTC()
	e.setConfig(t, bc)
	h.waitFor(20*time.Second, "the new config took over after the window", serving(2, 2))
	if r, err := get(addr); err != nil || r.Tag != "bad" {
		t.Fatalf("new config not serving: %+v %v", r, err)
	}
	// The rollback, then the restarted config serving: both say
	// rolled_back, the second one with the generation that serves.
	st := e.waitStatus(t, "rollback completed", func(st *topo.PoolStatus) bool {
		return st.Result == topo.SwapRolledBack && st.At.After(since) && st.Generation == 3
	})
	if !strings.Contains(st.Error, "worker crashes of config version 1") || st.ConfigVersion != 0 {
		t.Errorf("status record: %+v", st)
	}
	m := h.waitFor(20*time.Second, "the previous config restarted", serving(3, 2))
	if m.ConfigVersion != 0 || m.RolledBack == nil || m.RolledBack.ConfigVersion != 1 {
		t.Errorf("member record: config %d, rolled_back %+v", m.ConfigVersion, m.RolledBack)
	}
	if r, err := get(addr); err != nil || r.Tag != "good" {
		t.Fatalf("previous config not serving: %+v %v", r, err)
	}
	if n := testCounter(t, h, "shardvisor_supervisor_rollbacks_total", `kind="crash_loop"`); n != 1 {
		t.Errorf("rollbacks{crash_loop} = %v", n)
	}
	time.Sleep(2 * time.Second) // deliberate: the bad config must not be retried for a while
	if m := h.sv.Status(); m.Generation != 3 {
		t.Errorf("generation %d serving after the rollback: the bad config was retried", m.Generation)
	}
	l.finish(t)
}

// A worker that is ready and sends its watchdog pings but answers no
// request: the watchdog cannot see it, the HTTP probe on its private
// socket does, and it is replaced.
func TestProbeReplacesAHungWorker(t *testing.T) {
	_, h, _, _, addr := zkPool(t, map[string]string{"TW_TAG": "p", "TW_HANG_AFTER": "1500ms", "TW_HANG_WORKER": "1"}, func(c *topo.PoolConfig) {
		c.Watchdog = topo.Duration(time.Second)
		c.Probe = &topo.WorkerProbe{Path: "/probe", Interval: topo.Duration(200 * time.Millisecond), Timeout: topo.Duration(200 * time.Millisecond), Failures: 3}
	})
	r, err := get(addr)
	if err != nil || strings.Join(r.FDNames, ",") != "http,"+workerproto.ProbeFDName {
		t.Fatalf("first request: %+v %v", r, err)
	}
	var hungPID int
	for _, w := range h.sv.Status().Workers {
		if w.ID == 1 {
			hungPID = w.PID
		}
	}
	testenv.WaitFor(t, 20*time.Second, func() bool {
		return testCounter(t, h, "shardvisor_supervisor_worker_kills_total", `reason="probe"`) == 1 && !alive(hungPID)
	}, "the hung worker replaced")
	h.waitFor(20*time.Second, "two ready workers again", func(m topo.PoolMember) bool {
		n := 0
		for _, w := range m.Workers {
			if w.State == "ready" && w.PID != hungPID {
				n++
			}
		}
		return n == 2
	})
	if n := testCounter(t, h, "shardvisor_supervisor_worker_kills_total", `reason="watchdog"`); n != 0 {
		t.Errorf("the watchdog fired %v times: the hung worker kept pinging, only the probe can see it", n)
	}
	// /status carries when the member record last changed.
	var st struct {
		Member topo.PoolMember `json:"member"`
	}
	resp, err := http.Get("http://" + h.sv.AdminAddr() + "/status")
	if err != nil {
		t.Fatal(err)
	}
	err = jsonDecode(resp.Body, &st)
	resp.Body.Close()
	if err != nil || st.Member.UpdatedAt.Year() < 2020 {
		t.Errorf("/status member updated_at %s (%v)", st.Member.UpdatedAt, err)
	}
	// Every request is answered now (none reaches a hung worker).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 0; i < 50 && ctx.Err() == nil; i++ {
		if _, err := get(addr); err != nil {
			t.Fatalf("request %d after the replacement: %v", i, err)
		}
	}
}
