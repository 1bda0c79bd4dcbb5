// Package supervisor is shardvisor's prefork process supervisor. It binds a
// pool's listen sockets once, runs worker processes that inherit them by the
// systemd convention (LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID), gates workers
// on readiness (READY=1 on a per-worker NOTIFY_SOCKET, or a timer), and
// replaces them generation by generation whenever the pool config (in
// ZooKeeper, or a local file) or the bucket map changes, without ever
// letting the number of ready workers drop below the target.
//
// All decisions are taken by one goroutine, the loop, from events (config
// and map updates, worker exits and notifications, signals, ZooKeeper state
// changes) and deadlines; everything else only posts events to it. See
// docs/supervisor.md for the operator's view.
package supervisor

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// Defaults of Options.
const (
	DefaultDebounce   = 250 * time.Millisecond
	DefaultHolddown   = 3 * time.Second
	DefaultConfigPoll = time.Second
	DefaultAdminAddr  = "127.0.0.1:9180"
	// MaxDebounce caps the debounce after consecutive superseded swaps.
	MaxDebounce = 4 * time.Second
	// WatchdogKillDelay is the time between the watchdog's SIGQUIT (which
	// makes Go programs, and Python ones with faulthandler registered,
	// print every stack) and SIGKILL.
	WatchdogKillDelay = 5 * time.Second
)

// Options configure a Supervisor. Exactly one of Session (ZooKeeper mode)
// and ConfigFile (local mode) must be set.
type Options struct {
	Pool   string // pool name (also used in local mode, for logs and the state dir)
	Member string // this supervisor's member name; default <host>-<pid>

	Session *zksession.Session
	Paths   topo.Paths

	ConfigFile string        // local mode: JSON pool config, polled for changes
	ConfigPoll time.Duration // local mode poll interval

	// StateDir holds the map files handed to workers.
	StateDir string
	// AdminAddr is the HTTP address of /healthz, /readyz, /metrics and
	// /status; "" disables it.
	AdminAddr string
	Debounce  time.Duration // quiet time after a change before a swap starts
	Holddown  time.Duration // stable connected time after a session loss before serving again

	// ShimPath is the executable started as the exec shim (see ShimArg);
	// default os.Executable(). It must call MaybeRunShim first thing.
	ShimPath string
	// Stdout and Stderr of workers; default the supervisor's.
	Stdout, Stderr *os.File

	Logger   *zap.Logger
	Registry *prometheus.Registry // default: a new one with Go and process collectors
}

// Supervisor runs one pool. Create it with New, run it with Run.
type Supervisor struct {
	cluster *topo.ClusterRecord // read once, for the seed in map files
	opts    Options
	log     *zap.Logger
	m       *metrics
	host    string
	events  chan any
	http    *http.Server
	admin   string

	snapMu     sync.Mutex
	snap       topo.PoolMember
	health     healthState
	lastStatus topo.PoolStatus

	fileMu   sync.Mutex // local mode: config contents seen, for versions
	fileLast []byte
	fileN    int64

	// Everything below is owned by the loop goroutine.
	mode          mode
	desired       *spec // newest valid config (+ map) seen
	cfgVersion    int64 // version of the config in desired
	curMap        *mapData
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
	sockets       map[string]*boundSocket
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
	startedAt     time.Time
	notifiedUp    bool
	pub           *publisher
}

type mode int

const (
	modeRunning  mode = iota
	modeLost          // session lost: no workers, sockets closed
	modeHolddown      // session back: waiting for it to stay connected
	modeStopping      // graceful or fast stop
)

func (m mode) String() string {
	return [...]string{"running", "lost", "holddown", "stopping"}[m]
}

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

func (s *spec) key() string {
	mv := uint64(0)
	if s.mp != nil {
		mv = s.mp.version
	}
	return fmt.Sprintf("c%d/%s/m%d/r%d", s.cfgVersion, s.cfgHash, mv, s.reload)
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
	sockets     []*boundSocket // in config order
	names       []string
	mapFile     string
	created     time.Time
	established bool
	failed      bool
	superseded  bool
}

type wstate int

const (
	wStarting wstate = iota
	wReady
	wStopping
)

func (s wstate) String() string { return [...]string{"starting", "ready", "stopping"}[s] }

type worker struct {
	id         int64
	gen        *generation
	cmd        *exec.Cmd
	pid        int
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
	crashLike  bool // stopped by the watchdog: counts as a crash
	notify     *notifySock
}

type notifySock = notifySocket

// Events posted to the loop.
type (
	evConfig struct {
		cfg     *topo.PoolConfig // nil with err == nil: no config
		version int64
		hash    string
		err     error
		force   bool // HUP: swap even if unchanged
	}
	evMap struct {
		exists bool
		data   []byte
		force  bool
	}
	evExit struct {
		w     *worker
		state *os.ProcessState
		err   error
	}
	evNotify struct {
		w   *worker
		msg notifyMsg
	}
	evZK     struct{ ch zksession.StateChange }
	evSignal struct{ sig os.Signal }
	evResync struct {
		cfg evConfig
		mp  evMap
		err error
	}
	evStop struct{ fast bool }
)

type healthState struct {
	accepting bool
	ready     bool
	reason    string
}

// New checks the options. Nothing is bound or started until Run.
func New(opts Options) (*Supervisor, error) {
	if (opts.Session == nil) == (opts.ConfigFile == "") {
		return nil, errors.New("supervisor: exactly one of a ZooKeeper session and a config file is needed")
	}
	if err := topo.ValidName("pool", opts.Pool); err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	if opts.Member == "" {
		opts.Member = defaultMember(host)
	}
	if err := topo.ValidName("member", opts.Member); err != nil {
		return nil, fmt.Errorf("%v (set --member)", err)
	}
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	if opts.Holddown <= 0 {
		opts.Holddown = DefaultHolddown
	}
	if opts.ConfigPoll <= 0 {
		opts.ConfigPoll = DefaultConfigPoll
	}
	if opts.ShimPath == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("supervisor: finding its own executable for the exec shim: %w", err)
		}
		opts.ShimPath = exe
	}
	if opts.Stdout == nil {
		opts.Stdout = os.Stdout
	}
	if opts.Stderr == nil {
		opts.Stderr = os.Stderr
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.StateDir == "" {
		opts.StateDir = DefaultStateDir(opts.Pool)
	}
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("supervisor: state directory: %w", err)
	}
	s := &Supervisor{
		opts:    opts,
		log:     opts.Logger.With(zap.String("pool", opts.Pool)),
		m:       newMetrics(opts.Registry),
		host:    host,
		events:  make(chan any, 256),
		sockets: map[string]*boundSocket{},
	}
	if opts.Session == nil {
		s.mapKnown = true
		s.m.setZK("none")
	}
	return s, nil
}

