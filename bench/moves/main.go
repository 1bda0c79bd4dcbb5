// Command moves-bench measures online bucket moves (issue 7). Run it with
// bench/moves/run, which starts the local environment with four PostgreSQL
// nodes first.
//
// In one run, against the local ZooKeeper ensemble and PostgreSQL nodes of
// scripts/devenv, each in a fresh database:
//
//  1. a cluster of three nodes with the sharded table app.kv, the fence
//     installed, ROWS-PER-BUCKET rows loaded into every bucket (COPY
//     straight into the owners, bypassing the fence);
//  2. a constant write load: WRITERS goroutines, each with its own users,
//     upserting (updates of loaded users, inserts of new ones) through
//     router.Do, which retries across moves, and recording every
//     acknowledged write;
//  3. a fourth node added and the rebalancer run until balanced (level 7:
//     32 moves of about ROWS-PER-BUCKET rows each);
//  4. the copy baseline: for a few of the moved buckets, a plain
//     COPY (SELECT ... range) TO STDOUT piped into COPY ... FROM STDIN
//     between the same source and target, timed;
//  5. every acknowledged write checked on its owner in the final map.
//
// It reports the write pause per move three ways: the mover's record
// (source frozen to map flipped), the moving window as the router saw it
// (its map says moving until its map says flipped: writes go on to the
// source until its freeze), and as clients saw it (the longest write to the
// bucket that began in that window, router.Do's retries included); the pause's steps from the move
// record's step timestamps; the copy throughput against the baseline, with
// the copy step split into its phases by watching the replication
// connections; PostgreSQL and ZooKeeper round trips during the moves; the
// write load; and the acknowledged writes missing at the end. An aborted
// move (rolled back by the mover) is reported and the rebalancer run again.
//
// With --big-rows N it measures one big bucket's copy instead (big.go): N
// rows in one bucket, every 200th with a 4 KB TOASTed value, moved once,
// and the same rows through a single binary COPY pipe between the same
// nodes before and after the move, without write load.
//
// While it runs it holds the test environment's shared lock (as every
// integration test does), so that a disruptive test (one that kills a
// ZooKeeper server or stops a PostgreSQL node) waits for it, and it for them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/migrate"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

var (
	level         = flag.Int("level", 7, "map level: 2^level buckets (level 7: adding a 4th node to 3 moves 32 buckets)")
	rowsPerBucket = flag.Int("rows-per-bucket", 50000, "rows loaded into every bucket")
	writers       = flag.Int("writers", 32, "write-load goroutines")
	rate          = flag.Int("rate", 0, "total writes/s offered by the load (0: as fast as the writers go)")
	insertFrac    = flag.Float64("insert-frac", 0.25, "fraction of writes that insert a new user (the rest update a loaded one)")
	concurrency   = flag.Int("concurrency", 1, "moves at once (rebalancer policy)")
	rollbacks     = flag.Int("rollbacks", 8, "after the rebalance, move this many of the new node's buckets back with a rollback window and roll each move back, under the same load (issue 25): the rollbacks' write pauses (0: none)")
	retries       = flag.Int("retries", 3, "times to run the rebalancer again after it stopped on an aborted move")
	baselineN     = flag.Int("baseline", 3, "moved buckets to copy again with plain COPY for the baseline")
	warmup        = flag.Duration("warmup", 5*time.Second, "write load before the node is added (its rate is the 'before' figure)")
	jsonOut       = flag.Bool("json", false, "print the summary as JSON on stdout (the report goes to stderr)")
	verbose       = flag.Bool("v", false, "print every step of every move")
	devf          = benchkit.NewDevFlags(cliutil.LocalZK)
)

const (
	startNodes = 3
	clusterNm  = "moves"
	seedHex    = "6d6f7665732d62656e63682d69737375652d37" // "moves-bench-issue-7"
	kvDDL      = `CREATE SCHEMA IF NOT EXISTS app;
CREATE TABLE IF NOT EXISTS app.kv (bkey bigint NOT NULL, uid text NOT NULL, v bigint NOT NULL, PRIMARY KEY (bkey, uid))`
)

var kvTable = topo.TableRecord{Name: "app.kv", KeyColumn: "bkey"}

// printer prints the report: on stdout, or stderr with --json.
var printer = &benchkit.Printer{W: os.Stdout}

func say(format string, args ...any) { printer.Say(format, args...) }

func main() {
	flag.Parse()
	if *jsonOut {
		printer.W = os.Stderr
	}
	if *level < 1 || *level > 12 || *rowsPerBucket < 1 || *writers < 1 || *concurrency < 1 {
		fmt.Fprintln(os.Stderr, "moves-bench: --level 1..12, --rows-per-bucket, --writers and --concurrency >= 1")
		os.Exit(2)
	}
	if *bigRows < 0 || *bigToastEvery < 1 || *bigOthers < 1 {
		fmt.Fprintln(os.Stderr, "moves-bench: --big-rows >= 0, --big-toast-every and --big-others >= 1")
		os.Exit(2)
	}
	ctx, stop := benchkit.Context()
	defer stop()
	sum, err := run(ctx)
	benchkit.Finish("moves-bench", sum, err, func(s *Summary, e string) { s.Error = e }, report, *jsonOut)
	if sum.Missing > 0 {
		os.Exit(1)
	}
}

// ---------------------------------------------------------------- summary

// Stat is a distribution's nearest-rank percentiles, in ms (or rows/s).
type Stat = benchkit.Stat

func stat(xs []float64) Stat { return benchkit.Of(xs) }

// MoveRow is one move's figures.
type MoveRow struct {
	ID      string  `json:"id"`
	Bucket  uint32  `json:"bucket"`
	Level   int     `json:"level"`
	From    string  `json:"from"`
	To      string  `json:"to"`
	State   string  `json:"state"`
	Rows    int64   `json:"rows_copied"`
	CopyMS  float64 `json:"copy_ms"`
	RowsPS  float64 `json:"copy_rows_per_s"`
	LagMS   float64 `json:"lag_at_fence_ms"`
	PauseMS float64 `json:"pause_ms"`
	// Steps of the write pause, from the record's step timestamps.
	FenceMS   float64 `json:"fence_step_ms"`   // fence -> barrier: map says moving, members caught up, source frozen
	BarrierMS float64 `json:"barrier_step_ms"` // barrier -> flip: marker round trip, verification snapshot
	FlipMS    float64 `json:"flip_step_ms"`    // the rest of the pause: the map and the record in one ZooKeeper CAS
	TotalMS   float64 `json:"total_ms"`        // created -> done
	VerifyMS  float64 `json:"verify_ms"`       // the verify step: both snapshots counted and summed
	// RouterMS: the router's map said moving for this long (-1: never seen).
	RouterMS float64 `json:"router_pause_ms"`
	// ClientMS: the longest write to the bucket around the pause (-1: none).
	ClientMS float64 `json:"client_stall_ms"`
	VerifyOK bool    `json:"verify_ok"`
	// The copy step, from the nodes' activity (-1: not seen): ms from its
	// start until the move's slot was created, until its COPYs began and
	// until its apply worker connected (after the COPYs: the subscription
	// is enabled once they committed); the COPYs; from their end to the
	// end of the step.
	SlotMS     float64 `json:"copy_slot_ms"`
	LaunchMS   float64 `json:"copy_apply_worker_ms"`
	StartMS    float64 `json:"copy_start_ms"`
	DataMS     float64 `json:"copy_data_ms"`
	DataRowsPS float64 `json:"copy_data_rows_per_s"`
	HandoverMS float64 `json:"copy_handover_ms"`
	Error      string  `json:"error,omitempty"`
	startedAt  time.Time
	fenceAt    time.Time
	teardownAt time.Time
}

