// Command schema-bench measures online schema changes and schema diffs
// (issue 27). Run it with bench/schema/run, which starts the local
// environment with four PostgreSQL nodes first.
//
// In one run, against the local ZooKeeper ensemble and PostgreSQL nodes of
// scripts/devenv, each in a fresh database and under a fresh ZooKeeper
// root:
//
//  1. a cluster of four nodes with the sharded table app.kv and 20 more
//     sharded tables app.t01..app.t20 (a few columns, an index and a CHECK
//     constraint each), all declared in the cluster record, the fence
//     installed on every node, ROWS users loaded into app.kv (COPY straight
//     into the owners);
//  2. ADD COLUMN under full write load: WRITERS goroutines upsert through
//     router.Do as fast as they go, each write timed; after WARMUP, the
//     change `ALTER TABLE app.kv ADD COLUMN note text NOT NULL DEFAULT
//     'none'` goes through schema.Apply; the load goes on for TAIL. The
//     longest write during the change window is set against the longest
//     write in a window of the same length just before it (same writers,
//     same load, no change);
//  3. the same with a long transaction: one connection holds a row lock on
//     app.kv on one node (BEGIN; UPDATE one row; pg_sleep(HOLD); COMMIT)
//     while a second change (ADD COLUMN note2) is applied: the change's
//     lock request times out (lock_timeout) and is retried, and the other
//     writes should stay short;
//  4. schema.Diff over the 20 tables of the 4 nodes, RUNS times, against
//     one node's fence.ReadSchemas of the same tables.
//
// While it runs it holds the test environment's shared lock (as every
// integration test does), so that a disruptive test waits for it.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/schema"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

var (
	level      = flag.Int("level", 6, "map level: 2^level buckets")
	rowsN      = flag.Int("rows", 50000, "users loaded into app.kv before the load starts")
	writers    = flag.Int("writers", 8, "write-load goroutines (closed loop: as fast as they go)")
	insertFrac = flag.Float64("insert-frac", 0.25, "fraction of writes that insert a new user (the rest update a loaded one)")
	warmup     = flag.Duration("warmup", 3*time.Second, "write load before each change (the baseline window is taken from its end)")
	tail       = flag.Duration("tail", 2*time.Second, "write load after each change")
	minWindow  = flag.Duration("min-window", time.Second, "shortest compared window (the change window is the apply's duration, at least this)")
	hold       = flag.Duration("hold", 2*time.Second, "the long transaction's length in the second variant (0: skip the variant)")
	holdNode   = flag.String("hold-node", "", "node of the long transaction (default: the node owning the most buckets, ties to the lowest id: with a balanced map pg1, which is also the default canary)")
	tablesN    = flag.Int("tables", 20, "sharded tables app.t01.. for the diff")
	diffRuns   = flag.Int("diff-runs", 5, "schema.Diff runs")
	jsonOut    = flag.Bool("json", false, "print the summary as JSON on stdout (the report goes to stderr)")
	verbose    = flag.Bool("v", false, "print schema.Apply's progress events")
	devf       = benchkit.NewDevFlags(cliutil.LocalZK)
)

const (
	nodesN    = 4
	clusterNm = "schemabench"
	seedHex   = "736368656d612d62656e63682d69737375652d3237" // "schema-bench-issue-27"
	kvDDL     = `CREATE SCHEMA IF NOT EXISTS app;
CREATE TABLE IF NOT EXISTS app.kv (bkey bigint NOT NULL, uid text NOT NULL, v bigint NOT NULL, PRIMARY KEY (bkey, uid))`
	changeSQL  = "ALTER TABLE app.kv ADD COLUMN note text NOT NULL DEFAULT 'none';\n"
	change2SQL = "ALTER TABLE app.kv ADD COLUMN note2 text NOT NULL DEFAULT 'none';\n"
	// Goals (issue 27).
	waitGoalMS = 1000.0
	diffGoalMS = 2000.0
)

