package supervisor

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/workerproto"
	"github.com/shardvisor/shardvisor/zksession"
)

// The machine's decisions, as table tests: no process, no socket, no
// ZooKeeper, no real time. A sim plays the executor: it carries out starts
// and prepares (failing those a test asks to fail) and records every
// action as its String form.

type sim struct {
	t           *testing.T
	mc          *machine
	t0, now     time.Time
	pid         int
	failStart   map[int64]bool // worker ids whose start fails
	failPrepare map[int64]bool // generation ids whose prepare fails
	procState   map[int64]byte // what inspecting a worker finds (default 'S')
}

func newSim(t *testing.T, zk bool) *sim {
	t.Helper()
	mc := newMachine(machineConfig{pool: "p", zk: zk, configWhere: "/c", mapWhere: "/m",
		debounce: 250 * time.Millisecond, holddown: 3 * time.Second}, zap.NewNop(), newMetrics(nil))
	mc.randN = func(int64) int64 { return 0 }
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return &sim{t: t, mc: mc, t0: t0, now: t0, pid: 1000, failStart: map[int64]bool{}, failPrepare: map[int64]bool{}, procState: map[int64]byte{}}
}

// at sets the clock to t0+d.
func (s *sim) at(d time.Duration) *sim {
	s.t.Helper()
	if n := s.t0.Add(d); n.Before(s.now) {
		s.t.Fatalf("time goes backwards: %s", d)
	} else {
		s.now = n
	}
	return s
}

// run carries out acts as the executor would and returns them as strings,
// skipping those the machine says no longer apply.
func (s *sim) run(acts []action) []string {
	var out []string
	for i := 0; i < len(acts); i++ {
		a := acts[i]
		if s.mc.skip(a) {
			continue
		}
		out = append(out, a.String())
		switch a := a.(type) {
		case actPrepare:
			if s.failPrepare[a.g.id] {
				acts = slices.Insert(acts, i+1, s.mc.prepareFailed(a.g, errors.New("bind: address in use"), s.now)...)
				continue
			}
			acts = slices.Insert(acts, i+1, s.mc.prepared(a.g)...)
		case actStart:
			if s.failStart[a.w.id] {
				out[len(out)-1] += " (fails)"
				acts = slices.Insert(acts, i+1, s.mc.startFailed(a.w, errors.New("fork: resource temporarily unavailable"), s.now)...)
				continue
			}
			s.pid++
			s.mc.started(a.w, s.pid)
		case actInspect:
			st := s.procState[a.w.id]
			if st == 0 {
				st = 'S'
			}
			acts = slices.Insert(acts, i+1, s.mc.inspected(a.w, st, s.now)...)
		}
	}
	return out
}

// send delivers ev, then reconciles, as the loop does.
func (s *sim) send(ev any) []string {
	out := s.run(s.mc.handle(ev, s.now))
	return append(out, s.tick()...)
}

// swapAt delivers a config change at t0+at and ticks once its debounce
// has passed: the swap's first actions.
func (s *sim) swapAt(at time.Duration, ev evConfig) []string {
	s.t.Helper()
	s.at(at)
	s.send(ev)
	s.at(at + s.mc.cfg.debounce)
	return s.tick()
}

// tick reconciles and takes a snapshot, as the loop does on a timer.
func (s *sim) tick() []string {
	out := s.run(s.mc.reconcile(s.now))
	_, _, acts := s.mc.snapshot()
	return append(out, s.run(acts)...)
}

func (s *sim) w(id int64) *worker {
	s.t.Helper()
	for _, w := range s.mc.workers {
		if w.id == id {
			return w
		}
	}
	s.t.Fatalf("no worker %d (have %s)", id, s.workers())
	return nil
}

func (s *sim) ready(ids ...int64) []string {
	var out []string
	for _, id := range ids {
		out = append(out, s.send(evNotify{s.w(id), workerproto.Message{Ready: true}})...)
	}
	return out
}

func (s *sim) exit(id int64, status string) []string {
	return s.send(evExit{w: s.w(id), status: status})
}

// workers lists the live workers as "w1g1:ready".
func (s *sim) workers() string {
	var parts []string
	for _, w := range s.mc.workers {
		parts = append(parts, fmt.Sprintf("w%dg%d:%s", w.id, w.gen.id, w.state))
	}
	return strings.Join(parts, " ")
}

func (s *sim) expect(what string, got []string, want ...string) {
	s.t.Helper()
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		s.t.Fatalf("%s:\n got: %s\nwant: %s\nworkers: %s", what, strings.Join(got, "; "), strings.Join(want, "; "), s.workers())
	}
}

// poolCfg is a config event: n workers, one socket, options applied by
// the mutators.
func poolCfg(version int64, n int, mut ...func(*topo.PoolConfig)) evConfig {
	// The tests from before the stability checks run without them;
	// stability tests turn them on (withStability).
	off := topo.Duration(0)
	c := &topo.PoolConfig{Version: 1, Command: "/bin/app", Workers: n,
		Listen:    []topo.Listen{{Name: "http", Addr: "tcp://127.0.0.1:8080"}},
		Stability: topo.Stability{Window: &off, RollbackWithin: &off}}
	for _, f := range mut {
		f(c)
	}
	return evConfig{cfg: c, version: version, hash: fmt.Sprintf("h%d", version)}
}

func surge(n int) func(*topo.PoolConfig) { return func(c *topo.PoolConfig) { c.Surge = &n } }

func restart(initial, max time.Duration) func(*topo.PoolConfig) {
	return func(c *topo.PoolConfig) {
		c.Restart = topo.Backoff{Initial: topo.Duration(initial), Max: topo.Duration(max)}
	}
}

