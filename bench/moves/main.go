// Command moves-bench measures online bucket moves under a write load
// (issue 7): a fourth node added to three and the rebalancer run, rollbacks
// (--rollbacks), the copy against a plain COPY pipe of the same ranges, and
// every acknowledged write checked at the end; with --big-rows, one big
// bucket's copy (big.go). Run it with bench/moves/run; docs/moves.md
// ("Measured") says what each figure means. It holds the test
// environment's shared lock while it runs.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/benchkit/kvload"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/migrate"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

var (
	load          = kvload.NewFlags(7, "level 7: adding a 4th node to 3 moves 32 buckets", 32, "")
	rowsPerBucket = flag.Int("rows-per-bucket", 50000, "rows loaded into every bucket")
	rate          = flag.Int("rate", 0, "total writes/s offered by the load (0: as fast as the writers go)")
	concurrency   = flag.Int("concurrency", 1, "moves at once (rebalancer policy)")
	rollbacks     = flag.Int("rollbacks", 8, "after the rebalance, move this many of the new node's buckets back with a rollback window and roll each move back, under the same load (issue 25): the rollbacks' write pauses (0: none)")
	baselineN     = flag.Int("baseline", 3, "moved buckets to copy again with plain COPY for the baseline")
	warmup        = flag.Duration("warmup", benchkit.EnvDuration("SHARDVISOR_BENCH_WARMUP", 5*time.Second), "write load first: the router's pools connect and the servers' caches warm; its writes have a figure of their own (write_latency_warmup_ms), not in write_latency_ms (env SHARDVISOR_BENCH_WARMUP)")
	steady        = flag.Duration("steady", benchkit.EnvDuration("SHARDVISOR_BENCH_STEADY", 10*time.Second), "write load after the warm-up, before the node is added: write_latency_steady_ms and the 'before' rate, not in write_latency_ms (env SHARDVISOR_BENCH_STEADY)")
	devf          = benchkit.NewDevFlags(cliutil.LocalZK)
	compareTLS    = benchkit.CompareFlag()
	pooler        = flag.Bool("pooler", os.Getenv("SHARDVISOR_BENCH_POOLER") == "1", "the router writes through each node's PgBouncer (transaction mode, the node's pool_dsn; the mover and the loads' setup stay direct) (env SHARDVISOR_BENCH_POOLER=1)")
	comparePooler = flag.Bool("compare-pooler", os.Getenv("SHARDVISOR_BENCH_COMPARE_POOLER") == "1", "run twice (--rounds times each, alternating which goes first) on the same environment, the router direct then through the poolers, and print both and the ratios pooler/direct against issue 42's goals (env SHARDVISOR_BENCH_COMPARE_POOLER=1)")
	rounds        = benchkit.RoundsFlag()
	compareFiles  = flag.String("compare-json", benchkit.EnvOr("SHARDVISOR_BENCH_COMPARE_JSON", ""), "BASE,NEW: print the comparison of two runs' --json summaries (the baseline's first) against issue 39's goals, and exit (1 if a goal is missed); bench/moves/run --baseline REV makes both (env SHARDVISOR_BENCH_COMPARE_JSON)")
	// The big-bucket mode (big.go).
	bigRows       = flag.Int("big-rows", 0, "big-bucket mode: load this many rows into one bucket, move it once, and time the same rows through a single binary COPY pipe (0: the rebalance benchmark)")
	bigToastEvery = flag.Int("big-toast-every", 200, "big-bucket mode: every Nth row gets a 4 KB incompressible value (stored out of line: TOASTed)")
	bigOthers     = flag.Int("big-others", 2000, "big-bucket mode: rows loaded into every other bucket")
	bigSorted     = flag.Bool("big-sorted", false, "big-bucket mode: store the bucket's rows in key order (default: in random key order, as users' rows arrive)")
)

const (
	startNodes = 3
	retries    = 3 // times the rebalancer runs again after it stopped on an aborted move
	clusterNm  = "moves"
	seedHex    = "6d6f7665732d62656e63682d69737375652d37" // "moves-bench-issue-7"
)

// out prints the report: on stdout, or stderr with --json.
var out = benchkit.NewOut()

func say(format string, args ...any) { out.Say(format, args...) }

