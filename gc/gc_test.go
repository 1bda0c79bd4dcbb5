package gc

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
)

// GC deletes exactly the leftovers: across random sequences of moves and
// splits, after one run every node holds rows only in the buckets it owns,
// with the same count there as before, and the history is empty.
func TestIntegrationGCRandomizedMaps(t *testing.T) {
	t.Parallel()
	orders := []string{OrderAuto, OrderKey, OrderHeap}
	for seed := range uint64(6) {
		order := orders[seed%3]
		t.Run("order="+order, func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 99))
			c := newCluster(t, 3, 3)
			m := c.load()
			for b := range uint32(m.Buckets()) {
				c.insert(r, m, b, 20+r.IntN(20))
			}
			for range 10 {
				switch {
				case r.IntN(5) == 0 && m.Level < 6:
					m = c.update(func(m *bucketmap.Map) error { return m.Split() })
				default:
					b := uint32(r.IntN(m.Buckets()))
					to := c.ids[r.IntN(len(c.ids))]
					if m.Owner(b) == to {
						continue
					}
					m = c.move(m, b, to)
					c.insert(r, m, b, 1+r.IntN(5)) // the new owner takes writes
				}
			}
			if len(m.History()) == 0 {
				t.Fatal("setup: no moves in this sequence (the seeds are fixed, so this is a broken setup, not bad luck)")
			}
			before := map[bucketmap.NodeID]map[uint32]int64{}
			for _, id := range c.ids {
				before[id] = c.counts(id, m.Level)
			}
			dry := c.run(Options{Grace: -1, DryRun: true})
			if dry.Deleted != 0 || dry.Rows == 0 || len(dry.Skipped) != 0 {
				t.Fatalf("dry run: %+v", dry)
			}
			for _, id := range c.ids {
				if got := c.counts(id, m.Level); len(got) != len(before[id]) {
					t.Fatal("the dry run deleted rows")
				}
			}
			rep := c.run(Options{Grace: -1, Batch: 7, Order: order})
			if len(rep.Skipped) != 0 || rep.Deleted != dry.Rows || rep.Pruned != len(m.History()) {
				t.Fatalf("run: deleted %d of %d, pruned %d of %d, skipped %+v", rep.Deleted, dry.Rows, rep.Pruned, len(m.History()), rep.Skipped)
			}
			m = c.load()
			if len(m.History()) != 0 {
				t.Fatalf("history left: %+v", m.History())
			}
			var leftovers int64
			for _, id := range c.ids {
				after := c.counts(id, m.Level)
				for b := range uint32(m.Buckets()) {
					switch {
					case m.Owner(b) == id && after[b] != before[id][b]:
						t.Errorf("%s owns bucket %d: %d rows before, %d after", id, b, before[id][b], after[b])
					case m.Owner(b) != id:
						leftovers += before[id][b]
						if after[b] != 0 {
							t.Errorf("%s still has %d rows of bucket %d, owned by %s", id, after[b], b, m.Owner(b))
						}
					}
				}
			}
			for _, w := range rep.Work {
				for _, tw := range w.Tables {
					if tw.Rows > 0 && order != OrderAuto && tw.Order != order {
						t.Errorf("%s walked %s in %s order, want %s", w.Range, tw.Table, tw.Order, order)
					}
				}
			}
			if leftovers != rep.Deleted {
				t.Fatalf("deleted %d, leftovers were %d", rep.Deleted, leftovers)
			}
			// A second run finds nothing.
			if again := c.run(Options{Grace: -1}); again.Rows != 0 || len(again.Work) != 0 {
				t.Fatalf("second run: %+v", again)
			}
		})
	}
}

