// Command fleet-bench runs a whole shardvisor fleet on one machine and
// puts it through a rebalance and failures, under load, printing one
// table. Run it with bench/fleet/run (make bench-fleet), which builds the
// binaries and starts a throwaway ZooKeeper ensemble and four PostgreSQL
// nodes on ports of their own (scripts/devenv with another state
// directory), so that killing ZooKeeper breaks nobody else's tests.
//
// A fleet is a fresh cluster (a ZooKeeper subtree, a database on every db
// node) holding 2^level buckets on three nodes, with N supervisors in one
// pool, each running --workers examples/notes workers on a port of its
// own (the pool listens on 127.0.0.1:0; the load balancer finds each port
// in /proc), and R router sidecars. The load is examples/notes/loadgen's
// (create, edit, list, delete notes of many users, every write
// idempotent, every acknowledged write in a ledger) at a constant rate,
// through a health-checking load balancer in front of a sample of the
// supervisors. Scenarios (-only):
//
//	rebalance  a fourth node added and the rebalancer run (32 moves at level 7),
//	           in a fleet with map delivery "swap" and one with "reload"
//	boot       the same with workers that take -boot-delay to boot (reload)
//	sigstop    the same with one supervisor (not in the load sample)
//	           SIGSTOPped for the whole rebalance (reload)
//	isolate    one supervisor, in a network namespace of its own, cut off
//	           from ZooKeeper and its peers by blackholing proxies
//	outage     all three ZooKeeper servers killed for -outage, then restarted
//
// isolate and outage run in the reload fleet after its rebalance. Every
// scenario stops its load and checks every acknowledged write on its
// owner before the next one starts.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/faultproxy"
	"github.com/shardvisor/shardvisor/migrate"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

var (
	supervisors     = flag.Int("supervisors", benchkit.EnvInt("FLEET_SUPERVISORS", 50), "supervisors in the fleet (one pool)")
	routers         = flag.Int("routers", benchkit.EnvInt("FLEET_ROUTERS", 50), "router sidecars")
	workers         = flag.Int("workers", benchkit.EnvInt("FLEET_WORKERS", 2), "workers per supervisor")
	only            = flag.String("only", benchkit.EnvOr("FLEET_ONLY", "rebalance,boot,sigstop,isolate,outage"), "scenarios to run, comma-separated")
	loadSample      = flag.Int("load-sample", benchkit.EnvInt("FLEET_LOAD_SAMPLE", 10), "supervisors behind the load balancer")
	rate            = flag.Int("rate", benchkit.EnvInt("FLEET_RATE", 200), "requests/s offered in total")
	clients         = flag.Int("clients", 16, "concurrent clients of the load")
	users           = flag.Int("users", 400, "users of the load (per scenario)")
	level           = flag.Int("level", 7, "map level: 2^level buckets (level 7: adding a 4th node to 3 moves 32 buckets)")
	rowsPerBucket   = flag.Int("rows-per-bucket", 200, "notes preloaded into every bucket")
	sessionTimeoutF = flag.Duration("session-timeout", 10*time.Second, "ZooKeeper session timeout the supervisors and routers ask for")
	memberWait      = flag.Duration("member-wait", 10*time.Second, "the mover's --member-wait")
	stopMemberWait  = flag.Duration("sigstop-member-wait", 3*time.Second, "the mover's --member-wait in the sigstop scenario (below the session timeout, so the stopped member is still registered)")
	bootDelay       = flag.Duration("boot-delay", 5*time.Second, "worker boot time in the boot scenario")
	outageFor       = flag.Duration("outage", 30*time.Second, "how long the ZooKeeper ensemble stays down")
	warmup          = flag.Duration("warmup", 5*time.Second, "load before each scenario's event")
	retries         = flag.Int("retries", 3, "times the rebalancer is run again after it stopped on an aborted move")
	budget          = flag.Duration("rebalance-budget", benchkit.EnvDuration("FLEET_REBALANCE_BUDGET", 150*time.Second), "stop a rebalance after the move that ends past this (the table then says how many of the moves ran)")
	envDir          = flag.String("env-dir", benchkit.EnvOr("SHARDVISOR_DEVENV_DIR", "/tmp/shardvisor-fleet-env"), "scripts/devenv state directory of the throwaway environment")
	zkPortBase      = flag.Int("zk-port-base", benchkit.EnvInt("SHARDVISOR_ZK_PORT_BASE", 27811), "its first ZooKeeper client port")
	pgPortBase      = flag.Int("pg-port-base", benchkit.EnvInt("SHARDVISOR_PG_PORT_BASE", 26432), "its first PostgreSQL port")
	adminPortBase   = flag.Int("admin-port-base", benchkit.EnvInt("FLEET_ADMIN_PORT_BASE", 30100), "supervisor i's admin address is 127.0.0.1:base+i")
	routerPortBase  = flag.Int("router-port-base", benchkit.EnvInt("FLEET_ROUTER_PORT_BASE", 30500), "router i listens on 127.0.0.1:base+i")
	binDirF         = flag.String("bin", "bin", "directory with supervisor, router and notes")
	runDirF         = flag.String("run-dir", "", "logs and state (default: a new /tmp/shardvisor-fleet.*)")
	keep            = flag.Bool("keep", false, "keep the databases and ZooKeeper trees")
	jsonOut         = flag.String("json", "", "also write the results as JSON to this file")
	verbose         = flag.Bool("v", false, "print every move")
)

const pgNodes = 4

var sessionTimeout time.Duration

// printer prints the report on stdout, every line stamped with the time.
var printer = &benchkit.Printer{Stamp: true}