// DefaultStateDir is $RUNTIME_DIRECTORY (set by systemd's
// RuntimeDirectory=) or a directory under the system temp dir.
func DefaultStateDir(pool string) string {
	if d := os.Getenv("RUNTIME_DIRECTORY"); d != "" {
		return filepath.Join(strings.Split(d, ":")[0], pool)
	}
	return filepath.Join(os.TempDir(), "shardvisor-supervisor-"+pool)
}

func defaultMember(host string) string {
	h := strings.ToLower(host)
	var b strings.Builder
	for _, r := range h {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	name := strings.Trim(b.String(), "-_")
	suffix := "-" + strconv.Itoa(os.Getpid())
	if len(name) > 63-len(suffix) {
		name = name[:63-len(suffix)]
	}
	if name == "" {
		name = "host"
	}
	return name + suffix
}

// post hands an event to the loop.
func (s *Supervisor) post(ev any) { s.events <- ev }

// Signal makes the supervisor act on a signal as described in
// docs/supervisor.md: HUP reload, TERM/INT graceful stop, QUIT fast stop,
// TTIN/TTOU one worker more/less.
func (s *Supervisor) Signal(sig os.Signal) { s.post(evSignal{sig}) }

// Stop asks for a graceful (or fast) stop; Run returns when it is done.
func (s *Supervisor) Stop(fast bool) { s.post(evStop{fast}) }

// Status returns the supervisor's current member record.
func (s *Supervisor) Status() topo.PoolMember {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	m := s.snap
	m.Workers = append([]topo.WorkerInfo(nil), s.snap.Workers...)
	return m
}

// AdminAddr is the address the admin HTTP server listens on ("" if none).
func (s *Supervisor) AdminAddr() string {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	return s.admin
}

// Run supervises the pool until ctx is done or a stop signal arrives, then
// stops the workers gracefully and returns. Cancelling ctx is a graceful
// stop.
func (s *Supervisor) Run(ctx context.Context) error {
	s.startedAt = time.Now()
	if err := s.startAdmin(); err != nil {
		return err
	}
	defer s.stopAdmin()
	srcCtx, stopSources := context.WithCancel(context.Background())
	var srcWG sync.WaitGroup
	defer func() {
		stopSources()
		// Sources may be blocked posting to the loop; drain until they end.
		done := make(chan struct{})
		go func() { srcWG.Wait(); close(done) }()
		for drained := false; !drained; {
			select {
			case <-s.events:
			case <-done:
				drained = true
			}
		}
		if s.pub != nil {
			s.pub.deleteMember()
		}
		s.log.Info("supervisor stopped")
	}()
	if s.opts.Session != nil {
		s.zkState = s.opts.Session.State()
		s.m.setZK(s.zkState.String())
		s.pub = newPublisher(s)
		srcWG.Add(1)
		go func() { defer srcWG.Done(); s.pub.run(srcCtx) }()
		s.startZKSources(srcCtx, &srcWG)
		if s.zkState != zksession.StateConnected {
			// Serve nothing until a session proves we may.
			s.mode = modeLost
		} else {
			s.connectedOnce = true
		}
	} else {
		srcWG.Add(1)
		go func() { defer srcWG.Done(); s.pollFile(srcCtx) }()
	}
	s.log.Info("supervisor started", zap.String("member", s.opts.Member), zap.Int("pid", os.Getpid()),
		zap.String("state_dir", s.opts.StateDir), zap.String("admin", s.AdminAddr()), zap.Stringer("mode", s.mode))

	// The supervisor's own service manager watchdog (WatchdogSec=): ping
	// from the loop at half the interval, so a wedged loop gets restarted.
	var wdEvery time.Duration
	var wdNext time.Time
	if usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64); err == nil && usec > 0 &&
		(os.Getenv("WATCHDOG_PID") == "" || os.Getenv("WATCHDOG_PID") == strconv.Itoa(os.Getpid())) {
		wdEvery = time.Duration(usec) * time.Microsecond / 2
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	ctxDone := ctx.Done()
	for {
		now := time.Now()
		s.reconcile(now)
		s.publishSnapshot(now)
		if s.stopDone {
			s.finish()
			return nil
		}
		if wdEvery > 0 && !now.Before(wdNext) {
			s.sdNotify("WATCHDOG=1")
			wdNext = now.Add(wdEvery)
		}
		wake := s.nextWake(now)
		if wdEvery > 0 {
			wake = min(wake, max(time.Millisecond, wdNext.Sub(now)))
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wake)
		select {
		case ev := <-s.events:
			s.handle(ev, time.Now())
		case <-timer.C:
		case <-ctxDone:
			ctxDone = nil
			s.beginStop(false, "context cancelled", time.Now())
		}
	}
}

// ---------------------------------------------------------------- events

func (s *Supervisor) handle(ev any, now time.Time) {
	switch ev := ev.(type) {
	case evConfig:
		s.onConfig(ev, now)
	case evMap:
		s.onMap(ev, now)
	case evExit:
		s.onExit(ev, now)
	case evNotify:
		s.onNotify(ev, now)
	case evZK:
		s.onZK(ev.ch, now)
	case evSignal:
		s.onSignal(ev.sig, now)
	case evResync:
		s.onResync(ev, now)
	case evStop:
		s.beginStop(ev.fast, "stop requested", now)
	}
}

func (s *Supervisor) onConfig(ev evConfig, now time.Time) {
	if ev.err != nil {
		s.m.configErrors.Inc()
		s.m.swaps.WithLabelValues(topo.SwapInvalidConfig).Inc()
		s.setError("config rejected: " + ev.err.Error())
		s.log.Error("config rejected; the pool keeps running the previous one", zap.Error(ev.err))
		s.publishStatus(topo.SwapInvalidConfig, nil, ev.err.Error(), 0, now)
		return
	}
	if ev.cfg == nil {
		if s.desired == nil {
			s.log.Warn("no pool config yet; waiting for one", zap.String("where", s.configWhere()))
		} else {
			s.log.Warn("pool config disappeared; keeping the last one", zap.String("where", s.configWhere()))
		}
		return
	}
	eff := ev.cfg.Effective()
	sp := &spec{cfg: eff, cfgVersion: ev.version, cfgHash: ev.hash, mp: s.curMap, reload: s.reloadSeq}
	if ev.force {
		s.reloadSeq++
		sp.reload = s.reloadSeq
	}
	if s.desired != nil && s.desired.key() == sp.key() {
		return
	}
	if s.desired == nil || s.desired.cfgVersion != ev.version || s.desired.cfgHash != ev.hash {
		s.extra = 0 // a new config says how many workers; TTIN/TTOU adjust from there
	}
	s.desired = sp
	s.cfgVersion = ev.version
	s.log.Info("config received", zap.Int64("config_version", ev.version), zap.Int("workers", eff.Workers), zap.String("command", eff.Command))
	s.noteChange(now)
}

func (s *Supervisor) onMap(ev evMap, now time.Time) {
	first := !s.mapKnown
	s.mapKnown = true
	if !ev.exists {
		if s.curMap != nil {
			s.log.Warn("bucket map disappeared; keeping the last good one", zap.Uint64("map_version", s.curMap.version))
		} else if first {
			s.log.Info("no bucket map; workers start without SHARDVISOR_MAP_FILE", zap.String("path", s.opts.Paths.Map()))
		}
		return
	}
	var (
		v   uint64
		doc []byte
		err error
	)
	if s.cluster == nil {
		// The seed never changes: read the cluster record once.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s.cluster, err = topo.ReadCluster(ctx, s.opts.Session, s.opts.Paths)
		cancel()
	}
	if err == nil {
		v, doc, err = MapDocument(s.cluster, s.opts.Paths.Map(), ev.data)
	}
	if err == nil && s.curMap != nil && !ev.force {
		switch {
		case v < s.curMap.version:
			err = fmt.Errorf("map_version %d is older than the applied %d", v, s.curMap.version)
		case v == s.curMap.version && string(ev.data) != string(s.curMap.data):
			err = fmt.Errorf("map_version %d changed content without a new version", v)
		case v == s.curMap.version:
			return
		}
	}
	if err != nil {
		s.m.mapErrors.Inc()
		s.m.swaps.WithLabelValues(topo.SwapInvalidMap).Inc()
		s.setError("bucket map rejected: " + err.Error())
		s.log.Error("bucket map rejected; keeping the last good one", zap.Error(err))
		s.publishStatus(topo.SwapInvalidMap, nil, err.Error(), 0, now)
		return
	}
	s.curMap = &mapData{version: v, data: append([]byte(nil), ev.data...), doc: doc}
	s.log.Info("bucket map received", zap.Uint64("map_version", v), zap.Int("bytes", len(ev.data)))
	if s.desired != nil {
		sp := *s.desired
		sp.mp = s.curMap
		s.desired = &sp
	}
	s.noteChange(now)
}

func (s *Supervisor) noteChange(now time.Time) {
	if s.changeFirst.IsZero() {
		s.changeFirst = now
	}
	s.changeLast = now
}

// debounced reports whether a pending change may start a swap: after
// Debounce of quiet, or 10 Debounces after the first change of a burst, so
// a steady trickle cannot postpone swaps forever.
func (s *Supervisor) debounced(now time.Time) bool {
	if s.changeFirst.IsZero() {
		return true
	}
	return !now.Before(s.debounceAt())
}

// debounce is Options.Debounce doubled for each swap superseded in a row
// (up to MaxDebounce), reset when a swap completes. During a storm of
// changes faster than workers boot, every generation started would be
// thrown away unready: backing off spends that CPU on the serving
// generation instead, and the pool still converges on the newest change
// one debounce after the storm ends.
func (s *Supervisor) debounce() time.Duration {
	d := s.opts.Debounce
	for i := 0; i < s.supersedes && d < MaxDebounce; i++ {
		d *= 2
	}
	return min(d, max(MaxDebounce, s.opts.Debounce))
}

func (s *Supervisor) debounceAt() time.Time {
	d := s.debounce()
	a, b := s.changeLast.Add(d), s.changeFirst.Add(10*d)
	if b.Before(a) {
		return b
	}
	return a
}

func (s *Supervisor) onNotify(ev evNotify, now time.Time) {
	w := ev.w
	if !s.hasWorker(w) {
		return
	}
	if ev.msg.watchdog {
		w.lastPing = now
	}
	if ev.msg.status != "" {
		s.log.Debug("worker status", zap.Int64("worker", w.id), zap.String("status", ev.msg.status))
	}
	if ev.msg.ready && w.state == wStarting && w.notified.IsZero() {
		if cfg := w.gen.spec.cfg; cfg.Readiness.Mode == topo.ReadinessNotify && cfg.Readiness.Delay > 0 {
			w.notified = now // ready after the settle delay (reconcile)
			return
		}
		s.markReady(w, now, "READY=1")
	}
}

func (s *Supervisor) markReady(w *worker, now time.Time, how string) {
	w.state = wReady
	w.readyAt = now
	w.lastPing = now
	s.m.readiness.Observe(now.Sub(w.started).Seconds())
	cfg := w.gen.spec.cfg
	if cfg.MaxLifetime > 0 {
		life := cfg.MaxLifetime.D()
		if j := cfg.MaxLifetimeJitter.D(); j > 0 {
			life += time.Duration(rand.Int64N(int64(j)))
		}
		w.retireAt = w.started.Add(life)
	}
	s.log.Info("worker ready", zap.Int64("worker", w.id), zap.Int("pid", w.pid), zap.Int64("generation", w.gen.id),
		zap.Duration("after", now.Sub(w.started).Round(time.Millisecond)), zap.String("by", how))
}

func (s *Supervisor) onExit(ev evExit, now time.Time) {
	w := ev.w
	if !s.hasWorker(w) {
		return
	}
	s.removeWorker(w)
	w.notify.close()
	// Reap anything the worker left in its process group (children of a
	// forking server), so no orphan keeps serving.
	_ = syscall.Kill(-w.pid, syscall.SIGKILL)
	status := exitString(ev.state, ev.err)
	g := w.gen
	switch {
	case w.state == wStopping && !w.crashLike:
		s.m.exits.WithLabelValues("expected").Inc()
		s.log.Info("worker exited", zap.Int64("worker", w.id), zap.Int("pid", w.pid), zap.Int64("generation", g.id),
			zap.String("status", status), zap.String("stop_reason", w.stopReason))
	case w.state == wStarting && !g.established && !g.failed && g == s.latest:
		s.m.exits.WithLabelValues("boot_failure").Inc()
		s.failGeneration(g, fmt.Sprintf("worker %d (pid %d) exited before it was ready: %s", w.id, w.pid, status), now)
	case g == s.latest && !g.established:
		// A worker of a swap that already failed, or one that became ready
		// and then crashed mid-swap: fail the swap.
		s.m.exits.WithLabelValues("crash").Inc()
		if !g.failed {
			s.failGeneration(g, fmt.Sprintf("worker %d (pid %d) exited during the swap: %s", w.id, w.pid, status), now)
		}
	default:
		s.m.exits.WithLabelValues("crash").Inc()
		s.noteCrash(w, now)
		s.log.Warn("worker crashed", zap.Int64("worker", w.id), zap.Int("pid", w.pid), zap.Int64("generation", g.id),
			zap.String("status", status), zap.Stringer("was", w.state), zap.Duration("respawn_in", s.respawnAt.Sub(now).Round(time.Millisecond)))
	}
	s.cleanMapFiles()
}

func exitString(st *os.ProcessState, err error) string {
	if st == nil {
		if err != nil {
			return err.Error()
		}
		return "unknown"
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Exited() && ws.ExitStatus() == 127 {
		return "exit status 127 (the command could not be executed; see the worker's stderr)"
	}
	return st.String()
}

// noteCrash schedules the respawn of a crashed worker: restart.initial,
// doubling per consecutive crash up to restart.max, with ±20% jitter. A
// worker that stayed ready for restart.max resets the count.
func (s *Supervisor) noteCrash(w *worker, now time.Time) {
	b := w.gen.spec.cfg.Restart
	if !w.readyAt.IsZero() && now.Sub(w.readyAt) >= b.Max.D() {
		s.crashCount = 0
	}
	s.crashCount++
	s.respawnAt = now.Add(backoff(b.Initial.D(), b.Max.D(), s.crashCount))
}

func backoff(initial, max time.Duration, n int) time.Duration {
	d := initial
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	j := time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
	return j
}

// failGeneration abandons a swap: the previous good generation keeps (or
// goes back to) serving; the same spec is retried after a backoff unless a
// newer change arrives first.
func (s *Supervisor) failGeneration(g *generation, reason string, now time.Time) {
	g.failed = true
	s.failCount++
	b := g.spec.cfg.Restart
	s.retryAt = now.Add(backoff(b.Initial.D(), b.Max.D(), s.failCount))
	s.m.swaps.WithLabelValues(topo.SwapFailed).Inc()
	s.setError("swap failed: " + reason)
	fields := []zap.Field{zap.Int64("generation", g.id), zap.String("reason", reason), zap.Duration("retry_in", s.retryAt.Sub(now).Round(time.Millisecond))}
	if s.good != nil {
		fields = append(fields, zap.Int64("serving_generation", s.good.id))
	}
	s.log.Error("swap failed; the previous generation keeps serving", fields...)
	s.publishStatus(topo.SwapFailed, g, reason, 0, now)
	for _, w := range s.workers {
		if w.gen == g && w.state == wStarting {
			s.stopWorker(w, "swap_failed", now)
		}
	}
}

func (s *Supervisor) onSignal(sig os.Signal, now time.Time) {
	s.log.Info("signal", zap.String("signal", sig.String()))
	switch sig {
	case syscall.SIGHUP:
		s.reload()
	case syscall.SIGTERM, syscall.SIGINT:
		s.beginStop(s.mode == modeStopping, "signal "+sig.String(), now) // a second one is a fast stop
	case syscall.SIGQUIT:
		s.beginStop(true, "signal "+sig.String(), now)
	case syscall.SIGTTIN:
		s.extra++
		s.log.Info("one more worker", zap.Int("target", s.target()))
	case syscall.SIGTTOU:
		if s.target() > 1 {
			s.extra--
		}
		s.log.Info("one worker fewer", zap.Int("target", s.target()))
	}
}

func (s *Supervisor) target() int {
	var sp *spec
	switch {
	case s.latest != nil && !s.latest.failed:
		sp = s.latest.spec
	case s.good != nil:
		sp = s.good.spec
	case s.desired != nil:
		sp = s.desired
	default:
		return 0
	}
	return max(1, sp.cfg.Workers+s.extra)
}

// reload re-reads the config (and map) and forces a swap (HUP).
func (s *Supervisor) reload() {
	if s.opts.Session == nil {
		go func() {
			ev := s.readFile()
			ev.force = true
			s.post(ev)
		}()
		return
	}
	go func() {
		r := s.readZK(10 * time.Second)
		if r.err != nil {
			s.log.Error("reload: reading ZooKeeper failed; nothing changes", zap.Error(r.err))
			return
		}
		s.post(r.mp)
		r.cfg.force = true
		s.post(r.cfg)
	}()
}

func (s *Supervisor) onZK(ch zksession.StateChange, now time.Time) {
	s.zkState = ch.To
	s.m.setZK(ch.To.String())
	switch ch.To {
	case zksession.StateLost:
		if s.mode == modeRunning || s.mode == modeHolddown {
			s.enterLost(ch.Reason, now)
		}
	case zksession.StateSuspended:
		if s.mode == modeHolddown {
			s.mode = modeLost
			s.log.Warn("session suspended during holddown; waiting again")
		} else {
			s.log.Warn("zookeeper session suspended; serving on with the last good config and map", zap.String("reason", ch.Reason))
		}
	case zksession.StateConnected:
		if s.mode == modeLost && !s.connectedOnce {
			// The first session of this process: nothing was lost, and
			// the watches are about to deliver config and map.
			s.connectedOnce = true
			s.mode = modeRunning
			s.log.Info("zookeeper session connected")
			return
		}
		s.connectedOnce = true
		if s.mode == modeLost {
			s.mode = modeHolddown
			s.holdUntil = now.Add(s.opts.Holddown)
			s.log.Info("zookeeper session back; holding down before serving", zap.Duration("holddown", s.opts.Holddown), zap.Bool("new_session", ch.NewSession))
		}
	}
}

// enterLost takes this host out of service: every worker is killed and the
// sockets are closed, so connections are refused and /healthz fails.
func (s *Supervisor) enterLost(reason string, now time.Time) {
	s.mode = modeLost
	n := 0
	for _, w := range s.workers {
		if !w.killed {
			s.killWorker(w, "zk_lost")
			n++
		}
	}
	s.closeAllSockets()
	s.latest, s.good, s.gens = nil, nil, nil
	s.setError("zookeeper session lost: " + reason)
	s.log.Error("zookeeper session lost; killed workers and closed the listen sockets", zap.Int("killed", n), zap.String("reason", reason))
	s.sdNotify("STATUS=zookeeper session lost; not serving")
}

func (s *Supervisor) onResync(ev evResync, now time.Time) {
	s.resyncing = false
	if s.mode != modeHolddown {
		return
	}
	if ev.err != nil {
		s.log.Warn("re-reading config and map after the session came back failed; retrying", zap.Error(ev.err))
		s.holdUntil = now.Add(time.Second)
		return
	}
	s.mode = modeRunning
	s.crashCount, s.failCount = 0, 0
	s.retryAt, s.respawnAt = time.Time{}, time.Time{}
	s.onMap(ev.mp, now)
	s.onConfig(ev.cfg, now)
	s.changeFirst, s.changeLast = time.Time{}, time.Time{} // start at once: nothing is serving
	s.log.Info("serving again after the session loss; re-binding the listen sockets")
}

func (s *Supervisor) beginStop(fast bool, why string, now time.Time) {
	if s.mode == modeStopping && (!fast || s.stopFast) {
		return
	}
	s.mode = modeStopping
	s.stopFast = s.stopFast || fast
	s.log.Info("stopping", zap.Bool("fast", s.stopFast), zap.String("why", why), zap.Int("workers", len(s.workers)))
	s.sdNotify("STOPPING=1")
	s.closeAllSockets()
	for _, w := range s.workers {
		if s.stopFast {
			if !w.killed {
				s.killWorker(w, "fast_stop")
			}
		} else {
			s.stopWorker(w, "shutdown", now)
		}
	}
}

func (s *Supervisor) finish() {
	s.cleanMapFiles()
	s.closeAllSockets()
}

// ---------------------------------------------------------------- reconcile

func (s *Supervisor) reconcile(now time.Time) {
	// Deadlines of workers in any mode: kills, readiness, watchdog.
	for _, w := range append([]*worker(nil), s.workers...) {
		switch w.state {
		case wStopping:
			if !w.killed && !now.Before(w.killAt) {
				s.killWorker(w, "graceful_timeout")
			}
		case wStarting:
			cfg := w.gen.spec.cfg
			if cfg.Readiness.Mode == topo.ReadinessTimer && !now.Before(w.started.Add(cfg.Readiness.Delay.D())) {
				s.markReady(w, now, "timer")
			} else if !w.notified.IsZero() && !now.Before(w.notified.Add(cfg.Readiness.Delay.D())) {
				s.markReady(w, now, "READY=1 + readiness.delay")
			} else if !now.Before(w.started.Add(cfg.Readiness.Timeout.D())) {
				s.onReadinessTimeout(w, now)
			}
		case wReady:
			if wd := w.gen.spec.cfg.Watchdog.D(); wd > 0 && now.Sub(w.lastPing) > wd {
				s.log.Error("worker watchdog expired; sending SIGQUIT for a stack dump, SIGKILL follows", zap.Int64("worker", w.id),
					zap.Int("pid", w.pid), zap.Duration("silent_for", now.Sub(w.lastPing).Round(time.Millisecond)))
				w.state = wStopping
				w.stopReason = "watchdog"
				w.crashLike = true
				w.killAt = now.Add(WatchdogKillDelay)
				s.m.kills.WithLabelValues("watchdog").Inc()
				_ = syscall.Kill(w.pid, syscall.SIGQUIT)
			} else if !w.retireAt.IsZero() && !w.retiring && !now.Before(w.retireAt) {
				w.retiring = true
				s.log.Info("worker reached max_lifetime; replacing it", zap.Int64("worker", w.id), zap.Int("pid", w.pid))
			}
		}
	}
	switch s.mode {
	case modeStopping:
		if len(s.workers) == 0 {
			s.stopDone = true
		}
		return
	case modeLost:
		return
	case modeHolddown:
		if !now.Before(s.holdUntil) && !s.resyncing {
			s.resyncing = true
			go func() {
				r := s.readZK(10 * time.Second)
				s.post(r)
			}()
		}
		return
	}
	s.maybeNewGeneration(now)

	d := s.latest
	if d != nil && d.failed {
		d = s.good
	}
	// Workers that are not of d and not ready serve nobody: stop them.
	for _, w := range s.workers {
		if w.state == wStarting && w.gen != d {
			reason := "superseded"
			if w.gen.failed {
				reason = "swap_failed"
			}
			s.stopWorker(w, reason, now)
		}
	}
	if d == nil {
		return
	}
	target, surge := max(1, d.spec.cfg.Workers+s.extra), *d.spec.cfg.Surge
	var live, countD, readyD, readyTotal int
	for _, w := range s.workers {
		if w.state == wStopping {
			continue
		}
		live++
		if w.state == wReady {
			readyTotal++
		}
		if w.gen == d && !w.retiring {
			countD++
			if w.state == wReady {
				readyD++
			}
		}
	}
	// Start workers of d, within the surge, and (for a generation that is
	// already serving) not faster than the crash backoff allows.
	for countD < target && live < target+surge {
		if d.established && now.Before(s.respawnAt) {
			break
		}
		if _, err := s.spawn(d, now); err != nil {
			if d.established {
				s.crashCount++
				s.respawnAt = now.Add(backoff(d.spec.cfg.Restart.Initial.D(), d.spec.cfg.Restart.Max.D(), s.crashCount))
				s.log.Error("starting a worker failed; retrying with backoff", zap.Error(err), zap.Duration("retry_in", s.respawnAt.Sub(now)))
				break
			}
			if d == s.latest {
				s.failGeneration(d, "starting a worker: "+err.Error(), now)
			}
			return
		}
		if d.established && !s.respawnAt.IsZero() {
			s.m.restarts.Inc()
			s.respawnAt = time.Time{}
		}
		live++
		countD++
	}
	// Retire ready workers that are not of d (or are past their lifetime)
	// only while more than target are ready: oldest generation first.
	var old []*worker
	for _, w := range s.workers {
		if w.state == wReady && (w.gen != d || w.retiring) {
			old = append(old, w)
		}
	}
	sort.SliceStable(old, func(i, j int) bool {
		if old[i].gen.id != old[j].gen.id {
			return old[i].gen.id < old[j].gen.id
		}
		return old[i].started.Before(old[j].started)
	})
	for _, w := range old {
		if readyTotal <= target {
			break
		}
		reason := "replaced"
		if w.retiring && w.gen == d {
			reason = "max_lifetime"
		}
		s.stopWorker(w, reason, now)
		readyTotal--
	}
	// Too many of d (TTOU, or a config with fewer workers): starting ones
	// first, then the newest ready ones while enough stay ready.
	if countD > target {
		var mine []*worker
		for _, w := range s.workers {
			if w.gen == d && !w.retiring && w.state != wStopping {
				mine = append(mine, w)
			}
		}
		sort.SliceStable(mine, func(i, j int) bool {
			if (mine[i].state == wStarting) != (mine[j].state == wStarting) {
				return mine[i].state == wStarting
			}
			return mine[i].started.After(mine[j].started)
		})
		for _, w := range mine {
			if countD <= target {
				break
			}
			if w.state == wReady && readyTotal <= target {
				break
			}
			if w.state == wReady {
				readyTotal--
			}
			s.stopWorker(w, "scale_down", now)
			countD--
		}
	}
	if !d.established && readyD >= target {
		othersLive := false
		for _, w := range s.workers {
			if w.gen != d && w.state != wStopping {
				othersLive = true
			}
		}
		if !othersLive {
			s.establish(d, now)
		}
	}
}

func (s *Supervisor) onReadinessTimeout(w *worker, now time.Time) {
	g := w.gen
	reason := fmt.Sprintf("worker %d (pid %d) not ready after readiness.timeout %s", w.id, w.pid, g.spec.cfg.Readiness.Timeout.D())
	s.m.kills.WithLabelValues("readiness_timeout").Inc()
	w.crashLike = !(g == s.latest && !g.established) // during a swap the generation fails instead
	s.stopWorker(w, "readiness_timeout", now)
	if g == s.latest && !g.established && !g.failed {
		s.failGeneration(g, reason, now)
	} else {
		s.log.Warn("worker readiness timeout", zap.String("reason", reason))
	}
}

// maybeNewGeneration starts a swap when the desired spec differs from the
// newest generation (after the debounce), or retries a failed one.
func (s *Supervisor) maybeNewGeneration(now time.Time) {
	if s.desired == nil || !s.mapKnown {
		return
	}
	want := s.desired
	switch {
	case s.latest == nil:
	case s.latest.spec.key() != want.key():
		if !s.debounced(now) {
			return
		}
		if s.good != nil && s.good != s.latest && s.good.spec.key() == want.key() {
			// Changed back to what is serving: drop the swap in progress.
			s.supersede(s.latest, now)
			s.latest = s.good
			s.changeFirst = time.Time{}
			s.log.Info("change reverted to the serving generation; swap abandoned", zap.Int64("generation", s.good.id))
			return
		}
	case s.latest.failed && !now.Before(s.retryAt):
		// Retry the same spec.
	default:
		return
	}
	s.changeFirst = time.Time{}
	if s.latest != nil && !s.latest.established && !s.latest.failed {
		s.supersede(s.latest, now)
	}
	s.nextGen++
	g := &generation{id: s.nextGen, spec: want, created: now}
	s.gens = append(s.gens, g)
	s.latest = g
	log := s.log.With(zap.Int64("generation", g.id))
	if err := s.prepare(g); err != nil {
		s.failGeneration(g, err.Error(), now)
		return
	}
	log.Info("generation created", zap.Int64("config_version", want.cfgVersion), zap.Uint64("map_version", want.mapVersion()),
		zap.Int("workers", max(1, want.cfg.Workers+s.extra)), zap.Int("surge", *want.cfg.Surge))
	if s.good != nil {
		s.sdNotify(fmt.Sprintf("RELOADING=1\nMONOTONIC_USEC=%d\nSTATUS=swapping to generation %d", monotonicUsec(), g.id))
	}
}

func (s *Supervisor) supersede(g *generation, now time.Time) {
	g.superseded = true
	s.supersedes++
	s.m.swaps.WithLabelValues("superseded").Inc()
	s.log.Info("swap superseded by a newer change", zap.Int64("generation", g.id), zap.Duration("next_debounce", s.debounce()))
}

// prepare binds the generation's sockets (reusing ones already bound) and
// writes its map file.
func (s *Supervisor) prepare(g *generation) error {
	for _, l := range g.spec.cfg.Listen {
		b := s.sockets[l.Addr]
		if b == nil {
			var err error
			if b, err = bindSocket(l.Addr); err != nil {
				return err
			}
			s.sockets[l.Addr] = b
			s.log.Info("listening", zap.String("name", l.Name), zap.String("addr", l.Addr))
		}
		g.sockets = append(g.sockets, b)
		g.names = append(g.names, l.Name)
	}
	if mp := g.spec.mp; mp != nil {
		f, err := writeMapFile(s.opts.StateDir, mp.version, mp.doc)
		if err != nil {
			return err
		}
		g.mapFile = f
	}
	return nil
}

func (s *Supervisor) establish(g *generation, now time.Time) {
	g.established = true
	prev := s.good
	s.good = g
	s.failCount = 0
	s.supersedes = 0
	s.crashCount = 0
	s.lastError = ""
	took := now.Sub(g.created)
	s.m.swapDuration.Observe(took.Seconds())
	s.m.swaps.WithLabelValues(topo.SwapOK).Inc()
	s.m.generation.Set(float64(g.id))
	s.m.configVersion.Set(float64(g.spec.cfgVersion))
	s.m.mapVersion.Set(float64(g.spec.mapVersion()))
	fields := []zap.Field{zap.Int64("generation", g.id), zap.Int64("config_version", g.spec.cfgVersion),
		zap.Uint64("map_version", g.spec.mapVersion()), zap.Duration("took", took.Round(time.Millisecond))}
	if prev != nil {
		fields = append(fields, zap.Int64("previous", prev.id))
	}
	s.log.Info("swap complete", fields...)
	s.publishStatus(topo.SwapOK, g, "", took.Seconds(), now)
	s.sdNotify(fmt.Sprintf("READY=1\nSTATUS=serving generation %d", g.id))
	// Forget generations with no workers left.
	var keep []*generation
	for _, x := range s.gens {
		if x == g || s.genHasWorkers(x) {
			keep = append(keep, x)
		}
	}
	s.gens = keep
	s.closeUnusedSockets()
	s.cleanMapFiles()
}

func (s *Supervisor) genHasWorkers(g *generation) bool {
	for _, w := range s.workers {
		if w.gen == g {
			return true
		}
	}
	return false
}

// closeUnusedSockets closes sockets that neither the serving nor the newest
// generation lists (a config that changed its listen addresses).
func (s *Supervisor) closeUnusedSockets() {
	used := map[*boundSocket]bool{}
	for _, g := range []*generation{s.good, s.latest} {
		if g != nil {
			for _, b := range g.sockets {
				used[b] = true
			}
		}
	}
	for addr, b := range s.sockets {
		if !used[b] {
			b.close()
			delete(s.sockets, addr)
			s.log.Info("closed listen socket no longer configured", zap.String("addr", addr))
		}
	}
}

func (s *Supervisor) closeAllSockets() {
	for addr, b := range s.sockets {
		b.close()
		delete(s.sockets, addr)
	}
}

func (s *Supervisor) cleanMapFiles() {
	keep := map[uint64]bool{}
	for _, w := range s.workers {
		if w.gen.spec.mp != nil {
			keep[w.gen.spec.mp.version] = true
		}
	}
	for _, g := range []*generation{s.good, s.latest} {
		if g != nil && g.spec.mp != nil {
			keep[g.spec.mp.version] = true
		}
	}
	if s.desired != nil && s.desired.mp != nil {
		keep[s.desired.mp.version] = true
	}
	if s.mode == modeStopping && len(s.workers) == 0 {
		keep = nil
	}
	for _, name := range removeMapFiles(s.opts.StateDir, keep) {
		s.log.Debug("removed map file no worker uses", zap.String("file", name))
	}
}

// nextWake is when the loop must look again without an event.
func (s *Supervisor) nextWake(now time.Time) time.Duration {
	next := now.Add(time.Second) // watchdog and housekeeping granularity
	at := func(t time.Time) {
		if !t.IsZero() && t.Before(next) {
			next = t
		}
	}
	if !s.changeFirst.IsZero() {
		at(s.debounceAt())
	}
	if s.latest != nil && s.latest.failed {
		at(s.retryAt)
	}
	at(s.respawnAt)
	if s.mode == modeHolddown {
		at(s.holdUntil)
	}
	for _, w := range s.workers {
		cfg := w.gen.spec.cfg
		switch w.state {
		case wStopping:
			if !w.killed {
				at(w.killAt)
			}
		case wStarting:
			if cfg.Readiness.Mode == topo.ReadinessTimer {
				at(w.started.Add(cfg.Readiness.Delay.D()))
			}
			if !w.notified.IsZero() {
				at(w.notified.Add(cfg.Readiness.Delay.D()))
			}
			at(w.started.Add(cfg.Readiness.Timeout.D()))
		case wReady:
			if wd := cfg.Watchdog.D(); wd > 0 {
				at(w.lastPing.Add(wd + time.Millisecond))
			}
			at(w.retireAt)
		}
	}
	d := next.Sub(now)
	if d < time.Millisecond {
		d = time.Millisecond
	}
	return d
}

// ---------------------------------------------------------------- workers

func (s *Supervisor) spawn(g *generation, now time.Time) (*worker, error) {
	s.nextWorker++
	w := &worker{id: s.nextWorker, gen: g}
	ns, err := listenNotify(fmt.Sprintf("shardvisor/%d/%s/w%d", os.Getpid(), s.opts.Pool, w.id))
	if err != nil {
		return nil, err
	}
	w.notify = ns
	cfg := g.spec.cfg
	env := workerEnv(os.Environ(), cfg.Env)
	if len(g.sockets) > 0 {
		env = append(env, "LISTEN_FDS="+strconv.Itoa(len(g.sockets)), "LISTEN_FDNAMES="+strings.Join(g.names, ":"))
	}
	env = append(env, "NOTIFY_SOCKET="+ns.addr, "SHARDVISOR_GENERATION="+strconv.FormatInt(g.id, 10),
		"SHARDVISOR_WORKER_ID="+strconv.FormatInt(w.id, 10))
	if wd := cfg.Watchdog.D(); wd > 0 {
		env = append(env, "WATCHDOG_USEC="+strconv.FormatInt(wd.Microseconds(), 10))
	}
	if g.mapFile != "" {
		env = append(env, "SHARDVISOR_MAP_FILE="+g.mapFile, "SHARDVISOR_MAP_VERSION="+strconv.FormatUint(g.spec.mp.version, 10))
	}
	files := make([]*os.File, len(g.sockets))
	for i, b := range g.sockets {
		files[i] = b.file
	}
	cmd := &exec.Cmd{
		Path:       s.opts.ShimPath,
		Args:       append([]string{s.opts.ShimPath, ShimArg, cfg.Command}, cfg.Args...),
		Env:        env,
		Dir:        cfg.Dir,
		Stdout:     s.opts.Stdout,
		Stderr:     s.opts.Stderr,
		ExtraFiles: files,
		// Own process group: a terminal's ^C reaches only the supervisor,
		// which drains workers itself; and SIGKILL of the group also gets
		// a forking server's children.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
	}
	if err := startOnSpawnerThread(cmd); err != nil {
		ns.close()
		return nil, fmt.Errorf("start %s: %w", cfg.Command, err)
	}
	w.cmd, w.pid, w.started, w.state = cmd, cmd.Process.Pid, now, wStarting
	s.workers = append(s.workers, w)
	s.m.spawns.Inc()
	go func() {
		err := cmd.Wait()
		s.post(evExit{w: w, state: cmd.ProcessState, err: err})
	}()
	go ns.read(func(m notifyMsg) { s.post(evNotify{w, m}) })
	s.log.Info("worker started", zap.Int64("worker", w.id), zap.Int("pid", w.pid), zap.Int64("generation", g.id),
		zap.String("command", cfg.Command))
	return w, nil
}

// workerEnv is the supervisor's environment without what belongs to the
// supervisor's own service manager, plus the config's env.
func workerEnv(base []string, extra map[string]string) []string {
	drop := map[string]bool{"LISTEN_FDS": true, "LISTEN_FDNAMES": true, "LISTEN_PID": true, "NOTIFY_SOCKET": true,
		"WATCHDOG_USEC": true, "WATCHDOG_PID": true, "SHARDVISOR_MAP_FILE": true, "SHARDVISOR_MAP_VERSION": true,
		"SHARDVISOR_GENERATION": true, "SHARDVISOR_WORKER_ID": true}
	var env []string
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if drop[k] {
			continue
		}
		if _, over := extra[k]; over {
			continue
		}
		env = append(env, kv)
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+extra[k])
	}
	return env
}

