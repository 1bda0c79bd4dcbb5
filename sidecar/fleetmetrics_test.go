package sidecar

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fleet"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/topo"
)

// The map's history is what waits for GC: a bucket given from one node to
// another leaves a history entry naming the node that lost it, counted
// with its age on that node; every other node is exported at 0.
func TestGCPendingFromTheMap(t *testing.T) {
	m1, _ := bucketmap.New(4, clustertest.Nodes(3), t0)
	m2 := clustertest.Next(m1)
	from := m1.Owner(0)
	to := bucketmap.NodeID("pg3")
	if from == to {
		to = "pg2"
	}
	if err := m2.Assign(bucketmap.Bucket{Prefix: 0, Depth: m2.Level}, to, bucketmap.AssignOptions{}); err != nil {
		t.Fatal(err)
	}
	p := gcPendingOf(m2, m2.UpdatedAt.Add(2*time.Hour))
	if len(p.ranges) != 3 || p.ranges[string(from)] != 1 || p.oldest[string(from)] != 7200 {
		t.Fatalf("pending %+v, want 1 range of 7200 s on %s and 0 elsewhere", p, from)
	}
	for id, n := range p.ranges {
		if id != string(from) && (n != 0 || p.oldest[id] != 0) {
			t.Fatalf("node %s: %v ranges, oldest %v; want 0", id, n, p.oldest[id])
		}
	}
	if p := gcPendingOf(m1, t0); p.ranges["pg1"] != 0 || len(p.oldest) != 3 {
		t.Fatalf("no history: %+v", p)
	}

	// Served from a map file too (no ZooKeeper: GC's backlog is in the map).
	_, body := get(t, Handler(fileRouter(t, m2), HandlerOptions{}), "/metrics")
	for _, want := range []string{fmt.Sprintf(`shardvisor_router_gc_pending_ranges{node="%s"} 1`, from),
		`shardvisor_router_gc_pending_oldest_seconds{node="` + string(from) + `"}`} {
		if !strings.Contains(body, want) {
			t.Fatalf("metrics lack %s:\n%s", want, grepLines(body, "gc_pending"))
		}
	}
}