func say(format string, args ...any) { printer.Say(format, args...) }

// Stat is a distribution's nearest-rank percentiles.
type Stat = benchkit.Stat

func stat(xs []float64) Stat { return benchkit.Of(xs) }

type bench struct {
	env      *env
	sess     *zksession.Session
	root     string
	started  time.Time
	ps       *procs
	binDir   string
	runDir   string
	cleanups []func(context.Context)
	fleet    *fleet // the one running
	res      results
}

func main() {
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, `usage: bench/fleet/run [flags]   (make bench-fleet)

Environment: FLEET_SUPERVISORS, FLEET_ROUTERS, FLEET_WORKERS, FLEET_ONLY,
FLEET_LOAD_SAMPLE, FLEET_RATE, FLEET_ADMIN_PORT_BASE, FLEET_ROUTER_PORT_BASE
set the flags of the same name; SHARDVISOR_DEVENV_DIR, SHARDVISOR_ZK_PORT_BASE
and SHARDVISOR_PG_PORT_BASE say where the throwaway environment is
(bench/fleet/run sets them: /tmp/shardvisor-fleet-env, 27811, 26432).
Every fixed port is below 32768, outside Linux's default ephemeral range,
so that no outgoing connection holds one when it is bound again.

`)
		flag.PrintDefaults()
	}
	flag.Parse()
	sessionTimeout = *sessionTimeoutF
	sel := map[string]bool{}
	for _, s := range strings.Split(*only, ",") {
		s = strings.TrimSpace(s)
		switch s {
		case "rebalance": // both map delivery modes
			sel["swap"], sel["reload"] = true, true
		case "swap", "reload", "boot", "sigstop", "isolate", "outage":
			sel[s] = true
		case "":
		default:
			fmt.Fprintf(os.Stderr, "fleet-bench: unknown scenario %q in -only (rebalance = swap,reload; boot, sigstop, isolate, outage)\n", s)
			os.Exit(2)
		}
	}
	if *supervisors < 2 || *routers < 0 || *loadSample < 1 || *rate < 1 || *clients < 1 || *workers < 1 {
		fmt.Fprintln(os.Stderr, "fleet-bench: -supervisors >= 2, -load-sample, -rate, -clients, -workers >= 1")
		os.Exit(2)
	}
	if sel["outage"] && *zkPortBase == 21811 {
		// The shared development ensemble: others' tests run against it.
		fmt.Fprintln(os.Stderr, "fleet-bench: the outage scenario kills ZooKeeper: run it against a throwaway ensemble (bench/fleet/run starts one on port 27811)")
		os.Exit(2)
	}
	ctx, stop := benchkit.Context()
	defer stop()
	b := &bench{started: time.Now()}
	err := b.run(ctx, sel)
	b.report()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet-bench:", err)
		os.Exit(1)
	}
	if b.res.failedTargets > 0 {
		os.Exit(1)
	}
}

func (b *bench) run(ctx context.Context, sel map[string]bool) (err error) {
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	if b.binDir, err = filepath.Abs(*binDirF); err != nil {
		return err
	}
	b.runDir = *runDirF
	if b.runDir == "" {
		if b.runDir, err = os.MkdirTemp("", "shardvisor-fleet."); err != nil {
			return err
		}
	}
	if b.ps, err = newProcs(b.runDir); err != nil {
		return err
	}
	// Whatever happens, the processes stop, then the databases and trees go.
	defer func() {
		if b.fleet != nil {
			b.fleet.stop()
		}
		b.ps.stopAll()
		if *keep {
			say("kept: databases fleet_*_%d, ZooKeeper %s", b.started.Unix(), b.root)
			b.cleanups = nil
		}
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, f := range slices.Backward(b.cleanups) {
			f(cctx)
		}
		if b.sess != nil {
			b.sess.Close()
		}
	}()
	if b.env, err = newEnv(root); err != nil {
		return err
	}
	b.root = fmt.Sprintf("/shardvisor-fleet/run-%d", b.started.Unix())
	b.res.Config = fmt.Sprintf("%d supervisors x %d workers (examples/notes), %d routers, 3 ZooKeeper servers, %d PostgreSQL nodes; load %d req/s from %d clients over %d supervisors; level %d (%d buckets, %d notes each); session timeout %s; %d cores",
		*supervisors, *workers, *routers, pgNodes, *rate, *clients, min(*loadSample, *supervisors), *level, 1<<*level, *rowsPerBucket, sessionTimeout, runtime.NumCPU())
	say("fleet benchmark: %s", b.res.Config)
	say("logs in %s; ZooKeeper %s (throwaway ensemble), PostgreSQL %s", b.runDir, b.env.zkConnect(), strings.Join(b.env.pgAddrs, ","))
	if b.sess, err = zksession.Open(zksession.Config{Connect: b.env.zkConnect()}); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = b.sess.WaitConnected(wctx)
	cancel()
	if err != nil {
		return fmt.Errorf("ZooKeeper at %s (bench/fleet/run starts it): %w", b.env.zkConnect(), err)
	}
	b.purgeLeftovers(ctx)
	b.cleanups = append(b.cleanups, func(ctx context.Context) {
		if err := topo.DeleteRoot(ctx, b.sess, topo.MustPaths(b.root, "x")); err != nil {
			say("cleanup: ZooKeeper %s: %v", b.root, err)
		}
	})

	var errs []error
	step := func(name string, f func() error) {
		if ctx.Err() != nil {
			return
		}
		if err := f(); err != nil {
			say("%s: %v", name, err)
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			if b.fleet != nil {
				b.fleet.stop()
				b.fleet = nil
			}
		}
	}
	if sel["swap"] {
		step("rebalance, swap", func() error { return b.rebalanceFleet(ctx, "swap", topo.MapDeliverySwap, 0, false) })
	}
	if sel["reload"] || sel["isolate"] || sel["outage"] {
		step("rebalance, reload", func() error {
			return b.rebalanceFleet(ctx, "reload", topo.MapDeliveryReload, 0, sel["isolate"], func(f *fleet) error {
				if !sel["reload"] {
					return nil
				}
				return b.rebalance(ctx, f, "rebalance, reload", nil, *memberWait)
			}, func(f *fleet) error {
				if sel["isolate"] {
					if err := b.isolate(ctx, f); err != nil {
						return err
					}
				}
				if sel["outage"] {
					return b.outage(ctx, f)
				}
				return nil
			})
		})
	}
	if sel["boot"] {
		step("boot", func() error {
			return b.rebalanceFleet(ctx, "boot", topo.MapDeliveryReload, *bootDelay, false, func(f *fleet) error {
				return b.rebalance(ctx, f, fmt.Sprintf("rebalance, reload, %s boot", *bootDelay), nil, *memberWait)
			})
		})
	}
	if sel["sigstop"] {
		step("sigstop", func() error {
			return b.rebalanceFleet(ctx, "sigstop", topo.MapDeliveryReload, 0, false, func(f *fleet) error {
				victim := f.victim()
				return b.rebalance(ctx, f, fmt.Sprintf("rebalance, reload, %s SIGSTOPped", victim.name), victim, *stopMemberWait)
			})
		})
	}
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	return errors.Join(errs...)
}

