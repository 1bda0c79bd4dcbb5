package fleet

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
)

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// behindSince dates a straggler by the first map above its version when
// the router knows that map, else by the earliest newer one it knows, as
// a lower bound.
func TestBehindSince(t *testing.T) {
	known := []KnownMap{{5, t0}, {7, t0.Add(time.Minute)}, {8, t0.Add(2 * time.Minute)}}
	for _, tc := range []struct {
		v       uint64
		since   time.Time
		atLeast bool
	}{
		{4, t0, false},
		{2, t0, true},
		{5, t0.Add(time.Minute), true}, // 6 was skipped: 7 was applied after it
		{6, t0.Add(time.Minute), false},
		{7, t0.Add(2 * time.Minute), false},
		{8, time.Time{}, false},
	} {
		since, atLeast := behindSince(known, tc.v)
		if !since.Equal(tc.since) || atLeast != tc.atLeast {
			t.Errorf("behindSince(%d) = %s %v, want %s %v", tc.v, since, atLeast, tc.since, tc.atLeast)
		}
	}
}

// The view carries the schema history: states counted, the changes not
// applied everywhere with why, the newest first, and the last drift
// check; a record that does not decode is said, not fatal.
func TestViewSchemaHistory(t *testing.T) {
	ctx, _, s, p := zkCluster(t)
	now := time.Now().UTC()
	mk := func(seq int, id, state string, nodes map[string]*topo.SchemaNodeStatus) {
		c := &topo.SchemaChange{Version: 1, ID: id, Seq: seq, SHA256: strings.Repeat("a", 63) + strconv.Itoa(seq), SQL: "SELECT 1", Mode: topo.ModeTransaction,
			Statements: 1, By: "me@host", CreatedAt: now, UpdatedAt: now, State: state, Nodes: nodes}
		if err := topo.CreateSchemaChange(ctx, s, p, c); err != nil {
			t.Fatal(err)
		}
	}
	ok := &topo.SchemaNodeStatus{State: topo.SchemaApplied}
	mk(1, "001-init", topo.SchemaApplied, map[string]*topo.SchemaNodeStatus{"pg1": ok, "pg2": ok})
	mk(2, "002-more", topo.SchemaPartial, map[string]*topo.SchemaNodeStatus{"pg1": ok, "pg2": {State: topo.SchemaUnreachable, Error: "connection refused"}})
	if err := topo.WriteSchemaDrift(ctx, s, p, &topo.SchemaDrift{Version: 1, At: now, By: "me", Reference: "pg1", Nodes: []string{"pg1", "pg2"}, Count: 3}); err != nil {
		t.Fatal(err)
	}
	v := NewStatus(s, p, StatusOptions{TTL: -1}).View(ctx, Self{}, true, nil)
	sc := v.Schema
	if sc.Changes != 2 || sc.ByState[topo.SchemaApplied] != 1 || sc.ByState[topo.SchemaPartial] != 1 || sc.Error != "" {
		t.Fatalf("schema view: %+v", sc)
	}
	if len(sc.Recent) != 2 || sc.Recent[0].ID != "002-more" || len(sc.NotApplied) != 1 || sc.NotApplied[0].Missing["pg2"] != "unreachable: connection refused" ||
		!slices.Equal(sc.NotApplied[0].Applied, []string{"pg1"}) {
		t.Fatalf("schema view: recent %+v, not applied %+v", sc.Recent, sc.NotApplied)
	}
	if sc.Drift == nil || sc.Drift.Count != 3 {
		t.Fatalf("drift: %+v", sc.Drift)
	}
	// Against the router's map: a node added since misses every change.
	v = NewStatus(s, p, StatusOptions{TTL: -1}).View(ctx, Self{SchemaNodes: []string{"pg1", "pg2", "pg3"}}, true, nil)
	if v.Schema.ByState[topo.SchemaPartial] != 2 || v.Schema.Changes != 2 || v.Schema.Recent[1].Missing["pg3"] != "not run" {
		t.Fatalf("against pg1..pg3: %+v", v.Schema)
	}
	zktest.Put(t, s, p.SchemaChange("003-bad"), `{"version": 1, "id": "003-bad"}`)
	if v := NewStatus(s, p, StatusOptions{TTL: -1}).View(ctx, Self{}, true, nil); !strings.Contains(v.Schema.Error, "003-bad") || !v.Available {
		t.Fatalf("a malformed change record: %+v", v.Schema)
	}
}