// The fleet view's moves and members become gauges: every in-flight
// state at 0 or its count, the longest time in each state, the rollback
// window overdue, the recent pauses and the members behind the map.
func TestFleetGauges(t *testing.T) {
	now := t0.Add(time.Hour)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	v := &fleet.View{Available: true, AgeSeconds: 0.5,
		Moves: fleet.Moves{
			InFlight: []fleet.Move{
				{ID: "m1", State: topo.MoveCopy, StateSince: ago(40 * time.Minute), CreatedAt: ago(41 * time.Minute)},
				{ID: "m2", State: topo.MoveCopy, StateSince: ago(5 * time.Minute)},
				{ID: "m3", State: topo.MoveReversible, StateSince: ago(20 * time.Minute),
					Reverse: &fleet.MoveReverse{State: "running", WindowUntil: ago(5 * time.Minute)}},
				{ID: "m4", State: topo.MoveReversible, StateSince: ago(time.Minute),
					Reverse: &fleet.MoveReverse{State: "running", WindowUntil: now.Add(14 * time.Minute)}},
				{ID: "m5", Error: "move record: malformed", CreatedAt: ago(3 * time.Minute)},
				{ID: "m6", State: topo.MoveFailed, CreatedAt: ago(2 * time.Hour)}, // no steps: its age
			},
			Recent: []fleet.Move{{ID: "d2", State: topo.MoveDone, PauseMS: 15}, {ID: "d1", State: topo.MoveAborted, PauseMS: 2500}},
		},
		Members: []fleet.Member{
			{Kind: fleet.KindRouter, Name: "r1"},
			{Kind: fleet.KindRouter, Name: "r2", Straggler: true, BehindSince: ago(10 * time.Minute)},
			{Kind: fleet.KindSupervisor, Name: "s1", Straggler: true, BehindSince: ago(time.Minute)},
			{Kind: fleet.KindSupervisor, Name: "s2", Straggler: true, Error: "unreadable"},
		},
	}
	g := fleetGaugesOf(v, now)
	want := map[string]float64{topo.MoveCopy: 2, topo.MoveReversible: 2, moveUnreadable: 1, topo.MoveFailed: 1}
	for _, st := range inFlightStates {
		if g.inFlight[st] != want[st] {
			t.Errorf("in flight in %s: %v, want %v", st, g.inFlight[st], want[st])
		}
	}
	if len(g.inFlight) != len(inFlightStates) || len(inFlightStates) != 14 {
		t.Errorf("states %v (%d exported), want the 13 unfinished states and unreadable", inFlightStates, len(g.inFlight))
	}
	oldest := map[string]float64{topo.MoveCopy: 2400, topo.MoveReversible: 1200, moveUnreadable: 180, topo.MoveFailed: 7200}
	for st, w := range oldest {
		if g.stateOldest[st] != w {
			t.Errorf("oldest in %s: %v s, want %v", st, g.stateOldest[st], w)
		}
	}
	if g.stateOldest[topo.MovePrepare] != 0 || g.windowOver != 300 || g.lastPause != 0.015 || g.maxPause != 2.5 {
		t.Errorf("prepare %v, window overdue %v, last pause %v, max pause %v; want 0, 300, 0.015, 2.5",
			g.stateOldest[topo.MovePrepare], g.windowOver, g.lastPause, g.maxPause)
	}
	if g.stragglers[fleet.KindRouter] != 1 || g.stragglers[fleet.KindSupervisor] != 2 || g.behindOldest != 600 {
		t.Errorf("stragglers %v, behind %v s; want router 1, supervisor 2, 600 s", g.stragglers, g.behindOldest)
	}

	// Nothing in flight: every gauge still there, at 0.
	c := newFleetCollector(&handler{})
	c.nowFn = func() time.Time { return now }
	c.viewFn = func(context.Context) *fleet.View { return &fleet.View{Available: true} }
	series := collect(t, c)
	for name, n := range map[string]int{"shardvisor_router_moves_in_flight": 14, "shardvisor_router_move_state_oldest_seconds": 14,
		"shardvisor_router_fleet_stragglers": 2, "shardvisor_router_move_window_overdue_seconds": 1,
		"shardvisor_router_move_last_pause_seconds": 1, "shardvisor_router_schema_drift_differences": 1,
		"shardvisor_router_backup_checked_timestamp_seconds": 0} {
		if got := len(series[name]); got != n {
			t.Errorf("%s: %d series, want %d", name, got, n)
		}
	}
	for _, st := range inFlightStates {
		if v, ok := series["shardvisor_router_moves_in_flight"][`state="`+st+`"`]; !ok || v != 0 {
			t.Errorf("moves in flight in %s: %v (exported: %v), want 0", st, v, ok)
		}
	}
	// No view (ZooKeeper never answered): nothing rather than zeros.
	c.viewFn = func(context.Context) *fleet.View { return &fleet.View{} }
	if series := collect(t, c); len(series) != 0 {
		t.Errorf("series without a view: %v", series)
	}
}

// collect gathers c's series: by metric name, by their labels
// (`k="v",...`), the value.
func collect(t *testing.T, c prometheus.Collector) map[string]map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, mf := range mfs {
		out[mf.GetName()] = map[string]float64{}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+`="`+l.GetValue()+`"`)
			}
			out[mf.GetName()][strings.Join(labels, ",")] = m.GetGauge().GetValue()
		}
	}
	return out
}

// A group's gauges from its view: members registered, running, the
// leader, the synchronous standbys (registered ones only) and the mode;
// unreadable records give -1 severe and nothing else.
func TestGroupGauges(t *testing.T) {
	v := &GroupView{PatroniGroup: &topo.PatroniGroup{Leader: "a", SyncStandbys: []string{"b", "gone"},
		Config: &topo.PatroniConfig{SynchronousMode: true},
		Members: []topo.PatroniMember{{Name: "a", Leader: true, State: "running"}, {Name: "b", Sync: true, State: "streaming"},
			{Name: "c", State: "starting"}}}}
	g := groupGaugesOf(v)
	if !g.readable || g.leader != 1 || g.members != 3 || g.running != 2 || g.sync != 1 || g.syncMode != 1 {
		t.Fatalf("%+v", g)
	}
	g = groupGaugesOf(&GroupView{PatroniGroup: &topo.PatroniGroup{}, Error: "no Patroni records"})
	if g.readable || g.severe != -1 || g.whole != 0 {
		t.Fatalf("unreadable: %+v", g)
	}
	v = &GroupView{PatroniGroup: &topo.PatroniGroup{Leader: "a", Members: []topo.PatroniMember{{Name: "b", State: "running"}}}}
	if g := groupGaugesOf(v); g.leader != 0 || g.syncMode != 0 || g.members != 1 {
		t.Fatalf("a leader key without its member, no config: %+v", g)
	}
}