// purgeLeftovers removes what a run killed before its cleanup left in the
// throwaway environment: ZooKeeper trees under /shardvisor-fleet and
// fleet_* databases.
func (b *bench) purgeLeftovers(ctx context.Context) {
	// The root holds every fleet's cluster; the cluster name only fills Paths.
	if err := topo.DeleteRoot(ctx, b.sess, topo.MustPaths("/shardvisor-fleet", "leftovers")); err != nil && !errors.Is(err, zksession.ErrNoNode) {
		say("purging old ZooKeeper trees: %v", err)
	}
	for i := range b.env.pgAddrs {
		conn, err := pgx.Connect(ctx, b.env.adminDSN(i))
		if err != nil {
			say("purging old databases on pg%d: %v", i+1, err)
			continue
		}
		rows, _ := conn.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE 'fleet\_%'`)
		dbs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		conn.Close(context.Background())
		for _, db := range dbs {
			if err := b.env.dropDB(ctx, i, db); err != nil {
				say("purging old database %s on pg%d: %v", db, i+1, err)
			}
		}
		if err != nil {
			say("purging old databases on pg%d: %v", i+1, err)
		}
	}
}

// rebalanceFleet starts a fleet, runs the steps in order, and stops it.
// With no steps, the fleet is the swap baseline: one rebalance.
func (b *bench) rebalanceFleet(ctx context.Context, name, mode string, boot time.Duration, isolate bool, steps ...func(*fleet) error) error {
	f, err := b.startFleet(ctx, name, mode, boot, isolate)
	defer func() {
		if f != nil {
			f.stop()
		}
		b.fleet = nil
	}()
	if err != nil {
		return err
	}
	if len(steps) == 0 {
		return b.rebalance(ctx, f, "rebalance, swap", nil, *memberWait)
	}
	for _, s := range steps {
		if err := s(f); err != nil {
			return err
		}
	}
	return nil
}

// victim is the supervisor the sigstop scenario stops: the last one
// outside the load sample (the balancer would take one inside out by its
// /healthz, as the isolate scenario shows).
func (f *fleet) victim() *sup {
	in := map[string]bool{}
	for _, s := range f.sample(nil) {
		in[s.name] = true
	}
	for _, s := range slices.Backward(f.sups) {
		if !in[s.name] {
			return s
		}
	}
	return f.sups[len(f.sups)-1]
}

// ---------------------------------------------------------------- rebalance

// StepStat is one move step's duration over the moves.
type StepStat struct {
	Step string `json:"step"`
	Stat
}

// RebalanceResult is one rebalance of 3 -> 4 nodes.
type RebalanceResult struct {
	Name         string  `json:"name"`
	Mode         string  `json:"mode"`
	BootDelay    string  `json:"boot_delay,omitempty"`
	Boots        float64 `json:"worker_boots"`
	Kills        float64 `json:"worker_kills"`
	Seconds      float64 `json:"rebalance_seconds"`
	Moves        int     `json:"moves_done"`
	Aborted      int     `json:"moves_aborted"`
	Restarts     int     `json:"rebalancer_restarts"`
	Balanced     bool    `json:"balanced"`
	OverBudget   bool    `json:"stopped_at_budget,omitempty"`
	PauseMS      Stat    `json:"pause_ms"`
	MoveMS       Stat    `json:"move_ms"`
	MemberWaitMS Stat    `json:"member_wait_ms"`
	// StepsMS: each step's duration (the time from its start to the next
	// step's), p50 over the moves done, in step order.
	StepsMS      []StepStat     `json:"steps_ms"`
	Load         loadStats      `json:"load"`
	Verify       verification   `json:"verify"`
	Victim       string         `json:"victim,omitempty"`
	Stragglers   map[string]int `json:"stragglers,omitempty"` // member -> moves that named it
	AbortErrors  []string       `json:"abort_errors,omitempty"`
	VictimBackS  float64        `json:"victim_back_seconds,omitempty"`
	ScrapeErrors []string       `json:"scrape_errors,omitempty"`
}

func (b *bench) rebalance(ctx context.Context, f *fleet, name string, victim *sup, wait time.Duration) error {
	res := &RebalanceResult{Name: name, Mode: f.mode, Stragglers: map[string]int{}}
	if f.boot > 0 {
		res.BootDelay = f.boot.String()
	}
	b.res.Rebalances = append(b.res.Rebalances, res)
	skip := map[string]bool{}
	if victim != nil {
		res.Victim = victim.name
		skip[victim.name] = true
	}
	lb := newBalancer(f.sample(skip))
	defer lb.close()
	if err := lb.waitUp(ctx, 30*time.Second); err != nil {
		return err
	}
	l := startLoad(strings.ReplaceAll(f.name, "-", "")+"rb", lb)
	defer l.stop()
	if err := benchkit.Sleep(ctx, *warmup); err != nil {
		return err
	}
	before, errs := f.scrape(skip)
	res.ScrapeErrors = append(res.ScrapeErrors, errs...)
	if _, err := f.c.addFourth(ctx); err != nil {
		return err
	}
	if victim != nil {
		victim.p.signal(syscall.SIGSTOP)
		say("%s: SIGSTOP %s (pid %d) for the whole rebalance; the mover's member wait is %s", name, victim.name, victim.p.pid(), wait)
	}
	say("%s: rebalancing 3 -> 4 nodes under load", name)
	t0 := time.Now()
	rbErr := b.runRebalancer(ctx, f, res, wait)
	res.Seconds = time.Since(t0).Seconds()
	if victim != nil {
		victim.p.signal(syscall.SIGCONT)
	}
	m, _, err := f.c.st.Load(ctx)
	if err != nil {
		return err
	}
	// Every supervisor on the final map, workers settled, the stopped one
	// back in service, before the boots are counted.
	tc := time.Now()
	if _, err := f.settle(ctx, m.Version, 3*time.Minute, nil); err != nil {
		return err
	}
	if victim != nil {
		res.VictimBackS = time.Since(tc).Seconds()
	}
	after, errs := f.scrape(skip)
	res.ScrapeErrors = append(res.ScrapeErrors, errs...)
	d := after.minus(before)
	res.Boots, res.Kills = d.spawns, d.kills
	if err := benchkit.Sleep(ctx, 2*time.Second); err != nil {
		return err
	}
	l.stop()
	res.Load = l.stats(0, 0, f.supName)
	if res.Verify, err = f.c.verify(ctx, l); err != nil {
		return err
	}
	say("%s: %d moves in %.1f s (%d aborted), %.0f worker boots, pause p50 %.1f p99 %.1f max %.1f ms; %d requests, %d failed; %d acknowledged writes missing of %d",
		name, res.Moves, res.Seconds, res.Aborted, res.Boots, res.PauseMS.P50, res.PauseMS.P99, res.PauseMS.Max, res.Load.Requests, res.Load.Failed, res.Verify.lost(), res.Verify.Checked)
	if victim != nil {
		say("%s: %s named as a straggler in %d moves; back in service %.1f s after SIGCONT", name, victim.name, res.Stragglers[victim.name], res.VictimBackS)
	}
	return rbErr
}

// runRebalancer runs the rebalancer until balanced (again after an
// aborted move, up to --retries times) and reads every move record.
func (b *bench) runRebalancer(ctx context.Context, f *fleet, res *RebalanceResult, wait time.Duration) error {
	var done int
	t0 := time.Now()
	// Past the budget the rebalancer stops between two moves: cancelled
	// as a move ends, it returns before starting the next one.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	mv := migrate.New(f.c.st, migrate.Options{MemberWait: wait, Progress: func(prog migrate.Progress) {
		rec, msg := prog.Move, prog.Message
		switch {
		case msg == topo.MoveDone:
			done++
			if time.Since(t0) > *budget && !res.OverBudget {
				res.OverBudget = true
				say("  %s: past the %s budget after %d moves; stopping the rebalancer", res.Name, *budget, done)
				cancel()
			}
			if *verbose || done%8 == 0 {
				say("  move %2d done: bucket %3d %s -> %s, pause %.1f ms, member wait %.0f ms", done, rec.Bucket, rec.Source, rec.Target, rec.Stats.PauseMS, rec.Stats.MemberWaitMS)
			}
		case msg == topo.MoveAborted || msg == topo.MoveFailed:
			say("  move of bucket %d %s -> %s %s: %s", rec.Bucket, rec.Source, rec.Target, msg, rec.Error)
		}
	}})
	rb := migrate.NewRebalancer(mv, bucketmap.Policy{Concurrency: 1})
	var rbErr error
	for attempt := 0; ; attempt++ {
		rep, err := rb.Run(rctx)
		if res.OverBudget {
			break
		}
		if err == nil && rep != nil && rep.Balanced {
			res.Balanced = true
			break
		}
		if err == nil {
			err = errors.New("not balanced")
		}
		if attempt >= *retries || ctx.Err() != nil || errors.Is(err, migrate.ErrVerifyMismatch) {
			rbErr = fmt.Errorf("rebalance: %w", err)
			break
		}
		res.Restarts++
		say("  rebalancer stopped (%v); running it again (%d/%d)", err, attempt+1, *retries)
	}
	ids, err := topo.ListMoves(ctx, b.sess, f.c.paths)
	if err != nil {
		return errors.Join(rbErr, err)
	}
	var pause, total, mwait []float64
	steps := map[string][]float64{}
	for _, id := range ids {
		rec, _, err := topo.ReadMove(ctx, b.sess, f.c.paths, id)
		if err != nil {
			return errors.Join(rbErr, err)
		}
		for _, s := range rec.Stragglers {
			res.Stragglers[s.Member[strings.LastIndexByte(s.Member, '/')+1:]]++
		}
		switch rec.State {
		case topo.MoveDone:
			res.Moves++
			pause = append(pause, rec.Stats.PauseMS)
			mwait = append(mwait, rec.Stats.MemberWaitMS)
			total = append(total, float64(rec.UpdatedAt.Sub(rec.CreatedAt).Microseconds())/1000)
			for i := 0; i+1 < len(rec.Steps); i++ {
				steps[rec.Steps[i].State] = append(steps[rec.Steps[i].State], ms(rec.Steps[i+1].At.Sub(rec.Steps[i].At)))
			}
		case topo.MoveAborted:
			res.Aborted++
			if len(res.AbortErrors) < 3 {
				res.AbortErrors = append(res.AbortErrors, rec.Error)
			}
		}
	}
	res.PauseMS, res.MoveMS, res.MemberWaitMS = stat(pause), stat(total), stat(mwait)
	for _, st := range []string{topo.MovePrepare, topo.MoveCopy, topo.MoveCatchup, topo.MoveFence, topo.MoveBarrier, topo.MoveFlip, topo.MoveTeardown, topo.MoveVerify} {
		if xs := steps[st]; len(xs) > 0 {
			res.StepsMS = append(res.StepsMS, StepStat{Step: st, Stat: stat(xs)})
		}
	}
	return rbErr
}

// ---------------------------------------------------------------- isolate

// IsolateResult is one supervisor cut off from ZooKeeper and its peers.
type IsolateResult struct {
	Member        string       `json:"member"`
	SessionMS     float64      `json:"negotiated_session_timeout_ms"`
	BoundMS       float64      `json:"bound_ms"` // 2/3 T + 1 s
	RefusedMS     float64      `json:"port_refused_ms"`
	HealthzMS     float64      `json:"healthz_failed_ms"`
	OutMS         float64      `json:"out_of_lb_ms"` // the first of the two
	BalancerMS    float64      `json:"balancer_marked_down_ms"`
	BackMS        float64      `json:"back_after_heal_ms"`
	OwnFailed     int          `json:"isolated_host_failed_requests"`
	OthersFailed  int          `json:"others_failed_requests"`
	Load          loadStats    `json:"load"`
	Verify        verification `json:"verify"`
	Kills         float64      `json:"worker_kills"`
	KillsByReason map[string]float64
}

// negotiated asks the ensemble for a session with the supervisors'
// timeout and reports what it granted (the server clamps it): the T of
// the isolation bound.
func (b *bench) negotiated(ctx context.Context) (time.Duration, error) {
	s, err := zksession.Open(zksession.Config{Connect: b.env.zkConnect(), SessionTimeout: sessionTimeout})
	if err != nil {
		return 0, err
	}
	defer s.Close()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.WaitConnected(wctx); err != nil {
		return 0, err
	}
	return s.SessionTimeout(), nil
}

func ms(d time.Duration) float64 { return benchkit.MS(d) }

func (b *bench) isolate(ctx context.Context, f *fleet) error {
	if f.iso == nil {
		return errors.New("no isolated host in this fleet")
	}
	T, err := b.negotiated(ctx)
	if err != nil {
		return err
	}
	s := f.sups[f.isoIdx]
	res := &IsolateResult{Member: s.name, SessionMS: ms(T), BoundMS: ms(2*T/3 + time.Second), RefusedMS: -1, HealthzMS: -1, OutMS: -1, BalancerMS: -1, BackMS: -1}
	b.res.Isolate = res
	lb := newBalancer(f.sample(nil))
	defer lb.close()
	if err := lb.waitUp(ctx, 30*time.Second); err != nil {
		return err
	}
	var isoBE *backend
	for _, be := range lb.backends {
		if be.s == s {
			isoBE = be
		}
	}
	l := startLoad("iso", lb)
	defer l.stop()
	if err := benchkit.Sleep(ctx, *warmup); err != nil {
		return err
	}
	before, _ := f.scrape(nil)
	port := s.servicePort()
	say("isolate: cutting %s (port %d) off from ZooKeeper and its %d peers (blackholing proxies); negotiated session timeout T = %s, bound 2/3 T + 1 s = %s",
		s.name, port, len(f.sups)-1, T, 2*T/3+time.Second)
	t0 := time.Now()
	cut := l.since()
	f.iso.set(faultproxy.Blackhole)
	deadline := t0.Add(2*T + 5*time.Second)
	for time.Now().Before(deadline) && (res.RefusedMS < 0 || res.HealthzMS < 0) {
		if res.RefusedMS < 0 {
			dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			c, err := s.dial(dctx, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
			cancel()
			if err == nil {
				c.Close()
			} else if errors.Is(err, syscall.ECONNREFUSED) {
				res.RefusedMS = ms(time.Since(t0))
			}
		}
		if res.HealthzMS < 0 && !s.healthy(300*time.Millisecond) {
			res.HealthzMS = ms(time.Since(t0))
		}
		if err := benchkit.Sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	for _, x := range []float64{res.RefusedMS, res.HealthzMS} {
		if x >= 0 && (res.OutMS < 0 || x < res.OutMS) {
			res.OutMS = x
		}
	}
	if err := benchkit.Sleep(ctx, 3*time.Second); err != nil { // the others serve on
		return err
	}
	isoBE.mu.Lock()
	if isoBE.downAt.After(t0) {
		res.BalancerMS = ms(isoBE.downAt.Sub(t0))
	}
	isoBE.mu.Unlock()
	say("isolate: %s out of the load balancer after %.0f ms (port refused %.0f ms, /healthz failed %.0f ms; the balancer's check %.0f ms); healing",
		s.name, res.OutMS, res.RefusedMS, res.HealthzMS, res.BalancerMS)
	th := time.Now()
	f.iso.set(faultproxy.Pass)
	m, _, err := f.c.st.Load(ctx)
	if err != nil {
		return err
	}
	if _, err := f.settle(ctx, m.Version, 2*time.Minute, nil); err != nil {
		return err
	}
	for !s.healthy(time.Second) {
		if err := benchkit.Sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	res.BackMS = ms(time.Since(th))
	if err := benchkit.Sleep(ctx, 2*time.Second); err != nil {
		return err
	}
	l.stop()
	after, _ := f.scrape(nil)
	d := after.minus(before)
	res.Kills, res.KillsByReason = d.kills, d.killsBy
	res.Load = l.stats(cut, 0, f.supName)
	res.OwnFailed = res.Load.FailedOn[s.name]
	res.OthersFailed = res.Load.Failed - res.OwnFailed
	if res.Verify, err = f.c.verify(ctx, l); err != nil {
		return err
	}
	say("isolate: back in service %.1f s after the heal; requests failed: %d on %s, %d elsewhere; %d acknowledged writes missing of %d",
		res.BackMS/1000, res.OwnFailed, s.name, res.OthersFailed, res.Verify.lost(), res.Verify.Checked)
	return nil
}

func (l *loadRun) since() time.Duration { return time.Since(l.started) }

// ---------------------------------------------------------------- outage

// OutageResult is the whole ZooKeeper ensemble down under load.
type OutageResult struct {
	DownS         float64            `json:"killed_seconds"`
	RestartS      float64            `json:"restart_seconds"`                      // devenv up until healthy
	NormalS       float64            `json:"back_to_normal_seconds_after_restart"` // restart begun -> every member serving
	NormalHealthy float64            `json:"back_to_normal_seconds_after_healthy"` // ensemble healthy -> every member serving
	Kills         float64            `json:"worker_kills"`
	KillsByReason map[string]float64 `json:"worker_kills_by_reason,omitempty"`
	Boots         float64            `json:"worker_boots"`
	Load          loadStats          `json:"load"`
	Verify        verification       `json:"verify"`
}

func (b *bench) outage(ctx context.Context, f *fleet) (err error) {
	res := &OutageResult{}
	b.res.Outage = res
	lb := newBalancer(f.sample(nil))
	defer lb.close()
	if err := lb.waitUp(ctx, 30*time.Second); err != nil {
		return err
	}
	l := startLoad("out", lb)
	defer l.stop()
	if err := benchkit.Sleep(ctx, *warmup); err != nil {
		return err
	}
	before, _ := f.scrape(nil)
	say("outage: killing all 3 ZooKeeper servers of the THROWAWAY ensemble (%s; the shared one on 21811 is not touched) for %s under load",
		b.env.zkConnect(), *outageFor)
	t0 := time.Now()
	var tRestart time.Time
	restarted := false
	restart := func() error {
		if restarted {
			return nil
		}
		restarted = true
		res.DownS = time.Since(t0).Seconds()
		say("outage: restarting the ensemble after %.1f s down", res.DownS)
		tRestart = time.Now()
		err := b.env.dev.Up()
		res.RestartS = time.Since(tRestart).Seconds()
		return err
	}
	// However this ends, the ensemble comes back.
	defer func() { err = errors.Join(err, restart()) }()
	for i := 1; i <= 3; i++ {
		if err := b.env.dev.ZKKill(i); err != nil {
			return err
		}
	}
	for left := *outageFor; left > 0; left -= 10 * time.Second {
		up := 0
		for _, be := range lb.backends {
			if _, ok := be.state(); ok {
				up++
			}
		}
		say("outage: ZooKeeper down %2.0f s; %d/%d supervisors behind the balancer up; %d requests failed so far",
			time.Since(t0).Seconds(), up, len(lb.backends), l.stats(0, 0, f.supName).Failed)
		if err := benchkit.Sleep(ctx, min(left, 10*time.Second)); err != nil {
			return err
		}
	}
	if err := restart(); err != nil {
		return err
	}
	say("outage: ensemble back (devenv up took %.1f s); waiting for every member record, serving", res.RestartS)
	tr := time.Now()
	m, _, err := f.c.st.Load(ctx)
	for err != nil && time.Since(tr) < time.Minute {
		_ = benchkit.Sleep(ctx, 200*time.Millisecond)
		m, _, err = f.c.st.Load(ctx)
	}
	if err != nil {
		return err
	}
	if _, err := f.settle(ctx, m.Version, 3*time.Minute, nil); err != nil {
		return err
	}
	if err := lb.waitUp(ctx, time.Minute); err != nil {
		return err
	}
	res.NormalS, res.NormalHealthy = time.Since(tRestart).Seconds(), time.Since(tr).Seconds()
	if err := benchkit.Sleep(ctx, 3*time.Second); err != nil {
		return err
	}
	l.stop()
	after, _ := f.scrape(nil)
	d := after.minus(before)
	res.Kills, res.KillsByReason, res.Boots = d.kills, d.killsBy, d.spawns
	res.Load = l.stats(0, 0, f.supName)
	if res.Verify, err = f.c.verify(ctx, l); err != nil {
		return err
	}
	say("outage: back to normal %.1f s after the restart began (%.1f s after the ensemble was healthy); %d requests failed, %.0f worker kills, %.0f boots; %d acknowledged writes missing of %d",
		res.NormalS, res.NormalHealthy, res.Load.Failed, res.Kills, res.Boots, res.Verify.lost(), res.Verify.Checked)
	return nil
}

// ---------------------------------------------------------------- report

type results struct {
	Config        string             `json:"config"`
	Rebalances    []*RebalanceResult `json:"rebalances"`
	Isolate       *IsolateResult     `json:"isolate,omitempty"`
	Outage        *OutageResult      `json:"outage,omitempty"`
	Targets       []Target           `json:"targets"`
	failedTargets int
}

// Target is one goal and whether this run met it. Info lines are
// findings with no target.
type Target struct {
	Goal string `json:"goal"`
	Got  string `json:"got"`
	Pass bool   `json:"pass"`
	Info bool   `json:"info,omitempty"`
}

func (b *bench) find(prefix string) *RebalanceResult {
	for _, r := range b.res.Rebalances {
		if strings.HasPrefix(r.Name, prefix) {
			return r
		}
	}
	return nil
}

func ratio(x, base float64) string { return benchkit.RatioX(x, base) }

func isoLoad(x *IsolateResult) *loadStats {
	if x == nil {
		return nil
	}
	return &x.Load
}

func outLoad(x *OutageResult) *loadStats {
	if x == nil {
		return nil
	}
	return &x.Load
}

func (b *bench) report() {
	r := &b.res
	target := func(pass bool, goal, got string, args ...any) {
		r.Targets = append(r.Targets, Target{Goal: goal, Got: fmt.Sprintf(got, args...), Pass: pass})
		if !pass {
			r.failedTargets++
		}
	}
	fmt.Println()
	fmt.Println("shardvisor fleet benchmark: " + r.Config)
	fmt.Println()
	fmt.Printf("%-44s %7s %9s %22s %13s %11s  %s\n", "scenario", "boots", "rebalance", "pause p50/p99/max ms", "failed req", "lost writes", "notes")
	row := func(name, boots, rebal, pause, failed, lost, notes string) {
		fmt.Printf("%-44s %7s %9s %22s %13s %11s  %s\n", name, boots, rebal, pause, failed, lost, notes)
	}
	for _, x := range r.Rebalances {
		notes := fmt.Sprintf("%d moves", x.Moves)
		if x.Aborted > 0 {
			notes += fmt.Sprintf(", %d aborted", x.Aborted)
		}
		if x.OverBudget {
			notes += fmt.Sprintf(" (stopped at the %s budget)", *budget)
		} else if !x.Balanced {
			notes += ", NOT balanced"
		}
		notes += fmt.Sprintf(", move p50 %.0f ms", x.MoveMS.P50)
		if x.MemberWaitMS.Max > 0 { // recorded by movers that report stragglers
			notes += fmt.Sprintf(", member wait p50 %.0f max %.0f ms", x.MemberWaitMS.P50, x.MemberWaitMS.Max)
		}
		if x.Victim != "" {
			notes += fmt.Sprintf("; %s a straggler in %d moves, back %.1f s after SIGCONT", x.Victim, x.Stragglers[x.Victim], x.VictimBackS)
		}
		if x.Load.Stale > 0 {
			notes += fmt.Sprintf("; %d stale lists", x.Load.Stale)
		}
		row(x.Name, fmt.Sprintf("%.0f", x.Boots), fmt.Sprintf("%.1f s", x.Seconds),
			fmt.Sprintf("%.1f/%.1f/%.1f", x.PauseMS.P50, x.PauseMS.P99, x.PauseMS.Max),
			fmt.Sprintf("%d/%d", x.Load.Failed, x.Load.Requests), fmt.Sprintf("%d/%d", x.Verify.lost(), x.Verify.Checked), notes)
	}
	swap, reload, boot := b.find("rebalance, swap"), b.find("rebalance, reload"), b.find(fmt.Sprintf("rebalance, reload, %s", *bootDelay))
	if reload != nil && reload.Name != "rebalance, reload" {
		reload = nil
	}
	if swap != nil && reload != nil {
		// Per move when a rebalance stopped at its budget, whole otherwise.
		perMove := func(x *RebalanceResult, v float64) float64 {
			if x.OverBudget || reload.OverBudget || swap.OverBudget {
				return v / float64(max(x.Moves, 1))
			}
			return v
		}
		label := "  reload / swap"
		if reload.OverBudget || swap.OverBudget {
			label += " (per move)"
		}
		row(label, ratio(perMove(reload, reload.Boots), perMove(swap, swap.Boots)), ratio(perMove(reload, reload.Seconds), perMove(swap, swap.Seconds)),
			ratio(reload.PauseMS.P99, swap.PauseMS.P99)+" (p99)", "", "", fmt.Sprintf("move p50 %s", ratio(reload.MoveMS.P50, swap.MoveMS.P50)))
	}
	if boot != nil && reload != nil {
		row(fmt.Sprintf("  %s boot / no boot (reload)", *bootDelay), "", ratio(boot.Seconds, reload.Seconds),
			ratio(boot.PauseMS.P99, reload.PauseMS.P99)+" (p99)", "", "", fmt.Sprintf("move p50 %.0f vs %.0f ms: %s", boot.MoveMS.P50, reload.MoveMS.P50, ratio(boot.MoveMS.P50, reload.MoveMS.P50)))
	}
	if x := r.Isolate; x != nil {
		row(fmt.Sprintf("%s isolated (ZooKeeper + peers)", x.Member), fmt.Sprintf("k%.0f", x.Kills), "", "",
			fmt.Sprintf("%d/%d", x.OthersFailed, x.Load.Requests-x.OwnFailed), fmt.Sprintf("%d/%d", x.Verify.lost(), x.Verify.Checked),
			fmt.Sprintf("out of LB in %.2f s (bound 2/3 T + 1 s = %.2f s, T = %.1f s); own failed %d; back %.1f s after heal",
				x.OutMS/1000, x.BoundMS/1000, x.SessionMS/1000, x.OwnFailed, x.BackMS/1000))
	}
	if x := r.Outage; x != nil {
		row(fmt.Sprintf("ZooKeeper ensemble down %.0f s", x.DownS), fmt.Sprintf("k%.0f", x.Kills), "", "",
			fmt.Sprintf("%d/%d", x.Load.Failed, x.Load.Requests), fmt.Sprintf("%d/%d", x.Verify.lost(), x.Verify.Checked),
			fmt.Sprintf("back to normal %.1f s after the restart began (ensemble healthy after %.1f s); %.0f worker boots; kills %v", x.NormalS, x.RestartS, x.Boots, x.KillsByReason))
	}
	fmt.Println("(boots: worker spawns across the fleet, from /metrics; kN: worker kills; failed req: failed/sent; lost writes: acknowledged writes missing/checked)")
	if len(r.Rebalances) > 0 {
		fmt.Println("where a move's time goes, p50 per step in ms (fence: map set moving, members caught up, source frozen):")
		for _, x := range r.Rebalances {
			var parts []string
			for _, st := range x.StepsMS {
				parts = append(parts, fmt.Sprintf("%s %.0f", st.Step, st.P50))
			}
			fmt.Printf("  %-42s %s\n", x.Name, strings.Join(parts, ", "))
		}
	}
	fmt.Println()

	if reload != nil {
		target(reload.Boots == 0, "reload mode: 0 worker boots across the rebalance", "%.0f (swap: %s)", reload.Boots, func() string {
			if swap == nil {
				return "not run"
			}
			return fmt.Sprintf("%.0f", swap.Boots)
		}())
	}
	for _, x := range r.Rebalances {
		target(x.PauseMS.N > 0 && x.PauseMS.P99 < 50, fmt.Sprintf("%s: write pause p99 < 50 ms with %d supervisors", x.Name, *supervisors), "%.1f ms", x.PauseMS.P99)
		target(x.Balanced && x.Aborted == 0, x.Name+": rebalance completes, no move aborted", "balanced %v%s, %d aborted %v", x.Balanced,
			map[bool]string{true: " (stopped at the budget)", false: ""}[x.OverBudget], x.Aborted, x.AbortErrors)
		target(x.Load.Failed == 0 && x.Verify.lost() == 0, x.Name+": 0 failed requests, 0 lost writes", "%d failed %v, %d lost", x.Load.Failed, x.Load.Errors, x.Verify.lost())
		if x.Victim != "" {
			target(x.Stragglers[x.Victim] > 0, x.Name+": the stopped supervisor is reported as a straggler", "%d move records name it", x.Stragglers[x.Victim])
		}
	}
	if boot != nil && reload != nil {
		target(boot.MoveMS.P50 < reload.MoveMS.P50*1.5+500, fmt.Sprintf("reload mode: move time does not depend on a %s boot", *bootDelay), "move p50 %.0f ms vs %.0f ms", boot.MoveMS.P50, reload.MoveMS.P50)
	}
	if x := r.Isolate; x != nil {
		target(x.OutMS >= 0 && x.OutMS <= x.BoundMS, "isolated supervisor out of the load balancer within 2/3 T + 1 s", "%.2f s (bound %.2f s)", x.OutMS/1000, x.BoundMS/1000)
		target(x.OthersFailed == 0 && x.Verify.lost() == 0, "isolation: 0 failed requests on the other supervisors, 0 lost writes", "%d failed %v, %d lost", x.OthersFailed, x.Load.Errors, x.Verify.lost())
	}
	if x := r.Outage; x != nil {
		target(x.Load.Failed == 0 && x.Kills == 0, "whole-ensemble outage: 0 failed requests and 0 worker kills", "%d failed %v, %.0f kills", x.Load.Failed, x.Load.Errors, x.Kills)
		target(x.Verify.lost() == 0, "whole-ensemble outage: 0 lost writes", "%d lost", x.Verify.lost())
	}
	var stale []string
	for _, x := range r.Rebalances {
		if x.Load.Stale > 0 {
			stale = append(stale, fmt.Sprintf("%s: %d, e.g. %s", x.Name, x.Load.Stale, x.Load.StaleEx[0]))
		}
	}
	for _, l := range []*loadStats{isoLoad(r.Isolate), outLoad(r.Outage)} {
		if l != nil && l.Stale > 0 {
			stale = append(stale, fmt.Sprintf("%d, e.g. %s", l.Stale, l.StaleEx[0]))
		}
	}
	if len(stale) > 0 {
		r.Targets = append(r.Targets, Target{Info: true, Goal: "stale reads: lists that missed acknowledged notes (reads are not fenced)", Got: strings.Join(stale, "; ")})
	}
	fmt.Println("targets:")
	for _, t := range r.Targets {
		v := "FAIL"
		switch {
		case t.Info:
			v = "INFO"
		case t.Pass:
			v = "PASS"
		}
		fmt.Printf("  %s  %-80s %s\n", v, t.Goal, t.Got)
	}
	if *jsonOut != "" {
		if data, err := json.MarshalIndent(r, "", "  "); err == nil {
			_ = os.WriteFile(*jsonOut, data, 0o644)
		}
	}
}