// Skipped, never deleted: grace, moves in flight (map and records), a
// node that owns a bucket again, an owner with fewer rows than the
// leftovers, an unreachable owner, and an unreadable move record.
func TestIntegrationGCSkipsWhatIsUncertain(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3, 3)
	r := rand.New(rand.NewPCG(5, 6))
	m := c.filled(r, 30)
	owners := func(b uint32) bucketmap.NodeID { return m.Owner(b) }
	other := func(b uint32) bucketmap.NodeID {
		for _, id := range c.ids {
			if id != owners(b) {
				return id
			}
		}
		return ""
	}
	// Buckets 0 (grace), 1 (move record), 2 (moving in the map), 3 (no
	// copy: the owner has no rows), 5 (deletable).
	m = c.move(m, 5, other(5))
	m = c.move(m, 1, other(1))
	m = c.move(m, 2, other(2))
	m = c.update(func(m *bucketmap.Map) error {
		return m.Assign(bucketmap.Bucket{Prefix: 3, Depth: m.Level}, other(3), bucketmap.AssignOptions{NoCopy: true})
	})
	m = c.update(func(m *bucketmap.Map) error {
		return m.SetMoving(bucketmap.Bucket{Prefix: 2, Depth: m.Level}, c.ids[0], "mv-map")
	})
	ctx := context.Background()
	if err := c.s.CreateAll(ctx, c.st.Paths().Move("mv-rec")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.s.Set(ctx, c.st.Paths().Move("mv-rec"), []byte(`{"version":1,"bucket":1,"level":3,"state":"copy"}`), -1); err != nil {
		t.Fatal(err)
	}
	// A finished move's record does not block.
	c.s.CreateAll(ctx, c.st.Paths().Move("mv-old"))
	c.s.Set(ctx, c.st.Paths().Move("mv-old"), []byte(`{"version":1,"bucket":5,"level":3,"state":"done"}`), -1)
	c.s.CreateAll(ctx, c.st.Paths().Move("mv-gone"))
	c.s.Set(ctx, c.st.Paths().Move("mv-gone"), []byte(`{"version":1,"bucket":5,"level":3,"state":"aborted"}`), -1)
	// The recent change: bucket 0 moves now.
	c.clock = time.Now()
	m = c.move(m, 0, other(0))

	rep := c.run(Options{Grace: time.Hour})
	kinds := map[uint32]string{}
	for _, s := range rep.Skipped {
		kinds[s.Lo] = s.Kind
		t.Logf("skipped %s: %s: %s", s.Range, s.Kind, s.Reason)
	}
	want := map[uint32]string{0: SkipGrace, 1: SkipMove, 2: SkipMove, 3: SkipOwnerRows}
	for b, k := range want {
		if kinds[b] != k {
			t.Errorf("bucket %d: skipped as %q, want %q", b, kinds[b], k)
		}
	}
	if len(rep.Work) != 1 || rep.Work[0].Lo != 5 || !rep.Work[0].Done || rep.Pruned != 1 || rep.Uncertain() != 1 {
		t.Fatalf("work %+v, pruned %d, uncertain %d", rep.Work, rep.Pruned, rep.Uncertain())
	}
	for _, h := range c.load().History() {
		if cnt := c.counts(h.Node, 3)[h.Lo]; cnt != 30 {
			t.Errorf("%s lost rows of skipped bucket %d: %d left", h.Node, h.Lo, cnt)
		}
	}
	// An unreadable move record stops everything.
	c.s.Set(ctx, c.st.Paths().Move("mv-rec"), []byte(`garbage`), -1)
	rep = c.run(Options{Grace: -1})
	if rep.Deleted != 0 || len(rep.Work) != 0 || rep.Uncertain() == 0 {
		t.Fatalf("with an unreadable move record: %+v", rep)
	}
	for _, s := range rep.Skipped {
		if s.Kind != SkipMoveRecord && s.Kind != SkipMove {
			t.Errorf("unexpected skip %s: %s", s.Kind, s.Reason)
		}
	}
	// So does a record in a state no mover writes (a newer mover's, or
	// the "finished" GC once counted as final): it is not known final.
	for _, st := range []string{"finished", "copying"} {
		c.s.Set(ctx, c.st.Paths().Move("mv-rec"), []byte(`{"version":1,"bucket":1,"level":3,"state":"`+st+`"}`), -1)
		rep = c.run(Options{Grace: -1})
		if rep.Deleted != 0 || len(rep.Work) != 0 || rep.Uncertain() == 0 {
			t.Fatalf("with a move record in state %q: %+v", st, rep)
		}
		for _, s := range rep.Skipped {
			if s.Kind != SkipMoveRecord && s.Kind != SkipMove {
				t.Errorf("state %q: unexpected skip %s: %s", st, s.Kind, s.Reason)
			}
		}
	}
	c.s.Delete(ctx, c.st.Paths().Move("mv-rec"), -1)

	// The current owner is unreachable (its address refuses connections):
	// nothing of its ranges is deleted, and the run says so.
	m = c.update(func(m *bucketmap.Map) error { return m.ClearMoving(bucketmap.Bucket{Prefix: 2, Depth: m.Level}) })
	owner1 := m.Owner(1)
	old1 := m.HistoryOf(1)[0].Node
	down := func(ctx context.Context, n bucketmap.Node) (*pgx.Conn, error) {
		if n.ID == owner1 {
			n.DSN = "postgres://postgres@127.0.0.1:1/x?sslmode=disable"
		}
		return dbnode.Connect(ctx, n)
	}
	rep = c.run(Options{Grace: -1, Connect: down})
	found := false
	for _, s := range rep.Skipped {
		if s.Lo == 1 && s.Node == old1 {
			found = s.Kind == SkipOwnerDown && s.Uncertain && strings.Contains(s.Reason, string(owner1))
		}
	}
	if !found || c.counts(old1, 3)[1] != 30 {
		t.Fatalf("unreachable owner: %+v", rep.Skipped)
	}
	for _, w := range rep.Work {
		if w.Owner == owner1 {
			t.Fatalf("deleted a range owned by the unreachable %s: %+v", owner1, w)
		}
	}
}