func main() {
	out.Parse()
	if *load.Level < 1 || *load.Level > 12 || *rowsPerBucket < 1 || *load.Writers < 1 || *concurrency < 1 || *bigRows < 0 || *bigToastEvery < 1 || *bigOthers < 1 {
		benchkit.Fatalf(2, "moves-bench", "--level 1..12; --rows-per-bucket, --writers, --concurrency, --big-toast-every and --big-others >= 1; --big-rows >= 0")
	}
	if *compareFiles != "" {
		files := strings.Split(*compareFiles, ",")
		if len(files) != 2 {
			benchkit.Fatalf(2, "moves-bench", "--compare-json wants two files, BASE,NEW; got %q", *compareFiles)
		}
		met, err := compareJSON(files[0], files[1])
		if err != nil {
			benchkit.Fatalf(2, "moves-bench", "--compare-json: %v", err)
		}
		if !met {
			os.Exit(1)
		}
		return
	}
	ctx, stop := benchkit.Context()
	defer stop()
	if *comparePooler {
		comparePoolerMain(ctx)
		return
	}
	if *compareTLS {
		clustertest.CompareMain("moves-bench", out, *devf.Keep, *rounds, tlsFigures, func(e *devenv.Env) (*Summary, error) {
			*devf.Dir, *devf.ZK, *devf.PGPortBase, *devf.TLS = e.Dir(), e.ZKConnect(), e.PGPort(1), e.Config().TLS
			return run(ctx)
		}, report)
		return
	}
	sum, err := run(ctx)
	benchkit.Finish("moves-bench", sum, err, func(s *Summary, e string) { s.Error = e }, report, *out.JSON)
	if sum.Missing > 0 {
		os.Exit(1)
	}
}

// tlsFigures are --compare-tls's: issue 38 bounds the write p99 through
// router.Do at 1.15x the plain mode's, issue 41 the move pause p99 at
// 1.2x. The writes' p99 by phase says where a tail comes from.
var tlsFigures = []benchkit.Figure{{Name: "write p99 through router.Do (ms, node added on)", Path: "write_latency_ms.p99", Goal: benchkit.TLSGoal},
	{Name: "move pause p99 (ms, mover record)", Path: "pause_ms.p99", Goal: benchkit.TLSPauseGoal},
	{Name: "write p50 through router.Do (ms)", Path: "write_latency_ms.p50"},
	{Name: "write p99, warm-up (pools connecting)", Path: "write_latency_warmup_ms.p99"}, {Name: "write p99, steady (before the node)", Path: "write_latency_steady_ms.p99"}, {Name: "write p99, adding the node and rebalancing", Path: "write_latency_rebalance_ms.p99"},
	{Name: "write p99, rebalance, bucket not moving", Path: "write_latency_not_moving_ms.p99"}, {Name: "write p99, rebalance, bucket moving", Path: "write_latency_moving_ms.p99"},
	{Name: "write p99, after (rollbacks, COPY baseline)", Path: "write_latency_after_ms.p99"}, {Name: "moving window p99, router (ms)", Path: "router_pause_ms.p99"},
	{Name: "rollback pause p99 (ms)", Path: "rollback_pause_ms.p99"}, {Name: "ZooKeeper write p99 (ms, admin)", Path: "zk_write_ms.p99"},
	{Name: "writes/s during the moves", Path: "writes_per_s_during_moves"}, {Name: "rebalance (s)", Path: "rebalance_seconds"},
	{Name: "acknowledged writes lost: 0", Path: "missing_acknowledged_writes", Zero: true}, {Name: "moves aborted: 0", Path: "moves_aborted", Zero: true}}

type bench struct {
	sess  *zksession.Session
	st    *bucketmap.Store
	ks    *keystream.Keystream
	nodes []bucketmap.Node // all four; the first three start the cluster
	root  string
	r     *router.Router
	trk   *tracker
	prb   *probe
	start time.Time
}

