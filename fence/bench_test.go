package fence

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/testkit"
	"github.com/shardvisor/shardvisor/topo"
)

// BenchmarkFencedInsert measures the fence's cost on the write path:
// single-row INSERTs, each its own transaction, over one pgx connection to
// a local PostgreSQL node, into two tables of the same shape, one fenced
// (owned by this node, so every insert passes) and one plain. Both run in
// the same process, alternating insert by insert so that drift hits both alike.
// It reports the fenced insert's time as a multiple of the plain one's,
// x-unfenced (target: at most 1.5).
//
//	go test -run '^$' -bench FencedInsert -benchtime 20000x ./fence
func BenchmarkFencedInsert(b *testing.B) {
	pg := testenv.StartPGNodes(b, 1)
	ctx := context.Background()
	c := pg.Nodes[0].Conn(b)
	for _, sql := range []string{
		`CREATE SCHEMA app`,
		`CREATE TABLE app.plain (bkey bigint NOT NULL, id bigint NOT NULL, body text, PRIMARY KEY (bkey, id))`,
		`CREATE TABLE app.fenced (bkey bigint NOT NULL, id bigint NOT NULL, body text, PRIMARY KEY (bkey, id))`,
	} {
		if _, err := c.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	// A fragmented fence: this node owns every third bucket at level 12,
	// 1366 ownership rows, and the benchmark writes to those.
	m := testMap(b, 12, "a", "b", "c")
	m.Version++
	ids := []bucketmap.NodeID{"a", "b", "c"}
	for bk := range uint32(m.Buckets()) {
		if to := ids[bk%3]; m.Owner(bk) != to {
			if err := m.Assign(bucketmap.Bucket{Prefix: bk, Depth: m.Level}, to, bucketmap.AssignOptions{NoCopy: true}); err != nil {
				b.Fatal(err)
			}
		}
	}
	if _, err := Install(ctx, c, "c1", "a", []topo.TableRecord{{Name: "app.fenced", KeyColumn: "bkey"}}); err != nil {
		b.Fatal(err)
	}
	if _, err := Sync(ctx, c, m, "a"); err != nil {
		b.Fatal(err)
	}
	owned := Desired(m, "a")
	r := rand.New(rand.NewPCG(7, 8))
	key := func() int64 {
		s := owned[r.IntN(len(owned))]
		return s.Lo + int64(r.Uint64N(uint64(s.Hi-s.Lo)))
	}
	// Alternate single inserts, plain then fenced, timing each: on a busy
	// machine a burst of load then hits both variants alike.
	var plain, fenced time.Duration
	id := int64(0)
	b.ResetTimer()
	for range b.N {
		id++
		t0 := time.Now()
		if _, err := c.Exec(ctx, `INSERT INTO app.plain VALUES ($1, $2, 'body')`, key(), id); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := c.Exec(ctx, `INSERT INTO app.fenced VALUES ($1, $2, 'body')`, key(), id); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		plain += t1.Sub(t0)
		fenced += t2.Sub(t1)
	}
	ratio := testkit.ReportRatio(b, plain, fenced, "x-unfenced", "plain-ns/insert", "fenced-ns/insert")
	if b.N >= 1000 {
		b.Logf("N=%d, %d ownership rows: plain %.1f µs/insert, fenced %.1f µs/insert, ratio %.2fx",
			b.N, len(owned), float64(plain.Microseconds())/float64(b.N), float64(fenced.Microseconds())/float64(b.N), ratio)
	}
}
