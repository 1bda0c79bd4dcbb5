package devenv_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/internal/testenv"
)

// BenchmarkConnectPlainVsTLS: what a new pool connection costs with
// PostgreSQL over TLS (verify-full against the CA, the TLS mode's) and
// plain (sslmode=disable), side by side: two plain nodes of the same
// configuration, one in each mode, connected to in turn (TCP, the
// startup, scram-sha-256, one query), alternating which goes first. It
// reports each mean and the ratio TLS/plain (issue 41's connect cost).
//
//	go test -run '^$' -bench ConnectPlainVsTLS -benchtime 300x ./internal/devenv
func BenchmarkConnectPlainVsTLS(b *testing.B) {
	plain, tls := startPair(b)
	ctx := context.Background()
	connect := func(dsn string) time.Duration {
		t0 := time.Now()
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			b.Fatal(err)
		}
		d := time.Since(t0)
		c.Close(ctx)
		return d
	}
	connect(plain.NodeDSN(1))
	connect(tls.NodeDSN(1))
	var p, s time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Alternate which goes first: the second of a pair runs right
		// after a close, with the servers' and the kernel's state warm.
		if i%2 == 0 {
			p += connect(plain.NodeDSN(1))
			s += connect(tls.NodeDSN(1))
		} else {
			s += connect(tls.NodeDSN(1))
			p += connect(plain.NodeDSN(1))
		}
	}
	b.StopTimer()
	pm, sm := float64(p.Microseconds())/float64(b.N)/1000, float64(s.Microseconds())/float64(b.N)/1000
	b.ReportMetric(pm, "plain-ms/conn")
	b.ReportMetric(sm, "tls-ms/conn")
	b.ReportMetric(sm/pm, "tls/plain")
	b.Logf("new connection: plain %.2f ms, TLS (verify-full) %.2f ms, ratio %.2f (%d each)", pm, sm, sm/pm, b.N)
}

// startPair starts two PostgreSQL nodes of the same configuration, one
// plain and one in the TLS mode, stopped and removed at the end of b.
func startPair(b *testing.B) (plain, tls *devenv.Env) {
	if testing.Short() {
		b.Skip("starts two PostgreSQL servers")
	}
	start := func(tls bool) *devenv.Env {
		dir, err := os.MkdirTemp("", "shardvisor-connbench-")
		if err != nil {
			b.Fatal(err)
		}
		_ = os.Chmod(dir, 0o755)
		e := devenv.New(devenv.Config{Dir: dir, PGNodes: 1, TLS: tls, PGPortBase: testenv.FreePort(b), ZKPortBase: testenv.FreePort(b), Timeout: time.Minute})
		b.Cleanup(func() {
			_ = e.PGStop(1)
			os.RemoveAll(dir)
		})
		if err := e.PGStart(1); err != nil {
			b.Fatal(err)
		}
		return e
	}
	return start(false), start(true)
}

// BenchmarkQueryPlainVsTLS: what TLS adds to a query on an open
// connection, the steady state of a pool, on a quiet machine: one
// connection to each of two nodes alike but for TLS, a round trip of
// each kind in turn (SELECT 1; an upsert of one row, committed with
// synchronous_commit off so that the disk's flush does not hide the
// wire). It reports each mean and the ratio TLS/plain: what TLS costs one
// round trip on an idle machine. Under load the same TLS work (every
// write's records, the moves' streams and new connections) is CPU the
// other servers wait for, which bench/moves --compare-tls shows.
//
//	go test -run '^$' -bench QueryPlainVsTLS -benchtime 20000x ./internal/devenv
func BenchmarkQueryPlainVsTLS(b *testing.B) {
	plain, tls := startPair(b)
	ctx := context.Background()
	open := func(e *devenv.Env) *pgx.Conn {
		c, err := pgx.Connect(ctx, e.NodeDSN(1))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close(ctx) })
		for _, q := range []string{"SET synchronous_commit = off", "CREATE TABLE IF NOT EXISTS qbench (k bigint PRIMARY KEY, v bigint)"} {
			if _, err := c.Exec(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
		return c
	}
	conns := [2]*pgx.Conn{open(plain), open(tls)}
	var sel, ups [2]time.Duration
	round := func(i, n int) {
		t0 := time.Now()
		if _, err := conns[i].Exec(ctx, "SELECT 1"); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := conns[i].Exec(ctx, "INSERT INTO qbench VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v", n%1000, n); err != nil {
			b.Fatal(err)
		}
		sel[i] += t1.Sub(t0)
		ups[i] += time.Since(t1)
	}
	for n := range 100 { // warm: the statement caches, both servers' pages
		round(0, n)
		round(1, n)
	}
	sel, ups = [2]time.Duration{}, [2]time.Duration{}
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		round(n%2, n) // alternate which goes first
		round(1-n%2, n)
	}
	b.StopTimer()
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) / 1000 }
	b.ReportMetric(us(sel[0]), "plain-select-us")
	b.ReportMetric(us(sel[1]), "tls-select-us")
	b.ReportMetric(us(ups[0]), "plain-upsert-us")
	b.ReportMetric(us(ups[1]), "tls-upsert-us")
	b.ReportMetric(us(ups[1])/us(ups[0]), "tls/plain-upsert")
	b.Logf("round trip on an open connection: SELECT 1 plain %.0f us, TLS %.0f us (%.2fx); upsert plain %.0f us, TLS %.0f us (%.2fx) (%d each)",
		us(sel[0]), us(sel[1]), us(sel[1])/us(sel[0]), us(ups[0]), us(ups[1]), us(ups[1])/us(ups[0]), b.N)
}