// stopWorker sends SIGTERM once; SIGKILL follows after graceful_timeout.
func (s *Supervisor) stopWorker(w *worker, reason string, now time.Time) {
	if w.state == wStopping {
		return
	}
	w.state = wStopping
	w.stopReason = reason
	w.killAt = now.Add(w.gen.spec.cfg.GracefulTimeout.D())
	s.m.stops.WithLabelValues(reason).Inc()
	_ = syscall.Kill(w.pid, syscall.SIGTERM)
	s.log.Info("worker stopping", zap.Int64("worker", w.id), zap.Int("pid", w.pid), zap.Int64("generation", w.gen.id),
		zap.String("reason", reason), zap.Duration("graceful_timeout", w.gen.spec.cfg.GracefulTimeout.D()))
}

// killWorker sends SIGKILL to the worker's process group, once.
func (s *Supervisor) killWorker(w *worker, reason string) {
	if w.killed {
		return
	}
	if w.state != wStopping {
		w.stopReason = reason
	}
	w.state = wStopping
	w.killed = true
	s.m.kills.WithLabelValues(reason).Inc()
	_ = syscall.Kill(-w.pid, syscall.SIGKILL)
	_ = syscall.Kill(w.pid, syscall.SIGKILL)
	s.log.Warn("worker killed", zap.Int64("worker", w.id), zap.Int("pid", w.pid), zap.Int64("generation", w.gen.id), zap.String("reason", reason))
}

