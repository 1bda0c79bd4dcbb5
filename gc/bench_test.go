package gc

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/keystream"
)

// BenchmarkGCDelete1M deletes 1,000,000 leftover rows with GC and, in the
// same run and on the same node, the same 1,000,000 rows from an identical
// table (same columns, indexes and fence trigger, bypassed as GC bypasses
// it) with one plain DELETE ... WHERE key BETWEEN lo AND hi. It reports
// GC's rate as a multiple of the plain DELETE's, x-plain-delete (target: at
// least 0.8), for the whole run (finding, checking and counting on both
// nodes, deleting, pruning), for the time inside delete transactions
// (x-plain-delete-txns), and, for information, against a plain DELETE on a
// copy without the fence trigger (x-unfenced-delete: a row trigger, even
// one that does not fire, makes PostgreSQL fetch and lock each row before
// deleting it); and the longest single batch transaction. Each figure is
// the median of five rounds (GC_BENCH_ROUNDS), fresh data each, because
// one round on a shared machine varies by a third; every timed phase
// starts after a checkpoint on both nodes and a sync, and GC and the plain
// DELETE alternate in going first. Autovacuum is off on the tables so it
// cannot start on one side only. It runs GC as shipped (parallel=2: two
// connections deleting at once, the default) and with one connection
// (parallel=1), for comparison.
//
//	go test -run '^$' -bench GCDelete1M -benchtime 1x ./gc
func BenchmarkGCDelete1M(b *testing.B) {
	for _, layout := range []string{"key-order", "random"} {
		for _, par := range []int{2, 1} {
			b.Run(fmt.Sprintf("layout=%s/parallel=%d", layout, par), func(b *testing.B) { benchGCDelete(b, layout == "random", 20000, par) })
		}
	}
}

