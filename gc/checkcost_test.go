package gc

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
)

// statements counts, per node, the round trips (a query, an exec or a
// batch) and the SQL statements GC sends, through a pgx tracer.
type statements struct {
	mu     sync.Mutex
	rounds map[bucketmap.NodeID]int
	stmts  map[bucketmap.NodeID]int
}

func newStatements() *statements {
	return &statements{rounds: map[bucketmap.NodeID]int{}, stmts: map[bucketmap.NodeID]int{}}
}

func (s *statements) add(id bucketmap.NodeID, rounds, stmts int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rounds[id] += rounds
	s.stmts[id] += stmts
}

type stmtTracer struct {
	s  *statements
	id bucketmap.NodeID
}

func (t stmtTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	t.s.add(t.id, 1, 1)
	return ctx
}
func (stmtTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (t stmtTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	t.s.add(t.id, 1, 0)
	return ctx
}
func (t stmtTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	t.s.add(t.id, 0, 1)
}
func (stmtTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (s *statements) connect(ctx context.Context, n bucketmap.Node) (*pgx.Conn, error) {
	cfg, err := dbnode.ConnConfig(n)
	if err != nil {
		return nil, err
	}
	cfg.Tracer = stmtTracer{s: s, id: n.ID}
	return pgx.ConnectConfig(ctx, cfg)
}

// GC's checks cost the same few round trips and statements per node
// whether there are 2 leftover ranges or 8: the fences are read once per
// node, and every count a node owes (its leftovers, and the ranges it
// owns now) is one transaction, one statement per table. Counted from the
// statements sent, never timed.
func TestIntegrationGCChecksPerNodeDoNotGrowWithRanges(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(16, 7))
	c := newCluster(t, 4, 2)
	m := c.filled(r, 30)
	moveEvery := func(buckets []uint32) {
		for _, b := range buckets {
			to := c.ids[0]
			if m.Owner(b) == to {
				to = c.ids[1]
			}
			m = c.move(m, b, to)
		}
	}
	dry := func(want int) *statements {
		t.Helper()
		s := newStatements()
		rep := c.run(Options{Grace: -1, DryRun: true, Connect: s.connect})
		if len(rep.Work) != want || len(rep.Skipped) != 0 || rep.Rows != int64(30*want) {
			t.Fatalf("dry run: want %d ranges of 30 rows, got %d ranges, %d rows, skipped %+v", want, len(rep.Work), rep.Rows, rep.Skipped)
		}
		return s
	}
	moveEvery([]uint32{1, 6})
	two := dry(2)
	moveEvery([]uint32{3, 8, 10, 12, 14, 15})
	eight := dry(8)
	for _, id := range c.ids {
		t.Logf("node %s: 2 ranges: %d round trips, %d statements; 8 ranges: %d round trips, %d statements",
			id, two.rounds[id], two.stmts[id], eight.rounds[id], eight.stmts[id])
		if two.rounds[id] == 0 {
			t.Fatalf("node %s: no statements traced", id)
		}
		if eight.rounds[id] != two.rounds[id] || eight.stmts[id] != two.stmts[id] {
			t.Errorf("node %s: checking 8 ranges took %d round trips and %d statements, 2 ranges %d and %d: the checks grow with the ranges",
				id, eight.rounds[id], eight.stmts[id], two.rounds[id], two.stmts[id])
		}
	}
}
