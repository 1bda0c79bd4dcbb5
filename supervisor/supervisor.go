// Package supervisor is shardvisor's prefork process supervisor. It binds a
// pool's listen sockets once, runs worker processes that inherit them by the
// systemd convention (LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID), gates workers
// on readiness (READY=1 on a per-worker NOTIFY_SOCKET, or a timer), and
// replaces them generation by generation whenever the pool config (in
// ZooKeeper, or a local file) or the bucket map changes, without ever
// letting the number of ready workers drop below the target.
//
// It is two halves. The machine (machine.go, reconcile.go) takes every
// decision as a pure function of events and the clock and returns actions
// (start, stop, kill, publish...). The executor (this file, process.go,
// sockets.go, mapfile.go, sources.go, publish.go) is one goroutine, the
// loop, that feeds it events (config and map updates, worker exits and
// notifications, signals, ZooKeeper state changes, timers) and carries out
// its actions; everything else only posts events to the loop, and nothing
// on the loop waits for ZooKeeper. See docs/supervisor.md for the
// operator's view.
package supervisor

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/workerproto"
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
	// AdminTLS, when set, serves the admin endpoints over TLS with its
	// configuration (a client certificate of its CA required: load
	// balancer probes, metrics scrapers and peers) and makes the peers'
	// fail-static question over TLS with its certificate (peers.go). An
	// admin address off loopback without it is open to every host that
	// reaches it.
	AdminTLS *tls.Config
	// AdminTLSClient, when set with AdminTLS, gives the configuration
	// the peers' question dials a peer's host with (one that reads
	// rotated files at each dial, pki's Reloading); else AdminTLS serves
	// for both.
	AdminTLSClient func(host string) *tls.Config
	Debounce       time.Duration // quiet time after a change before a swap starts
	Holddown       time.Duration // stable connected time after a session loss before serving again

	// ShimPath is the executable started as the exec shim (see ShimArg);
	// default os.Executable(). It must call MaybeRunShim first thing.
	ShimPath string
	// Stdout and Stderr of workers; default the supervisor's.
	Stdout, Stderr *os.File

	// NoFailStatic makes a lost session always take the pool out of
	// service, as an isolated host must, without asking the peers
	// whether the whole ensemble is down (failstatic.go).
	NoFailStatic bool
	// PeerSecret authenticates the peers' answers (peers.go); empty:
	// unauthenticated, with the risk docs/supervisor.md describes.
	PeerSecret []byte
	// PeerRefresh is how often the peer list is re-read from the member
	// records (default DefaultPeerRefresh, with +20% jitter).
	PeerRefresh time.Duration

	// UpgradeExec is the binary SIGUSR2 starts as the new supervisor
	// (upgrade.go); default os.Executable() as resolved by New.
	UpgradeExec string
	// UpgradeArgs are its arguments; default os.Args[1:].
	UpgradeArgs []string
	// UpgradeTimeout is how long the new supervisor has to establish its
	// first generation (default DefaultUpgradeTimeout).
	UpgradeTimeout time.Duration

	Logger   *zap.Logger
	Registry *prometheus.Registry // default: a new one with Go and process collectors
}

