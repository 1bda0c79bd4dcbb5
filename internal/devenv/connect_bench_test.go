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
// startup, scram-sha-256, one query). It reports each mean and the ratio
// TLS/plain (issue 41's connect cost).
//
//	go test -run '^$' -bench ConnectPlainVsTLS -benchtime 300x ./internal/devenv
func BenchmarkConnectPlainVsTLS(b *testing.B) {
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
	plain, tls := start(false), start(true)
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
		p += connect(plain.NodeDSN(1))
		s += connect(tls.NodeDSN(1))
	}
	b.StopTimer()
	pm, sm := float64(p.Microseconds())/float64(b.N)/1000, float64(s.Microseconds())/float64(b.N)/1000
	b.ReportMetric(pm, "plain-ms/conn")
	b.ReportMetric(sm, "tls-ms/conn")
	b.ReportMetric(sm/pm, "tls/plain")
	b.Logf("new connection: plain %.2f ms, TLS (verify-full) %.2f ms, ratio %.2f (%d each)", pm, sm, sm/pm, b.N)
}