// BaselineRun is one plain COPY of a moved bucket's range.
type BaselineRun struct {
	Bucket uint32  `json:"bucket"`
	From   string  `json:"from"`
	To     string  `json:"to"`
	Rows   int64   `json:"rows"`
	MS     float64 `json:"ms"`
	RowsPS float64 `json:"rows_per_s"`
}

// Summary is everything the run found.
type Summary struct {
	Cores         int            `json:"cores"`
	Level         int            `json:"level"`
	Buckets       int            `json:"buckets"`
	RowsPerBucket int            `json:"rows_per_bucket"`
	RowsLoaded    int64          `json:"rows_loaded"`
	LoadSeconds   float64        `json:"load_seconds"`
	Writers       int            `json:"writers"`
	Rate          int            `json:"rate"`
	Concurrency   int            `json:"concurrency"`
	Database      string         `json:"database"`
	ZKRoot        string         `json:"zk_root"`
	Kept          bool           `json:"kept"`
	RebalanceSecs float64        `json:"rebalance_seconds"`
	Balanced      bool           `json:"balanced"`
	Restarts      int            `json:"rebalancer_restarts"`
	FinalCounts   map[string]int `json:"final_bucket_counts"`
	Moves         []MoveRow      `json:"moves"`
	MovesDone     int            `json:"moves_done"`
	MovesAborted  int            `json:"moves_aborted"`
	VerifyOK      int            `json:"verify_ok"`
	RowsMoved     int64          `json:"rows_moved"`
	PauseMS       Stat           `json:"pause_ms"`
	FenceStepMS   Stat           `json:"fence_step_ms"`
	BarrierStepMS Stat           `json:"barrier_step_ms"`
	FlipStepMS    Stat           `json:"flip_step_ms"`
	LagAtFenceMS  Stat           `json:"lag_at_fence_ms"`
	RouterPauseMS Stat           `json:"router_pause_ms"`
	ClientStallMS Stat           `json:"client_stall_ms"`
	MoveTotalMS   Stat           `json:"move_total_ms"`
	CopyMS        Stat           `json:"copy_ms"`
	MoverRowsPS   Stat           `json:"mover_copy_rows_per_s"`
	Baseline      []BaselineRun  `json:"baseline"`
	// Rollbacks: moves made with a rollback window after the rebalance,
	// each rolled back at once under the same load; their rollback moves'
	// write pauses (issue 25's goal: p99 under 50 ms).
	Rollbacks       []MoveRow `json:"rollbacks,omitempty"`
	RollbackPauseMS Stat      `json:"rollback_pause_ms"`
	BaselineRowsPS  Stat      `json:"baseline_copy_rows_per_s"`
	CopyRatio       float64   `json:"copy_ratio_mover_over_baseline"`
	SlotMS          Stat      `json:"copy_slot_ms"`
	LaunchMS        Stat      `json:"copy_apply_worker_ms"`
	StartMS         Stat      `json:"copy_start_ms"`
	DataMS          Stat      `json:"copy_data_ms"`
	HandoverMS      Stat      `json:"copy_handover_ms"`
	DataRowsPS      Stat      `json:"copy_data_rows_per_s"`
	DataRatio       float64   `json:"copy_data_ratio_over_baseline"`
	PGProbeMS       Stat      `json:"pg_probe_ms"`
	ZKReadMS        Stat      `json:"zk_read_ms"`
	ZKWriteMS       Stat      `json:"zk_write_ms"`
	PGConnectMS     Stat      `json:"pg_connect_ms"`
	PauseTargetMet  bool      `json:"pause_target_met"`

	WritesPerSecBefore float64 `json:"writes_per_s_before"`
	WritesPerSecDuring float64 `json:"writes_per_s_during_moves"`
	WritesAcked        int64   `json:"writes_acknowledged"`
	WritesFailed       int64   `json:"writes_failed"`
	WritesGaveUp       int64   `json:"writes_gave_up"`
	LastWriteError     string  `json:"last_write_error,omitempty"`
	WriteLatencyMS     Stat    `json:"write_latency_ms"`

	UsersChecked   int      `json:"users_checked"`
	Missing        int      `json:"missing_acknowledged_writes"`
	MissingSamples []string `json:"missing_samples,omitempty"`
	NewerThanAcked int      `json:"newer_than_acknowledged"`
	Leftovers      []string `json:"leftovers,omitempty"`
	Error          string   `json:"error,omitempty"`

	// Big is the big-bucket mode's (--big-rows) result; nil otherwise.
	Big *BigRun `json:"big,omitempty"`
}

const pauseTarget = 100.0 // ms, p99

