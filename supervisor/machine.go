package supervisor

import (
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/internal/backoff"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/workerproto"
	"github.com/shardvisor/shardvisor/zksession"
)

// machine is every decision the supervisor takes, as a pure state machine:
// events and the clock go in (handle, reconcile), actions come out. It
// starts no process, binds no socket, reads no file and never talks to
// ZooKeeper; the executor (Supervisor) does what the actions say and
// reports back what only the world can tell (a worker started, exited,
// said READY=1; a bind failed). So debounce, surge, supersede, backoff,
// max lifetime and session-loss behaviour are table-tested without
// processes or servers (machine_test.go), and the executor stays thin.
//
// A machine is used by one goroutine (the supervisor's loop).
type machine struct {
	cfg machineConfig
	// log levels: Warn for a state the supervisor handles and reports
	// itself (session lost, cut off, a bad config or map refused, a
	// rollback); Error for what an operator must act on (nothing serves,
	// a worker hung, a file it cannot write, the whole ensemble down).
	// Neither carries a stack (cliutil: stacks only at DPanic, for bugs),
	// and a state is logged when it begins, not at every turn.
	log *zap.Logger
	m   *metrics
	// randN draws the max-lifetime jitter, in [0, n); tests make it 0.
	randN func(n int64) int64

	mode          mode
	desired       *spec // newest valid config (+ map) seen
	cfgVersion    int64 // version of the config in desired
	curMap        *mapData
	liveMap       *mapData // reload mode: the map the live map file holds (nil: not written)
	liveRetryAt   time.Time
	mapKnown      bool // ZooKeeper mode: the map watch has reported once
	changeFirst   time.Time
	changeLast    time.Time
	reloadSeq     int
	extra         int // TTIN minus TTOU since the last config change
	gens          []*generation
	latest        *generation
	good          *generation
	nextGen       int64
	nextWorker    int64
	workers       []*worker
	bound         map[string]bool // listen addresses the executor holds open
	failCount     int
	supersedes    int // swaps superseded in a row (lengthens the debounce)
	retryAt       time.Time
	crashCount    int
	respawnAt     time.Time
	lastError     string
	zkState       zksession.State
	holdUntil     time.Time
	connectedOnce bool // a session was connected at least once (the first connect needs no holddown)
	resyncing     bool
	stopFast      bool
	stopDone      bool
	notifiedUp    bool
	reloading     bool             // RELOADING=1 sent, its READY=1 not yet (endReload)
	failStatic    *topo.FailStatic // the last fail-static episode
	peerCheckAt   time.Time        // fail-static: when to ask the peers again
	loudAt        time.Time        // fail-static: when to log the reminder
	cutOffSince   time.Time        // fail-static: since when the peers no longer confirm the outage
	sharedUntil   time.Time        // checking: until when to wait for our own session after a shared disruption

	// Stability (stability.go). held: configs (spec.ident) whose workers
	// stayed ready through the stability window; a change back to one
	// needs no window. prevCfg: the config that held before the serving
	// one, restarted if the serving one crash-loops before cfgSince +
	// rollback_within; cfgCrashes counts its crashes since. bad: the
	// config (spec.cfgID) rolled back, refused until it changes or HUP.
	held       map[string]bool
	prevCfg    *spec
	cfgSince   time.Time
	cfgCrashes int
	bad        string
	rollback   *topo.Rollback
	// failedCfg failed failedTries swaps in a row whose canary failed its
	// first probe (canary.go); failCfg is the config (ident) whose failed
	// swaps failCount counts for the retry backoff.
	failedCfg   string
	failedTries int
	failCfg     string
	// rollingBackTo is the config (cfgID) a crash-loop rollback restarts:
	// its generation's "ok" is published as rolled_back too, so the pool
	// status record does not lose the rollback to the swap that ends it.
	rollingBackTo string
	// lostFrom is the config that served when the session was lost: the
	// rollback target of the first generation after it (stability.go).
	lostFrom *spec
	// up is this supervisor's part in upgrades of its binary
	// (upgrade_machine.go).
	up upgradeState

	out []action // actions decided by the current call
}