// Supervisor runs one pool. Create it with New, run it with Run.
type Supervisor struct {
	env    *env // the process environment (env.go)
	opts   Options
	log    *zap.Logger
	m      *metrics
	host   string
	events chan any
	http   *http.Server
	// adminLn is the admin server's listener; it counts the connections
	// accepted and not yet closed, which stopAdmin waits for.
	adminLn *trackedListener
	// adminServed is closed when the admin server's Serve has returned:
	// from then on adminLn has counted every connection it accepted.
	adminServed chan struct{}
	admin       string

	// start starts a worker process: startOSProcess, or a fake in tests.
	start startProcess

	snapMu     sync.Mutex
	snap       topo.PoolMember
	health     healthState
	lastStatus topo.PoolStatus

	fileMu   sync.Mutex // local mode: config contents seen, for versions
	fileLast []byte
	fileN    int64

	clusterMu sync.Mutex
	cluster   *topo.ClusterRecord // read once, for the seed in map files

	// Owned by the loop goroutine.
	mc        *machine
	sockets   map[string]*boundSocket
	procs     map[*worker]process
	probes    map[*worker]*probeRun // HTTP probes running (probe.go)
	sampled   sampleSet             // workers the sampler looks at (sampler.go)
	startedAt time.Time
	updatedAt time.Time    // when the member record last changed (publish.go)
	loopAt    atomic.Int64 // unix nanos of the loop's last turn (/livez)
	// The service manager's watchdog (pingWatchdog): half its interval
	// (0: none) and when the next ping is due. Owned by the loop.
	wdEvery   time.Duration
	wdNext    time.Time
	pub       *publisher
	memberReg *topo.PoolMemberRegistration // claimed before anything starts (member.go)
	takenOver atomic.Pointer[error]        // set when another supervisor claimed our name (member.go)

	peers      peerSet
	peerClient peerHTTP

	up upgrade // the pool lock and binary upgrades (upgrade.go)
}

// New checks the options. Nothing is bound or started until Run.
func New(opts Options) (*Supervisor, error) { return newSupervisor(osEnv, opts) }

// newSupervisor is New with the process environment e (tests give a fake).
func newSupervisor(e *env, opts Options) (*Supervisor, error) {
	if (opts.Session == nil) == (opts.ConfigFile == "") {
		return nil, errors.New("supervisor: exactly one of a ZooKeeper session and a config file is needed")
	}
	if err := topo.ValidName("pool", opts.Pool); err != nil {
		return nil, err
	}
	if opts.ConfigFile != "" {
		// Fail now rather than serve nothing until the file appears.
		if _, err := os.Stat(opts.ConfigFile); err != nil {
			return nil, fmt.Errorf("supervisor: config file: %w", err)
		}
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
	if opts.PeerRefresh <= 0 {
		opts.PeerRefresh = DefaultPeerRefresh
	}
	if opts.ConfigPoll <= 0 {
		opts.ConfigPoll = DefaultConfigPoll
	}
	if opts.ShimPath == "" {
		exe, err := e.executable()
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
		opts.StateDir = defaultStateDir(e, opts.Pool)
	}
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("supervisor: state directory: %w", err)
	}
	if opts.UpgradeExec == "" {
		exe, err := e.executable()
		if err != nil {
			return nil, fmt.Errorf("supervisor: finding its own executable for upgrades: %w", err)
		}
		opts.UpgradeExec = exe
	}
	if opts.UpgradeArgs == nil {
		opts.UpgradeArgs = os.Args[1:]
	}
	if opts.UpgradeTimeout <= 0 {
		opts.UpgradeTimeout = DefaultUpgradeTimeout
	}
	// The pool lock first: nothing in the state directory is touched, and
	// nothing bound or published, by a second supervisor of the pool.
	up, err := prepareState(e, &opts)
	if err != nil {
		return nil, err
	}
	s := &Supervisor{
		env:        e,
		opts:       opts,
		log:        opts.Logger.With(zap.String("pool", opts.Pool)),
		m:          newMetrics(opts.Registry),
		host:       host,
		events:     make(chan any, 256),
		start:      startOSProcess,
		sockets:    map[string]*boundSocket{},
		procs:      map[*worker]process{},
		probes:     map[*worker]*probeRun{},
		peerClient: newPeerHTTP(opts.AdminTLS, opts.AdminTLSClient),
		up:         *up,
	}
	mcfg := machineConfig{pool: opts.Pool, zk: opts.Session != nil, configWhere: opts.ConfigFile,
		debounce: opts.Debounce, holddown: opts.Holddown, jitter: 0.2, failStatic: opts.Session != nil && !opts.NoFailStatic,
		stoppedWarn: stoppedWarnAfter, stoppedReplace: stoppedReplaceAfter, upgradeExec: opts.UpgradeExec}
	if up.ready != nil {
		mcfg.takeOverFrom = up.parent
	}
	if opts.Session != nil {
		mcfg.configWhere, mcfg.mapWhere = opts.Paths.PoolConfig(opts.Pool), opts.Paths.Map()
	}
	s.mc = newMachine(mcfg, s.log, s.m)
	if opts.Session == nil {
		s.m.setZK("none")
	}
	return s, nil
}