func report(s *Summary) {
	if s.Big != nil {
		reportBig(s)
		return
	}
	ms := func(st Stat) string {
		if st.N == 0 {
			return "n/a"
		}
		return fmt.Sprintf("p50 %7.1f  p99 %7.1f  max %7.1f ms  (n=%d)", st.P50, st.P99, st.Max, st.N)
	}
	say("")
	say("move benchmark (issue 7): %d -> %d PostgreSQL nodes, level %d (%d buckets), %d rows/bucket (%s rows loaded in %.0f s), %d writers%s, concurrency %d, %d cores",
		startNodes, startNodes+1, s.Level, s.Buckets, s.RowsPerBucket, human(float64(s.RowsLoaded)), s.LoadSeconds, s.Writers,
		map[bool]string{true: fmt.Sprintf(" at %d writes/s", s.Rate), false: " (closed loop)"}[s.Rate > 0], s.Concurrency, s.Cores)
	say("  moves:            %d done, %d aborted, verified %d/%d; %s rows moved; rebalance %.1f s (balanced: %v, buckets now %v)",
		s.MovesDone, s.MovesAborted, s.VerifyOK, len(s.Moves), human(float64(s.RowsMoved)), s.RebalanceSecs, s.Balanced, s.FinalCounts)
	if s.Restarts > 0 {
		say("                    the rebalancer stopped on an aborted move and was run again %d time(s)", s.Restarts)
	}
	for _, m := range s.Moves {
		if m.State != topo.MoveDone {
			say("                    move %s (bucket %d %s -> %s) %s: %s", m.ID, m.Bucket, m.From, m.To, m.State, m.Error)
		}
	}
	verdict := "NOT MET"
	if s.PauseTargetMet {
		verdict = "met"
	}
	say("  write pause per move (mover record: source frozen -> map flipped, ZooKeeper CAS included)")
	say("                    %s   target p99 < %.0f ms: %s", ms(s.PauseMS), pauseTarget, verdict)
	say("    steps:  fence (map moving, routers caught up, freeze)  %s", ms(s.FenceStepMS))
	say("            barrier (marker applied on target, snapshot)    %s", ms(s.BarrierStepMS))
	say("            flip (map + move record: one ZooKeeper CAS)     %s", ms(s.FlipStepMS))
	say("  moving window as the router saw it (map says moving -> map flipped; writes go on to the source until its freeze)")
	say("                    %s", ms(s.RouterPauseMS))
	say("  longest client write to the bucket that began while it was moving (router.Do: fence rejections and retries included;")
	say("  for information: it also holds the write load's own latency tail, see below)")
	say("                    %s", ms(s.ClientStallMS))
	say("  replication lag at fence: %s", ms(s.LagAtFenceMS))
	say("  move duration:    %s", ms(s.MoveTotalMS))
	ratio := "n/a"
	if s.CopyRatio > 0 {
		ratio = fmt.Sprintf("%.2f", s.CopyRatio)
	}
	say("  copy throughput:  mover median %s rows/s (copy step median %.0f ms), plain COPY pipe median %s rows/s (%d buckets, same nodes, under the same load)",
		human(s.MoverRowsPS.P50), s.CopyMS.P50, human(s.BaselineRowsPS.P50), len(s.Baseline))
	say("                    ratio mover/baseline: %s", ratio)
	if s.DataRowsPS.N > 0 {
		say("    where the copy step goes (the nodes' activity, probed every %s):", probeEvery)
		say("            step start -> the move's slot created  %s", ms(s.SlotMS))
		say("            step start -> its COPYs start          %s", ms(s.StartMS))
		say("            the COPYs (source sends .. target done) %s", ms(s.DataMS))
		say("            COPY end -> end of the copy step       %s", ms(s.HandoverMS))
		say("            step start -> apply worker streaming   %s (enabled once the COPYs committed)", ms(s.LaunchMS))
		say("            the COPYs alone: median %s rows/s, ratio to the baseline %.2f", human(s.DataRowsPS.P50), s.DataRatio)
	}
	say("  during the moves: PostgreSQL probe query %s", ms(s.PGProbeMS))
	say("                    PostgreSQL new conn.   %s", ms(s.PGConnectMS))
	say("                    ZooKeeper map read     %s", ms(s.ZKReadMS))
	say("                    ZooKeeper write        %s", ms(s.ZKWriteMS))
	say("  write load:       %.0f writes/s before, %.0f writes/s during the moves; %d acknowledged, %d failed (%d gave up after router.Do's retries)",
		s.WritesPerSecBefore, s.WritesPerSecDuring, s.WritesAcked, s.WritesFailed, s.WritesGaveUp)
	say("                    write latency %s", ms(s.WriteLatencyMS))
	if s.LastWriteError != "" {
		say("                    last write error: %s", s.LastWriteError)
	}
	if s.RollbackPauseMS.N > 0 {
		say("  rollbacks:        %d moves rolled back under the load: write pause %s (goal: p99 under 50 ms)", s.RollbackPauseMS.N, ms(s.RollbackPauseMS))
	}
	say("  acknowledged writes missing at the end: %d (of %d users written; target 0)", s.Missing, s.UsersChecked)
	for _, m := range s.MissingSamples {
		say("    %s", m)
	}
	if s.NewerThanAcked > 0 {
		say("  (%d users hold a newer value from a write that failed on the client side: not lost)", s.NewerThanAcked)
	}
	if len(s.Leftovers) > 0 {
		say("  replication objects left behind: %v", s.Leftovers)
	}
	if s.Kept {
		say("  kept: database %s on every node, ZooKeeper %s", s.Database, s.ZKRoot)
	}
	if s.Error != "" {
		say("  ERROR: %s", s.Error)
	}
}

func human(x float64) string {
	switch {
	case x >= 1e6:
		return fmt.Sprintf("%.2fM", x/1e6)
	case x >= 1e4:
		return fmt.Sprintf("%.1fk", x/1e3)
	default:
		return fmt.Sprintf("%.0f", x)
	}
}

// ---------------------------------------------------------------- run

type bench struct {
	sess  *zksession.Session
	st    *bucketmap.Store
	ks    *keystream.Keystream
	nodes []bucketmap.Node // all four; the first three start the cluster
	db    string
	root  string
	r     *router.Router
	trk   *tracker
	prb   *probe
	start time.Time
}