const ms = time.Millisecond

// serving brings up generation 1 with n ready workers (w1..wn).
func (s *sim) serving(n int, mut ...func(*topo.PoolConfig)) {
	s.t.Helper()
	starts := []string{"prepare g1"}
	for i := 1; i <= n; i++ {
		starts = append(starts, fmt.Sprintf("start w%d g1", i))
	}
	s.expect("first config", s.send(poolCfg(1, n, mut...)), starts...)
	var ids []int64
	for i := 1; i <= n; i++ {
		ids = append(ids, int64(i))
	}
	got := s.ready(ids...)
	maps := "clean-maps keep "
	if mp := s.mc.desired.mp; mp != nil {
		maps += fmt.Sprint(mp.version)
	}
	s.expect("all ready", got, "publish ok g1", "notify READY=1 STATUS=serving generation 1", maps)
	if s.mc.good == nil || s.mc.good.id != 1 {
		s.t.Fatalf("generation 1 not serving: %s", s.workers())
	}
}

func TestMachineFirstGenerationStartsAtOnceAndEstablishes(t *testing.T) {
	s := newSim(t, false)
	// Nothing happens before a config.
	s.expect("no config", s.tick())
	s.serving(3)
	mem, h, _ := s.mc.snapshot()
	if mem.State != "serving" || !h.accepting || !h.ready || mem.Target != 3 {
		t.Fatalf("member %+v health %+v", mem, h)
	}
}

func TestMachineDebounce(t *testing.T) {
	s := newSim(t, false)
	s.serving(1)
	// A change waits for the debounce of quiet...
	s.at(1000 * ms)
	s.expect("change", s.send(poolCfg(2, 1)))
	s.at(1100 * ms)
	s.expect("another change resets the quiet time", s.send(poolCfg(3, 1)))
	s.at(1349 * ms)
	s.expect("still quiet-waiting", s.tick())
	if d := s.mc.nextWake(s.now); d != 1*ms {
		t.Fatalf("next wake %s, want the debounce deadline 1ms away", d)
	}
	s.at(1350 * ms)
	s.expect("after 250ms of quiet", s.tick(), "prepare g2", "notify RELOADING=1 STATUS=swapping to generation 2", "start w2 g2")
	if s.mc.latest.spec.cfgVersion != 3 {
		t.Fatalf("swapped to config %d, want the newest (3)", s.mc.latest.spec.cfgVersion)
	}
}

func TestMachineDebounceCannotBePostponedForever(t *testing.T) {
	s := newSim(t, false)
	s.serving(1)
	// A change every 200ms (under the 250ms debounce) still swaps 10
	// debounces (2.5s) after the first change of the burst.
	var started time.Duration
	for i, d := 0, time.Duration(0); d <= 4*time.Second; i, d = i+1, d+200*ms {
		s.at(5*time.Second + d)
		got := s.send(poolCfg(int64(2+i), 1))
		if len(got) > 0 && got[0] == "prepare g2" && started == 0 {
			started = d
		}
	}
	if started != 2600*ms { // the first event at or after 2.5s
		t.Fatalf("swap began %s into the burst, want 2.6s (first change + 10 debounces)", started)
	}
}

func TestMachineSurgeReplacesOneAtATime(t *testing.T) {
	s := newSim(t, false)
	s.serving(3, surge(1))
	s.at(time.Second)
	s.send(poolCfg(2, 3, surge(1)))
	s.at(time.Second + 250*ms)
	s.expect("swap starts one (3 ready + surge 1)", s.tick(), "prepare g2", "notify RELOADING=1 STATUS=swapping to generation 2", "start w4 g2")
	s.expect("w4 ready: one old retired, one more new", s.ready(4), "term w1 replaced", "start w5 g2")
	s.expect("w5 ready", s.ready(5), "term w2 replaced", "start w6 g2")
	s.expect("w6 ready: the last old one goes and the swap is done", s.ready(6),
		"term w3 replaced", "publish ok g2", "notify READY=1 STATUS=serving generation 2", "clean-maps keep ")
	for _, id := range []int64{1, 2, 3} {
		s.exit(id, "exit status 0")
	}
	if got := s.workers(); got != "w4g2:ready w5g2:ready w6g2:ready" {
		t.Fatalf("workers %s", got)
	}
}

func TestMachineSupersedeDuringSwap(t *testing.T) {
	s := newSim(t, false)
	s.serving(2)
	s.at(time.Second)
	s.send(poolCfg(2, 2))
	s.at(time.Second + 250*ms)
	s.expect("swap to g2", s.tick(), "prepare g2", "notify RELOADING=1 STATUS=swapping to generation 2", "start w3 g2", "start w4 g2")
	// A newer change before g2 is ready supersedes it: its starting
	// workers stop, and the next debounce is doubled.
	s.at(1500 * ms)
	s.expect("newer change", s.send(poolCfg(3, 2)))
	s.at(1750 * ms)
	s.expect("g3 replaces g2", s.tick(), "prepare g3",
		"notify RELOADING=1 STATUS=swapping to generation 3", "term w3 superseded", "term w4 superseded", "start w5 g3", "start w6 g3")
	if !s.mc.gens[1].superseded || s.mc.debounce() != 500*ms {
		t.Fatalf("g2 superseded %v, debounce %s (want doubled to 500ms)", s.mc.gens[1].superseded, s.mc.debounce())
	}
	// The old generation kept serving throughout.
	for _, id := range []int64{1, 2} {
		if s.w(id).state != wReady {
			t.Fatalf("w%d of the serving generation is %s", id, s.w(id).state)
		}
	}
	s.ready(5, 6)
	if s.mc.good.id != 3 || s.mc.debounce() != 250*ms {
		t.Fatalf("serving g%d, debounce %s (want g3, reset to 250ms)", s.mc.good.id, s.mc.debounce())
	}
}

