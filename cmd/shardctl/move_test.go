package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/migrate"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// The mover's metrics are served under their names.
func TestServeMoveMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := migrate.NewMetrics(reg)
	m.Stragglers.WithLabelValues("router", "proceed").Inc()
	m.MemberWait.Observe(0.25)
	stop, addr, err := serveMetrics("metrics-addr", "127.0.0.1:0", reg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`shardvisor_move_stragglers_total{action="proceed",kind="router"} 1`, "shardvisor_move_member_wait_seconds_count 1", "shardvisor_build_info{goversion="} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	if _, _, err := serveMetrics("metrics-addr", "nonsense", reg, zap.NewNop()); err == nil || !strings.Contains(err.Error(), "--metrics-addr nonsense") {
		t.Fatalf("a bad address: %v", err)
	}
}

// A member stuck at an old map version: `move` goes on without it and
// says so, `move status` (text and --json) shows it, --on-straggler=abort
// aborts instead, and a bad --on-straggler or --metrics-addr is refused.
func TestIntegrationMoveStragglers(t *testing.T) {
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 2)
	cmd := dataCluster(t, z, pg, "mvs", 2, 2)

	// The stuck member: a router record at the map version of now, from a
	// session of its own (its process hangs).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := topo.MustPaths(z.Root, "mvs")
	ms := zktest.Session(t, zksession.Config{Connect: z.ConnectString})
	if _, err := topo.RegisterRouter(ctx, ms, p, topo.RouterMember{Version: topo.RouterMemberVersion, ID: "stuck", MapVersion: 1}); err != nil {
		t.Fatal(err)
	}
	stuck := p.Router("stuck")

	for _, tc := range []struct {
		args   []string
		code   int
		errHas string
	}{
		{[]string{"move", "0", "--to", "pg2", "--on-straggler", "sometimes"}, 2, `--on-straggler must be proceed or abort, not "sometimes"`},
		{[]string{"move", "0", "--to", "pg2", "--metrics-addr", "nonsense"}, 1, "--metrics-addr nonsense"},
	} {
		r := runData(t, cmd(tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.errHas) {
			t.Errorf("%v: exit %d, %q; want %d mentioning %q", tc.args, r.code, r.stderr, tc.code, tc.errHas)
		}
	}
	t.Setenv("SHARDVISOR_MOVE_ON_STRAGGLER", "never")
	if r := runData(t, cmd("move", "0", "--to", "pg2")...); r.code != 2 || !strings.Contains(r.stderr, `not "never"`) {
		t.Errorf("SHARDVISOR_MOVE_ON_STRAGGLER=never: exit %d, %q", r.code, r.stderr)
	}
	t.Setenv("SHARDVISOR_MOVE_ON_STRAGGLER", "abort")
	r := runData(t, cmd("move", "0", "--to", "pg2", "--member-wait", "300ms", "--json")...)
	var rec topo.MoveRecord
	if err := json.Unmarshal([]byte(r.stdout), &rec); err != nil || r.code != 1 || rec.State != topo.MoveAborted || !strings.Contains(r.stderr, stuck) {
		t.Fatalf("move with a straggler, SHARDVISOR_MOVE_ON_STRAGGLER=abort: exit %d, state %s, %v\n%s", r.code, rec.State, err, r.stderr)
	}

	// The default: proceed.
	out := mustData(t, cmd("move", "0", "--to", "pg2", "--member-wait", "300ms", "--on-straggler", "proceed", "--metrics-addr", "127.0.0.1:0")...)
	if !strings.Contains(out, ": reversible") || !strings.Contains(out, "1 stragglers") || !strings.Contains(out, stuck+": at map version 1") ||
		!strings.Contains(out, "rollback window until") {
		t.Fatalf("move output (the default --window keeps it reversible):\n%s", out)
	}
	id := strings.TrimSuffix(strings.Fields(out)[1], ":")
	if out := mustData(t, cmd("moves")...); !strings.Contains(out, "reversible") || !strings.Contains(out, "s left") {
		t.Fatalf("moves in the window:\n%s", out)
	}
	// In the window the map does not split, and the old owner stays.
	if r := runData(t, cmd("split")...); r.code != 1 || !strings.Contains(r.stderr, "rollback window") || !strings.Contains(r.stderr, "\nhint: shardctl move complete "+id) {
		t.Fatalf("split in a move's window: exit %d, %q", r.code, r.stderr)
	}
	if r := runData(t, cmd("node", "remove", "pg1")...); r.code != 1 || !strings.Contains(r.stderr, "still needs it") || !strings.Contains(r.stderr, "\nhint: shardctl move resume "+id) {
		t.Fatalf("node remove of a move's old owner in its window: exit %d, %q", r.code, r.stderr)
	}
	// Rolled back (a move of its own, over the reverse stream), then
	// moved again and completed at once.
	if out := mustData(t, cmd("move", "rollback", id, "--member-wait", "300ms", "--on-straggler", "proceed")...); !strings.Contains(out, ": rolled_back") || !strings.Contains(out, "rollback move: ") {
		t.Fatalf("move rollback:\n%s", out)
	}
	if out := mustData(t, cmd("moves")...); !strings.Contains(out, "rolls back "+id) || !strings.Contains(out, "rolled back by ") {
		t.Fatalf("moves after the rollback:\n%s", out)
	}
	if r := runData(t, cmd("move", "rollback", "nonesuch")...); r.code != 1 || !strings.Contains(r.stderr, "nonesuch") {
		t.Fatalf("rollback of an unknown move: exit %d, %q", r.code, r.stderr)
	}
	out = mustData(t, cmd("move", "0", "--to", "pg2", "--member-wait", "300ms", "--on-straggler", "proceed")...)
	id2 := strings.TrimSuffix(strings.Fields(out)[1], ":")
	if out := mustData(t, cmd("move", "complete", id2)...); !strings.Contains(out, ": done") {
		t.Fatalf("move complete:\n%s", out)
	}
	if r := runData(t, cmd("move", "rollback", id2)...); r.code != 1 || !strings.Contains(r.stderr, "cannot be rolled back") {
		t.Fatalf("rollback of a completed move: exit %d, %q", r.code, r.stderr)
	}
	if out := mustData(t, cmd("move", "status", id)...); !strings.Contains(out, stuck+": at map version 1") || !strings.Contains(out, "member wait") {
		t.Fatalf("move status:\n%s", out)
	}
	var st topo.MoveRecord
	if err := json.Unmarshal([]byte(mustData(t, cmd("move", "status", id, "--json")...)), &st); err != nil ||
		len(st.Stragglers) != 1 || st.Stragglers[0] != (topo.Straggler{Member: stuck, MapVersion: 1}) || st.Stats.MemberWaitMS <= 0 {
		t.Fatalf("move status --json: %+v %v", st, err)
	}
	// A move done says where its time went: in all, by phase, and its
	// pause's phases; --json has them in stats.
	if out := mustData(t, cmd("move", "status", id2)...); !strings.Contains(out, "ms in all; phases: prepare ") || !strings.Contains(out, "write pause phases: freeze ") {
		t.Fatalf("move status of a move done:\n%s", out)
	}
	st = topo.MoveRecord{}
	if err := json.Unmarshal([]byte(mustData(t, cmd("move", "status", id2, "--json")...)), &st); err != nil || st.Stats.TotalMS <= 0 ||
		st.Stats.Phase(topo.PhaseCopy) <= 0 || st.Stats.Phase(topo.PhaseFlip) <= 0 {
		t.Fatalf("move status --json of a move done: %+v %v", st.Stats, err)
	}
	if out := mustData(t, cmd("moves")...); !strings.Contains(out, "TOOK") {
		t.Fatalf("moves:\n%s", out)
	}
}