func run(ctx context.Context) (*Summary, error) {
	b := &bench{start: time.Now()}
	now := time.Now().Unix()
	b.db = fmt.Sprintf("svbench_%d", now)
	b.root = fmt.Sprintf("/shardvisor-bench/moves-%d", now)
	sum := &Summary{Cores: runtime.NumCPU(), Level: *level, Buckets: 1 << *level, RowsPerBucket: *rowsPerBucket,
		Writers: *writers, Rate: *rate, Concurrency: *concurrency, Database: b.db, ZKRoot: b.root, Kept: *devf.Keep}

	say("creating database %s on %d nodes", b.db, startNodes+1)
	dev, err := clustertest.OpenDev(ctx, clustertest.DevSpec{Dir: *devf.Dir, Lock: !*devf.NoLock, PGHost: *devf.PGHost, PGPortBase: *devf.PGPortBase,
		Nodes: startNodes + 1, DB: b.db, ZK: *devf.ZK, Keep: *devf.Keep, Logf: say})
	if err != nil {
		return nil, err
	}
	defer dev.Close()
	dev.DeleteAtClose(topo.MustPaths(b.root, clusterNm))
	b.sess, b.nodes = dev.Session, dev.Nodes

	if err := b.setup(ctx); err != nil {
		return nil, err
	}
	if *bigRows > 0 {
		return sum, b.runBig(ctx, sum)
	}
	loadStart := time.Now()
	n, maxIdx, err := b.load(ctx)
	if err != nil {
		return nil, err
	}
	sum.RowsLoaded, sum.LoadSeconds = n, time.Since(loadStart).Seconds()

	// The router, registered as a member so that every move waits for it.
	b.trk = &tracker{since: map[bucketmap.Bucket]time.Time{}}
	b.r = router.New(b.sess, b.st.Paths(), router.Options{MemberID: "moves-bench", TunePool: func(c *pgxpool.Config) {
		c.MaxConns = int32(*writers)
	}})
	defer b.r.Close()
	b.r.OnUpdate(func(uint64) { b.trk.observe(b.r.Map(), time.Now()) })
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = b.r.WaitReady(wctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}

	// The write load.
	say("write load: %d writers, %.0f%% inserts of new users, the rest updates of loaded users; warming up %s", *writers, 100**insertFrac, *warmup)
	l := b.startLoad(maxIdx)
	loadStopped := false
	stopLoad := func() {
		if !loadStopped {
			loadStopped = true
			l.finish()
		}
	}
	defer stopLoad()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(*warmup):
	}
	sum.WritesPerSecBefore = float64(l.acks.Load()) / time.Since(l.started).Seconds()

	// Add the fourth node and rebalance.
	pg4 := b.nodes[startNodes]
	m, err := b.st.Update(ctx, func(m *bucketmap.Map) error { return m.AddNode(pg4) })
	if err != nil {
		return nil, fmt.Errorf("adding %s: %w", pg4.ID, err)
	}
	if err := clustertest.SyncFence(ctx, pg4, m); err != nil {
		return nil, err
	}
	say("added %s (map version %d); rebalancing with concurrency %d", pg4.ID, m.Version, *concurrency)
	b.prb = b.startProbe(ctx)
	acksBefore, rbStart := l.acks.Load(), time.Now()
	var done atomic.Int32
	mv := migrate.New(b.st, migrate.Options{Progress: func(prog migrate.Progress) {
		rec, msg := prog.Move, prog.Message
		switch {
		case msg == topo.MoveDone:
			row := b.moveRow(rec)
			say("  move %2d: bucket %3d %s -> %s  %6d rows  copy %6.0f ms (%s rows/s) [slot %s, COPY from %s for %s, then %s; apply worker %s]  lag %5.1f ms  pause %6.1f ms [fence %5.1f, barrier %5.1f, flip %5.1f]  router %s",
				done.Add(1), rec.Bucket, rec.Source, rec.Target, rec.Stats.RowsCopied, rec.Stats.CopyMS, human(row.RowsPS),
				seen(row.SlotMS), seen(row.StartMS), seen(row.DataMS), seen(row.HandoverMS), seen(row.LaunchMS),
				rec.Stats.LagAtFenceMS, rec.Stats.PauseMS, row.FenceMS, row.BarrierMS, row.FlipMS, optMS(b.trk.pause(bucketmap.Bucket{Prefix: rec.Bucket, Depth: rec.Level}, row.startedAt)))
		case msg == topo.MoveAborting || msg == topo.MoveAborted || msg == topo.MoveFailed:
			say("  move of bucket %d %s -> %s: %s: %s", rec.Bucket, rec.Source, rec.Target, msg, rec.Error)
		case *verbose:
			say("    bucket %d: %s", rec.Bucket, msg)
		}
	}})
	rb := migrate.NewRebalancer(mv, bucketmap.Policy{Concurrency: *concurrency})
	rb.Progress = func(prog migrate.Progress) {
		msg := prog.Message
		if *verbose || strings.HasPrefix(msg, "balanced") || strings.Contains(msg, "moves left (lower bound") && done.Load() == 0 {
			say("  rebalancer: %s", msg)
		}
	}
	// An aborted move stops the rebalancer (the move rolled back safely);
	// run it again, as an operator would, up to --retries times.
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
		if !aborted || attempt >= *retries || ctx.Err() != nil || errors.Is(err, migrate.ErrVerifyMismatch) {
			rbErr = fmt.Errorf("rebalance: %w", err)
			break
		}
		sum.Restarts++
		say("  rebalancer stopped (%v); running it again (%d/%d)", err, attempt+1, *retries)
	}
	sum.RebalanceSecs = time.Since(rbStart).Seconds()
	b.prb.finish()
	sum.PGProbeMS, sum.ZKReadMS, sum.ZKWriteMS, sum.PGConnectMS = stat(b.prb.pgRTT), stat(b.prb.zkRTT), stat(b.prb.zkWrite), stat(b.prb.pgConnect)
	sum.WritesPerSecDuring = float64(l.acks.Load()-acksBefore) / sum.RebalanceSecs

	// Rollbacks, under the same load: each bucket goes back to its old
	// owner with a window, and that move is rolled back at once (so the
	// map ends as balanced as the rebalance left it).
	if ctx.Err() == nil && rbErr == nil && *rollbacks > 0 {
		if err := b.rollbackRuns(ctx, sum, pg4.ID); err != nil {
			rbErr = fmt.Errorf("rollbacks: %w", err)
		}
	}

	// The copy baseline, under the same load.
	if ctx.Err() == nil {
		if sum.Baseline, err = b.baseline(ctx, sum.Moves); err != nil && rbErr == nil {
			rbErr = fmt.Errorf("baseline: %w", err)
		}
	}

	stopLoad()
	w := l.result()
	sum.WritesAcked, sum.WritesFailed, sum.WritesGaveUp = l.acks.Load(), l.failed.Load(), l.gaveUp.Load()
	if p := l.lastErr.Load(); p != nil {
		sum.LastWriteError = *p
	}
	var lat []float64
	for _, wr := range w.writes {
		lat = append(lat, float64(wr.durUS)/1000)
	}
	sum.WriteLatencyMS = stat(lat)
	b.clientStalls(sum.Moves, w.writes)

	// Every acknowledged write, on its owner in the final map.
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	final, _, err := b.st.Load(cctx)
	if err != nil {
		return sum, err
	}
	sum.FinalCounts = map[string]int{}
	for id, c := range final.Counts() {
		sum.FinalCounts[string(id)] = c
	}
	say("checking %d acknowledged users on their owners", len(w.acked))
	if err := b.checkAcked(cctx, final, w, sum); err != nil {
		return sum, err
	}
	sum.Leftovers = b.leftovers(cctx)
	b.summarize(sum)
	if rbErr == nil && ctx.Err() != nil {
		rbErr = ctx.Err()
	}
	return sum, rbErr
}

func seen(ms float64) string {
	if ms < 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", ms)
}

func optMS(d time.Duration, ok bool) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
}

func (b *bench) summarize(s *Summary) {
	var pause, fenceS, barrierS, flipS, lag, routerP, client, total, copyMS, rps, base []float64
	var slot, launch, start, data, handover, dataRPS []float64
	add := func(xs *[]float64, x float64) {
		if x >= 0 {
			*xs = append(*xs, x)
		}
	}
	for _, m := range s.Moves {
		switch m.State {
		case topo.MoveDone:
			s.MovesDone++
		case topo.MoveAborted:
			s.MovesAborted++
		}
		if m.VerifyOK {
			s.VerifyOK++
		}
		if m.State != topo.MoveDone {
			continue
		}
		s.RowsMoved += m.Rows
		pause = append(pause, m.PauseMS)
		fenceS = append(fenceS, m.FenceMS)
		barrierS = append(barrierS, m.BarrierMS)
		flipS = append(flipS, m.FlipMS)
		lag = append(lag, m.LagMS)
		total = append(total, m.TotalMS)
		copyMS = append(copyMS, m.CopyMS)
		rps = append(rps, m.RowsPS)
		add(&routerP, m.RouterMS)
		add(&client, m.ClientMS)
		add(&slot, m.SlotMS)
		add(&launch, m.LaunchMS)
		add(&start, m.StartMS)
		add(&data, m.DataMS)
		add(&handover, m.HandoverMS)
		if m.DataRowsPS > 0 {
			dataRPS = append(dataRPS, m.DataRowsPS)
		}
	}
	for _, r := range s.Baseline {
		base = append(base, r.RowsPS)
	}
	s.PauseMS, s.FenceStepMS, s.BarrierStepMS, s.FlipStepMS = stat(pause), stat(fenceS), stat(barrierS), stat(flipS)
	s.LagAtFenceMS, s.RouterPauseMS, s.ClientStallMS, s.MoveTotalMS = stat(lag), stat(routerP), stat(client), stat(total)
	s.CopyMS, s.MoverRowsPS, s.BaselineRowsPS = stat(copyMS), stat(rps), stat(base)
	s.SlotMS, s.LaunchMS, s.StartMS, s.DataMS, s.HandoverMS, s.DataRowsPS = stat(slot), stat(launch), stat(start), stat(data), stat(handover), stat(dataRPS)
	if s.BaselineRowsPS.P50 > 0 {
		s.CopyRatio = s.MoverRowsPS.P50 / s.BaselineRowsPS.P50
		s.DataRatio = s.DataRowsPS.P50 / s.BaselineRowsPS.P50
	}
	s.PauseTargetMet = s.PauseMS.N > 0 && s.PauseMS.P99 < pauseTarget && s.MovesAborted == 0
}