func run(ctx context.Context) (*Summary, error) {
	b := &bench{start: time.Now()}
	db := fmt.Sprintf("svbench_%d", b.start.Unix())
	b.root = fmt.Sprintf("/shardvisor-bench/moves-%d", b.start.Unix())
	sum := &Summary{Cores: runtime.NumCPU(), Level: *load.Level, Buckets: 1 << *load.Level, RowsPerBucket: *rowsPerBucket,
		Writers: *load.Writers, Rate: *rate, Concurrency: *concurrency, Pooler: *pooler, Database: db, ZKRoot: b.root, Kept: *devf.Keep, Stats: map[string]benchkit.Stat{}}

	say("creating database %s on %d nodes", db, startNodes+1)
	dev, err := clustertest.OpenDev(ctx, clustertest.DevSpec{Dir: *devf.Dir, Lock: !*devf.NoLock, PGHost: *devf.PGHost, PGPortBase: *devf.PGPortBase,
		Nodes: startNodes + 1, DB: db, ZK: *devf.ZK, TLS: *devf.TLS, Pooler: *pooler, Keep: *devf.Keep, Logf: say})
	if err != nil {
		return nil, err
	}
	defer dev.Close()
	dev.DeleteAtClose(topo.MustPaths(b.root, clusterNm))
	b.sess, b.nodes = dev.Session, dev.Nodes

	ddl := []string{clustertest.KVDDL}
	if *bigRows > 0 {
		ddl = append(ddl, blobDDL)
	}
	c, err := clustertest.Build(ctx, b.sess, clustertest.Spec{Root: b.root, Name: clusterNm, Seed: seedHex, Level: *load.Level,
		Nodes: b.nodes, Mapped: startNodes, Tables: []topo.TableRecord{clustertest.KV}, DDL: ddl})
	if err != nil {
		return nil, err
	}
	b.st, b.ks = c.Store, c.Keystream
	say("cluster %s at %s: map level %d, %d buckets on %d nodes; fence installed on %d nodes", clusterNm, b.root, *load.Level, c.Map.Buckets(), startNodes, len(b.nodes))
	if *bigRows > 0 {
		return sum, b.runBig(ctx, sum)
	}
	loadStart := time.Now()
	n, maxIdx, err := b.load(ctx)
	if err != nil {
		return nil, err
	}
	sum.RowsLoaded, sum.LoadSeconds = n, time.Since(loadStart).Seconds()

	// The router, on a session of its own as a web head's, registered as
	// a member so that every move waits for it.
	rs, err := dev.SessionAs(ctx, clustertest.WebHead)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	b.trk = &tracker{since: map[bucketmap.Bucket]time.Time{}}
	if b.r, err = kvload.NewRouter(ctx, rs, b.st.Paths(), "moves-bench", *load.Writers, func(r *router.Router) { b.trk.observe(r.Map(), time.Now()) }); err != nil {
		return nil, err
	}
	defer b.r.Close()

	say("write load: %d writers, %.0f%% inserts of new users, the rest updates of loaded users; warming up %s", *load.Writers, 100**load.InsertFrac, *warmup)
	l := kvload.Start(kvload.Options{Router: b.r, Keystream: b.ks, Level: *load.Level, Writers: *load.Writers, Rate: *rate, InsertFrac: *load.InsertFrac,
		Users: int(maxIdx), Fresh: "n", Seed: 7, Start: b.start})
	defer l.Stop() // Stop is idempotent: the load also stops before the check
	if sum.ZKWarmupOps, err = warmZK(ctx, b.sess, b.st.Paths(), *warmup); err != nil {
		return nil, err
	}
	// The warm-up's writes pay the pools' new connections (TLS's handshake,
	// say: the connect benchmark's figure); the steady window's are a
	// figure of their own; the goal's figure is every write from the node's
	// addition on (phaseLatencies).
	steadyFrom, acksWarm := time.Now(), l.Acks.Load()
	say("steady load for %s (measured apart), then the node is added", *steady)
	if err := benchkit.Sleep(ctx, *steady); err != nil {
		return nil, err
	}
	steadyTo := time.Now()
	sum.WarmupSecs, sum.SteadySecs = steadyFrom.Sub(l.Started).Seconds(), steadyTo.Sub(steadyFrom).Seconds()
	sum.WritesPerSecBefore = float64(l.Acks.Load()-acksWarm) / sum.SteadySecs

	pg4 := b.nodes[startNodes]
	m, err := clustertest.AddNode(ctx, b.st, pg4)
	if err != nil {
		return nil, err
	}
	say("added %s (map version %d); rebalancing with concurrency %d", pg4.ID, m.Version, *concurrency)
	b.prb = b.startProbe(ctx)
	acksBefore, rbStart := l.Acks.Load(), time.Now()
	var done atomic.Int32
	mv := migrate.New(b.st, migrate.Options{Progress: func(prog migrate.Progress) {
		rec, msg := prog.Move, prog.Message
		switch {
		case msg == topo.MoveDone:
			row := b.moveRow(rec)
			say("  move %2d: bucket %3d %s -> %s  %6d rows  copy %6.0f ms (%s rows/s) [slot %s, COPY from %s for %s, then %s; apply worker %s]  lag %5.1f ms  pause %6.1f ms [fence %5.1f, barrier %5.1f, flip %5.1f]  router %s",
				done.Add(1), rec.Bucket, rec.Source, rec.Target, rec.Stats.RowsCopied, rec.Stats.CopyMS, human(row.RowsPS),
				seen(row.SlotMS, "%.0f"), seen(row.StartMS, "%.0f"), seen(row.DataMS, "%.0f"), seen(row.HandoverMS, "%.0f"), seen(row.LaunchMS, "%.0f"),
				rec.Stats.LagAtFenceMS, rec.Stats.PauseMS, row.FenceMS, row.BarrierMS, row.FlipMS, seen(row.RouterMS, "%.1f ms"))
		case msg == topo.MoveAborting || msg == topo.MoveAborted || msg == topo.MoveFailed:
			say("  move of bucket %d %s -> %s: %s: %s", rec.Bucket, rec.Source, rec.Target, msg, rec.Error)
		}
	}})
	rb := migrate.NewRebalancer(mv, bucketmap.Policy{Concurrency: *concurrency})
	rb.Progress = func(prog migrate.Progress) {
		if msg := prog.Message; strings.HasPrefix(msg, "balanced") || strings.Contains(msg, "moves left (lower bound") && done.Load() == 0 {
			say("  rebalancer: %s", msg)
		}
	}
	// An aborted move stops the rebalancer (the move rolled back safely);
	// run it again, as an operator would, up to retries times.
	var rbErr error
	for attempt := 0; ; attempt++ {
		rep, err := rb.Run(ctx)
		aborted := false
		if rep != nil {
			sum.Balanced = rep.Balanced
			for _, rec := range rep.Moves {
				sum.Moves = append(sum.Moves, b.moveRow(rec))
				aborted = rec.State == topo.MoveAborted
			}
		}
		if err == nil {
			break
		}
		if !aborted || attempt >= retries || ctx.Err() != nil || errors.Is(err, migrate.ErrVerifyMismatch) {
			rbErr = fmt.Errorf("rebalance: %w", err)
			break
		}
		sum.Restarts++
		say("  rebalancer stopped (%v); running it again (%d/%d)", err, attempt+1, retries)
	}
	rbEnd := time.Now()
	sum.RebalanceSecs = rbEnd.Sub(rbStart).Seconds()
	b.prb.Stop()
	for i, k := range probeStats {
		sum.Stats[k] = benchkit.Of(b.prb.samples[i])
	}
	sum.WritesPerSecDuring = float64(l.Acks.Load()-acksBefore) / sum.RebalanceSecs

	// Rollbacks, under the same load (the map ends as balanced as the rebalance left it).
	if ctx.Err() == nil && rbErr == nil && *rollbacks > 0 {
		if err := b.rollbackRuns(ctx, sum, pg4.ID); err != nil {
			rbErr = fmt.Errorf("rollbacks: %w", err)
		}
	}

	if ctx.Err() == nil {
		if sum.Baseline, err = b.baseline(ctx, sum.Moves); err != nil && rbErr == nil {
			rbErr = fmt.Errorf("baseline: %w", err)
		}
	}

	l.Stop()
	w := l.Result()
	sum.WritesAcked, sum.WritesFailed, sum.WritesGaveUp = l.Acks.Load(), l.Failed.Load(), l.GaveUp.Load()
	if p := l.LastErr.Load(); p != nil {
		sum.LastWriteError = *p
	}
	b.clientStalls(sum.Moves, w.Writes)
	b.phaseLatencies(sum, w.Writes, steadyFrom, steadyTo, rbEnd)

	// Every acknowledged write, on its owner in the final map.
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	final, _, err := b.st.Load(cctx)
	if err != nil {
		return sum, err
	}
	sum.FinalCounts = final.Counts()
	say("checking %d acknowledged users on their owners", len(w.Acked))
	if sum.Check, err = b.checkAcked(cctx, final, w); err != nil {
		return sum, err
	}
	sum.Leftovers = b.leftovers(cctx)
	b.summarize(sum)
	return sum, cmp.Or(rbErr, ctx.Err())
}

