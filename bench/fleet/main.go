// Command fleet-bench runs a whole shardvisor fleet on one machine through
// a rebalance and failures under a load through a health-checking load
// balancer, printing one table. Run it with bench/fleet/run (make
// bench-fleet); docs/fleet.md says what each scenario measures.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

var (
	supervisors    = flag.Int("supervisors", benchkit.EnvInt("FLEET_SUPERVISORS", 50), "supervisors in the fleet (one pool)")
	routers        = flag.Int("routers", benchkit.EnvInt("FLEET_ROUTERS", 50), "router sidecars")
	workers        = flag.Int("workers", benchkit.EnvInt("FLEET_WORKERS", 2), "workers per supervisor")
	fleetCPU       = flag.Int("fleet-cpu", benchkit.EnvInt("FLEET_CPU", -1), "pin every supervisor and router (and so their workers) to this CPU, leaving the other cores to ZooKeeper, PostgreSQL and the mover, as a fleet of web heads on hosts of their own would (-1: not pinned)")
	only           = flag.String("only", benchkit.EnvOr("FLEET_ONLY", "rebalance,boot,sigstop,isolate,outage"), "scenarios to run, comma-separated")
	loadSample     = flag.Int("load-sample", benchkit.EnvInt("FLEET_LOAD_SAMPLE", 10), "supervisors behind the load balancer")
	rate           = flag.Int("rate", benchkit.EnvInt("FLEET_RATE", 200), "requests/s offered in total")
	clients        = flag.Int("clients", 16, "concurrent clients of the load")
	users          = flag.Int("users", 400, "users of the load (per scenario)")
	level          = benchkit.LevelFlag(7, "level 7: adding a 4th node to 3 moves 32 buckets")
	rowsPerBucket  = flag.Int("rows-per-bucket", 200, "notes preloaded into every bucket")
	sessionTimeout = flag.Duration("session-timeout", 10*time.Second, "ZooKeeper session timeout the supervisors and routers ask for")
	memberWait     = flag.Duration("member-wait", 10*time.Second, "the mover's --member-wait")
	stopMemberWait = flag.Duration("sigstop-member-wait", 3*time.Second, "the mover's --member-wait in the sigstop scenario (below the session timeout, so the stopped member is still registered)")
	bootDelay      = flag.Duration("boot-delay", 5*time.Second, "worker boot time in the boot scenario")
	outageFor      = flag.Duration("outage", 30*time.Second, "how long the ZooKeeper ensemble stays down")
	warmup         = flag.Duration("warmup", 5*time.Second, "load before each scenario's event")
	budget         = flag.Duration("rebalance-budget", benchkit.EnvDuration("FLEET_REBALANCE_BUDGET", 150*time.Second), "stop a rebalance after the move that ends past this (the table then says how many of the moves ran)")
	envDir         = flag.String("env-dir", benchkit.EnvOr("SHARDVISOR_DEVENV_DIR", "/tmp/shardvisor-fleet-env"), "scripts/devenv state directory of the throwaway environment")
	zkPortBase     = flag.Int("zk-port-base", benchkit.EnvInt("SHARDVISOR_ZK_PORT_BASE", 27811), "its first ZooKeeper client port")
	pgPortBase     = flag.Int("pg-port-base", benchkit.EnvInt("SHARDVISOR_PG_PORT_BASE", 26432), "its first PostgreSQL port")
	adminPortBase  = flag.Int("admin-port-base", benchkit.EnvInt("FLEET_ADMIN_PORT_BASE", 30100), "supervisor i's admin address is 127.0.0.1:base+i")
	routerPortBase = flag.Int("router-port-base", benchkit.EnvInt("FLEET_ROUTER_PORT_BASE", 30500), "router i listens on 127.0.0.1:base+i")
	binDirF        = flag.String("bin", "bin", "directory with supervisor, router and notes")
	runDirF        = flag.String("run-dir", "", "logs and state (default: a new /tmp/shardvisor-fleet.*)")
	jsonOut        = flag.String("json", "", "also write the results as JSON to this file")
)

const (
	pgNodes = 4
	retries = 3 // times the rebalancer is run again after it stopped on an aborted move
)

// say prints a line of the report on stdout, stamped with the time.
var say = (&benchkit.Printer{Stamp: true}).Say

type bench struct {
	env                  *env
	sess                 *zksession.Session
	root, binDir, runDir string
	started              time.Time
	ps                   *procs
	cleanups             []func(context.Context)
	res                  results
}

func main() {
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: bench/fleet/run [flags] (make bench-fleet; docs/fleet.md)\nFLEET_SUPERVISORS, _ROUTERS, _WORKERS, _ONLY, _LOAD_SAMPLE, _RATE, _REBALANCE_BUDGET, _ADMIN_PORT_BASE, _ROUTER_PORT_BASE set those flags' defaults")
		flag.PrintDefaults()
	}
	flag.Parse()
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
			benchkit.Fatalf(2, "fleet-bench", "unknown scenario %q in -only (rebalance = swap,reload; boot, sigstop, isolate, outage)", s)
		}
	}
	if *supervisors < 2 || *routers < 0 || *loadSample < 1 || *rate < 1 || *clients < 1 || *workers < 1 {
		benchkit.Fatalf(2, "fleet-bench", "-supervisors >= 2, -load-sample, -rate, -clients, -workers >= 1")
	}
	if sel["outage"] && *zkPortBase == 21811 {
		// The shared development ensemble: others' tests run against it.
		benchkit.Fatalf(2, "fleet-bench", "the outage scenario kills ZooKeeper: run it against a throwaway ensemble (bench/fleet/run starts one on port 27811)")
	}
	ctx, stop := benchkit.Context()
	defer stop()
	b := &bench{started: time.Now()}
	err := b.run(ctx, sel)
	b.report()
	if err != nil {
		benchkit.Fatalf(1, "fleet-bench", "%v", err)
	}
	if slices.ContainsFunc(b.res.Targets, func(t Target) bool { return !t.Pass && !t.Info }) {
		os.Exit(1)
	}
}