// moveRow extracts a move's figures from its record.
func (b *bench) moveRow(rec *topo.MoveRecord) MoveRow {
	row := MoveRow{ID: rec.ID, Bucket: rec.Bucket, Level: rec.Level, From: rec.Source, To: rec.Target, State: rec.State, Rows: rec.Stats.RowsCopied,
		CopyMS: rec.Stats.CopyMS, LagMS: rec.Stats.LagAtFenceMS, PauseMS: rec.Stats.PauseMS, Error: rec.Error,
		VerifyOK: rec.Verify != nil && rec.Verify.OK && !rec.Verify.Inconclusive, RouterMS: -1, ClientMS: -1, startedAt: rec.CreatedAt}
	if rec.Stats.CopyMS > 0 {
		row.RowsPS = float64(rec.Stats.RowsCopied) / rec.Stats.CopyMS * 1000
	}
	at := map[string]time.Time{}
	for _, st := range rec.Steps {
		at[st.State] = st.At // the last entry of a state wins
	}
	span := func(a, z string) float64 {
		ta, okA := at[a]
		tz, okZ := at[z]
		if !okA || !okZ {
			return 0
		}
		return float64(tz.Sub(ta).Microseconds()) / 1000
	}
	// The flip's step ends with a ZooKeeper transaction that also writes
	// the record, so the record cannot time it: it is the rest of the
	// pause (the barrier step begins when the freeze commits).
	row.FenceMS, row.BarrierMS = span(topo.MoveFence, topo.MoveBarrier), span(topo.MoveBarrier, topo.MoveFlip)
	if rec.Stats.PauseMS > 0 && row.BarrierMS > 0 {
		row.FlipMS = max(rec.Stats.PauseMS-row.BarrierMS, 0)
	}
	row.TotalMS = span(topo.MovePrepare, topo.MoveDone)
	if row.VerifyMS = span(topo.MoveVerify, topo.MoveReversible); row.VerifyMS == 0 {
		row.VerifyMS = span(topo.MoveVerify, topo.MoveDone)
	}
	row.fenceAt, row.teardownAt = at[topo.MoveFence], at[topo.MoveTeardown]
	if b.trk != nil {
		if d, ok := b.trk.pause(bucketmap.Bucket{Prefix: rec.Bucket, Depth: rec.Level}, rec.CreatedAt); ok {
			row.RouterMS = float64(d.Microseconds()) / 1000
		}
	}
	if b.prb != nil {
		b.prb.copyPhases(&row, rec)
	}
	return row
}

// ---------------------------------------------------------------- setup

func (b *bench) setup(ctx context.Context) error {
	ddl := []string{kvDDL}
	if *bigRows > 0 {
		ddl = append(ddl, blobDDL)
	}
	c, err := clustertest.Build(ctx, b.sess, clustertest.Spec{Root: b.root, Name: clusterNm, Seed: seedHex, Level: *level,
		Nodes: b.nodes, Mapped: startNodes, Tables: []topo.TableRecord{kvTable}, DDL: ddl})
	if err != nil {
		return err
	}
	b.st, b.ks = c.Store, c.Keystream
	say("cluster %s at %s: map level %d, %d buckets on %d nodes; fence installed on %d nodes", clusterNm, b.root, *level, c.Map.Buckets(), startNodes, len(b.nodes))
	return nil
}

type loadRow struct {
	key int64
	idx uint32
}

type rowSource struct {
	rows []loadRow
	i    int
	done *atomic.Int64
}

func (s *rowSource) Next() bool {
	s.i++
	if s.i <= len(s.rows) {
		s.done.Add(1)
		return true
	}
	return false
}

func (s *rowSource) Values() ([]any, error) {
	r := s.rows[s.i-1]
	return []any{r.key, benchkit.UserID(r.idx), int64(0)}, nil
}

func (s *rowSource) Err() error { return nil }

// load fills every bucket with rowsPerBucket users "u%08d", COPYing each
// node's rows in key order straight into it (bypassing the fence, as
// replication and GC do). It returns the rows loaded and the first user
// index not generated.
func (b *bench) load(ctx context.Context) (int64, uint32, error) {
	m, _, err := b.st.Load(ctx)
	if err != nil {
		return 0, 0, err
	}
	nb := m.Buckets()
	need := *rowsPerBucket
	total := nb * need
	counts := make([]int, nb)
	perNode := make([][]loadRow, startNodes)
	owner := make([]int, nb)
	for bk := range nb {
		owner[bk] = m.OwnerIndex(uint32(bk))
		if owner[bk] >= startNodes {
			return 0, 0, fmt.Errorf("bucket %d owned by node index %d", bk, owner[bk])
		}
	}
	for i := range perNode {
		perNode[i] = make([]loadRow, 0, total/startNodes+need)
	}
	say("generating %s users for %d buckets x %d rows", human(float64(total)), nb, need)
	const chunk = 1 << 18
	prefixes := make([]uint64, chunk)
	left, idx := total, uint32(0)
	procs := runtime.GOMAXPROCS(0)
	for left > 0 {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		var wg sync.WaitGroup
		per := (chunk + procs - 1) / procs
		for p := range procs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := p * per; j < min(chunk, (p+1)*per); j++ {
					prefixes[j] = b.ks.Prefix64(benchkit.UserID(idx + uint32(j)))
				}
			}()
		}
		wg.Wait()
		for j := 0; j < chunk && left > 0; j++ {
			bk := keystream.BucketOf(prefixes[j], *level)
			if counts[bk] >= need {
				continue
			}
			counts[bk]++
			left--
			o := owner[bk]
			perNode[o] = append(perNode[o], loadRow{key: keystream.Key(prefixes[j]), idx: idx + uint32(j)})
		}
		idx += chunk
	}
	for i := range perNode {
		slices.SortFunc(perNode[i], func(x, y loadRow) int {
			if x.key < y.key {
				return -1
			} else if x.key > y.key {
				return 1
			}
			return 0
		})
	}
	var done atomic.Int64
	start := time.Now()
	stopProgress := make(chan struct{})
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-t.C:
				n := done.Load()
				say("  loading: %s / %s rows (%s rows/s)", human(float64(n)), human(float64(total)), human(float64(n)/time.Since(start).Seconds()))
			}
		}
	}()
	errs := make([]error, startNodes)
	var wg sync.WaitGroup
	for i := range startNodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = b.copyIn(ctx, b.nodes[i], perNode[i], &done)
		}()
	}
	wg.Wait()
	close(stopProgress)
	if err := errors.Join(errs...); err != nil {
		return 0, 0, fmt.Errorf("loading: %w", err)
	}
	say("  loaded %s rows in %.1f s (%s rows/s); VACUUM ANALYZE", human(float64(done.Load())), time.Since(start).Seconds(), human(float64(done.Load())/time.Since(start).Seconds()))
	for i := range startNodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := dbnode.Connect(ctx, b.nodes[i])
			if err != nil {
				errs[i] = err
				return
			}
			defer c.Close(context.Background())
			_, errs[i] = c.Exec(ctx, "VACUUM (ANALYZE) app.kv")
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, 0, err
	}
	return done.Load(), idx, nil
}