func tableDDL(i int) string {
	t := fmt.Sprintf("app.t%02d", i)
	n := fmt.Sprintf("t%02d", i)
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s (
	bkey bigint NOT NULL,
	id bigint NOT NULL,
	name text NOT NULL DEFAULT '',
	amount numeric(12,2) NOT NULL DEFAULT 0,
	status smallint NOT NULL DEFAULT 0,
	created timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (bkey, id),
	CONSTRAINT %[2]s_amount_ck CHECK (amount >= 0 AND status BETWEEN 0 AND 9)
);
CREATE INDEX IF NOT EXISTS %[2]s_created_idx ON %[1]s (bkey, created)`, t, n)
}

var printer = &benchkit.Printer{W: os.Stdout}

func say(format string, args ...any) { printer.Say(format, args...) }

func main() {
	flag.Parse()
	if *jsonOut {
		printer.W = os.Stderr
	}
	if *level < 2 || *level > 12 || *rowsN < 1 || *writers < 1 || *tablesN < 1 || *diffRuns < 1 || *minWindow <= 0 {
		benchkit.Fatalf(2, "schema-bench", "--level 2..12; --rows, --writers, --tables, --diff-runs >= 1; --min-window > 0")
	}
	ctx, stop := benchkit.Context()
	defer stop()
	sum, err := run(ctx)
	benchkit.Finish("schema-bench", sum, err, func(s *Summary, e string) { s.Error = e }, report, *jsonOut)
	if sum != nil && !sum.GoalsMet {
		os.Exit(1)
	}
}

// ---------------------------------------------------------------- summary

// Stat is a distribution's nearest-rank percentiles, in ms.
type Stat = benchkit.Stat

// Window is the writes that overlapped a span of time.
type Window struct {
	FromMS    float64 `json:"from_ms"` // since the variant's load started
	LengthMS  float64 `json:"length_ms"`
	Writes    int     `json:"writes"`
	Failed    int     `json:"failed"`
	LatencyMS Stat    `json:"latency_ms"`
}

// Variant is one schema change applied under the write load.
type Variant struct {
	Name        string  `json:"name"`
	ChangeID    string  `json:"change_id"`
	SQL         string  `json:"sql"`
	HoldNode    string  `json:"hold_node,omitempty"`
	HoldMS      float64 `json:"hold_ms,omitempty"`
	HoldError   string  `json:"hold_error,omitempty"`
	ApplyMS     float64 `json:"apply_ms"`
	ApplyError  string  `json:"apply_error,omitempty"`
	Canary      string  `json:"canary"`
	State       string  `json:"state"`
	Attempts    int     `json:"attempts"`
	LockTimeout int     `json:"lock_timeouts"`
	BlockedMax  float64 `json:"blocked_max_ms"`
	// Nodes is schema.Apply's per-node result.
	Nodes []schema.NodeResult `json:"nodes"`
	// ColumnOn counts the nodes where the new column is there afterwards.
	ColumnOn int `json:"column_on_nodes"`

	LoadSeconds  float64 `json:"load_seconds"`
	WritesPerSec float64 `json:"writes_per_s"`
	Writes       int     `json:"writes"`
	Failed       int     `json:"failed"`
	LastError    string  `json:"last_write_error,omitempty"`
	Baseline     Window  `json:"baseline_window"`
	During       Window  `json:"change_window"`
	// MaxRatio is the longest write during the change over the longest
	// write in the baseline window.
	MaxRatio float64 `json:"max_ratio_during_over_baseline"`
	GoalMet  bool    `json:"goal_met"`
}

// DiffRun is the diff part's figures.
type DiffRun struct {
	Tables       int       `json:"tables"`
	Nodes        int       `json:"nodes"`
	Runs         []float64 `json:"runs_ms"`
	MS           Stat      `json:"diff_ms"`
	MinMS        float64   `json:"diff_min_ms"`
	Differences  int       `json:"differences"`
	Unreachable  int       `json:"unreachable"`
	ElapsedMS    Stat      `json:"diff_elapsed_ms_own"`
	OneNodeMS    Stat      `json:"one_node_connect_read_ms"`
	OneNodeRead  Stat      `json:"one_node_read_ms"`
	OneNodeMinMS float64   `json:"one_node_connect_read_min_ms"`
	Ratio        float64   `json:"ratio_diff_over_one_node"`
	GoalMet      bool      `json:"goal_met"`
}

// Summary is everything the run found.
type Summary struct {
	Cores       int            `json:"cores"`
	LoadAvg     string         `json:"load_avg"`
	Level       int            `json:"level"`
	Buckets     int            `json:"buckets"`
	Nodes       int            `json:"nodes"`
	Writers     int            `json:"writers"`
	RowsLoaded  int64          `json:"rows_loaded"`
	Database    string         `json:"database"`
	ZKRoot      string         `json:"zk_root"`
	Kept        bool           `json:"kept"`
	Variants    []Variant      `json:"variants"`
	Diff        *DiffRun       `json:"diff,omitempty"`
	GoalsMet    bool           `json:"goals_met"`
	Error       string         `json:"error,omitempty"`
	BucketCount map[string]int `json:"bucket_counts"`
}

func msStat(st Stat) string {
	if st.N == 0 {
		return "n/a"
	}
	return fmt.Sprintf("p50 %7.1f  p99 %7.1f  max %7.1f ms  (n=%d)", st.P50, st.P99, st.Max, st.N)
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT MET"
}

func report(s *Summary) {
	say("")
	say("schema benchmark (issue 27): %d PostgreSQL nodes, level %d (%d buckets: %v), %d rows in app.kv, %d writers (closed loop), %d cores, load average %s",
		s.Nodes, s.Level, s.Buckets, s.BucketCount, s.RowsLoaded, s.Writers, s.Cores, s.LoadAvg)
	for _, v := range s.Variants {
		say("")
		say("  %s: %s", v.Name, strings.TrimSpace(v.SQL))
		if v.HoldNode != "" {
			say("    long transaction on %s: row lock held %.0f ms (BEGIN; UPDATE one row; pg_sleep; COMMIT)%s", v.HoldNode, v.HoldMS, optErr(v.HoldError))
		}
		say("    schema.Apply:    %.1f ms, state %s, canary %s; attempts %d, lock timeouts %d, blocked at most %.1f ms (the change's record)%s",
			v.ApplyMS, v.State, v.Canary, v.Attempts, v.LockTimeout, v.BlockedMax, optErr(v.ApplyError))
		for _, n := range v.Nodes {
			say("      %-4s %-8s attempts %2d  lock timeouts %2d  longest attempt %7.1f ms  app statements seen waiting %7.1f ms  waiting for blockers %7.1f ms  ran %v%s",
				n.Node, n.State, n.Attempts, n.LockTimeouts, n.BlockedMaxMS, n.AppWaitMaxMS, n.BlockerWaitMS, n.Ran, optErr(n.Error))
		}
		say("    column on nodes: %d/%d", v.ColumnOn, s.Nodes)
		say("    write load:      %d writes in %.1f s (%.0f writes/s), %d failed (goal 0)%s", v.Writes, v.LoadSeconds, v.WritesPerSec, v.Failed, optErr(v.LastError))
		say("    baseline window  (%6.0f ms before the change, no change): %s, %d failed", v.Baseline.LengthMS, msStat(v.Baseline.LatencyMS), v.Baseline.Failed)
		say("    change window    (%6.0f ms from the apply's start):       %s, %d failed", v.During.LengthMS, msStat(v.During.LatencyMS), v.During.Failed)
		if v.Baseline.LengthMS > 0 && v.During.LengthMS > 0 && v.Baseline.LatencyMS.N > 0 {
			before := float64(v.Baseline.LatencyMS.N) / v.Baseline.LengthMS * 1000
			during := float64(v.During.LatencyMS.N) / v.During.LengthMS * 1000
			say("    throughput:      %.0f writes/s in the change window vs %.0f before: %s", during, before, ratioX(during/before))
		}
		say("    longest write: %.1f ms during the change vs %.1f ms before: %s; goal failed = 0 and longest write < %.0f ms: %s",
			v.During.LatencyMS.Max, v.Baseline.LatencyMS.Max, ratioX(v.MaxRatio), waitGoalMS, verdict(v.GoalMet))
	}
	if d := s.Diff; d != nil {
		say("")
		say("  schema diff: %d sharded tables on %d nodes, %d runs of schema.Diff (connect + read every node at once + compare)", d.Tables, d.Nodes, len(d.Runs))
		say("    schema.Diff:       min %7.1f  median %7.1f  max %7.1f ms   (its own elapsed_ms: median %.1f)   goal < %.0f ms: %s",
			d.MinMS, d.MS.P50, d.MS.Max, d.ElapsedMS.P50, diffGoalMS, verdict(d.GoalMet))
		say("    one node:          connect + fence.ReadSchemas median %7.1f ms (min %.1f); ReadSchemas alone median %.1f ms", d.OneNodeMS.P50, d.OneNodeMinMS, d.OneNodeRead.P50)
		say("    ratio diff / one node (medians): %s; differences found %d, unreachable %d", ratioX(d.Ratio), d.Differences, d.Unreachable)
	}
	say("")
	say("  goals: %s", verdict(s.GoalsMet))
	if s.Kept {
		say("  kept: database %s on every node, ZooKeeper %s", s.Database, s.ZKRoot)
	}
	if s.Error != "" {
		say("  ERROR: %s", s.Error)
	}
}

func optErr(e string) string {
	if e == "" {
		return ""
	}
	return "; error: " + e
}

func ratioX(r float64) string {
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return "n/a"
	}
	return fmt.Sprintf("%.2fx", r)
}

// ---------------------------------------------------------------- run

type bench struct {
	sess   *zksession.Session
	st     *bucketmap.Store
	ks     *keystream.Keystream
	nodes  []bucketmap.Node
	db     string
	root   string
	r      *router.Router
	tables []topo.TableRecord // app.t01..
	users  int                // loaded users u00000000..
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func run(ctx context.Context) (*Summary, error) {
	b := &bench{}
	tag := fmt.Sprintf("%d_%s", time.Now().Unix(), randHex(3))
	b.db = "svbench_schema_" + tag
	b.root = "/shardvisor-bench/schema-" + strings.ReplaceAll(tag, "_", "-")
	sum := &Summary{Cores: runtime.NumCPU(), LoadAvg: benchkit.LoadAvg(3), Level: *level, Buckets: 1 << *level, Nodes: nodesN,
		Writers: *writers, Database: b.db, ZKRoot: b.root, Kept: *devf.Keep}

	say("creating database %s on %d nodes", b.db, nodesN)
	dev, err := clustertest.OpenDev(ctx, clustertest.DevSpec{Dir: *devf.Dir, Lock: !*devf.NoLock, PGHost: *devf.PGHost, PGPortBase: *devf.PGPortBase,
		Nodes: nodesN, DB: b.db, ZK: *devf.ZK, Keep: *devf.Keep, Logf: say})
	if err != nil {
		return nil, err
	}
	defer dev.Close()
	dev.DeleteAtClose(topo.MustPaths(b.root, clusterNm))
	b.sess, b.nodes = dev.Session, dev.Nodes

	m, err := b.setup(ctx)
	if err != nil {
		return nil, err
	}
	sum.BucketCount = map[string]int{}
	for id, c := range m.Counts() {
		sum.BucketCount[string(id)] = c
	}
	n, err := b.load(ctx, m)
	if err != nil {
		return nil, err
	}
	sum.RowsLoaded = n

	b.r = router.New(b.sess, b.st.Paths(), router.Options{MemberID: "schema-bench", TunePool: func(c *pgxpool.Config) {
		c.MaxConns = int32(*writers)
	}})
	defer b.r.Close()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = b.r.WaitReady(wctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}

	var errs []error
	v, err := b.variant(ctx, m, "ADD COLUMN under full write load", "add-note.sql", changeSQL, "note", 0)
	sum.Variants = append(sum.Variants, v)
	if err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", v.Name, err))
	}
	if *hold > 0 && ctx.Err() == nil {
		v, err := b.variant(ctx, m, "ADD COLUMN under full write load with a long transaction", "add-note2.sql", change2SQL, "note2", *hold)
		sum.Variants = append(sum.Variants, v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", v.Name, err))
		}
	}
	if ctx.Err() == nil {
		d, err := b.diff(ctx, m)
		sum.Diff = d
		if err != nil {
			errs = append(errs, fmt.Errorf("diff: %w", err))
		}
	}
	sum.GoalsMet = len(errs) == 0 && sum.Diff != nil && sum.Diff.GoalMet
	for _, v := range sum.Variants {
		sum.GoalsMet = sum.GoalsMet && v.GoalMet
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return sum, errors.Join(errs...)
}

// ---------------------------------------------------------------- setup

func (b *bench) setup(ctx context.Context) (*bucketmap.Map, error) {
	tables := []topo.TableRecord{{Name: "app.kv", KeyColumn: "bkey"}}
	ddl := []string{kvDDL}
	for i := 1; i <= *tablesN; i++ {
		t := topo.TableRecord{Name: fmt.Sprintf("app.t%02d", i), KeyColumn: "bkey"}
		tables = append(tables, t)
		b.tables = append(b.tables, t)
		ddl = append(ddl, tableDDL(i))
	}
	c, err := clustertest.Build(ctx, b.sess, clustertest.Spec{Root: b.root, Name: clusterNm, Seed: seedHex, Level: *level,
		Nodes: b.nodes, Tables: tables, DDL: ddl, Parallel: true})
	if err != nil {
		return nil, err
	}
	b.st, b.ks = c.Store, c.Keystream
	say("cluster %s at %s: level %d, %d buckets on %d nodes; app.kv and %d tables app.t01.. declared and fenced on every node",
		clusterNm, b.root, *level, c.Map.Buckets(), len(b.nodes), *tablesN)
	return c.Map, nil
}

// load COPYs --rows users into app.kv on their owners (bypassing the
// fence, as replication does).
func (b *bench) load(ctx context.Context, m *bucketmap.Map) (int64, error) {
	start := time.Now()
	per := make([][][]any, len(b.nodes))
	idx := map[bucketmap.NodeID]int{}
	for i, n := range b.nodes {
		idx[n.ID] = i
	}
	for i := range *rowsN {
		uid := benchkit.UserID(uint32(i))
		p := b.ks.Prefix64(uid)
		o := idx[m.Owner(keystream.BucketOf(p, m.Level))]
		per[o] = append(per[o], []any{keystream.Key(p), uid, int64(0)})
	}
	b.users = *rowsN
	var total atomic.Int64
	if err := clustertest.EachNode(ctx, b.nodes, func(i int, _ bucketmap.Node, c *pgx.Conn) error {
		if _, err := c.Exec(ctx, "SET session_replication_role = replica"); err != nil {
			return err
		}
		got, err := c.CopyFrom(ctx, pgx.Identifier{"app", "kv"}, []string{"bkey", "uid", "v"}, pgx.CopyFromRows(per[i]))
		if err == nil {
			_, err = c.Exec(ctx, "RESET session_replication_role")
		}
		if err == nil {
			_, err = c.Exec(ctx, "VACUUM (ANALYZE) app.kv")
		}
		total.Add(got)
		return err
	}); err != nil {
		return 0, err
	}
	say("loaded %d users into app.kv in %.1f s", total.Load(), time.Since(start).Seconds())
	return total.Load(), nil
}

// ---------------------------------------------------------------- load

type write struct {
	at, end time.Time
	ok      bool
}

type load struct {
	stop    *benchkit.Stopper
	started time.Time
	lastErr atomic.Pointer[string]
	res     [][]write
}

func (b *bench) startLoad() *load {
	nw := *writers
	l := &load{stop: benchkit.NewStopper(), started: time.Now(), res: make([][]write, nw)}
	usersPer := max(b.users/nw, 1)
	run := time.Now().UnixNano()
	for w := range nw {
		l.stop.Go(func() {
			rng := mrand.New(mrand.NewPCG(uint64(w), uint64(run)))
			var seq, fresh int64
			for {
				select {
				case <-l.stop.C:
					return
				default:
				}
				var uid string
				if rng.Float64() < *insertFrac {
					fresh++
					uid = fmt.Sprintf("n%d-%02d-%d", run, w, fresh)
				} else {
					uid = benchkit.UserID(uint32(rng.IntN(usersPer)*nw + w))
				}
				seq++
				key := keystream.Key(b.ks.Prefix64(uid))
				wctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				start := time.Now()
				err := b.r.Do(wctx, uid, func(ctx context.Context, pool *pgxpool.Pool, _ router.Route) error {
					_, err := pool.Exec(ctx, `INSERT INTO app.kv (bkey, uid, v) VALUES ($1, $2, $3) ON CONFLICT (bkey, uid) DO UPDATE SET v = EXCLUDED.v`, key, uid, seq)
					return err
				})
				end := time.Now()
				cancel()
				l.res[w] = append(l.res[w], write{at: start, end: end, ok: err == nil})
				if err != nil {
					msg := err.Error()
					l.lastErr.Store(&msg)
				}
			}
		})
	}
	return l
}

// window summarizes the writes that overlapped [lo, hi].
func (l *load) window(lo, hi time.Time) Window {
	w := Window{FromMS: benchkit.MS(lo.Sub(l.started)), LengthMS: benchkit.MS(hi.Sub(lo))}
	var lat []float64
	for _, ws := range l.res {
		for _, x := range ws {
			if x.at.After(hi) || x.end.Before(lo) {
				continue
			}
			w.Writes++
			if !x.ok {
				w.Failed++
			}
			lat = append(lat, benchkit.MS(x.end.Sub(x.at)))
		}
	}
	w.LatencyMS = benchkit.Of(lat)
	return w
}

// ---------------------------------------------------------------- variants

// variant applies one change under the write load; with holdFor > 0, a
// long transaction holds a row lock on app.kv on one node meanwhile.
func (b *bench) variant(ctx context.Context, m *bucketmap.Map, name, file, sql, column string, holdFor time.Duration) (Variant, error) {
	v := Variant{Name: name, SQL: sql}
	ch, err := schema.Parse(file, sql)
	if err != nil {
		return v, err
	}
	v.ChangeID = ch.ID
	say("")
	say("%s: %d writers, warming up %s", name, *writers, *warmup)

	// The long transaction's node and row (a user owned by that node that
	// no writer touches).
	var holdConn *pgx.Conn
	var holdKey int64
	var holdUID string
	if holdFor > 0 {
		node := b.holdNode(m)
		v.HoldNode = string(node.ID)
		for i := 0; ; i++ {
			holdUID = fmt.Sprintf("hold-%d", i)
			p := b.ks.Prefix64(holdUID)
			if m.Owner(keystream.BucketOf(p, m.Level)) == node.ID {
				holdKey = keystream.Key(p)
				break
			}
		}
		if holdConn, err = dbnode.Connect(ctx, node); err != nil {
			return v, err
		}
		defer holdConn.Close(context.Background())
		if _, err := holdConn.Exec(ctx, `INSERT INTO app.kv (bkey, uid, v) VALUES ($1, $2, 0) ON CONFLICT DO NOTHING`, holdKey, holdUID); err != nil {
			return v, fmt.Errorf("%s: the long transaction's row: %w", node.ID, err)
		}
	}

	l := b.startLoad()
	stopped := false
	stopLoad := func() {
		if !stopped {
			stopped = true
			l.stop.Stop()
		}
	}
	defer stopLoad()
	if err := benchkit.Sleep(ctx, *warmup); err != nil {
		return v, err
	}
	phase := time.Now() // the change phase begins: the baseline window ends here

	// The long transaction: BEGIN; UPDATE the row (its lock held from
	// here); pg_sleep; COMMIT, in the background.
	holdDone := make(chan error, 1)
	if holdConn != nil {
		tx, err := holdConn.Begin(ctx)
		if err != nil {
			return v, err
		}
		if _, err := tx.Exec(ctx, `UPDATE app.kv SET v = v + 1 WHERE bkey = $1 AND uid = $2`, holdKey, holdUID); err != nil {
			_ = tx.Rollback(context.Background())
			return v, fmt.Errorf("long transaction: %w", err)
		}
		holdStart := time.Now()
		go func() {
			_, err := tx.Exec(ctx, fmt.Sprintf("SELECT pg_sleep(%f)", holdFor.Seconds()))
			if err == nil {
				err = tx.Commit(ctx)
			} else {
				_ = tx.Rollback(context.Background())
			}
			v.HoldMS = benchkit.MS(time.Since(holdStart))
			holdDone <- err
		}()
		say("  long transaction on %s holds a row lock on app.kv for %s", v.HoldNode, holdFor)
		_ = benchkit.Sleep(ctx, 100*time.Millisecond)
	} else {
		holdDone <- nil
	}

	opt := schema.Options{}
	if *verbose {
		opt.Progress = func(e schema.Event) { say("    schema: %s %s: %s", e.Node, e.Change, e.Message) }
	}
	applyStart := time.Now()
	res, applyErr := schema.Apply(ctx, b.st, ch, opt)
	applyEnd := time.Now()
	v.ApplyMS = benchkit.MS(applyEnd.Sub(applyStart))
	if applyErr != nil {
		v.ApplyError = applyErr.Error()
	}
	if res != nil {
		v.Canary, v.State, v.Nodes = res.Canary, res.State, res.Nodes
		for _, n := range res.Nodes {
			v.Attempts += n.Attempts
			v.LockTimeout += n.LockTimeouts
			v.BlockedMax = max(v.BlockedMax, n.BlockedMaxMS)
		}
	}
	say("  applied %s in %.1f ms (state %s, %d attempts, %d lock timeouts); load goes on for %s", ch.ID, v.ApplyMS, v.State, v.Attempts, v.LockTimeout, *tail)
	if err := benchkit.Sleep(ctx, *tail); err != nil {
		return v, err
	}
	if herr := <-holdDone; herr != nil {
		v.HoldError = herr.Error()
	}
	stopLoad()
	end := time.Now()

	// The windows: the change window from the apply's start, as long as
	// the apply (at least --min-window); the baseline window as long,
	// ending where the change phase began (clipped to the load's first
	// half second, when the pools fill).
	length := max(applyEnd.Sub(applyStart), *minWindow)
	v.During = l.window(applyStart, applyStart.Add(length))
	blo := max(phase.Add(-length).Sub(l.started), 500*time.Millisecond)
	v.Baseline = l.window(l.started.Add(blo), phase)
	for _, ws := range l.res {
		for _, x := range ws {
			v.Writes++
			if !x.ok {
				v.Failed++
			}
		}
	}
	v.LoadSeconds = end.Sub(l.started).Seconds()
	v.WritesPerSec = float64(v.Writes) / v.LoadSeconds
	if p := l.lastErr.Load(); p != nil {
		v.LastError = *p
	}
	v.MaxRatio = benchkit.Ratio(v.During.LatencyMS.Max, v.Baseline.LatencyMS.Max)

	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v.ColumnOn, err = b.columnOn(cctx, column)
	v.GoalMet = applyErr == nil && v.Failed == 0 && v.During.LatencyMS.Max < waitGoalMS && v.ColumnOn == len(b.nodes)
	if holdFor > 0 {
		v.GoalMet = v.GoalMet && v.HoldError == ""
	}
	if err == nil {
		err = applyErr
	}
	return v, err
}

// holdNode is --hold-node, or the node owning the most buckets, ties to
// the lowest id (the default canary owns the fewest, ties to the lowest id
// too: with a balanced map both are the first node).
func (b *bench) holdNode(m *bucketmap.Map) bucketmap.Node {
	if *holdNode != "" {
		if n, ok := m.Node(bucketmap.NodeID(*holdNode)); ok {
			return n
		}
	}
	counts := m.Counts()
	nodes := slices.Clone(b.nodes)
	slices.SortStableFunc(nodes, func(x, y bucketmap.Node) int { return counts[y.ID] - counts[x.ID] })
	return nodes[0]
}

func (b *bench) columnOn(ctx context.Context, column string) (int, error) {
	on := 0
	for _, n := range b.nodes {
		c, err := dbnode.Connect(ctx, n)
		if err != nil {
			return on, err
		}
		var ok bool
		err = c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'app.kv'::regclass AND attname = $1 AND NOT attisdropped)`, column).Scan(&ok)
		c.Close(context.Background())
		if err != nil {
			return on, err
		}
		if ok {
			on++
		}
	}
	return on, nil
}