// DefaultStateDir is $RUNTIME_DIRECTORY (set by systemd's
// RuntimeDirectory=) or a directory under the system temp dir.
func DefaultStateDir(pool string) string { return defaultStateDir(osEnv, pool) }

func defaultStateDir(e *env, pool string) string {
	if d := e.getenv("RUNTIME_DIRECTORY"); d != "" {
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
// TTIN/TTOU one worker more/less, USR2 upgrade to a new binary (upgrade.go).
func (s *Supervisor) Signal(sig os.Signal) {
	if sig == syscall.SIGUSR2 {
		s.post(evUpgrade{}) // refused before the loop runs (member.go's claimWait)
		return
	}
	s.post(evSignal{sig})
}

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
	s.wdEvery = workerproto.WatchdogInterval(false) / 2
	defer s.releaseUpgrade() // last: the pool lock outlives everything else
	if err := s.startAdmin(); err != nil {
		return err
	}
	defer s.stopAdmin()
	if s.opts.Session != nil {
		// Before anything is bound, spawned or published: one live
		// supervisor per member name (member.go).
		if stop, err := s.claimMember(ctx); err != nil || stop {
			return err
		}
	}
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
		// Before the first connect this is the timeout asked for; the
		// session's state log says the negotiated one once connected.
		s.log.Info("zookeeper session timeout", zap.Duration("session_timeout", s.opts.Session.SessionTimeout()),
			zap.Stringer("state", s.opts.Session.State()))
		if s.opts.Session.State() == zksession.StateConnected {
			s.m.zkSessionTimeout.Set(s.opts.Session.SessionTimeout().Seconds())
		}
		// Subscribe before reading the state: a connect in between is
		// then delivered as an event rather than missed (which left a
		// supervisor "lost" for good, 1 start in about 200 in bench/fleet).
		zkSub := s.opts.Session.Subscribe()
		s.mc.startState(s.opts.Session.State())
		s.pub = newPublisher(s)
		s.pub.reg = s.memberReg
		srcWG.Add(1)
		go func() { defer srcWG.Done(); s.pub.run(srcCtx) }()
		s.startZKSources(srcCtx, &srcWG, zkSub)
	} else {
		srcWG.Add(1)
		go func() { defer srcWG.Done(); s.pollFile(srcCtx) }()
	}
	srcWG.Add(1)
	go func() { defer srcWG.Done(); s.runSampler(srcCtx) }()
	s.log.Info("supervisor started", zap.String("member", s.opts.Member), zap.Int("pid", os.Getpid()),
		zap.String("state_dir", s.opts.StateDir), zap.String("admin", s.AdminAddr()), zap.Stringer("mode", s.mc.mode))

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	ctxDone := ctx.Done()
	for {
		now := time.Now()
		s.loopAt.Store(now.UnixNano())
		s.apply(s.mc.reconcile(now), now)
		s.publishSnapshot(now)
		if s.mc.stopDone {
			s.finish()
			if err := s.takenOver.Load(); err != nil {
				return *err
			}
			return nil
		}
		wake := s.mc.nextWake(now)
		if next := s.pingWatchdog(now); !next.IsZero() {
			wake = min(wake, max(time.Millisecond, next.Sub(now)))
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
			now := time.Now()
			if ex, ok := ev.(evExit); ok {
				s.reap(ex.w)
			}
			s.apply(s.mc.handle(ev, now), now)
		case <-timer.C:
		case <-ctxDone:
			ctxDone = nil
			s.apply(s.mc.handle(evStop{}, time.Now()), time.Now())
		}
	}
}

