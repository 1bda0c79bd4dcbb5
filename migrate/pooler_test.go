package migrate

import (
	"context"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
)

// TestIntegrationMoveThroughPooler: the writers' path through each node's
// PgBouncer in transaction mode (issue 42), the mover's direct. A move
// under a write load: the fence's SV001 and the pause reach
// the writers through the pooler as they do directly, so every write is
// acknowledged (none gives up), and every acknowledged one is on its
// owner at the end.
func TestIntegrationMoveThroughPooler(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPGNodes(t, 2)
	nodes := clustertest.NodesOf(&testenv.PG{Nodes: pg.Nodes[:2]}, "pg")
	for i := range nodes {
		if pg.Nodes[i].PoolDSN == "" {
			t.Skip("the servers have no pooler (SHARDVISOR_TEST_PG names servers of its own)")
		}
		nodes[i].PoolDSN = pg.Nodes[i].PoolDSN
	}
	f := newFixtureOf(t, 3, &testenv.PG{Nodes: pg.Nodes[:2]}, nodes, []topo.TableRecord{kvTable}, kvDDL)
	ctx := context.Background()
	// The application path is the pooler; the mover's is the server.
	for i, n := range f.nodes {
		pool, err := f.r.NodePool(ctx, n.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got := int(pool.Config().ConnConfig.Port); got != pg.Nodes[i].PoolPort {
			t.Fatalf("%s: the router's pool connects to port %d, want its pooler's %d", n.ID, got, pg.Nodes[i].PoolPort)
		}
	}
	l := f.startLoadEvery(6, 200, pacedWrite)
	testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= 20 }, "writes acknowledged before the move")
	mv := f.mover(Options{})
	rec, err := mv.Move(ctx, 1, "pg2", false)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != topo.MoveDone && rec.State != topo.MoveReversible {
		t.Fatalf("move ended %s: %s", rec.State, rec.Error)
	}
	n := l.writes.Load()
	testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= n+100 }, "writes acknowledged on the new owner")
	acked := l.finish()
	if l.failed.Load() > 0 {
		t.Fatalf("%d writes failed through the pooler: %s", l.failed.Load(), *l.lastErr.Load())
	}
	if m := f.mapNow(); m.Owner(1) != "pg2" {
		t.Fatalf("bucket 1 on %s after its move to pg2", m.Owner(1))
	}
	f.checkAcked(acked, l.maybe)
	t.Logf("%d writes through the poolers across a move: pause %.1f ms", l.writes.Load(), rec.Stats.PauseMS)
}