func (b *bench) copyIn(ctx context.Context, n bucketmap.Node, rows []loadRow, done *atomic.Int64) error {
	c, err := dbnode.Connect(ctx, n)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "SET session_replication_role = replica"); err != nil {
		return err
	}
	got, err := c.CopyFrom(ctx, pgx.Identifier{"app", "kv"}, []string{"bkey", "uid", "v"}, &rowSource{rows: rows, done: done})
	if err != nil {
		return fmt.Errorf("%s: %w", n.ID, err)
	}
	if got != int64(len(rows)) {
		return fmt.Errorf("%s: copied %d rows of %d", n.ID, got, len(rows))
	}
	return nil
}

// ---------------------------------------------------------------- load

type write struct {
	atUS   int64 // start, µs since the bench started
	durUS  int32
	bucket uint32
	ok     bool
}

type writerResult struct {
	acked     map[string]int64
	uncertain map[string][]int64 // values of failed writes after the last acknowledged one
	writes    []write
}

type load struct {
	stop    *benchkit.Stopper
	started time.Time
	acks    atomic.Int64
	failed  atomic.Int64
	gaveUp  atomic.Int64
	lastErr atomic.Pointer[string]
	res     []*writerResult
}

func (b *bench) startLoad(maxIdx uint32) *load {
	l := &load{stop: benchkit.NewStopper(), started: time.Now(), res: make([]*writerResult, *writers)}
	nw := *writers
	var interval time.Duration
	if *rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(nw) / float64(*rate))
	}
	usersPer := int(maxIdx) / nw
	for w := range nw {
		res := &writerResult{acked: map[string]int64{}, uncertain: map[string][]int64{}}
		l.res[w] = res
		l.stop.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var seq, fresh int64
			pace := benchkit.NewPacer(interval)
			for pace.Wait(l.stop.C) {
				var uid string
				if rng.Float64() < *insertFrac {
					fresh++
					uid = fmt.Sprintf("n%02d-%d", w, fresh)
				} else {
					uid = benchkit.UserID(uint32(rng.IntN(usersPer)*nw + w))
				}
				seq++
				v := seq
				prefix := b.ks.Prefix64(uid)
				key := keystream.Key(prefix)
				wctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				start := time.Now()
				err := b.r.Do(wctx, uid, func(ctx context.Context, pool *pgxpool.Pool, _ router.Route) error {
					_, err := pool.Exec(ctx, `INSERT INTO app.kv (bkey, uid, v) VALUES ($1, $2, $3) ON CONFLICT (bkey, uid) DO UPDATE SET v = EXCLUDED.v`, key, uid, v)
					return err
				})
				dur := time.Since(start)
				cancel()
				res.writes = append(res.writes, write{atUS: start.Sub(b.start).Microseconds(), durUS: int32(min(dur.Microseconds(), math.MaxInt32)),
					bucket: keystream.BucketOf(prefix, *level), ok: err == nil})
				if err != nil {
					l.failed.Add(1)
					if strings.Contains(err.Error(), "gave up") {
						l.gaveUp.Add(1)
					}
					msg := err.Error()
					l.lastErr.Store(&msg)
					res.uncertain[uid] = append(res.uncertain[uid], v)
					continue
				}
				l.acks.Add(1)
				res.acked[uid] = v
				delete(res.uncertain, uid)
			}
		})
	}
	return l
}

func (l *load) finish() { l.stop.Stop() }

// result merges the writers' records (after finish). Writers own disjoint
// users, so the maps do not overlap.
func (l *load) result() *writerResult {
	all := &writerResult{acked: map[string]int64{}, uncertain: map[string][]int64{}}
	for _, r := range l.res {
		for k, v := range r.acked {
			all.acked[k] = v
		}
		for k, v := range r.uncertain {
			all.uncertain[k] = v
		}
		all.writes = append(all.writes, r.writes...)
	}
	return all
}

// ---------------------------------------------------------------- pauses

// tracker records, from the router's applied maps, when each bucket was
// moving: writes to it wait in router.Do for that long.
type tracker struct {
	mu      sync.Mutex
	since   map[bucketmap.Bucket]time.Time
	windows []window
}

type window struct {
	bucket     bucketmap.Bucket
	start, end time.Time
}

func (t *tracker) observe(m *bucketmap.Map, now time.Time) {
	if m == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	moving := map[bucketmap.Bucket]bool{}
	for _, bk := range m.NonActive() {
		if m.MetaOf(bk).State == bucketmap.BucketMoving {
			moving[bk] = true
			if _, ok := t.since[bk]; !ok {
				t.since[bk] = now
			}
		}
	}
	for bk, s := range t.since {
		if !moving[bk] {
			t.windows = append(t.windows, window{bucket: bk, start: s, end: now})
			delete(t.since, bk)
		}
	}
}

// find returns the bucket's moving window that began after a move's start.
func (t *tracker) find(bucket bucketmap.Bucket, after time.Time) (window, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := len(t.windows) - 1; i >= 0; i-- {
		if w := t.windows[i]; w.bucket == bucket && !w.start.Before(after) {
			return w, true
		}
	}
	return window{}, false
}

func (t *tracker) pause(bucket bucketmap.Bucket, after time.Time) (time.Duration, bool) {
	w, ok := t.find(bucket, after)
	return w.end.Sub(w.start), ok
}

// clientStalls sets each move's longest write to its bucket that started
// while the router's map said moving (or, not seen, between the fence and
// the teardown steps): those writes waited for the pause.
func (b *bench) clientStalls(moves []MoveRow, writes []write) {
	for i := range moves {
		mr := &moves[i]
		lo, hi := mr.fenceAt, mr.teardownAt
		if w, ok := b.trk.find(bucketmap.Bucket{Prefix: mr.Bucket, Depth: mr.Level}, mr.startedAt); ok {
			lo, hi = w.start, w.end
		}
		if lo.IsZero() || hi.IsZero() {
			continue
		}
		loUS, hiUS := lo.Sub(b.start).Microseconds(), hi.Sub(b.start).Microseconds()
		for _, w := range writes {
			if w.bucket == mr.Bucket && w.atUS >= loUS && w.atUS <= hiUS {
				mr.ClientMS = max(mr.ClientMS, float64(w.durUS)/1000)
			}
		}
	}
}

// ---------------------------------------------------------------- baseline