// apply carries out the machine's actions in order. Preparing a
// generation and starting a worker can fail; the machine hears of it at
// once, and its answer is carried out next, before the rest of the batch.
func (s *Supervisor) apply(acts []action, now time.Time) {
	for i := 0; i < len(acts); i++ {
		a := acts[i]
		if s.mc.skip(a) {
			continue
		}
		switch a := a.(type) {
		case actPrepare:
			if err := s.prepare(a.g); err != nil {
				acts = slices.Insert(acts, i+1, s.mc.prepareFailed(a.g, err, now)...)
				continue
			}
			acts = slices.Insert(acts, i+1, s.mc.prepared(a.g)...)
		case actStart:
			// Debug: the moment the machine chose, before the fork's own cost.
			s.log.Debug("starting worker", zap.Int64("worker", a.w.id), zap.Int64("generation", a.w.gen.id))
			p, probeAddr, err := s.spawn(a.w)
			if err != nil {
				acts = slices.Insert(acts, i+1, s.mc.startFailed(a.w, err, now)...)
				continue
			}
			s.procs[a.w] = p
			s.sampled.add(a.w, sampled{pid: p.pid(), mem: a.w.gen.spec.cfg.MaxMemory > 0})
			if probeAddr != "" {
				s.startProbe(a.w, probeAddr, *a.w.gen.spec.cfg.Probe)
			}
			s.mc.started(a.w, p.pid())
			s.log.Info("worker started", zap.Int64("worker", a.w.id), zap.Int("pid", p.pid()), zap.Int64("generation", a.w.gen.id),
				zap.String("command", a.w.gen.spec.cfg.Command))
		case actTerm:
			if p := s.procs[a.w]; p != nil {
				p.signal(syscall.SIGTERM)
			}
		case actInspect:
			st := byte(0)
			if p := s.procs[a.w]; p != nil {
				st = procStateOf(p.pid())
			}
			acts = slices.Insert(acts, i+1, s.mc.inspected(a.w, st, now)...)
		case actQuit:
			if p := s.procs[a.w]; p != nil {
				p.signal(syscall.SIGQUIT)
			}
		case actKill:
			if p := s.procs[a.w]; p != nil {
				p.killGroup()
			}
		case actProbeNow:
			s.claimProbe(a.w)
		case actCloseSockets:
			for addr, b := range s.sockets {
				if !a.keep[addr] {
					s.closeSocket(b)
					delete(s.sockets, addr)
					if a.keep != nil {
						s.log.Info("closed listen socket no longer configured", zap.String("addr", addr))
					}
				}
			}
		case actCleanMapFiles:
			for _, name := range removeMapFiles(s.opts.StateDir, a.keep) {
				s.log.Debug("removed map file no worker uses", zap.String("file", name))
			}
		case actPublish:
			s.publishStatus(a.st)
		case actNotify:
			state := a.state
			if strings.HasPrefix(state, workerproto.Reloading) {
				state = fmt.Sprintf("%s\nMONOTONIC_USEC=%d%s", workerproto.Reloading, monotonicUsec(), strings.TrimPrefix(state, workerproto.Reloading))
			}
			s.sdNotify(state)
		case actReload:
			s.reload()
		case actResync:
			go func() { s.post(s.readZK(10 * time.Second)) }()
		case actCheckPeers:
			go func() { s.post(evPeers{s.checkPeers(context.Background())}) }()
		case actWriteLiveMap:
			if err := writeLiveMapFile(s.opts.StateDir, a.mp.doc); err != nil {
				acts = slices.Insert(acts, i+1, s.mc.liveMapFailed(a.mp, err, now)...)
			}
		case actMapSignal:
			if p, sig := s.procs[a.w], a.signal(); p != nil && sig != 0 {
				p.signal(sig)
			}
		case actStartUpgrade:
			s.startUpgrade()
		case actStopUpgrade:
			s.stopUpgrade(a)
		case actHandOver:
			s.handOver()
		case actTakeOver:
			s.takeOver(a.gen)
		}
	}
}

