package gc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/keystream"
)

// BenchmarkGCDelete1M deletes 1,000,000 leftover rows with GC and, in the
// same run and on the same node, the same 1,000,000 rows from an identical
// unsharded table with one plain DELETE ... WHERE key BETWEEN lo AND hi.
// It reports GC's rate as a multiple of the plain DELETE's, x-plain-delete
// (target: at least 0.8), for the whole run (finding, checking and
// counting on both nodes, deleting, pruning) and for the deletes alone
// (x-plain-delete-phase), and the longest single batch transaction.
//
//	go test -run '^$' -bench GCDelete1M -benchtime 1x ./gc
func BenchmarkGCDelete1M(b *testing.B) {
	for _, layout := range []string{"key-order", "random"} {
		for _, batch := range []int{5000, 20000} {
			b.Run(fmt.Sprintf("layout=%s/batch=%d", layout, batch), func(b *testing.B) { benchGCDelete(b, layout == "random", batch) })
		}
	}
}

func benchGCDelete(b *testing.B, random bool, batch int) {
	const rows = 1_000_000
	c := newCluster(b, 2, 2)
	ctx := context.Background()
	m := c.load()
	lo, hi, _ := keystream.Range(m.Level, 0)
	x, y := m.Owner(0), m.Owner(3)
	gen := `INSERT INTO %s SELECT $1::bigint + (random() * ($2::float8 - $1::float8))::bigint AS k, g, 'leftover row body' FROM generate_series(1, $3::int) g`
	if !random {
		gen += ` ORDER BY k`
	}
	for b.Loop() {
		for _, sql := range []string{
			`DROP TABLE IF EXISTS app.plain`,
			`CREATE TABLE app.plain (LIKE app.events INCLUDING ALL)`,
			`TRUNCATE app.events`,
			`SET session_replication_role = replica`,
		} {
			c.exec(c.conns[x], sql)
		}
		c.exec(c.conns[x], fmtSQL(gen, "app.plain"), lo, hi, rows)
		c.exec(c.conns[x], `INSERT INTO app.events SELECT * FROM app.plain`)
		c.exec(c.conns[x], `RESET session_replication_role`)
		c.exec(c.conns[x], `VACUUM ANALYZE app.plain`)
		c.exec(c.conns[x], `VACUUM ANALYZE app.events`)
		// The owner holds the range's rows too (as after a copy).
		c.exec(c.conns[y], `SET session_replication_role = replica`)
		c.exec(c.conns[y], `TRUNCATE app.events`)
		c.exec(c.conns[y], fmtSQL(gen, "app.events"), lo, hi, rows)
		c.exec(c.conns[y], `RESET session_replication_role`)
		c.exec(c.conns[y], `VACUUM ANALYZE app.events`)
		if m.Owner(0) == x {
			m = c.update(func(m *bucketmap.Map) error { return m.Assign(0, y, bucketmap.AssignOptions{}) })
		}
		c.exec(c.conns[x], `CHECKPOINT`)

		t0 := time.Now()
		tag, err := c.conns[x].Exec(ctx, `DELETE FROM app.plain WHERE bkey BETWEEN $1 AND $2`, lo, hi)
		plain := time.Since(t0)
		if err != nil || tag.RowsAffected() != rows {
			b.Fatalf("plain delete: %v %v", tag, err)
		}
		c.exec(c.conns[x], `CHECKPOINT`)

		var deleteStart time.Time
		opt := Options{Grace: -1, Batch: batch, Progress: func(p Progress) {
			if deleteStart.IsZero() {
				deleteStart = time.Now()
			}
		}}
		t1 := time.Now()
		rep := c.run(opt)
		whole := time.Since(t1)
		if rep.Deleted != rows || rep.Pruned != 1 {
			b.Fatalf("gc: %+v", rep)
		}
		// From the end of the first batch: the checks before it are
		// excluded, and so, conservatively, is nothing else.
		phase := whole - deleteStart.Sub(t1)
		plainRate := rows / plain.Seconds()
		b.ReportMetric(plain.Seconds()/whole.Seconds(), "x-plain-delete")
		b.ReportMetric(plain.Seconds()/phase.Seconds(), "x-plain-delete-phase")
		b.ReportMetric(plainRate, "plain-rows/s")
		b.ReportMetric(rows/whole.Seconds(), "gc-rows/s")
		b.ReportMetric(float64(rep.MaxBatch.Microseconds())/1000, "max-batch-ms")
		b.Logf("1M rows: plain DELETE %.2fs (%.0f rows/s); gc %.2fs whole run (%.0f rows/s, %.2fx), %d batches of %d, longest batch %.1f ms",
			plain.Seconds(), plainRate, whole.Seconds(), rows/whole.Seconds(), plain.Seconds()/whole.Seconds(), rep.Batches, batch, float64(rep.MaxBatch.Microseconds())/1000)
	}
}