func benchGCDelete(b *testing.B, random bool, batch, parallel int) {
	const rows = 1_000_000
	c := newCluster(b, 2, 2)
	ctx := context.Background()
	m := c.load()
	lo, hi, _ := keystream.Range(m.Level, 0)
	x, y := m.Owner(0), m.Owner(3)
	rounds := 5
	if v, err := strconv.Atoi(os.Getenv("GC_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	// quiesce writes every dirty page out before a timed phase: a round
	// writes some 300 MB (tables, WAL), and the kernel's background
	// writeback of it otherwise lands in whichever phase runs next.
	quiesce := func() {
		c.exec(c.conns[x], `CHECKPOINT`)
		c.exec(c.conns[y], `CHECKPOINT`)
		syscall.Sync()
	}
	gen := `INSERT INTO %s SELECT $1::bigint + (random() * ($2::float8 - $1::float8))::bigint AS k, g, 'leftover row body' FROM generate_series(1, $3::int) g`
	if !random {
		gen += ` ORDER BY k`
	}
	median := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	for b.Loop() {
		var xWhole, xTxns, xUnfenced, maxBatch []float64
		for round := range rounds {
			for _, sql := range []string{
				`DROP TABLE IF EXISTS app.plain, app.unfenced`,
				`CREATE TABLE app.plain (LIKE app.events INCLUDING ALL)`,
				`CREATE TABLE app.unfenced (LIKE app.events INCLUDING ALL)`,
				`ALTER TABLE app.plain SET (autovacuum_enabled = off)`,
				`ALTER TABLE app.unfenced SET (autovacuum_enabled = off)`,
				`ALTER TABLE app.events SET (autovacuum_enabled = off)`,
				// The benchmark is the admin: it empties the table on purpose.
				`SET shardvisor.allow_truncate = on`,
				`TRUNCATE app.events`,
				`SET session_replication_role = replica`,
			} {
				c.exec(c.conns[x], sql)
			}
			c.exec(c.conns[x], fmtSQL(gen, "app.plain"), lo, hi, rows)
			c.exec(c.conns[x], `INSERT INTO app.events SELECT * FROM app.plain`)
			c.exec(c.conns[x], `INSERT INTO app.unfenced SELECT * FROM app.plain`)
			var trig string
			// The row trigger that fences deletes (the fence also has a
			// final UPDATE trigger and a TRUNCATE guard, which a DELETE
			// never fires).
			if err := c.conns[x].QueryRow(ctx, `SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'app.events'::regclass AND tgname = $1`, fence.TriggerName).Scan(&trig); err != nil {
				b.Fatalf("the fence trigger of app.events: %v", err)
			}
			c.exec(c.conns[x], strings.Replace(trig, " ON app.events ", " ON app.plain ", 1))
			c.exec(c.conns[x], `RESET session_replication_role`)
			// The rows were committed asynchronously (the servers run with
			// synchronous_commit = off), and PostgreSQL sets no hint bit
			// for a commit whose WAL is not flushed yet: without the
			// checkpoint, VACUUM would leave every tuple unhinted and the
			// first reader (GC's count) would dirty and write out the whole
			// table, which old leftover rows never make anyone do.
			c.exec(c.conns[x], `CHECKPOINT`)
			for _, t := range []string{"app.plain", "app.events", "app.unfenced"} {
				c.exec(c.conns[x], `VACUUM ANALYZE `+t)
			}
			// The owner holds the range's rows too (as after a copy).
			c.exec(c.conns[y], `SET session_replication_role = replica`)
			c.exec(c.conns[y], `SET shardvisor.allow_truncate = on`)
			c.exec(c.conns[y], `TRUNCATE app.events`)
			c.exec(c.conns[y], fmtSQL(gen, "app.events"), lo, hi, rows)
			c.exec(c.conns[y], `RESET session_replication_role`)
			c.exec(c.conns[y], `CHECKPOINT`)
			c.exec(c.conns[y], `VACUUM ANALYZE app.events`)
			if round == 0 {
				m = c.update(func(m *bucketmap.Map) error {
					return m.Assign(bucketmap.Bucket{Prefix: 0, Depth: m.Level}, y, bucketmap.AssignOptions{})
				})
			} else {
				// Put the history entry GC pruned back: same handoff again.
				m = c.update(func(m *bucketmap.Map) error {
					return m.Assign(bucketmap.Bucket{Prefix: 0, Depth: m.Level}, x, bucketmap.AssignOptions{})
				})
				m = c.update(func(m *bucketmap.Map) error {
					return m.Assign(bucketmap.Bucket{Prefix: 0, Depth: m.Level}, y, bucketmap.AssignOptions{})
				})
			}
			plainDelete := func(table string) time.Duration {
				// The fence rejects the delete otherwise: the node does not own the range.
				quiesce()
				c.exec(c.conns[x], `SET session_replication_role = replica`)
				defer c.exec(c.conns[x], `RESET session_replication_role`)
				t0 := time.Now()
				tag, err := c.conns[x].Exec(ctx, `DELETE FROM `+table+` WHERE bkey BETWEEN $1 AND $2`, lo, hi)
				d := time.Since(t0)
				if err != nil || tag.RowsAffected() != rows {
					b.Fatalf("plain delete from %s: %v %v", table, tag, err)
				}
				return d
			}
			runGC := func() (*Report, time.Duration) {
				quiesce()
				t1 := time.Now()
				rep := c.run(Options{Grace: -1, Batch: batch, Parallel: parallel})
				return rep, time.Since(t1)
			}
			// GC and the plain DELETE take turns going first, so that
			// whatever the earlier one leaves behind (evicted buffers, WAL
			// segments to recycle) does not always favour the same side.
			var (
				unfenced, plain, whole time.Duration
				rep                    *Report
			)
			if round%2 == 0 {
				unfenced = plainDelete("app.unfenced")
				plain = plainDelete("app.plain")
				rep, whole = runGC()
			} else {
				rep, whole = runGC()
				plain = plainDelete("app.plain")
				unfenced = plainDelete("app.unfenced")
			}
			if rep.Deleted != rows || rep.Pruned != 1 {
				b.Fatalf("gc: %+v", rep)
			}
			xWhole = append(xWhole, plain.Seconds()/whole.Seconds())
			xTxns = append(xTxns, plain.Seconds()/rep.Deleting.Seconds())
			xUnfenced = append(xUnfenced, unfenced.Seconds()/whole.Seconds())
			maxBatch = append(maxBatch, float64(rep.MaxBatch.Microseconds())/1000)
			b.Logf("round %d (load %s): plain DELETE %.2fs (%.0f rows/s; without the fence trigger %.2fs); gc %.2fs whole run (%.0f rows/s, %.2fx): checking %.2fs (connecting %.3fs), in delete transactions %.2fs (%.2fx), %d batches of %d in %s order, longest %.1f ms",
				round+1, loadAvg(), plain.Seconds(), rows/plain.Seconds(), unfenced.Seconds(), whole.Seconds(), rows/whole.Seconds(), plain.Seconds()/whole.Seconds(),
				rep.Checking.Seconds(), rep.Connecting.Seconds(), rep.Deleting.Seconds(), plain.Seconds()/rep.Deleting.Seconds(),
				rep.Batches, batch, rep.Work[0].Tables[0].Order, float64(rep.MaxBatch.Microseconds())/1000)
		}
		b.ReportMetric(median(xWhole), "x-plain-delete")
		b.ReportMetric(median(xTxns), "x-plain-delete-txns")
		b.ReportMetric(median(xUnfenced), "x-unfenced-delete")
		b.ReportMetric(slices.Max(maxBatch), "max-batch-ms")
		b.Logf("median of %d rounds: gc %.2fx a plain DELETE (target >= 0.8); in delete transactions %.2fx; %.2fx an unfenced DELETE; longest batch %.1f ms",
			rounds, median(xWhole), median(xTxns), median(xUnfenced), slices.Max(maxBatch))
	}
}

// BenchmarkGCDemoLeftovers reproduces the leftovers of the demo's
// rebalance (scripts/demo: three nodes, a fourth added, buckets moved to
// it, then `shardctl gc`): 8 leftover ranges of about 700 rows each
// (5,600 rows) on three nodes, in a table holding every bucket's rows, the
// new owner holding the moved ones. It reports the share of GC's wall
// time spent finding and checking the ranges (Report.Checking less
// Report.Connecting, over Report.Elapsed: the map, move and member
// records, the fences, the counts on both sides) as check-share (target
// at most 0.25), and with connecting to the nodes as check+connect-share,
// the median of GC_BENCH_ROUNDS rounds (default 5), each on fresh
// leftovers (every range moved back to its old node and away again).
//
//	go test -run '^$' -bench GCDemoLeftovers -benchtime 1x ./gc
func BenchmarkGCDemoLeftovers(b *testing.B) {
	const perBucket = 700
	c := newCluster(b, 4, 4)
	r := rand.New(rand.NewPCG(5591, 16))
	// The fourth node starts empty, as the one the demo adds.
	m := c.update(func(m *bucketmap.Map) error {
		for bk := range uint32(m.Buckets()) {
			if m.Owner(bk) == c.ids[3] {
				if err := m.Assign(bucketmap.Bucket{Prefix: bk, Depth: m.Level}, c.ids[int(bk)%3], bucketmap.AssignOptions{}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	for bk := range uint32(m.Buckets()) {
		c.insert(r, m, bk, perBucket)
	}
	// Drop the history of that setup: no rows were ever on the fourth node.
	c.run(Options{Grace: -1})
	var moved []uint32
	for bk := uint32(0); bk < 16; bk += 2 {
		moved = append(moved, bk)
	}
	old := map[uint32]bucketmap.NodeID{}
	for _, bk := range moved {
		old[bk] = m.Owner(bk)
	}
	rounds := 5
	if v, err := strconv.Atoi(os.Getenv("GC_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	median := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	for b.Loop() {
		var share, withConn, elapsed []float64
		for round := range rounds {
			for _, bk := range moved {
				if round > 0 {
					m = c.move(m, bk, old[bk])
				}
				m = c.move(m, bk, c.ids[3])
			}
			rep := c.run(Options{Grace: -1})
			if len(rep.Work) != len(moved) || rep.Deleted != int64(len(moved)*perBucket) || rep.Uncertain() != 0 {
				b.Fatalf("gc: %d ranges, %d rows deleted, %d uncertain skips: %+v", len(rep.Work), rep.Deleted, rep.Uncertain(), rep.Skipped)
			}
			checks := rep.Checking - rep.Connecting
			share = append(share, checks.Seconds()/rep.Elapsed.Seconds())
			withConn = append(withConn, rep.Checking.Seconds()/rep.Elapsed.Seconds())
			elapsed = append(elapsed, rep.Elapsed.Seconds())
			b.Logf("round %d: %d ranges, %d rows: gc %.1f ms; before the first delete %.1f ms (%.0f%%): connecting %.1f ms, checking %.1f ms (%.0f%%); in delete transactions %.1f ms, %d batches",
				round+1, len(rep.Work), rep.Deleted, 1000*rep.Elapsed.Seconds(), 1000*rep.Checking.Seconds(), 100*rep.Checking.Seconds()/rep.Elapsed.Seconds(),
				1000*rep.Connecting.Seconds(), 1000*checks.Seconds(), 100*checks.Seconds()/rep.Elapsed.Seconds(), 1000*rep.Deleting.Seconds(), rep.Batches)
		}
		b.ReportMetric(median(share), "check-share")
		b.ReportMetric(median(withConn), "check+connect-share")
		b.ReportMetric(1000*median(elapsed), "gc-ms")
		b.Logf("median of %d rounds: checking %.0f%% of GC's wall time (target <= 25%%), with connecting %.0f%%; GC %.1f ms", rounds, 100*median(share), 100*median(withConn), 1000*median(elapsed))
	}
}

// loadAvg is the machine's 1-minute load average, for the rounds' lines:
// on a shared machine a round's ratio follows the load, and the line says
// how busy the machine was ("?" where /proc/loadavg cannot be read).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}