// reap forgets a worker that exited and kills anything it left in its
// process group (children of a forking server), so no orphan keeps
// serving.
func (s *Supervisor) reap(w *worker) {
	if p := s.procs[w]; p != nil {
		p.killGroup()
		delete(s.procs, w)
	}
	s.sampled.remove(w)
	if run := s.probes[w]; run != nil {
		run.cancel()
		delete(s.probes, w)
	}
}

// prepare binds the generation's sockets (reusing ones already bound) and
// writes its map file.
func (s *Supervisor) prepare(g *generation) error {
	for _, l := range g.spec.cfg.Listen {
		if s.sockets[l.Addr] != nil {
			continue
		}
		b, err := s.bindOrInherit(l.Addr)
		if err != nil {
			return err
		}
		s.sockets[l.Addr] = b
		s.log.Info("listening", zap.String("name", l.Name), zap.String("addr", l.Addr))
	}
	// Reload mode: the live map file is already written (actWriteLiveMap
	// comes first).
	if mp := g.spec.mp; mp != nil && !g.spec.cfg.MapDelivery.Reload() {
		if _, err := writeMapFile(s.opts.StateDir, mp.version, mp.doc); err != nil {
			return err
		}
	}
	return nil
}

// spawn starts w's process with the environment of the worker protocol
// (workerproto) and the generation's sockets as fds 3..., and returns the
// address of its private probe socket when the pool probes workers.
func (s *Supervisor) spawn(w *worker) (process, string, error) {
	g := w.gen
	cfg := g.spec.cfg
	env := workerEnv(s.env.environ(), cfg.Env)
	files := make([]*os.File, 0, len(cfg.Listen)+1)
	names := make([]string, 0, len(cfg.Listen)+1)
	for _, l := range cfg.Listen {
		b := s.sockets[l.Addr]
		if b == nil {
			return nil, "", fmt.Errorf("listen socket %s is not bound", l.Addr)
		}
		files = append(files, b.file)
		names = append(names, l.Name)
	}
	probeAddr := ""
	if cfg.Probe != nil {
		f, addr, err := bindProbe()
		if err != nil {
			return nil, "", err
		}
		defer f.Close() // the worker has its own copy once started
		files = append(files, f)
		names = append(names, workerproto.ProbeFDName)
		probeAddr = addr
	}
	if len(files) > 0 {
		env = append(env, workerproto.EnvListenFDs+"="+strconv.Itoa(len(files)), workerproto.EnvListenFDNames+"="+strings.Join(names, ":"))
	}
	env = append(env, workerproto.EnvGeneration+"="+strconv.FormatInt(g.id, 10), workerproto.EnvWorkerID+"="+strconv.FormatInt(w.id, 10))
	if wd := cfg.Watchdog.D(); wd > 0 {
		env = append(env, workerproto.EnvWatchdogUSec+"="+strconv.FormatInt(wd.Microseconds(), 10))
	}
	switch mp := g.spec.mp; {
	case mp != nil && cfg.MapDelivery.Reload():
		env = append(env, workerproto.EnvMapFile+"="+liveMapName(s.opts.StateDir),
			workerproto.EnvMapVersion+"="+strconv.FormatUint(w.mapVersion, 10), workerproto.EnvMapDelivery+"="+workerproto.MapDeliveryReload)
		if sig := cfg.MapDelivery.Signal; sig != "" {
			env = append(env, workerproto.EnvMapSignal+"="+sig)
		}
	case mp != nil:
		env = append(env, workerproto.EnvMapFile+"="+mapFileName(s.opts.StateDir, mp.version),
			workerproto.EnvMapVersion+"="+strconv.FormatUint(mp.version, 10), workerproto.EnvMapDelivery+"="+workerproto.MapDeliverySwap)
	}
	spec := procSpec{
		notifyPath: s.notifyPath(w.id),
		path:       s.opts.ShimPath,
		args:       append([]string{s.opts.ShimPath, ShimArg, cfg.Command}, cfg.Args...),
		env:        env,
		dir:        cfg.Dir,
		files:      files,
		stdout:     s.opts.Stdout,
		stderr:     s.opts.Stderr,
	}
	var refused atomic.Int64
	p, err := s.start(spec, procEvents{
		notify: func(m workerproto.Message) { s.post(evNotify{w, m}) },
		rejected: func(why string) {
			// A flood must not flood the log: the first few, then every 100th.
			s.m.notifyRejected.Inc()
			if n := refused.Add(1); n <= 5 || n%100 == 0 {
				s.log.Warn("notify datagram refused: not from the worker's process tree", zap.Int64("worker", w.id),
					zap.Int64("generation", g.id), zap.String("why", why), zap.Int64("refused", n))
			}
		},
		exited: func(status string) { s.post(evExit{w: w, status: status}) },
	})
	if err != nil {
		return nil, "", fmt.Errorf("start %s: %w", cfg.Command, err)
	}
	return p, probeAddr, nil
}