// baseline copies the ranges of a few moved buckets again, from the same
// source to the same target, with a plain binary COPY pipe into a scratch
// table with the same columns and primary key.
func (b *bench) baseline(ctx context.Context, moves []MoveRow) ([]BaselineRun, error) {
	var done []MoveRow
	for _, m := range moves {
		if m.State == topo.MoveDone {
			done = append(done, m)
		}
	}
	if len(done) == 0 || *baselineN <= 0 {
		return nil, nil
	}
	var pick []MoveRow
	n := min(*baselineN, len(done))
	for i := range n {
		pick = append(pick, done[i*len(done)/n])
	}
	node := func(id string) bucketmap.Node {
		for _, n := range b.nodes {
			if string(n.ID) == id {
				return n
			}
		}
		return bucketmap.Node{}
	}
	say("copy baseline: plain COPY of %d moved buckets' ranges, source -> target, into app.kv_baseline", len(pick))
	var runs []BaselineRun
	for _, mv := range pick {
		lo, hi, err := keystream.Range(*level, mv.Bucket)
		if err != nil {
			return runs, err
		}
		src, err := dbnode.Connect(ctx, node(mv.From))
		if err != nil {
			return runs, err
		}
		dst, err := dbnode.Connect(ctx, node(mv.To))
		if err != nil {
			src.Close(context.Background())
			return runs, err
		}
		run, err := copyPipe(ctx, src, dst, lo, hi)
		src.Close(context.Background())
		dst.Close(context.Background())
		if err != nil {
			return runs, err
		}
		run.Bucket, run.From, run.To = mv.Bucket, mv.From, mv.To
		say("  bucket %3d %s -> %s  %6d rows in %6.0f ms (%s rows/s); the mover: %6d rows in %6.0f ms (%s rows/s)",
			run.Bucket, run.From, run.To, run.Rows, run.MS, human(run.RowsPS), mv.Rows, mv.CopyMS, human(mv.RowsPS))
		runs = append(runs, run)
	}
	if c, err := dbnode.Connect(ctx, node(pick[0].To)); err == nil {
		_, _ = c.Exec(ctx, "DROP TABLE IF EXISTS app.kv_baseline")
		c.Close(context.Background())
	}
	return runs, nil
}

func copyPipe(ctx context.Context, src, dst *pgx.Conn, lo, hi int64) (BaselineRun, error) {
	var run BaselineRun
	if _, err := dst.Exec(ctx, "CREATE TABLE IF NOT EXISTS app.kv_baseline (LIKE app.kv INCLUDING ALL EXCLUDING CONSTRAINTS)"); err != nil {
		return run, err
	}
	if _, err := dst.Exec(ctx, "TRUNCATE app.kv_baseline"); err != nil {
		return run, err
	}
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := src.PgConn().CopyTo(ctx, pw, fmt.Sprintf("COPY (SELECT bkey, uid, v FROM app.kv WHERE bkey BETWEEN %d AND %d) TO STDOUT (FORMAT binary)", lo, hi))
		pw.CloseWithError(err)
		errc <- err
	}()
	tag, err := dst.PgConn().CopyFrom(ctx, pr, "COPY app.kv_baseline (bkey, uid, v) FROM STDIN (FORMAT binary)")
	pr.CloseWithError(err)
	if serr := <-errc; serr != nil {
		return run, fmt.Errorf("COPY TO: %w", serr)
	}
	if err != nil {
		return run, fmt.Errorf("COPY FROM: %w", err)
	}
	el := time.Since(start)
	run.Rows, run.MS = tag.RowsAffected(), float64(el.Microseconds())/1000
	run.RowsPS = float64(run.Rows) / el.Seconds()
	return run, nil
}

// ---------------------------------------------------------------- checks

// checkAcked looks up every user written with an acknowledgement on the
// owner of its bucket in the final map; its value must be the last
// acknowledged one (or that of a later write whose outcome the client did
// not learn).
func (b *bench) checkAcked(ctx context.Context, m *bucketmap.Map, w *writerResult, s *Summary) error {
	type item struct {
		uid string
		key int64
	}
	by := map[bucketmap.NodeID][]item{}
	for uid := range w.acked {
		p := b.ks.Prefix64(uid)
		o := m.Owner(keystream.BucketOf(p, m.Level))
		by[o] = append(by[o], item{uid, keystream.Key(p)})
	}
	s.UsersChecked = len(w.acked)
	for _, n := range m.Nodes() {
		items := by[n.ID]
		if len(items) == 0 {
			continue
		}
		c, err := dbnode.Connect(ctx, n)
		if err != nil {
			return err
		}
		for i := 0; i < len(items); i += 5000 {
			part := items[i:min(i+5000, len(items))]
			keys, uids := make([]int64, len(part)), make([]string, len(part))
			for j, it := range part {
				keys[j], uids[j] = it.key, it.uid
			}
			rows, err := c.Query(ctx, `SELECT k.uid, kv.v FROM unnest($1::bigint[], $2::text[]) AS k(bkey, uid)
				LEFT JOIN app.kv kv ON kv.bkey = k.bkey AND kv.uid = k.uid`, keys, uids)
			if err != nil {
				c.Close(context.Background())
				return err
			}
			for rows.Next() {
				var uid string
				var v *int64
				if err := rows.Scan(&uid, &v); err != nil {
					rows.Close()
					c.Close(context.Background())
					return err
				}
				want := w.acked[uid]
				switch {
				case v != nil && *v == want:
				case v != nil && slices.Contains(w.uncertain[uid], *v):
					s.NewerThanAcked++
				default:
					s.Missing++
					if len(s.MissingSamples) < 10 {
						got := "no row"
						if v != nil {
							got = fmt.Sprintf("v=%d", *v)
						}
						s.MissingSamples = append(s.MissingSamples, fmt.Sprintf("%s: acknowledged v=%d, owner %s has %s", uid, want, n.ID, got))
					}
				}
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				c.Close(context.Background())
				return err
			}
		}
		c.Close(context.Background())
	}
	return nil
}

// leftovers lists the moves' replication objects still on the nodes.
func (b *bench) leftovers(ctx context.Context) []string {
	var outl []string
	for _, n := range b.nodes {
		c, err := dbnode.Connect(ctx, n)
		if err != nil {
			outl = append(outl, fmt.Sprintf("%s: %v", n.ID, err))
			continue
		}
		objs, err := migrate.ReplicationObjects(ctx, c)
		if err != nil {
			outl = append(outl, fmt.Sprintf("%s: %v", n.ID, err))
		}
		for _, o := range objs {
			outl = append(outl, string(n.ID)+": "+o)
		}
		c.Close(context.Background())
	}
	sort.Strings(outl)
	return outl
}

// ---------------------------------------------------------------- probes

// probe watches, while the moves run, the round-trip time of a small query
// on every node and of a ZooKeeper read, and the replication connections
// (walsenders) and COPYs of the bench's database on every node: what they
// are doing tells where a move's copy step spends its time (creating the
// slot, copying, enabling the subscription).
type probe struct {
	mu        sync.Mutex
	sightings []sighting
	pgRTT     []float64
	zkRTT     []float64
	zkWrite   []float64
	pgConnect []float64
	stop      chan struct{}
	wg        sync.WaitGroup
}

type sighting struct {
	at   time.Time
	node string
	kind string // slot (the move's slot), start (its apply worker), copy (source), ingest (target)
	slot string
}

const probeEvery = 20 * time.Millisecond