func (b *bench) run(ctx context.Context, sel map[string]bool) (err error) {
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
		b.ps.stopAll()
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, f := range slices.Backward(b.cleanups) {
			f(cctx)
		}
		if b.sess != nil {
			b.sess.Close()
		}
	}()
	if b.env, err = newEnv(); err != nil {
		return err
	}
	b.root = fmt.Sprintf("/shardvisor-fleet/run-%d", b.started.Unix())
	b.res.Config = fmt.Sprintf("%d supervisors x %d workers (examples/notes), %d routers, 3 ZooKeeper servers, %d PostgreSQL nodes; load %d req/s from %d clients over %d supervisors; level %d (%d buckets, %d notes each); session timeout %s; %d cores",
		*supervisors, *workers, *routers, pgNodes, *rate, *clients, min(*loadSample, *supervisors), *level, 1<<*level, *rowsPerBucket, *sessionTimeout, runtime.NumCPU())
	say("logs in %s; ZooKeeper %s (throwaway ensemble), PostgreSQL %s", b.runDir, b.env.ZKConnect(), strings.Join(b.env.pgAddrs, ","))
	if b.sess, err = clustertest.OpenSession(ctx, b.env.ZKConnect(), "bench/fleet/run starts it"); err != nil {
		return err
	}
	b.purgeLeftovers(ctx)
	b.cleanups = append(b.cleanups, func(ctx context.Context) {
		if err := topo.DeleteRoot(ctx, b.sess, topo.MustPaths(b.root, "x")); err != nil {
			say("cleanup: ZooKeeper %s: %v", b.root, err)
		}
	})

	rebalance := func(f *fleet, step string) error { return b.rebalance(ctx, f, step, nil, *memberWait) }
	// Each fleet in turn: the step its errors (and rebalance) are named
	// after, cluster name, map delivery, worker boot, what it goes through.
	var errs []error
	for _, fr := range []struct {
		on               bool
		step, name, mode string
		boot             time.Duration
		run              func(f *fleet, step string) error
	}{
		{sel["swap"], "rebalance, swap", "swap", topo.MapDeliverySwap, 0, rebalance},
		{sel["reload"] || sel["isolate"] || sel["outage"], "rebalance, reload", "reload", topo.MapDeliveryReload, 0, func(f *fleet, step string) (err error) {
			if sel["reload"] {
				err = rebalance(f, step)
			}
			if err == nil && sel["isolate"] {
				err = b.isolate(ctx, f)
			}
			if err == nil && sel["outage"] {
				err = b.outage(ctx, f)
			}
			return err
		}},
		{sel["boot"], fmt.Sprintf("rebalance, reload, %s boot", *bootDelay), "boot", topo.MapDeliveryReload, *bootDelay, rebalance},
		{sel["sigstop"], "sigstop", "sigstop", topo.MapDeliveryReload, 0, func(f *fleet, _ string) error {
			victim := f.victim()
			return b.rebalance(ctx, f, fmt.Sprintf("rebalance, reload, %s SIGSTOPped", victim.name), victim, *stopMemberWait)
		}},
	} {
		if !fr.on || ctx.Err() != nil {
			continue
		}
		f, err := b.startFleet(ctx, fr.name, fr.mode, fr.boot, fr.name == "reload" && sel["isolate"])
		if err == nil {
			err = fr.run(f, fr.step)
		}
		if f != nil {
			f.stop()
		}
		if err != nil {
			say("%s: %v", fr.step, err)
			errs = append(errs, fmt.Errorf("%s: %w", fr.step, err))
		}
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
		var dbs []string
		conn, err := pgx.Connect(ctx, b.env.admin[i])
		if err == nil {
			rows, _ := conn.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE 'fleet\_%'`)
			dbs, err = pgx.CollectRows(rows, pgx.RowTo[string])
			conn.Close(context.Background())
		}
		if err != nil {
			say("purging old databases on pg%d: %v", i+1, err)
		}
		for _, db := range dbs {
			if err := clustertest.DropDatabase(ctx, b.env.admin[i], db, say); err != nil {
				say("purging old database %s on pg%d: %v", db, i+1, err)
			}
		}
	}
}

// victim is the supervisor the sigstop scenario stops: the last one
// outside the load sample (the balancer would take one inside out by its
// /healthz, as the isolate scenario shows).
func (f *fleet) victim() *sup {
	sample := f.sample(nil)
	for _, s := range slices.Backward(f.sups) {
		if !slices.Contains(sample, s) {
			return s
		}
	}
	return f.sups[len(f.sups)-1]
}