// ---------------------------------------------------------------- diff

func (b *bench) diff(ctx context.Context, m *bucketmap.Map) (*DiffRun, error) {
	d := &DiffRun{Tables: len(b.tables), Nodes: len(b.nodes)}
	say("")
	say("schema diff: %d runs over %d tables on %d nodes", *diffRuns, len(b.tables), len(b.nodes))
	var own []float64
	for i := range *diffRuns {
		start := time.Now()
		res, err := schema.Diff(ctx, m, b.tables, nil, "", 0)
		el := benchkit.MS(time.Since(start))
		if err != nil {
			return d, err
		}
		d.Runs = append(d.Runs, el)
		own = append(own, res.ElapsedMS)
		d.Differences, d.Unreachable = len(res.Diffs), len(res.Unreachable)
		if res.Tables != len(b.tables) || len(res.Nodes) != len(b.nodes) {
			return d, fmt.Errorf("schema.Diff compared %d tables on %d nodes, want %d on %d", res.Tables, len(res.Nodes), len(b.tables), len(b.nodes))
		}
		say("  run %d: %.1f ms (%d differences, %d unreachable, reference %s)", i+1, el, len(res.Diffs), len(res.Unreachable), res.Reference)
	}
	d.MS, d.ElapsedMS = benchkit.Of(d.Runs), benchkit.Of(own)
	d.MinMS = slices.Min(d.Runs)

	// The baseline: one node, connect + fence.ReadSchemas of the same
	// tables (what Diff does on each node, in parallel).
	var one, read []float64
	for range *diffRuns {
		start := time.Now()
		c, err := dbnode.Connect(ctx, b.nodes[0])
		if err != nil {
			return d, err
		}
		rs := time.Now()
		ts, err := fence.ReadSchemas(ctx, c, b.tables)
		now := time.Now()
		c.Close(context.Background())
		if err != nil {
			return d, err
		}
		if len(ts) != len(b.tables) {
			return d, fmt.Errorf("fence.ReadSchemas read %d tables, want %d", len(ts), len(b.tables))
		}
		one = append(one, benchkit.MS(now.Sub(start)))
		read = append(read, benchkit.MS(now.Sub(rs)))
	}
	d.OneNodeMS, d.OneNodeRead = benchkit.Of(one), benchkit.Of(read)
	d.OneNodeMinMS = slices.Min(one)
	d.Ratio = benchkit.Ratio(d.MS.P50, d.OneNodeMS.P50)
	d.GoalMet = d.MS.Max < diffGoalMS && d.Unreachable == 0 && d.Differences == 0
	return d, nil
}