func TestMachineChangeBackToServingAbandonsSwap(t *testing.T) {
	s := newSim(t, false)
	s.serving(1)
	s.at(time.Second)
	s.send(poolCfg(2, 1))
	s.at(1250 * ms)
	s.expect("swap", s.tick(), "prepare g2", "notify RELOADING=1 STATUS=swapping to generation 2", "start w2 g2")
	s.at(1300 * ms)
	s.send(poolCfg(1, 1)) // the serving config again
	s.at(1800 * ms)
	// READY=1 ends the swap's RELOADING=1: the reload is over.
	s.expect("back to g1: the starting worker stops", s.tick(),
		"notify READY=1 STATUS=swap to generation 2 abandoned; generation 1 serves", "term w2 superseded")
	if s.mc.latest != s.mc.good {
		t.Fatal("latest is not the serving generation")
	}
}

func TestMachineFailedSwapKeepsServingAndRetriesWithBackoff(t *testing.T) {
	s := newSim(t, false)
	s.serving(1, restart(time.Second, 4*time.Second))
	s.at(10 * time.Second)
	s.send(poolCfg(2, 1, restart(time.Second, 4*time.Second)))
	s.at(10*time.Second + 250*ms)
	s.tick()
	s.at(10*time.Second + 500*ms)
	// READY=1 ends the RELOADING=1 of the swap: the reload is over.
	s.expect("new worker dies at boot", s.exit(2, "exit status 3"), "publish failed g2", "notify READY=1 STATUS=swap to generation 2 failed; generation 1 serves", "clean-maps keep ")
	if s.w(1).state != wReady || !s.mc.latest.failed {
		t.Fatalf("the serving worker must keep serving: %s", s.workers())
	}
	if got := s.mc.retryAt.Sub(s.now); got != time.Second {
		t.Fatalf("retry in %s, want restart.initial 1s", got)
	}
	s.at(11*time.Second + 499*ms)
	s.expect("not before the backoff", s.tick())
	s.at(11*time.Second + 500*ms)
	s.expect("retry the same spec", s.tick(), "prepare g3", "notify RELOADING=1 STATUS=swapping to generation 3", "start w3 g3")
	s.expect("fails again", s.exit(3, "exit status 3"), "publish failed g3", "notify READY=1 STATUS=swap to generation 3 failed; generation 1 serves", "clean-maps keep ")
	if got := s.mc.retryAt.Sub(s.now); got != 2*time.Second {
		t.Fatalf("second retry in %s, want doubled to 2s", got)
	}
}

func TestMachineBadConfigAndMapAreRejected(t *testing.T) {
	s := newSim(t, true)
	s.send(evZK{zksession.StateChange{To: zksession.StateConnected}})
	s.send(evMap{exists: true, version: 5, data: []byte("m5"), doc: []byte("d5")})
	s.serving(1)
	s.expect("invalid config", s.send(evConfig{err: errors.New("workers: must be at least 1"), version: 9}), "publish invalid_config g1")
	s.expect("older map", s.send(evMap{exists: true, version: 4, data: []byte("m4")}), "publish invalid_map g1")
	s.expect("same version, other content", s.send(evMap{exists: true, version: 5, data: []byte("other")}), "publish invalid_map g1")
	s.expect("undecodable map", s.send(evMap{exists: true, err: errors.New("bad json")}), "publish invalid_map g1")
	s.expect("same map again: nothing", s.send(evMap{exists: true, version: 5, data: []byte("m5")}))
	s.expect("map deleted: keep the last", s.send(evMap{}))
	if s.mc.good.spec.mapVersion() != 5 || s.w(1).state != wReady {
		t.Fatalf("pool changed: %s map %d", s.workers(), s.mc.good.spec.mapVersion())
	}
	if !strings.Contains(s.mc.lastError, "bucket map rejected") {
		t.Fatalf("last error %q", s.mc.lastError)
	}
}

func TestMachineWaitsForTheMapInZooKeeperMode(t *testing.T) {
	s := newSim(t, true)
	s.send(evZK{zksession.StateChange{To: zksession.StateConnected}})
	s.expect("config before the map watch reported", s.send(poolCfg(1, 1)))
	s.expect("map arrives", s.send(evMap{exists: true, version: 7, data: []byte("m7"), doc: []byte("d7")}),
		"prepare g1", "start w1 g1")
	if s.mc.latest.spec.mapVersion() != 7 {
		t.Fatal("generation without the map")
	}
	s.at(time.Second)
	s.send(evMap{exists: true, version: 8, data: []byte("m8"), doc: []byte("d8")})
	s.at(1250 * ms)
	s.expect("a map change is a swap", s.tick(), "prepare g2", "term w1 superseded", "start w2 g2")
}