// `move status` says the reverse stream's state as probed from the
// servers, never the record's enabled flag: a lost stream is said lost,
// and --json carries the probe next to the record's fields.
func TestMoveStatusSaysProbedReverse(t *testing.T) {
	until := time.Now().Add(time.Hour)
	rec := &topo.MoveRecord{ID: "b0-l2-v3-abc", Source: "pg1", Target: "pg2", State: topo.MoveReversible,
		Reverse: &topo.ReverseStream{Slot: "sv_r", Subscription: "sv_r", StartLSN: "0/1", Enabled: true, Until: &until}}
	lost := &migrate.ReverseProbe{State: migrate.ReverseLost, Reason: "the reverse slot sv_r is gone from pg2 (a failover of the target?)"}
	var b strings.Builder
	writeMoveProbed(&b, rec, lost)
	if out := b.String(); !strings.Contains(out, "LOST (the reverse slot sv_r is gone from pg2") || strings.Contains(out, "running") {
		t.Fatalf("move status of a lost stream:\n%s", out)
	}
	lag := int64(4096)
	b.Reset()
	writeMoveProbed(&b, rec, &migrate.ReverseProbe{State: migrate.ReverseRunning, LagBytes: &lag})
	if out := b.String(); !strings.Contains(out, "running, 4096 bytes behind") {
		t.Fatalf("move status of a running stream:\n%s", out)
	}
	data, err := json.Marshal(moveStatus{MoveRecord: rec, ReverseProbe: lost})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if p, _ := got["reverse_probe"].(map[string]any); got["id"] != rec.ID || p["state"] != "lost" || p["reason"] != lost.Reason {
		t.Fatalf("move status --json: %s", data)
	}
}
