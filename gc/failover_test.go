package gc

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/keystream"
)

// GC deleting a Patroni group's leftovers when the group's primary is
// SIGKILLed: the run stops with an error (its connection died), nothing
// of the owner's is touched; while the group has no synchronous standby
// (the old primary not back yet) GC keeps the leftovers (group-not-safe);
// once the old primary has rejoined, GC finishes on the new primary.
func TestFaultsGCThroughFailover(t *testing.T) {
	testenv.Faults(t)
	testenv.Exclusive(t)
	plain := testenv.StartPGNodes(t, 1)
	groups := testenv.StartPGGroups(t, 1)
	group := groups.Nodes[0]
	c := newClusterOn(t, 2, &testenv.PG{Nodes: []*testenv.PGNode{plain.Nodes[0], group}})
	r := rand.New(rand.NewPCG(22, 1))
	m := c.load()
	const perBucket = 20000
	for _, b := range []uint32{2, 3} { // n2, the group, owns 2 and 3
		if m.Owner(b) != "n2" {
			t.Fatalf("bucket %d on %s", b, m.Owner(b))
		}
		c.insert(r, m, b, perBucket)
	}
	m = c.move(m, 2, "n1")
	m = c.move(m, 3, "n1")
	count := func(node *testenv.PGNode, b uint32) int64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, node.DSNWithPassword)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		lo, hi, _ := keystream.Range(m.Level, b)
		var n int64
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM app.events WHERE bkey BETWEEN $1 AND $2`, lo, hi).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// A slow GC (5,000 rows/s in batches of 500), and the group's primary
	// SIGKILLed a second into it.
	opt := Options{Batch: 500, Parallel: 1, Rate: 5000}
	killed := make(chan string, 1)
	go func() {
		time.Sleep(time.Second)
		killed <- group.KillPrimary(t)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	_, err := c.gc(opt).Run(ctx)
	cancel()
	who := <-killed
	if err == nil {
		t.Fatalf("GC ran through the death of %s without an error", who)
	}
	t.Logf("GC stopped when %s died: %v", who, err)
	for _, b := range []uint32{2, 3} {
		if n := count(plain.Nodes[0], b); n != perBucket {
			t.Fatalf("the owner n1 holds %d rows of bucket %d, want %d", n, b, perBucket)
		}
	}
	// Promoted, but no synchronous standby until the old primary is back:
	// GC keeps the leftovers.
	group.Primary(t)
	rep := c.run(opt)
	skipped := 0
	for _, s := range rep.Skipped {
		if s.Kind == SkipGroup {
			skipped++
		}
	}
	if skipped == 0 || rep.Rows != 0 {
		t.Fatalf("GC on a group without a synchronous standby: %d rows to delete, skipped %+v", rep.Rows, rep.Skipped)
	}
	group.StartMembers(t)
	testenv.WaitFor(t, time.Minute, func() bool {
		rep = c.run(Options{Batch: 5000})
		return len(rep.Skipped) == 0
	}, "GC to find the group whole again")
	for _, b := range []uint32{2, 3} {
		if n := count(group, b); n != 0 {
			t.Fatalf("the group still holds %d leftover rows of bucket %d after GC", n, b)
		}
		if n := count(plain.Nodes[0], b); n != perBucket {
			t.Fatalf("the owner n1 holds %d rows of bucket %d after GC, want %d", n, b, perBucket)
		}
	}
}
