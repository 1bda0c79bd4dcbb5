package devenv_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/internal/testenv"
)

// BenchmarkQueryThroughPooler: what the application path through the
// node's PgBouncer (transaction mode) costs a query, against pgx's
// default on a direct connection, side by side on one node: a pool of one
// connection per variant (as a prefork worker's), each running a
// parameterised SELECT by key and an upsert of one row (synchronous_commit
// off, so the disk's flush does not hide the wire), the variants in turn,
// rotating which goes first. The variants:
//
//	direct/cache_statement  pgx's default, named prepared statements (the baseline)
//	direct/cache_describe   the exec mode the router uses through a pooler, without one
//	pooler/cache_describe   the router's application path (dbnode.AppPoolConfig)
//	pooler/exec             the text-format alternative, no description cache
//	pooler/simple_protocol  client-side interpolation, one round trip
//
// It reports each mean in µs and its ratio to the baseline (issue 42:
// "measure the cost against the default, side by side").
//
//	go test -run '^$' -bench QueryThroughPooler -benchtime 5000x ./internal/devenv
func BenchmarkQueryThroughPooler(b *testing.B) {
	if testing.Short() {
		b.Skip("starts a PostgreSQL server and its pooler")
	}
	dir, err := os.MkdirTemp("", "shardvisor-poolbench-")
	if err != nil {
		b.Fatal(err)
	}
	_ = os.Chmod(dir, 0o755)
	e := devenv.New(devenv.Config{Dir: dir, PGNodes: 1, PGPortBase: testenv.FreePort(b), ZKPortBase: testenv.FreePort(b), Timeout: time.Minute})
	b.Cleanup(func() {
		_ = e.PGStop(1)
		os.RemoveAll(dir)
	})
	if err := e.PGStart(1); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	variants := []struct{ name, dsn, mode string }{
		{"direct/cache_statement", e.NodeDSN(1), "cache_statement"},
		{"direct/cache_describe", e.NodeDSN(1), "cache_describe"},
		{"pooler/cache_describe", e.NodePoolDSN(1), "cache_describe"},
		{"pooler/exec", e.NodePoolDSN(1), "exec"},
		{"pooler/simple_protocol", e.NodePoolDSN(1), "simple_protocol"},
	}
	pools := make([]*pgxpool.Pool, len(variants))
	for i, v := range variants {
		sep := "?"
		if strings.Contains(v.dsn, "?") {
			sep = "&"
		}
		p, err := pgxpool.New(ctx, v.dsn+sep+"pool_max_conns=1&default_query_exec_mode="+v.mode)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(p.Close)
		pools[i] = p
	}
	if _, err := pools[0].Exec(ctx, "CREATE TABLE IF NOT EXISTS pbench (k bigint PRIMARY KEY, v bigint)"); err != nil {
		b.Fatal(err)
	}
	took := make([]time.Duration, len(variants))
	round := func(i, n int) {
		p := pools[i]
		t0 := time.Now()
		var v int64
		if err := p.QueryRow(ctx, "SELECT coalesce((SELECT v FROM pbench WHERE k = $1), 0)", int64(n%1000)).Scan(&v); err != nil {
			b.Fatalf("%s: %v", variants[i].name, err)
		}
		tx, err := p.Begin(ctx)
		if err != nil {
			b.Fatalf("%s: %v", variants[i].name, err)
		}
		if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = off"); err != nil {
			b.Fatalf("%s: %v", variants[i].name, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO pbench VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v", int64(n%1000), int64(n)); err != nil {
			b.Fatalf("%s: %v", variants[i].name, err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatalf("%s: %v", variants[i].name, err)
		}
		took[i] += time.Since(t0)
	}
	for n := range 200 { // warm: connections, caches, pages
		for i := range variants {
			round(i, n)
		}
	}
	clear(took)
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		for k := range variants {
			round((n+k)%len(variants), n)
		}
	}
	b.StopTimer()
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) / 1000 }
	var line []string
	for i, v := range variants {
		b.ReportMetric(us(took[i]), v.name+"-us")
		b.ReportMetric(us(took[i])/us(took[0]), v.name+"/baseline")
		line = append(line, fmt.Sprintf("%s %.0f µs (%.2fx)", v.name, us(took[i]), us(took[i])/us(took[0])))
	}
	b.Logf("a SELECT by key and a one-row upsert transaction, %d each: %s", b.N, strings.Join(line, "; "))
}
