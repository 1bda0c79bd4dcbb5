// Command schema-bench measures online schema changes under a write load
// (plainly and against a long transaction holding a row lock) and
// schema.Diff of many tables against one node's fence.ReadSchemas (issue
// 27). Run it with bench/schema/run; docs/data-contract.md ("Measured")
// says what each figure means. It holds the test environment's shared lock
// while it runs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/benchkit/kvload"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

var (
	load     = kvload.NewFlags(6, "", 8, "closed loop: as fast as they go")
	rowsN    = flag.Int("rows", 50000, "users loaded into app.kv before the load starts")
	warmup   = flag.Duration("warmup", 3*time.Second, "write load before each change (the baseline window is taken from its end)")
	tail     = flag.Duration("tail", 2*time.Second, "write load after each change")
	hold     = flag.Duration("hold", 2*time.Second, "the long transaction's length in the second variant (0: skip the variant)")
	tablesN  = flag.Int("tables", 20, "sharded tables app.t01.. for the diff")
	diffRuns = flag.Int("diff-runs", 5, "schema.Diff runs")
	devf     = benchkit.NewDevFlags(cliutil.LocalZK)
)

const (
	nodesN    = 4
	clusterNm = "schemabench"
	seedHex   = "736368656d612d62656e63682d69737375652d3237" // "schema-bench-issue-27"
	// Goals (issue 27).
	waitGoalMS = 1000.0
	diffGoalMS = 2000.0
)

// out prints the report: on stdout, or stderr with --json.
var out = benchkit.NewOut()

func say(format string, args ...any) { out.Say(format, args...) }

func main() {
	out.Parse()
	if *load.Level < 2 || *load.Level > 12 || *rowsN < 1 || *load.Writers < 1 || *tablesN < 1 || *diffRuns < 1 {
		benchkit.Fatalf(2, "schema-bench", "--level 2..12; --rows, --writers, --tables, --diff-runs >= 1")
	}
	ctx, stop := benchkit.Context()
	defer stop()
	sum, err := run(ctx)
	benchkit.Finish("schema-bench", sum, err, func(s *Summary, e string) { s.Error = e }, report, *out.JSON)
	if sum != nil && !sum.GoalsMet {
		os.Exit(1)
	}
}

type bench struct {
	sess   *zksession.Session
	st     *bucketmap.Store
	ks     *keystream.Keystream
	nodes  []bucketmap.Node
	root   string
	r      *router.Router
	tables []topo.TableRecord // app.t01..
}