func (b *bench) startProbe(ctx context.Context) *probe {
	p := &probe{stop: make(chan struct{})}
	for _, n := range b.nodes {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			var c *pgx.Conn
			defer func() {
				if c != nil {
					c.Close(context.Background())
				}
			}()
			t := time.NewTicker(probeEvery)
			defer t.Stop()
			for {
				select {
				case <-p.stop:
					return
				case <-t.C:
				}
				if c == nil || c.IsClosed() {
					var err error
					if c, err = dbnode.Connect(ctx, n); err != nil {
						c = nil
						continue
					}
				}
				start := time.Now()
				// The walsenders and the move's COPYs (source side:
				// the mover quotes the table's name, the baseline does
				// not), and the COPYs being written (target side; the
				// baseline's go to another table).
				rows, err := c.Query(ctx, `SELECT query FROM pg_stat_activity WHERE state = 'active' AND datname = current_database()
						AND (backend_type = 'walsender' OR query LIKE 'COPY (SELECT % FROM "app"."kv" %')
					UNION ALL SELECT 'INGEST ' || relid::regclass::text FROM pg_stat_progress_copy WHERE datname = current_database() AND command = 'COPY FROM'`)
				if err != nil {
					c.Close(context.Background())
					c = nil
					continue
				}
				qs, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil {
					continue
				}
				rtt := float64(time.Since(start).Microseconds()) / 1000
				p.mu.Lock()
				p.pgRTT = append(p.pgRTT, rtt)
				for _, q := range qs {
					if k, slot := classify(q); k != "" {
						p.sightings = append(p.sightings, sighting{at: start, node: string(n.ID), kind: k, slot: slot})
					}
				}
				p.mu.Unlock()
			}
		}()
	}
	// Writes are timed on a scratch node beside the cluster.
	scratch, scratchErr := topo.CreateScratch(ctx, b.sess, b.st.Paths(), "moves-bench", nil)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		n := 0
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
			start := time.Now()
			if _, _, err := topo.ReadMapData(ctx, b.sess, b.st.Paths()); err != nil {
				continue
			}
			read := float64(time.Since(start).Microseconds()) / 1000
			start = time.Now()
			err := scratchErr
			if err == nil {
				err = scratch.Write(ctx, []byte(start.String()))
			}
			write := float64(time.Since(start).Microseconds()) / 1000
			p.mu.Lock()
			p.zkRTT = append(p.zkRTT, read)
			if err == nil {
				p.zkWrite = append(p.zkWrite, write)
			}
			p.mu.Unlock()
			// A new connection to the new node, as the mover opens one
			// inside the pause (see the report).
			if n++; n%5 == 0 {
				start = time.Now()
				if c, err := dbnode.Connect(ctx, b.nodes[startNodes]); err == nil {
					d := float64(time.Since(start).Microseconds()) / 1000
					c.Close(context.Background())
					p.mu.Lock()
					p.pgConnect = append(p.pgConnect, d)
					p.mu.Unlock()
				}
			}
		}
	}()
	return p
}

func (p *probe) finish() {
	close(p.stop)
	p.wg.Wait()
}

// classify names what a replication connection is doing.
func classify(q string) (kind, slot string) {
	quoted := func() string {
		if i := strings.IndexByte(q, '"'); i >= 0 {
			if j := strings.IndexByte(q[i+1:], '"'); j >= 0 {
				return q[i+1 : i+1+j]
			}
		}
		return ""
	}
	switch {
	case strings.HasPrefix(q, "CREATE_REPLICATION_SLOT"):
		if s := quoted(); strings.HasPrefix(s, "sv_") {
			return "slot", s
		}
	case strings.HasPrefix(q, "START_REPLICATION"):
		if s := quoted(); strings.HasPrefix(s, "sv_") {
			return "start", s
		}
	case strings.HasPrefix(q, "COPY") && strings.Contains(q, "kv") && !strings.Contains(q, "move_marker"):
		return "copy", ""
	case q == "INGEST app.kv":
		return "ingest", ""
	}
	return "", ""
}

// copyPhases splits a move's copy step with the sightings on its nodes:
// until its slot exists (the replication connection creating it), until
// its COPYs start, the COPYs (the source sending, the target writing), and
// the rest (the subscription enabled). Its apply worker connects after
// that, once enabled (sighted up to 5 s after the step). Times in ms; -1:
// not seen (shorter than the probe interval).
func (p *probe) copyPhases(row *MoveRow, rec *topo.MoveRecord) {
	var copyAt, catchupAt time.Time
	for _, st := range rec.Steps {
		switch st.State {
		case topo.MoveCopy:
			copyAt = st.At
		case topo.MoveCatchup:
			catchupAt = st.At
		}
	}
	row.SlotMS, row.LaunchMS, row.StartMS, row.DataMS, row.HandoverMS = -1, -1, -1, -1, -1
	if copyAt.IsZero() || catchupAt.IsZero() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var slotEnd, start, copyFirst, copyLast time.Time
	for _, s := range p.sightings {
		if s.at.Before(copyAt) || s.at.After(catchupAt.Add(5*time.Second)) {
			continue
		}
		if s.kind == "start" && s.node == rec.Source && s.slot == rec.Slot && start.IsZero() {
			start = s.at
			continue
		}
		if s.at.After(catchupAt) {
			continue
		}
		switch {
		case s.kind == "ingest" && s.node == rec.Target, s.kind == "copy" && s.node == rec.Source:
			if copyFirst.IsZero() || s.at.Before(copyFirst) {
				copyFirst = s.at
			}
			if s.at.After(copyLast) {
				copyLast = s.at
			}
		case s.kind == "slot" && s.node == rec.Source && s.slot == rec.Slot:
			slotEnd = s.at
		}
	}
	ms := func(a, z time.Time) float64 { return float64(z.Sub(a).Microseconds()) / 1000 }
	if !slotEnd.IsZero() {
		row.SlotMS = ms(copyAt, slotEnd)
	}
	if !start.IsZero() {
		row.LaunchMS = ms(copyAt, start)
	}
	if !copyFirst.IsZero() {
		// The COPYs ran from about their first sighting to their last,
		// give or take a probe interval.
		copyLast = copyLast.Add(probeEvery / 2)
		copyFirst = copyFirst.Add(-probeEvery / 2)
		row.StartMS = max(ms(copyAt, copyFirst), 0)
		row.DataMS = ms(copyFirst, copyLast)
		row.HandoverMS = ms(copyLast, catchupAt)
		if row.DataMS > 0 {
			row.DataRowsPS = float64(rec.Stats.RowsCopied) / row.DataMS * 1000
		}
	}
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
		r := b.moveRow(rb)
		sum.Rollbacks = append(sum.Rollbacks, r)
		pauses = append(pauses, rb.Stats.PauseMS)
		say("  rollback %d: bucket %3d %s -> %s moved (pause %.1f ms), rolled back %s -> %s: pause %.1f ms",
			len(pauses), row.Bucket, rec.Source, rec.Target, rec.Stats.PauseMS, rb.Source, rb.Target, rb.Stats.PauseMS)
	}
	sum.RollbackPauseMS = stat(pauses)
	return nil
}
