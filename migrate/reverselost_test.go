package migrate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/shardvisor/shardvisor/fleet"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
)

// A failover of a move's target in its rollback window takes the reverse
// slot with it (PostgreSQL 15's slots do not survive one). The continuous
// watcher (`rebalance --watch`) finds the stream lost from the servers,
// records why, counts it, and ends the window at once: the move is done on
// its target, with every write made before and after the failover, and
// the status page says that the way back is lost. Before, the record kept
// saying the stream was running until someone tried to roll back.
func TestFaultsReverseStreamLostInWindow(t *testing.T) {
	testenv.Faults(t)
	testenv.Exclusive(t)
	f, group := groupFixture(t)
	base := f.seedRows("seed", 100)
	ctx := context.Background()
	rec, err := f.mover(Options{Window: 10 * time.Minute}).Move(ctx, 0, "pg2", false)
	if err != nil || rec.State != topo.MoveReversible {
		t.Fatalf("move: %v (%+v)", err, rec)
	}
	uid := f.uidIn(f.mapNow(), 0, "window")
	for v := int64(1); v <= 20; v++ {
		if err := f.write(ctx, uid, v); err != nil {
			t.Fatal(err)
		}
	}
	base[uid] = 20
	mv := f.mover(Options{})
	if p := mv.ProbeReverse(ctx, rec); p == nil || p.State != ReverseRunning || p.LagBytes == nil {
		t.Fatalf("the reverse stream before the failover: %+v", p)
	}

	met := NewMetrics(prometheus.NewRegistry())
	watcher := f.mover(Options{Metrics: met})
	f.inBackground(watcher.WatchOrphans)
	running := met.ReverseState.WithLabelValues(rec.ID, ReverseRunning)
	testenv.WaitFor(t, time.Minute, func() bool { return metricValue(running) == 1 }, "the watcher's probe: running")

	killed := group.KillPrimary(t)
	killedAt := time.Now()
	primary := group.Primary(t)
	promotedAt := time.Now() // when the test saw the new primary (it polls)
	var out *topo.MoveRecord
	testenv.WaitFor(t, 2*time.Minute, func() bool {
		out, err = mv.Get(ctx, rec.ID)
		return err == nil && out.Finished()
	}, "the move's window ended")
	endedAt := time.Now()
	t.Logf("killed %s; %s primary %.1fs later; window ended %.1fs after the kill, %.1fs after the test saw the new primary",
		killed, primary, promotedAt.Sub(killedAt).Seconds(), endedAt.Sub(killedAt).Seconds(), endedAt.Sub(promotedAt).Seconds())
	if out.State != topo.MoveDone || out.Reverse == nil || !strings.Contains(out.Reverse.Lost, "reverse slot "+rec.Reverse.Slot+" is gone from pg2") || out.Reverse.Enabled {
		t.Fatalf("the move after its target failed over in the window: %s, reverse %+v", out.State, out.Reverse)
	}
	// The watcher counts once EndLostWindow has returned, which is after
	// the record the test just read was written: wait for it.
	testenv.WaitFor(t, 30*time.Second, func() bool { return metricValue(met.ReverseLost) >= 1 }, "shardvisor_move_reverse_lost_total to count the lost stream")
	if n := metricValue(met.ReverseLost); n != 1 {
		t.Fatalf("%s = %v, want 1", "shardvisor_move_reverse_lost_total", n)
	}
	// The record as it was in the window, probed now: lost, from the
	// servers; the record as it is: nothing left to probe.
	if p := mv.ProbeReverse(ctx, rec); p == nil || p.State != ReverseLost {
		t.Fatalf("probe of the stream after the failover: %+v", p)
	}
	if p := mv.ProbeReverse(ctx, out); p != nil {
		t.Fatalf("probe of a move whose stream is recorded lost: %+v", p)
	}
	v := fleet.NewStatus(f.s, mv.p, fleet.StatusOptions{TTL: -1}).View(ctx, fleet.Self{}, true, nil)
	found := false
	for _, m := range append(v.Moves.InFlight, v.Moves.Recent...) {
		if m.ID == rec.ID {
			found = true
			if m.Reverse == nil || m.Reverse.State != "lost" || m.Reverse.Lost != out.Reverse.Lost {
				t.Fatalf("the status page's move: %+v (reverse %+v)", m, m.Reverse)
			}
		}
	}
	if !found {
		t.Fatalf("move %s not on the status page: %+v", rec.ID, v.Moves)
	}
	if _, err := mv.Rollback(ctx, rec.ID); err == nil {
		t.Fatal("a rollback of a move whose way back is lost")
	}
	for v := int64(21); v <= 40; v++ {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := f.write(wctx, uid, v)
		cancel()
		if err != nil {
			t.Fatalf("a write after the failover: %v", err)
		}
	}
	base[uid] = 40
	f.checkAcked(base, nil)
	if left := f.leftovers(); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
	group.StartMembers(t)
}

// metricValue reads a gauge or a counter without the testutil package
// (and its extra dependency).
func metricValue(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	if m.Gauge != nil {
		return m.GetGauge().GetValue()
	}
	return m.GetCounter().GetValue()
}