// workerEnv is the supervisor's environment without what belongs to the
// supervisor's own service manager (workerproto.ReservedEnv), plus the
// config's env.
func workerEnv(base []string, extra map[string]string) []string {
	var env []string
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if workerproto.IsReservedEnv(k) {
			continue
		}
		if _, over := extra[k]; over {
			continue
		}
		env = append(env, kv)
	}
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		env = append(env, k+"="+extra[k])
	}
	return env
}

// finish removes every map file and closes the sockets, after the last
// worker is gone.
func (s *Supervisor) finish() {
	if !s.mc.sharesState() {
		removeMapFiles(s.opts.StateDir, nil)
		_ = os.Remove(liveMapName(s.opts.StateDir))
	}
	for addr, b := range s.sockets {
		s.closeSocket(b)
		delete(s.sockets, addr)
	}
}

// pingWatchdog sends WATCHDOG=1 to the supervisor's own service manager
// (WatchdogSec=) when one is due, at half its interval, and returns when
// the next one is (zero: no watchdog). Only the loop and the wait before
// it (claimWait) call it, so a wedged loop stops the pings and gets the
// supervisor restarted. WATCHDOG_PID, when set, must name this process;
// the new supervisor of an upgrade gets none and pings once it is the
// main process (NOTIFY_SOCKET is set only then).
func (s *Supervisor) pingWatchdog(now time.Time) time.Time {
	if s.wdEvery <= 0 {
		return time.Time{}
	}
	if !now.Before(s.wdNext) {
		s.sdNotify(workerproto.Watchdog)
		s.wdNext = now.Add(s.wdEvery)
	}
	return s.wdNext
}

// sdNotify tells the supervisor's own service manager, if any.
func (s *Supervisor) sdNotify(state string) {
	if _, err := workerproto.Notify(state); err != nil {
		s.log.Warn("sd_notify failed", zap.Error(err))
	}
}

func monotonicUsec() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Sec*1e6 + ts.Nsec/1e3
}

// newPeerHTTP asks the peers without keep-alive (an answer must come from
// the peer as it is now, on a fresh connection), over TLS with cfg when
// set, or with what clientFor gives each peer's host.
func newPeerHTTP(cfg *tls.Config, clientFor func(host string) *tls.Config) peerHTTP {
	tr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: cfg}
	p := peerHTTP{c: &http.Client{Transport: tr}, scheme: "http://"}
	if cfg != nil || clientFor != nil {
		p.scheme = "https://"
	}
	if clientFor != nil {
		tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			raw, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			c := tls.Client(raw, clientFor(host))
			if err := c.HandshakeContext(ctx); err != nil {
				raw.Close()
				return nil, err
			}
			return c, nil
		}
	}
	return p
}