func TestIntegrationGCLock(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1, 1)
	ctx := context.Background()
	l, err := Acquire(ctx, c.s, c.st.Paths())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err = Acquire(ctx, c.s, c.st.Paths())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(ctx, c.s, c.st.Paths()); !errors.Is(err, ErrLocked) {
		t.Fatalf("second acquire in this process: %v", err)
	}
	// Another process (another session) is told who holds it.
	s2 := c.session()
	if _, err := Acquire(ctx, s2, c.st.Paths()); !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "pid") {
		t.Fatalf("acquire from another session: %v", err)
	}
	l.Release(ctx)
}

// A heap walk over a range packed into one region of the table (a bucket
// copied in, then moved away) keeps its batches short: after pages with
// none of the range's rows, a batch does not swallow the whole region.
func TestIntegrationGCHeapBatchesStayShort(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2, 2)
	r := rand.New(rand.NewPCG(7, 8))
	m := c.load()
	x := m.Owner(0)
	var other uint32 // another bucket of x: its rows come first in the heap
	for b := uint32(1); b < uint32(m.Buckets()); b++ {
		if m.Owner(b) == x {
			other = b
		}
	}
	if other == 0 {
		t.Fatal("setup: node owns one bucket only (the layout is fixed, so this is a broken setup)")
	}
	c.insert(r, m, other, 20000)
	c.insert(r, m, 0, 3000)
	c.exec(c.conns[x], `VACUUM ANALYZE app.events`)
	var perPage float64
	if err := c.conns[x].QueryRow(context.Background(), `SELECT reltuples / relpages FROM pg_class WHERE oid = 'app.events'::regclass`).Scan(&perPage); err != nil {
		t.Fatal(err)
	}
	var to bucketmap.NodeID
	for _, id := range c.ids {
		if id != x {
			to = id
		}
	}
	c.move(m, 0, to)
	const batch = 100
	var last, most int64
	rep := c.run(Options{Grace: -1, Batch: batch, Order: OrderHeap, Progress: func(p Progress) {
		if p.Message == "" {
			t.Error("progress without a message")
		}
		most = max(most, p.Deleted-last)
		last = p.Deleted
	}})
	if rep.Deleted != 3000 || len(rep.Skipped) != 0 {
		t.Fatalf("run: %+v", rep)
	}
	if limit := max(2*batch, int64(perPage)+1); most > limit {
		t.Fatalf("a batch deleted %d rows (batch %d, %.0f tuples per page): the walk swallowed the packed region", most, batch, perPage)
	}
	t.Logf("3000 packed rows in %d batches, at most %d rows each", rep.Batches, most)
}

// Run takes the GC lock itself: while another process holds it, Run is
// refused naming the holder; once released, Run proceeds.
func TestIntegrationGCRunTakesTheLock(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1, 1)
	ctx := context.Background()
	s2 := c.session()
	l, err := Acquire(ctx, s2, c.st.Paths())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.gc(Options{Grace: -1, Now: time.Now}).Run(ctx); !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "pid") {
		t.Fatalf("run while another holds the lock: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	c.run(Options{Grace: -1})
	// The run released it.
	l, err = Acquire(ctx, s2, c.st.Paths())
	if err != nil {
		t.Fatalf("after a run: %v", err)
	}
	l.Release(ctx)
}