// machineConfig is what a machine needs to know of its options.
type machineConfig struct {
	pool        string
	zk          bool   // ZooKeeper mode: a session and a bucket map exist
	configWhere string // the config's znode or file, for messages
	mapWhere    string // the map's znode, for messages
	debounce    time.Duration
	holddown    time.Duration
	// jitter is the random fraction of every backoff (0.2: ±20%), so that
	// a fleet that failed together does not retry together; 0 in tests.
	jitter float64
	// failStatic: on a session loss, ask the peers before leaving service
	// (failstatic.go).
	failStatic bool
	// stoppedWarn, stoppedReplace: the stopped-worker check (liveness.go);
	// zero takes the defaults.
	stoppedWarn, stoppedReplace time.Duration
	// takeOverFrom: this is the new supervisor of an upgrade, taking
	// over from that pid; upgradeExec is the binary a SIGUSR2 starts
	// (for messages).
	takeOverFrom int
	upgradeExec  string
}

func newMachine(cfg machineConfig, log *zap.Logger, m *metrics) *machine {
	if cfg.stoppedWarn <= 0 {
		cfg.stoppedWarn = stoppedWarnAfter
	}
	if cfg.stoppedReplace <= 0 {
		cfg.stoppedReplace = stoppedReplaceAfter
	}
	mc := &machine{cfg: cfg, log: log, m: m, randN: rand.Int64N, bound: map[string]bool{}, held: map[string]bool{},
		up: upgradeState{from: cfg.takeOverFrom}}
	if !cfg.zk {
		mc.mapKnown = true
	}
	return mc
}

type mode int

const (
	modeRunning    mode = iota
	modeLost            // session lost: no workers, sockets closed
	modeHolddown        // session back: waiting for it to stay connected
	modeStopping        // graceful or fast stop
	modeChecking        // session lost: asking the peers, still serving
	modeFailStatic      // the whole ensemble is down: serving the last config and map
)

func (m mode) String() string {
	return [...]string{"running", "lost", "holddown", "stopping", "checking-peers", "fail-static"}[m]
}

// serving reports whether the mode keeps the pool in service.
func (m mode) serving() bool { return m == modeRunning || m == modeChecking || m == modeFailStatic }

type mapData struct {
	version uint64
	data    []byte // the map znode, to compare versions
	doc     []byte // the map file workers get (seed + map)
}

// spec is what a generation runs: a config and a map.
type spec struct {
	cfg        topo.PoolConfig // Effective()
	cfgVersion int64
	cfgHash    string
	mp         *mapData // nil: no map
	reload     int      // bumped by HUP to force a swap
}

// key identifies what a generation runs: two specs with the same key need
// no swap between them. In reload mode the map is not part of it: a new
// map reaches the running workers in place.
func (s *spec) key() string {
	mv := s.mapVersion()
	if s.cfg.MapDelivery.Reload() {
		mv = 0
	}
	return fmt.Sprintf("c%d/%s/m%d/r%d", s.cfgVersion, s.cfgHash, mv, s.reload)
}

// ident is the config a generation runs, HUP included (a HUP may load new
// code): what the stability window proves.
func (s *spec) ident() string {
	return fmt.Sprintf("c%d/%s/r%d", s.cfgVersion, s.cfgHash, s.reload)
}

// cfgID is the config as the source holds it: a rolled-back config is
// refused until this changes (HUP retries it).
func (s *spec) cfgID() string { return fmt.Sprintf("c%d/%s", s.cfgVersion, s.cfgHash) }

// withMap is a copy of s routing by mp.
func (s *spec) withMap(mp *mapData) *spec {
	c := *s
	c.mp = mp
	return &c
}

func (s *spec) mapVersion() uint64 {
	if s.mp == nil {
		return 0
	}
	return s.mp.version
}

type generation struct {
	id          int64
	spec        *spec
	created     time.Time
	established bool
	failed      bool
	superseded  bool
	// canary: the generation starts one worker, and the rest only once
	// that one is ready (canaryPassed). Decided when it is created: a new
	// config while another generation serves (canary.go).
	canary       bool
	canaryPassed bool
	// servedBroken: the swap failed because a worker failed its first
	// probe after READY=1 (it took traffic): what counts towards refusing
	// the config.
	servedBroken bool
}

type wstate int

const (
	wStarting wstate = iota
	wReady
	wStopping
)

func (s wstate) String() string { return [...]string{"starting", "ready", "stopping"}[s] }

