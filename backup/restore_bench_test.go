package backup_test

import (
	"context"
	"flag"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/backup"
	"github.com/shardvisor/shardvisor/migrate"
)

var benchRows = flag.Int("restore-rows", 1_000_000, "rows in the restored bucket (BenchmarkRestoreBucket)")

// BenchmarkRestoreBucket restores one bucket of -restore-rows rows (1M by
// default), all deleted by mistake, to a restore point taken before, and
// reports where the time went: recovering the owner into a scratch server
// against staging, diffing and applying the rows; and the bucket's write
// pause against a move's pause in the same run (a bucket of 2,000 rows
// moved under no load: the pause a move holds whatever its size). Run:
//
//	go test -run '^$' -bench RestoreBucket -benchtime 1x ./backup
//	(make bench-restore)
func BenchmarkRestoreBucket(b *testing.B) {
	cl := newCluster(b, 3)
	ctx := context.Background()
	m := cl.mapNow()
	big, small := m.BucketAt(1), m.BucketAt(4)
	lo, _ := big.Keys()
	// As a replica (a move's copy does the same): the fence's trigger,
	// which every ordinary write to a sharded table runs, would take most
	// of the time of a million-row load.
	asReplica(b, cl.owner(big), `INSERT INTO app.notes (bkey, uid, id, body, tag)
		SELECT $1::bigint + g::bigint * 1000003, 'u' || g, 1, 'note of user ' || g || ', restored by the benchmark', CASE WHEN g % 3 = 0 THEN NULL ELSE 'tag' END
		FROM generate_series(1, $2) g`, lo, *benchRows)
	slo, _ := small.Keys()
	if _, err := cl.owner(small).Exec(ctx, `INSERT INTO app.notes (bkey, uid, id, body) SELECT $1::bigint + g, 'u' || g, 1, 'small' FROM generate_series(1, 2000) g`, slo); err != nil {
		b.Fatal(err)
	}
	owner := m.OwnerOf(big)
	if _, err := cl.pg.Backup(ctx, testenvStanza(b, cl, owner), backup.Incr); err != nil {
		b.Fatal(err)
	}
	rp, err := backup.CreatePoint(ctx, cl.st, "bench", backup.PointOptions{SwitchWAL: true, By: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	want := len(cl.rows(big))
	hi := lo + int64(*benchRows+1)*1000003
	asReplica(b, cl.owner(big), `DELETE FROM app.notes WHERE bkey BETWEEN $1 AND $2`, lo, hi)
	b.ResetTimer()
	res, err := backup.RestoreBucket(ctx, cl.st, backup.RestoreOptions{Bucket: big.String(), Point: rp.Name, PGBackRest: cl.pg, ScratchDir: scratchDir(b), By: "bench"})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if got := len(cl.rows(big)); got != want || res.Tables[0].Back != int64(want) {
		b.Fatalf("restored %d rows (%d back), want %d", got, res.Tables[0].Back, want)
	}
	// A move's pause, same run, same servers.
	target := m.OwnerOf(m.BucketAt(0))
	if target == m.OwnerOf(small) {
		target = m.OwnerOf(big)
	}
	mv := migrate.New(cl.st, migrate.Options{})
	defer mv.Close()
	rec, err := mv.MoveBucket(ctx, small, target, false)
	if err != nil {
		b.Fatal(err)
	}
	total := res.TotalMS
	b.ReportMetric(total/1000, "total-s")
	b.ReportMetric(res.RecoverMS/1000, "recover-s")
	b.ReportMetric((res.StageMS+res.DiffMS)/1000, "copy-s")
	b.ReportMetric(res.PauseMS, "pause-ms")
	b.ReportMetric(rec.Stats.PauseMS, "move-pause-ms")
	b.Logf("bucket %s, %d rows: %.1f s in all; recovery %.1f s (%.0f%%), staging %.1f s, diff %.1f s (copy and diff %.0f%%), the pause %.0f ms (%.0f%%); a move's pause %.1f ms: %.2fx",
		big, want, total/1000, res.RecoverMS/1000, 100*res.RecoverMS/total, res.StageMS/1000, res.DiffMS/1000,
		100*(res.StageMS+res.DiffMS)/total, res.PauseMS, 100*res.PauseMS/total, rec.Stats.PauseMS, res.PauseMS/rec.Stats.PauseMS)
}

// asReplica runs one statement in a transaction as a replica (no trigger
// fires).
func asReplica(b *testing.B, c *pgx.Conn, sql string, args ...any) {
	b.Helper()
	ctx := context.Background()
	tx, err := c.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		b.Fatal(err)
	}
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		b.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		b.Fatal(err)
	}
}