func TestMachineCrashRespawnBackoff(t *testing.T) {
	s := newSim(t, false)
	s.serving(2, restart(time.Second, 4*time.Second))
	s.at(time.Minute)
	s.expect("crash", s.exit(1, "signal: segmentation fault"), "clean-maps keep ")
	if got := s.mc.respawnAt.Sub(s.now); got != time.Second {
		t.Fatalf("respawn in %s, want 1s", got)
	}
	s.at(time.Minute + 999*ms)
	s.expect("not yet", s.tick())
	s.at(time.Minute + time.Second)
	s.expect("respawn", s.tick(), "start w3 g1")
	s.at(time.Minute + 1100*ms)
	s.expect("crashes again before it was ready long", s.exit(3, "exit status 1"), "clean-maps keep ")
	if got := s.mc.respawnAt.Sub(s.now); got != 2*time.Second {
		t.Fatalf("respawn in %s, want doubled to 2s", got)
	}
	for i := 0; i < 5; i++ {
		s.at(s.mc.respawnAt.Sub(s.t0))
		got := s.tick()
		id := s.mc.workers[len(s.mc.workers)-1].id
		s.expect("respawn", got, fmt.Sprintf("start w%d g1", id))
		s.exit(id, "exit status 1")
	}
	if got := s.mc.respawnAt.Sub(s.now); got != 4*time.Second {
		t.Fatalf("respawn in %s, want capped at restart.max 4s", got)
	}
	// A worker that stays ready for restart.max resets the count.
	s.at(s.mc.respawnAt.Sub(s.t0))
	s.tick()
	id := s.mc.workers[len(s.mc.workers)-1].id
	s.ready(id)
	s.at(s.now.Sub(s.t0) + 4*time.Second)
	s.exit(id, "exit status 1")
	if got := s.mc.respawnAt.Sub(s.now); got != time.Second {
		t.Fatalf("respawn after a long-lived worker in %s, want back to 1s", got)
	}
}

func TestMachineStartFailureDropsTheRestOfTheBatch(t *testing.T) {
	s := newSim(t, false)
	s.failStart[1] = true
	s.expect("first start fails: the swap fails, w2 and w3 are never started",
		s.send(poolCfg(1, 3)), "prepare g1", "start w1 g1 (fails)", "publish failed g1")
	if len(s.mc.workers) != 0 {
		t.Fatalf("workers left: %s", s.workers())
	}
	// An established generation retries with backoff instead.
	s = newSim(t, false)
	s.serving(2, restart(time.Second, 4*time.Second))
	s.at(time.Minute)
	s.exit(1, "killed")
	s.exit(2, "killed")
	s.at(time.Minute + time.Second)
	s.failStart[3] = true
	s.expect("respawn fails", s.tick(), "start w3 g1 (fails)")
	if got := s.mc.respawnAt.Sub(s.now); got != 2*time.Second {
		t.Fatalf("retry in %s, want 2s", got)
	}
	s.at(time.Minute + 3*time.Second)
	s.expect("respawn again, both", s.tick(), "start w5 g1", "start w6 g1")
}

func TestMachinePrepareFailureFailsTheSwap(t *testing.T) {
	s := newSim(t, false)
	s.serving(1)
	s.at(time.Second)
	s.send(poolCfg(2, 1, func(c *topo.PoolConfig) { c.Listen = []topo.Listen{{Name: "http", Addr: "tcp://127.0.0.1:9999"}} }))
	s.failPrepare[2] = true
	s.at(1250 * ms)
	s.expect("bind fails: no start, no RELOADING", s.tick(), "prepare g2", "publish failed g2")
	if !s.mc.bound["tcp://127.0.0.1:8080"] || s.mc.bound["tcp://127.0.0.1:9999"] {
		t.Fatalf("bound %v", s.mc.bound)
	}
}

func TestMachineReadinessTimeoutFailsTheSwap(t *testing.T) {
	s := newSim(t, false)
	s.serving(1)
	s.at(time.Second)
	s.send(poolCfg(2, 1, func(c *topo.PoolConfig) { c.Readiness.Timeout = topo.Duration(5 * time.Second) }))
	s.at(1250 * ms)
	s.tick()
	s.at(6249 * ms)
	s.expect("not yet", s.tick())
	s.at(6250 * ms)
	s.expect("timeout", s.tick(), "term w2 readiness_timeout", "publish failed g2", "notify READY=1 STATUS=swap to generation 2 failed; generation 1 serves")
}

func TestMachineMaxLifetimeRecycles(t *testing.T) {
	s := newSim(t, false)
	s.serving(2, surge(1), func(c *topo.PoolConfig) { c.MaxLifetime = topo.Duration(time.Hour) })
	s.at(time.Hour - ms)
	s.expect("not yet", s.tick())
	s.at(time.Hour)
	s.expect("both retire; one replacement within the surge", s.tick(), "start w3 g1")
	s.expect("replacement ready: the oldest goes, the next replacement starts", s.ready(3), "term w1 max_lifetime", "start w4 g1")
	s.expect("second replacement", s.ready(4), "term w2 max_lifetime")
}

func TestMachineWatchdog(t *testing.T) {
	s := newSim(t, false)
	s.serving(1, func(c *topo.PoolConfig) { c.Watchdog = topo.Duration(time.Second) })
	s.at(900 * ms)
	s.send(evNotify{s.w(1), workerproto.Message{Watchdog: true}})
	s.at(1900 * ms)
	s.expect("pinged in time", s.tick())
	s.at(1901 * ms)
	s.expect("silent too long: inspected, stack dump; a replacement starts", s.tick(), "inspect w1 watchdog", "quit w1", "start w2 g1")
	s.at(1901*ms + WatchdogKillDelay)
	s.expect("then SIGKILL", s.tick(), "kill w1 watchdog")
	s.expect("its exit is a crash: respawn after backoff", s.exit(1, "signal: killed"), "clean-maps keep ")
	if s.mc.respawnAt.IsZero() {
		t.Fatal("no respawn scheduled")
	}
}