// worker is the machine's view of one worker process.
type worker struct {
	id         int64
	gen        *generation
	pid        int // 0 until the executor started it
	state      wstate
	started    time.Time
	readyAt    time.Time
	lastPing   time.Time
	notified   time.Time // READY=1 received, settling for readiness.delay (notify mode)
	retireAt   time.Time // max_lifetime (zero: never)
	retiring   bool
	stopReason string
	killAt     time.Time // SIGKILL deadline once stopping
	killed     bool
	crashLike  bool // stopped by the watchdog or the probe: counts as a crash
	crashNoted bool // its crash backoff was already counted when it was killed
	retireWhy  string

	// HTTP probe (pool config "probe"): passed once (a condition of
	// readiness), and failures in a row since the last pass. claimed:
	// when every other readiness condition held (READY=1 + delay), from
	// which on the worker is probed at once and its first failure kills
	// it.
	probeOK    bool
	probeFails int
	claimed    time.Time

	// Reload mode: the map version the worker routes by (the live map at
	// its start until it says MAPVERSION=N), and since when it has been
	// asked to take a newer one (zero: up to date, or not asked yet).
	mapVersion uint64
	mapAsked   time.Time

	// Liveness (liveness.go): the process state the executor last
	// reported, since when it has been stopped, whether that was logged;
	// and the message of a give-up waiting for its inspection.
	procState     byte
	stoppedSince  time.Time
	stoppedWarned bool
	giveUpMsg     string
	giveUpFields  []zap.Field

	// Recycling (recycle.go): the request count it reported and its
	// limit (drawn at its first report), and its tree's resident memory.
	requests     uint64
	requestLimit uint64
	rss          int64
}

// routes is the map version w routes by: its acknowledged one in reload
// mode, its generation's map otherwise.
func (w *worker) routes() uint64 {
	if w.gen.spec.cfg.MapDelivery.Reload() {
		return w.mapVersion
	}
	return w.gen.spec.mapVersion()
}

// Events posted to the loop.
type (
	evConfig struct {
		cfg     *topo.PoolConfig // nil with err == nil: no config
		version int64
		hash    string
		err     error
		force   bool // HUP: swap even if unchanged
	}
	// evMap is the map record, already validated and turned into the map
	// file document off the loop (mapEvent).
	evMap struct {
		exists  bool
		version uint64
		data    []byte
		doc     []byte
		err     error
		force   bool
	}
	evExit struct {
		w      *worker
		status string
	}
	evNotify struct {
		w   *worker
		msg workerproto.Message
	}
	evZK     struct{ ch zksession.StateChange }
	evSignal struct{ sig os.Signal }
	evResync struct {
		cfg evConfig
		mp  evMap
		err error
	}
	evStop struct{ fast bool }
	// evPeers is the answer of the peers to "is ZooKeeper down for you
	// too?" (actCheckPeers).
	evPeers struct{ v peerVerdict }
	// evProbe is one HTTP probe of a worker: ok, or why not; first: a
	// failure after the worker said READY=1 and before its first pass;
	// answered: the worker sent a status (not a timeout or a reset).
	evProbe struct {
		w        *worker
		ok       bool
		why      string
		first    bool
		answered bool
	}
)

// healthState is what the admin endpoints answer (admin.go): serving
// (/healthz, the load balancer's probe) is in service with at least one
// ready worker; ready (/readyz) is at least the target ready.
type healthState struct {
	accepting  bool
	serving    bool
	ready      bool
	readyN     int
	failStatic bool
	reason     string
}

// take returns the actions decided since the last take.
func (m *machine) take() []action {
	out := m.out
	m.out = nil
	return out
}

func (m *machine) do(a action) { m.out = append(m.out, a) }

// debounced reports whether a pending change may start a swap: after
// the debounce of quiet, or 10 debounces after the first change of a
// burst, so a steady trickle cannot postpone swaps forever.
func (m *machine) debounced(now time.Time) bool {
	if m.changeFirst.IsZero() {
		return true
	}
	return !now.Before(m.debounceAt())
}

// debounce is the configured debounce doubled for each swap superseded in
// a row (up to MaxDebounce), reset when a swap completes. During a storm
// of changes faster than workers boot, every generation started would be
// thrown away unready: backing off spends that CPU on the serving
// generation instead, and the pool still converges on the newest change
// one debounce after the storm ends.
func (m *machine) debounce() time.Duration {
	d := m.cfg.debounce
	for i := 0; i < m.supersedes && d < MaxDebounce; i++ {
		d *= 2
	}
	return min(d, max(MaxDebounce, m.cfg.debounce))
}

func (m *machine) debounceAt() time.Time {
	d := m.debounce()
	a, b := m.changeLast.Add(d), m.changeFirst.Add(10*d)
	if b.Before(a) {
		return b
	}
	return a
}