// rollbackRuns moves up to --rollbacks of the new node's buckets back to
// their old owners with a rollback window, and rolls each move back at
// once: the rollback moves' pauses go into the summary; the acknowledged
// writes check at the end covers the writes made on either side.
func (b *bench) rollbackRuns(ctx context.Context, sum *Summary, to bucketmap.NodeID) error {
	mv := migrate.New(b.st, migrate.Options{Window: time.Hour})
	defer mv.Close()
	var pauses []float64
	for _, row := range sum.Moves {
		if len(pauses) >= *rollbacks {
			break
		}
		if row.State != topo.MoveDone || row.To != string(to) {
			continue
		}
		rec, err := mv.Move(ctx, row.Bucket, bucketmap.NodeID(row.From), false)
		if err != nil {
			return fmt.Errorf("moving bucket %d back to %s: %w", row.Bucket, row.From, err)
		}
		out, err := mv.Rollback(ctx, rec.ID)
		if err != nil {
			return fmt.Errorf("rolling back move %s: %w", rec.ID, err)
		}
		rb, err := mv.Get(ctx, out.Reverse.Rollback)
		if err != nil {
			return err
		}
		sum.Rollbacks = append(sum.Rollbacks, b.moveRow(rb))
		pauses = append(pauses, rb.Stats.PauseMS)
		say("  rollback %d: bucket %3d %s -> %s moved (pause %.1f ms), rolled back %s -> %s: pause %.1f ms",
			len(pauses), row.Bucket, rec.Source, rec.Target, rec.Stats.PauseMS, rb.Source, rb.Target, rb.Stats.PauseMS)
	}
	sum.Stats["rollback_pause_ms"] = benchkit.Of(pauses)
	return nil
}