func TestMachineZooKeeperLossKillsAndHoldsDown(t *testing.T) {
	s := newSim(t, true)
	s.mc.startState(zksession.StateConnected)
	s.send(evMap{exists: true, version: 1, data: []byte("m1"), doc: []byte("d1")})
	s.serving(2)
	s.at(time.Second)
	s.expect("suspended: serve on", s.send(evZK{zksession.StateChange{To: zksession.StateSuspended}}))
	s.expect("lost: kill everything, close the sockets",
		s.send(evZK{zksession.StateChange{To: zksession.StateLost, Reason: "session expired"}}),
		"kill w1 zk_lost", "kill w2 zk_lost", "close-sockets all", "notify STATUS=zookeeper session lost; not serving")
	mem, h, _ := s.mc.snapshot()
	if mem.State != "lost" || h.accepting {
		t.Fatalf("member %+v health %+v", mem, h)
	}
	s.exit(1, "signal: killed")
	s.exit(2, "signal: killed")
	s.at(2 * time.Second)
	s.expect("back: hold down", s.send(evZK{zksession.StateChange{To: zksession.StateConnected, NewSession: true}}))
	s.at(3 * time.Second)
	s.expect("suspended during holddown: lost again", s.send(evZK{zksession.StateChange{To: zksession.StateSuspended}}))
	s.at(4 * time.Second)
	s.send(evZK{zksession.StateChange{To: zksession.StateConnected}})
	s.at(6999 * ms)
	s.expect("holding down", s.tick())
	s.at(7 * time.Second)
	s.expect("holddown over: re-read ZooKeeper", s.tick(), "resync")
	s.expect("one resync at a time", s.tick())
	s.expect("a failed re-read waits", s.send(evResync{err: errors.New("connection loss")}))
	s.at(8 * time.Second)
	s.expect("retry", s.tick(), "resync")
	s.expect("serving again at once, no debounce",
		s.send(evResync{cfg: poolCfg(1, 2), mp: evMap{exists: true, version: 2, data: []byte("m2"), doc: []byte("d2")}}),
		"prepare g2", "start w3 g2", "start w4 g2")
	s.ready(3, 4)
	if s.mc.good.id != 2 || s.mc.good.spec.mapVersion() != 2 {
		t.Fatalf("serving %d with map %d", s.mc.good.id, s.mc.good.spec.mapVersion())
	}
}

func TestMachineStartsLostWithoutASession(t *testing.T) {
	s := newSim(t, true)
	s.mc.startState(zksession.StateSuspended)
	s.send(evMap{exists: true, version: 1, data: []byte("m1"), doc: []byte("d1")})
	s.expect("no session yet: nothing runs", s.send(poolCfg(1, 1)))
	s.expect("the first session needs no holddown", s.send(evZK{zksession.StateChange{To: zksession.StateConnected}}),
		"prepare g1", "start w1 g1")
}

func TestMachineStop(t *testing.T) {
	s := newSim(t, false)
	s.serving(2, func(c *topo.PoolConfig) { c.GracefulTimeout = topo.Duration(10 * time.Second) })
	s.expect("TERM: graceful", s.send(evSignal{syscall.SIGTERM}),
		"notify STOPPING=1", "close-sockets all", "term w1 shutdown", "term w2 shutdown")
	s.exit(1, "exit status 0")
	s.at(10 * time.Second)
	s.expect("graceful timeout", s.tick(), "kill w2 shutdown")
	if s.mc.stopDone {
		t.Fatal("done before the last worker exited")
	}
	s.exit(2, "signal: killed")
	if !s.mc.stopDone {
		t.Fatal("not done after the last worker exited")
	}
	// A second TERM during a graceful stop makes it fast.
	s = newSim(t, false)
	s.serving(1)
	s.send(evSignal{syscall.SIGTERM})
	s.expect("second TERM: fast", s.send(evSignal{syscall.SIGTERM}), "notify STOPPING=1", "kill w1 shutdown")
}

func TestMachineTTINTTOU(t *testing.T) {
	s := newSim(t, false)
	s.serving(2)
	s.at(time.Second)
	s.expect("TTIN", s.send(evSignal{syscall.SIGTTIN}), "start w3 g1")
	s.ready(3)
	s.expect("TTOU: newest ready goes", s.send(evSignal{syscall.SIGTTOU}), "term w3 scale_down")
	s.send(evSignal{syscall.SIGTTOU})
	s.send(evSignal{syscall.SIGTTOU})
	if s.mc.target() != 1 {
		t.Fatalf("target %d, never below 1", s.mc.target())
	}
	s.expect("HUP asks the executor to reload", s.send(evSignal{syscall.SIGHUP}), "reload")
}

func TestMachineListenChangeClosesOldSocketAfterSwap(t *testing.T) {
	s := newSim(t, false)
	s.serving(1)
	s.at(time.Second)
	s.send(poolCfg(2, 1, func(c *topo.PoolConfig) { c.Listen = []topo.Listen{{Name: "http", Addr: "tcp://127.0.0.1:9999"}} }))
	s.at(1250 * ms)
	s.tick()
	s.expect("swap done: the old address closes", s.ready(2), "term w1 replaced", "publish ok g2",
		"notify READY=1 STATUS=serving generation 2", "close-sockets keep tcp://127.0.0.1:9999", "clean-maps keep ")
}

// reloadMode is a pool that takes new maps in place.
func reloadMode(sig string) func(*topo.PoolConfig) {
	return func(c *topo.PoolConfig) {
		c.MapDelivery = topo.MapDelivery{Mode: topo.MapDeliveryReload, Signal: sig, AckTimeout: topo.Duration(5 * time.Second)}
	}
}

func mapEv(v uint64) evMap {
	return evMap{exists: true, version: v, data: []byte(fmt.Sprint("m", v)), doc: []byte(fmt.Sprint("d", v))}
}