func (s *Supervisor) hasWorker(w *worker) bool {
	for _, x := range s.workers {
		if x == w {
			return true
		}
	}
	return false
}

func (s *Supervisor) removeWorker(w *worker) {
	for i, x := range s.workers {
		if x == w {
			s.workers = append(s.workers[:i], s.workers[i+1:]...)
			return
		}
	}
}

func (s *Supervisor) setError(msg string) { s.lastError = msg }

func (s *Supervisor) configWhere() string {
	if s.opts.Session != nil {
		return s.opts.Paths.PoolConfig(s.opts.Pool)
	}
	return s.opts.ConfigFile
}

func hashBytes(b []byte) string {
	h := sha256.Sum256(b)
	return fmt.Sprintf("%x", h[:8])
}

// sdNotify tells the supervisor's own service manager, if any.
func (s *Supervisor) sdNotify(state string) {
	if strings.HasPrefix(state, "READY=1") {
		s.notifiedUp = true
	}
	if _, err := SdNotify(state); err != nil {
		s.log.Warn("sd_notify failed", zap.Error(err))
	}
}

func monotonicUsec() int64 {
	var ts syscall.Timespec
	// CLOCK_MONOTONIC = 1
	_, _, _ = syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1, uintptrOf(&ts), 0)
	return ts.Sec*1e6 + ts.Nsec/1e3
}

func pid() int { return os.Getpid() }