// A started reverse stream shows what the watcher's latest probe of its
// servers said (the record's "enabled" says only that the mover started
// it): with the lag; "started" and why not when there is no probe or it is
// older than ReverseProbeStale; a stream recorded lost is lost whatever
// was probed before.
func TestViewReverseStreamFromTheProbe(t *testing.T) {
	ctx, _, s, p := zkCluster(t)
	now := time.Now().UTC()
	until := now.Add(10 * time.Minute)
	mk := func(id string, lost string) {
		rec := &topo.MoveRecord{Version: topo.MoveVersion, ID: id, State: topo.MoveReversible, Source: "pg1", Target: "pg2", CreatedAt: now, UpdatedAt: now,
			Reverse: &topo.ReverseStream{Publication: "p", Slot: "s", Subscription: "s", Enabled: lost == "", Lost: lost, Until: &until}}
		if err := topo.CreateMove(ctx, s, p, rec); err != nil {
			t.Fatal(err)
		}
	}
	lag := int64(4096)
	probe := func(id, state, why string, at time.Time) {
		if err := topo.WriteReverseState(ctx, s, p, id, topo.ReverseState{State: state, Reason: why, LagBytes: &lag, At: at, By: "w1"}); err != nil {
			t.Fatal(err)
		}
	}
	mk("m-running", "")
	probe("m-running", "running", "", now.Add(-2*time.Second))
	mk("m-disabled", "")
	probe("m-disabled", "disabled", "an apply error disabled it", now)
	mk("m-unprobed", "")
	mk("m-stale", "")
	probe("m-stale", "running", "", now.Add(-ReverseProbeStale-time.Minute))
	mk("m-lost", "the reverse slot s is gone from pg2")
	probe("m-lost", "running", "", now)
	if err := topo.WriteReverseState(ctx, s, p, "m-none", topo.ReverseState{State: "running", At: now}); err == nil {
		t.Fatal("a probe of a move with no record was published")
	}

	v := NewStatus(s, p, StatusOptions{TTL: -1}).View(ctx, Self{}, true, nil)
	got := map[string]*MoveReverse{}
	for _, m := range v.Moves.InFlight {
		got[m.ID] = m.Reverse
	}
	for id, want := range map[string]string{"m-running": "running", "m-disabled": "disabled", "m-unprobed": "started", "m-stale": "started", "m-lost": "lost"} {
		if r := got[id]; r == nil || r.State != want {
			t.Errorf("%s: %+v, want state %s", id, r, want)
		}
	}
	if r := got["m-running"]; r.LagBytes == nil || *r.LagBytes != 4096 || r.ProbedAt.IsZero() {
		t.Errorf("running: %+v, want its lag and when it was probed", r)
	}
	if r := got["m-disabled"]; r.Reason != "an apply error disabled it" {
		t.Errorf("disabled: %+v", r)
	}
	for _, id := range []string{"m-unprobed", "m-stale"} {
		if r := got[id]; !strings.Contains(r.Reason, "rebalance --watch") || r.LagBytes != nil {
			t.Errorf("%s: %+v, want why it is not known", id, r)
		}
	}
	if r := got["m-lost"]; r.Lost == "" || r.LagBytes != nil {
		t.Errorf("lost: %+v", r)
	}
}

// The view carries the backup watcher's last check; without one it says
// none, and a malformed record shows as none rather than failing the view.
func TestViewBackups(t *testing.T) {
	ctx, _, s, p := zkCluster(t)
	if v := NewStatus(s, p, StatusOptions{TTL: -1}).View(ctx, Self{}, true, nil); v.Backups != nil || !v.Available {
		t.Fatalf("no check yet: %+v", v.Backups)
	}
	at := time.Now().UTC().Truncate(time.Second)
	if err := topo.WriteBackupStatus(ctx, s, p, &topo.BackupStatus{At: at, By: "w@repo", Nodes: []topo.BackupNodeStatus{
		{Node: "pg1", Stanza: "pg1", NewestAt: &at}, {Node: "pg2", Problems: []string{"archiving is failing"}}}}); err != nil {
		t.Fatal(err)
	}
	v := NewStatus(s, p, StatusOptions{TTL: -1}).View(ctx, Self{}, true, nil)
	if b := v.Backups; b == nil || len(b.Nodes) != 2 || b.Nodes[1].Problems[0] != "archiving is failing" || !b.At.Equal(at) {
		t.Fatalf("backups: %+v", v.Backups)
	}
	zktest.Put(t, s, p.BackupStatusPath(), `{"version": 1}`)
	if v := NewStatus(s, p, StatusOptions{TTL: -1}).View(ctx, Self{}, true, nil); v.Backups != nil || !v.Available {
		t.Fatalf("a malformed status record: %+v", v.Backups)
	}
}