func ack(w *worker, v uint64) evNotify {
	return evNotify{w, workerproto.Message{MapVersion: v}}
}

// reloadServing brings up a ZooKeeper-mode reload pool of n ready workers
// on map version 1.
func reloadServing(t *testing.T, n int, sig string) *sim {
	t.Helper()
	s := newSim(t, true)
	s.send(evZK{zksession.StateChange{To: zksession.StateConnected}})
	s.send(mapEv(1))
	want := []string{"write-live-map m1", "prepare g1"}
	for i := 1; i <= n; i++ {
		want = append(want, fmt.Sprintf("start w%d g1", i))
	}
	s.expect("first config", s.send(poolCfg(1, n, surge(1), reloadMode(sig))), want...)
	for i := 1; i <= n; i++ {
		s.ready(int64(i))
	}
	if s.mc.good == nil || s.mc.good.id != 1 {
		t.Fatalf("not serving: %s", s.workers())
	}
	return s
}

func (s *sim) memberMap() uint64 {
	s.t.Helper()
	mem, _, _ := s.mc.snapshot()
	return mem.MapVersion
}

func TestMachineReloadModeDeliversMapsInPlace(t *testing.T) {
	s := reloadServing(t, 2, "SIGUSR2")
	if v := s.memberMap(); v != 1 {
		t.Fatalf("member map version %d, want 1 (the live file at the workers' start)", v)
	}
	s.at(time.Second)
	s.expect("a new map: rewritten in place and announced, no generation", s.send(mapEv(2)),
		"write-live-map m2", "map-signal w1 SIGUSR2 m2", "map-signal w2 SIGUSR2 m2")
	s.at(2 * time.Second)
	s.expect("no swap after the debounce either", s.tick())
	if s.mc.latest.id != 1 || s.mc.nextGen != 1 {
		t.Fatalf("a generation was created: %s", s.workers())
	}
	s.expect("w1 acknowledges", s.send(ack(s.w(1), 2)))
	if v := s.memberMap(); v != 1 {
		t.Fatalf("member map version %d with w2 still on 1; want 1 (the slowest ready worker)", v)
	}
	s.send(ack(s.w(2), 2))
	if v := s.memberMap(); v != 2 {
		t.Fatalf("member map version %d after both acknowledged, want 2", v)
	}
	mem, _, _ := s.mc.snapshot()
	if mem.MapDelivery != topo.MapDeliveryReload || mem.Workers[0].MapVersion != 2 {
		t.Fatalf("member record %+v", mem)
	}
	// A config change still swaps generations, and the new workers start
	// on the live file.
	s.at(3 * time.Second)
	s.send(poolCfg(2, 2, surge(1), reloadMode("SIGUSR2")))
	s.at(3*time.Second + 250*ms)
	s.expect("config change swaps", s.tick(), "prepare g2", "notify RELOADING=1 STATUS=swapping to generation 2", "start w3 g2")
	if s.w(3).mapVersion != 2 {
		t.Fatalf("new worker starts on map %d, want the live 2", s.w(3).mapVersion)
	}
}

func TestMachineReloadModeReplacesASilentWorker(t *testing.T) {
	s := reloadServing(t, 2, "")
	s.at(time.Second)
	s.expect("no signal configured: the workers watch the file", s.send(mapEv(2)), "write-live-map m2")
	s.send(ack(s.w(1), 2))
	s.at(6*time.Second - ms)
	s.expect("within ack_timeout", s.tick())
	if d := s.mc.nextWake(s.now); d != ms {
		t.Fatalf("next wake %s, want the ack deadline in 1ms", d)
	}
	s.at(6 * time.Second)
	s.expect("w2 is silent: replaced by a worker that starts on the new map", s.tick(), "start w3 g1")
	if s.w(3).mapVersion != 2 {
		t.Fatalf("replacement on map %d", s.w(3).mapVersion)
	}
	if v := s.memberMap(); v != 1 {
		t.Fatalf("member map %d while the silent worker still serves, want 1", v)
	}
	s.expect("replacement ready: the silent one drains", s.ready(3), "term w2 map_ack_timeout")
	if v := s.memberMap(); v != 2 {
		t.Fatalf("member map %d after the replacement, want 2", v)
	}
	if n := counterValue(s.mc.m.mapAckTimeouts); n != 1 {
		t.Fatalf("map_ack_timeouts_total %v", n)
	}
}

func TestMachineReloadModeBootingWorkerIsAskedWhenReady(t *testing.T) {
	s := reloadServing(t, 1, "SIGHUP")
	s.at(time.Second)
	s.send(poolCfg(2, 1, surge(1), reloadMode("SIGHUP")))
	s.at(time.Second + 250*ms)
	s.expect("config swap", s.tick(), "prepare g2", "notify RELOADING=1 STATUS=swapping to generation 2", "start w2 g2")
	s.expect("a map while w2 boots: only the ready worker is signalled", s.send(mapEv(2)), "write-live-map m2", "map-signal w1 SIGHUP m2")
	s.expect("w2 ready without saying which map it read: asked now, swap completes",
		s.ready(2), "map-signal w2 SIGHUP m2", "term w1 replaced", "publish ok g2", "notify READY=1 STATUS=serving generation 2", "clean-maps keep 2")
	s.send(ack(s.w(2), 2))
	if v := s.memberMap(); v != 2 {
		t.Fatalf("member map %d", v)
	}
	// A worker that says which map it read is not asked again.
	s.at(2 * time.Second)
	s.send(mapEv(3))
	s.send(ack(s.w(2), 3))
	s.send(evSignal{syscall.SIGTTIN})
	s.expect("w3 says MAPVERSION=3 before READY=1", s.send(evNotify{s.w(3), workerproto.Message{MapVersion: 3}}))
	s.expect("ready: nothing to ask", s.ready(3))
}