func run(ctx context.Context) (*Summary, error) {
	b := &bench{}
	tag := fmt.Sprintf("%d_%s", time.Now().Unix(), benchkit.IdempotencyKey()[:6]) // 3 random bytes
	db := "svbench_schema_" + tag
	b.root = "/shardvisor-bench/schema-" + strings.ReplaceAll(tag, "_", "-")
	sum := &Summary{Cores: runtime.NumCPU(), LoadAvg: benchkit.LoadAvg(3), Level: *load.Level, Buckets: 1 << *load.Level, Nodes: nodesN,
		Writers: *load.Writers, Database: db, ZKRoot: b.root, Kept: *devf.Keep}

	say("creating database %s on %d nodes", db, nodesN)
	dev, err := clustertest.OpenDev(ctx, clustertest.DevSpec{Dir: *devf.Dir, Lock: !*devf.NoLock, PGHost: *devf.PGHost, PGPortBase: *devf.PGPortBase,
		Nodes: nodesN, DB: db, ZK: *devf.ZK, TLS: *devf.TLS, Keep: *devf.Keep, Logf: say})
	if err != nil {
		return nil, err
	}
	defer dev.Close()
	dev.DeleteAtClose(topo.MustPaths(b.root, clusterNm))
	b.sess, b.nodes = dev.Session, dev.Nodes

	ddl := []string{clustertest.KVDDL}
	for i := 1; i <= *tablesN; i++ {
		t := fmt.Sprintf("app.t%02d", i)
		b.tables = append(b.tables, topo.TableRecord{Name: t, KeyColumn: "bkey"})
		ddl = append(ddl, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s (
	bkey bigint NOT NULL,
	id bigint NOT NULL,
	name text NOT NULL DEFAULT '',
	amount numeric(12,2) NOT NULL DEFAULT 0,
	status smallint NOT NULL DEFAULT 0,
	created timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (bkey, id),
	CONSTRAINT %[2]s_amount_ck CHECK (amount >= 0 AND status BETWEEN 0 AND 9)
);
CREATE INDEX IF NOT EXISTS %[2]s_created_idx ON %[1]s (bkey, created)`, t, t[len("app."):]))
	}
	c, err := clustertest.Build(ctx, b.sess, clustertest.Spec{Root: b.root, Name: clusterNm, Seed: seedHex, Level: *load.Level,
		Nodes: b.nodes, Tables: append([]topo.TableRecord{clustertest.KV}, b.tables...), DDL: ddl, Parallel: true})
	if err != nil {
		return nil, err
	}
	b.st, b.ks = c.Store, c.Keystream
	say("cluster %s at %s: level %d, %d buckets on %d nodes; app.kv and %d tables app.t01.. declared and fenced on every node",
		clusterNm, b.root, *load.Level, c.Map.Buckets(), len(b.nodes), *tablesN)
	sum.BucketCount = c.Map.Counts()
	if sum.RowsLoaded, err = b.load(ctx, c.Map); err != nil {
		return nil, err
	}

	if b.r, err = kvload.NewRouter(ctx, b.sess, b.st.Paths(), "schema-bench", *load.Writers, nil); err != nil {
		return nil, err
	}
	defer b.r.Close()

	var errs []error
	for i, name := range []string{"ADD COLUMN under full write load", "ADD COLUMN under full write load with a long transaction"} {
		if i > 0 && (*hold <= 0 || ctx.Err() != nil) {
			break
		}
		v, err := b.variant(ctx, c.Map, name, []string{"note", "note2"}[i], []time.Duration{0, *hold}[i])
		sum.Variants = append(sum.Variants, v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", v.Name, err))
		}
	}
	if ctx.Err() == nil {
		if sum.Diff, err = b.diff(ctx, c.Map); err != nil {
			errs = append(errs, fmt.Errorf("diff: %w", err))
		}
	}
	sum.GoalsMet = len(errs) == 0 && sum.Diff != nil && sum.Diff.GoalMet
	for _, v := range sum.Variants {
		sum.GoalsMet = sum.GoalsMet && v.GoalMet
	}
	return sum, errors.Join(append(errs, ctx.Err())...) // Join drops a nil
}

// load COPYs --rows users into app.kv on their owners (bypassing the
// fence, as replication does).
func (b *bench) load(ctx context.Context, m *bucketmap.Map) (int64, error) {
	start := time.Now()
	per := make([][][]any, len(b.nodes))
	for i := range *rowsN {
		uid := benchkit.UserID(uint32(i))
		p := b.ks.Prefix64(uid)
		o := m.OwnerIndex(keystream.BucketOf(p, m.Level)) // b.nodes' order; slot = bucket at the map's level
		per[o] = append(per[o], []any{keystream.Key(p), uid, int64(0)})
	}
	var total atomic.Int64
	if err := clustertest.EachNode(ctx, b.nodes, func(i int, _ bucketmap.Node, c *pgx.Conn) error {
		got, err := clustertest.CopyAsReplica(ctx, c, pgx.Identifier{"app", "kv"}, []string{"bkey", "uid", "v"}, pgx.CopyFromRows(per[i]))
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

// window summarizes the writes that overlapped [lo, hi].
func window(l *kvload.Load, writes []kvload.Write, lo, hi time.Time) Window {
	w := Window{FromMS: benchkit.MS(lo.Sub(l.Started)), LengthMS: benchkit.MS(hi.Sub(lo))}
	loUS, hiUS := lo.Sub(l.Started).Microseconds(), hi.Sub(l.Started).Microseconds()
	var lat []float64
	for _, x := range writes {
		if x.AtUS > hiUS || x.AtUS+int64(x.DurUS) < loUS {
			continue
		}
		w.Writes++
		if !x.OK {
			w.Failed++
		}
		lat = append(lat, float64(x.DurUS)/1000)
	}
	w.LatencyMS = benchkit.Of(lat)
	return w
}
