package migrate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
)

// The continuous watcher publishes what the servers say of a move's
// reverse stream (topo.WriteReverseState) for the status page, which
// cannot ask them: running with its lag; disabled, with why, once the
// subscription is stopped on the old owner; and when the slot is dropped
// from the new owner, the stream is lost: the reason is recorded and the
// window ends at once, the move done on its target. (The fault schedule
// makes the same loss with a real failover: TestFaultsReverseStreamLostInWindow.)
func TestIntegrationWatcherPublishesReverseState(t *testing.T) {
	f := parallelFixture(t, 2, 2) // 4 buckets: pg1 0-1, pg2 2-3
	base := f.seedRows("seed", 100)
	ctx := context.Background()
	mv := f.mover(Options{Window: 10 * time.Minute})
	rec, err := mv.Move(ctx, 0, "pg2", false)
	if err != nil || rec.State != topo.MoveReversible {
		t.Fatalf("move: %v (%+v)", err, rec)
	}
	met := NewMetrics(prometheus.NewRegistry())
	f.inBackground(f.mover(Options{Metrics: met}).WatchOrphans)
	published := func(state string) func() bool {
		return func() bool {
			st, err := topo.ReadReverseState(ctx, f.st.Session(), f.st.Paths(), rec.ID)
			return err == nil && st != nil && st.State == state && time.Since(st.At) < time.Minute
		}
	}
	testenv.WaitFor(t, time.Minute, published(ReverseRunning), "the watcher to publish the stream running")
	st, _ := topo.ReadReverseState(ctx, f.st.Session(), f.st.Paths(), rec.ID)
	if st.LagBytes == nil || st.By == "" {
		t.Fatalf("published while running: %+v, want its lag and who probed", st)
	}

	sub := pgx.Identifier{rec.Reverse.Subscription}.Sanitize()
	if _, err := f.conn("pg1").Exec(ctx, "ALTER SUBSCRIPTION "+sub+" DISABLE"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, published(ReverseDisabled), "the watcher to publish the stream disabled")
	if got, _ := mv.Get(ctx, rec.ID); got.State != topo.MoveReversible {
		t.Fatalf("a disabled stream (a rollback enables it again) ended the window: %s", got.State)
	}

	// The walsender lets the slot go once the subscription is disabled.
	testenv.WaitFor(t, 30*time.Second, func() bool {
		_, err := f.conn("pg2").Exec(ctx, "SELECT pg_drop_replication_slot($1)", rec.Reverse.Slot)
		return err == nil
	}, "the reverse slot to be dropped")
	var out *topo.MoveRecord
	testenv.WaitFor(t, time.Minute, func() bool {
		out, err = mv.Get(ctx, rec.ID)
		return err == nil && out.Finished()
	}, "the watcher to end the window of a lost stream")
	if out.State != topo.MoveDone || out.Reverse.Lost == "" || !strings.Contains(out.Reverse.Lost, rec.Reverse.Slot) || f.mapNow().Owner(0) != "pg2" {
		t.Fatalf("after the slot was dropped: %s, lost %q, bucket 0 on %s", out.State, out.Reverse.Lost, f.mapNow().Owner(0))
	}
	if _, err := mv.Rollback(ctx, rec.ID); err == nil {
		t.Fatal("a rollback of a move whose way back is lost was accepted")
	}
	f.checkClean(base)
}