func TestMachineReloadModeLiveMapWriteFailure(t *testing.T) {
	s := reloadServing(t, 1, "SIGUSR1")
	s.at(time.Second)
	acts := s.mc.handle(mapEv(2), s.now)
	acts = append(acts, s.mc.reconcile(s.now)...)
	var got []string
	for i := 0; i < len(acts); i++ {
		if s.mc.skip(acts[i]) {
			continue
		}
		got = append(got, acts[i].String())
		if a, ok := acts[i].(actWriteLiveMap); ok {
			acts = slices.Insert(acts, i+1, s.mc.liveMapFailed(a.mp, errors.New("disk full"), s.now)...)
		}
	}
	s.expect("the signal after a failed write is skipped", got, "write-live-map m2")
	if !s.w(1).mapAsked.IsZero() {
		t.Fatal("a worker was held to an ack for a file that was not written")
	}
	s.at(2 * time.Second)
	s.expect("retried a second later", s.tick(), "write-live-map m2", "map-signal w1 SIGUSR1 m2")
}

func TestMapSignalsCoverTheConfigsChoices(t *testing.T) {
	for _, name := range topo.MapSignals {
		if _, ok := workerproto.MapSignal(name); !ok {
			t.Errorf("topo.MapSignals allows %s but the supervisor cannot send it", name)
		}
	}
}

// counterValue reads a counter without the testutil package (and its
// extra dependency).
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// failStaticSim is a ZooKeeper-mode pool of 2 ready workers whose session
// loss is checked with the peers.
func failStaticSim(t *testing.T) *sim {
	t.Helper()
	s := newSim(t, true)
	s.mc.cfg.failStatic = true
	s.mc.startState(zksession.StateConnected)
	s.send(mapEv(1))
	s.serving(2)
	s.at(time.Second)
	s.send(evZK{zksession.StateChange{To: zksession.StateSuspended}})
	s.expect("lost: ask the peers before anything else, still serving",
		s.send(evZK{zksession.StateChange{To: zksession.StateLost, Reason: "no answer for 2/3 of the session timeout"}}), "check-peers")
	if _, h, _ := s.mc.snapshot(); !h.accepting {
		t.Fatalf("stopped accepting while the peers were asked: %+v", h)
	}
	return s
}

func TestMachineFailStaticWhenThePeersAgree(t *testing.T) {
	s := failStaticSim(t)
	s.expect("3 of 4 peers answer, none connected: fail-static, nothing killed",
		s.send(evPeers{peerVerdict{known: 4, answered: 3}}), "notify STATUS=fail-static: ZooKeeper unreachable for the whole fleet; serving the last config and map")
	mem, h, _ := s.mc.snapshot()
	if mem.State != "fail-static" || !h.accepting || !h.ready || !h.failStatic || !strings.Contains(h.reason, "fail-static") ||
		mem.FailStatic == nil || mem.FailStatic.Peers != 3 || !mem.FailStatic.Until.IsZero() {
		t.Fatalf("member %+v health %+v", mem, h)
	}
	if counterValue(s.mc.m.failStaticEpisodes) != 1 {
		t.Fatal("fail_static_episodes_total not counted")
	}
	s.expect("HUP is refused", s.send(evSignal{syscall.SIGHUP}))
	s.expect("a crashed worker is respawned as usual", s.exit(1, "exit status 1"), "clean-maps keep 1")
	s.at(2 * time.Second)
	s.expect("respawn after the backoff", s.tick(), "start w3 g1")
	s.at(3 * time.Second)
	s.expect("the peers are asked again", s.tick(), "check-peers")
	s.expect("one question at a time", s.tick())
	s.expect("still an outage", s.send(evPeers{peerVerdict{known: 4, answered: 4}}))
	s.at(4 * time.Second)
	s.expect("back: serving normally at once, no holddown, no swap",
		s.send(evZK{zksession.StateChange{To: zksession.StateConnected, NewSession: true}}), "notify STATUS=serving")
	mem, _, _ = s.mc.snapshot()
	if mem.State == "fail-static" || mem.FailStatic == nil || mem.FailStatic.Until.IsZero() || s.mc.mode != modeRunning {
		t.Fatalf("after the outage: mode %s member %+v", s.mc.mode, mem)
	}
	if s.mc.good.id != 1 {
		t.Fatalf("generation %d", s.mc.good.id)
	}
}