// backoff is the n-th (from 1) wait of a restart policy, with jitter.
func (m *machine) backoff(b topo.Backoff, n int) time.Duration {
	return backoff.Jittered(backoff.Delay(b.Initial.D(), b.Max.D(), n-1), m.cfg.jitter)
}

func (m *machine) target() int {
	var sp *spec
	switch {
	case m.latest != nil && !m.latest.failed:
		sp = m.latest.spec
	case m.good != nil:
		sp = m.good.spec
	case m.desired != nil:
		sp = m.desired
	default:
		return 0
	}
	return max(1, sp.cfg.Workers+m.extra)
}

// stopWorker sends SIGTERM once; SIGKILL follows after graceful_timeout.
func (m *machine) stopWorker(w *worker, reason string, now time.Time) {
	if w.state == wStopping {
		return
	}
	w.state = wStopping
	w.stopReason = reason
	w.killAt = now.Add(w.gen.spec.cfg.GracefulTimeout.D())
	m.m.stops.WithLabelValues(reason).Inc()
	m.do(actTerm{w})
	m.log.Info("worker stopping", zap.Int64("worker", w.id), zap.Int("pid", w.pid), zap.Int64("generation", w.gen.id),
		zap.String("reason", reason), zap.Duration("graceful_timeout", w.gen.spec.cfg.GracefulTimeout.D()))
}

// killWorker sends SIGKILL to the worker's process group, once.
func (m *machine) killWorker(w *worker, reason string) {
	if w.killed {
		return
	}
	if w.state != wStopping {
		w.stopReason = reason
	}
	w.state = wStopping
	w.killed = true
	m.m.kills.WithLabelValues(reason).Inc()
	m.do(actKill{w})
	m.log.Warn("worker killed", zap.Int64("worker", w.id), zap.Int("pid", w.pid), zap.Int64("generation", w.gen.id), zap.String("reason", reason))
}

func (m *machine) hasWorker(w *worker) bool {
	for _, x := range m.workers {
		if x == w {
			return true
		}
	}
	return false
}

func (m *machine) removeWorker(w *worker) {
	for i, x := range m.workers {
		if x == w {
			m.workers = append(m.workers[:i], m.workers[i+1:]...)
			return
		}
	}
}

// publish records a swap result.
func (m *machine) publish(result string, g *generation, msg string, secs float64, now time.Time) {
	st := topo.PoolStatus{Version: topo.PoolStatusVersion, Result: result, Error: msg, SwapSeconds: secs, At: now.UTC()}
	if g == nil {
		g = m.good
	}
	if g != nil {
		st.Generation, st.ConfigVersion, st.MapVersion = g.id, g.spec.cfgVersion, g.spec.mapVersion()
	}
	m.do(actPublish{st})
}

func (m *machine) closeAllSockets() {
	if len(m.bound) > 0 {
		m.do(actCloseSockets{})
	}
	m.bound = map[string]bool{}
}

// closeUnusedSockets closes sockets that neither the serving nor the newest
// generation lists (a config that changed its listen addresses).
func (m *machine) closeUnusedSockets() {
	keep := map[string]bool{}
	for _, g := range []*generation{m.good, m.latest} {
		if g != nil {
			for _, l := range g.spec.cfg.Listen {
				keep[l.Addr] = true
			}
		}
	}
	drop := false
	for addr := range m.bound {
		if !keep[addr] {
			delete(m.bound, addr)
			drop = true
		}
	}
	if drop {
		m.do(actCloseSockets{keep: keep})
	}
}

// cleanMapFiles removes the map files no worker, generation or pending
// change uses.
func (m *machine) cleanMapFiles() {
	if m.sharesState() {
		return // the other supervisor's workers may use them
	}
	keep := map[uint64]bool{}
	for _, w := range m.workers {
		if w.gen.spec.mp != nil {
			keep[w.gen.spec.mp.version] = true
		}
	}
	for _, g := range []*generation{m.good, m.latest} {
		if g != nil && g.spec.mp != nil {
			keep[g.spec.mp.version] = true
		}
	}
	if m.desired != nil && m.desired.mp != nil {
		keep[m.desired.mp.version] = true
	}
	if m.mode == modeStopping && len(m.workers) == 0 {
		keep = map[uint64]bool{}
	}
	m.do(actCleanMapFiles{keep: keep})
}