// Fail-static and cut-off are states, not bugs: each is logged when it
// begins (the whole-ensemble outage at Error, since someone must bring
// ZooKeeper back; the rest at Warn), and a fail-static reminder comes once
// a minute, not every 10 s and not at every peer recheck (every 2 s).
func TestMachineFailStaticLogsOncePerStateChange(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	count := func(level zapcore.Level, prefix string) int {
		return logs.Filter(func(e observer.LoggedEntry) bool {
			return e.Level == level && strings.HasPrefix(e.Message, prefix)
		}).Len()
	}
	s := failStaticSim(t)
	s.mc.log = zap.New(core)
	s.send(evPeers{peerVerdict{known: 2, answered: 2}})
	if n := count(zapcore.ErrorLevel, "FAIL-STATIC: ZooKeeper is down"); n != 1 {
		t.Fatalf("%d entry errors", n)
	}
	checks := 0
	for d := 3 * time.Second; d <= 151*time.Second; d += time.Second {
		s.at(d)
		if slices.Contains(s.tick(), "check-peers") {
			checks++
			s.send(evPeers{peerVerdict{known: 2, answered: 2}})
		}
	}
	// 150 s of fail-static: reminders at 61 s and 121 s.
	if n := count(zapcore.WarnLevel, "FAIL-STATIC continues"); checks < 50 || n != 2 {
		t.Fatalf("%d peer checks, %d reminders; want 2 reminders", checks, n)
	}
	cut := peerVerdict{grace: 4 * time.Second, known: 2, answered: 2, connected: []string{"web/b"}}
	for d := 152 * time.Second; s.mc.mode == modeFailStatic; d += time.Second {
		s.at(d)
		if slices.Contains(s.tick(), "check-peers") {
			s.send(evPeers{cut})
		}
	}
	if n := count(zapcore.WarnLevel, "fail-static: the peers no longer confirm"); n != 1 {
		t.Fatalf("the grace logged %d times", n)
	}
	if count(zapcore.WarnLevel, "fail-static ends") != 1 || count(zapcore.WarnLevel, "zookeeper session lost; killed") != 1 {
		t.Fatalf("leaving service: %v", logs.All())
	}
	if n := logs.FilterLevelExact(zapcore.ErrorLevel).Len(); n != 1 {
		t.Fatalf("%d errors; want only the outage's", n)
	}

	// Cut off at the first check: warnings only.
	core, logs = observer.New(zap.InfoLevel)
	s = failStaticSim(t)
	s.mc.log = zap.New(core)
	s.send(evPeers{peerVerdict{known: 3, answered: 3, connected: []string{"web/b"}}})
	if logs.FilterLevelExact(zapcore.ErrorLevel).Len() != 0 || count(zapcore.WarnLevel, "the peers do not confirm") != 1 {
		t.Fatalf("cut off: %v", logs.All())
	}
}

func TestMachineCutOffHostLeavesService(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    peerVerdict
	}{
		{"a peer is connected", peerVerdict{known: 3, answered: 3, connected: []string{"web/b"}}},
		{"too few answer", peerVerdict{known: 4, answered: 2}},
		{"no peer known", peerVerdict{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := failStaticSim(t)
			s.expect("leave service", s.send(evPeers{tc.v}),
				"kill w1 zk_lost", "kill w2 zk_lost", "close-sockets all", "notify STATUS=zookeeper session lost; not serving")
			if mem, h, _ := s.mc.snapshot(); mem.State != "lost" || h.accepting {
				t.Fatalf("member %+v health %+v", mem, h)
			}
		})
	}
}

func TestMachineFailStaticEndsWhenAPeerReconnects(t *testing.T) {
	s := failStaticSim(t)
	s.send(evPeers{peerVerdict{known: 2, answered: 2}})
	s.at(3 * time.Second)
	s.expect("ask again", s.tick(), "check-peers")
	cut := peerVerdict{grace: 4 * time.Second, known: 2, answered: 2, connected: []string{"web/b"}}
	s.expect("a peer reached ZooKeeper: this host's session gets the grace to come back too", s.send(evPeers{cut}))
	s.at(5 * time.Second)
	s.expect("asked again within the grace", s.tick(), "check-peers")
	s.expect("still within the grace", s.send(evPeers{cut}))
	s.at(7 * time.Second)
	s.expect("asked again at the end of the grace", s.tick(), "check-peers")
	s.expect("grace over and this host still has no session: leave",
		s.send(evPeers{cut}),
		"kill w1 zk_lost", "kill w2 zk_lost", "close-sockets all", "notify STATUS=zookeeper session lost; not serving")
	if mem, _, _ := s.mc.snapshot(); mem.FailStatic == nil || mem.FailStatic.Until.IsZero() {
		t.Fatalf("episode not closed: %+v", mem.FailStatic)
	}
	if counterValue(s.mc.m.failStaticEpisodes) != 1 {
		t.Fatal("episodes")
	}
}

func TestMachineSessionBackWhileAskingThePeers(t *testing.T) {
	s := failStaticSim(t)
	s.expect("back before the answer", s.send(evZK{zksession.StateChange{To: zksession.StateConnected}}))
	s.expect("a late answer changes nothing", s.send(evPeers{peerVerdict{known: 2, answered: 0}}))
	if s.mc.mode != modeRunning || s.mc.failStatic != nil {
		t.Fatalf("mode %s fail-static %+v", s.mc.mode, s.mc.failStatic)
	}
}

func TestMachineFailStaticSessionBackWithinTheGrace(t *testing.T) {
	s := failStaticSim(t)
	s.send(evPeers{peerVerdict{known: 2, answered: 2}})
	s.at(3 * time.Second)
	s.tick()
	s.expect("a peer reconnected first", s.send(evPeers{peerVerdict{grace: 4 * time.Second, known: 2, answered: 2, connected: []string{"web/b"}}}))
	s.at(4 * time.Second)
	s.expect("our session is back within the grace: nothing killed", s.send(evZK{zksession.StateChange{To: zksession.StateConnected, NewSession: true}}), "notify STATUS=serving")
	if s.mc.mode != modeRunning {
		t.Fatalf("mode %s", s.mc.mode)
	}
}

// A member with no ready worker routes nothing: it reports the map its
// newest generation starts on, not 0 (which would make it a straggler of
// every move and hold GC back while it boots).
func TestMachineMemberMapVersionWhileBooting(t *testing.T) {
	s := newSim(t, true)
	s.send(evZK{zksession.StateChange{To: zksession.StateConnected}})
	s.send(mapEv(3))
	s.send(poolCfg(1, 2))
	if v := s.memberMap(); v != 3 {
		t.Fatalf("booting member reports map %d, want 3", v)
	}
}
