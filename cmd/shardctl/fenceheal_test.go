package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/urfave/cli/v2"

	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/internal/testenv"
)

// Finding 16.5: after a rebalance and a GC that prunes the history, `node
// check` exits 0 on every node (nodes a move did not involve used to report
// fence-map-version); every real drift is still caught and named, and
// `node reconcile` exits non-zero for a fence ahead of the map.
func TestIntegrationNodeCheckNoFalseAlarms(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 3)
	cmd := dataCluster(t, z, pg, "heal", 3, 2)
	ctx := context.Background()
	conns := []*pgx.Conn{pg.Nodes[0].Conn(t), pg.Nodes[1].Conn(t), pg.Nodes[2].Conn(t)}
	for b := uint32(0); b < 8; b++ {
		c := conns[0]
		if b >= 4 {
			c = conns[1]
		}
		for i := range 3 {
			if _, err := c.Exec(ctx, `INSERT INTO app.events VALUES ($1, $2)`, keyOf(3, b)+int64(i), i); err != nil {
				t.Fatal(err)
			}
		}
	}
	mustData(t, cmd("node", "add", "pg3", pg.Nodes[2].DSN, "--password", "file:"+pg.Nodes[0].PasswordFile)...)
	mustData(t, cmd("node", "prepare", "pg3")...)
	mustData(t, cmd("rebalance")...)
	var moves []map[string]any
	if err := json.Unmarshal([]byte(mustData(t, cmd("moves", "--json")...)), &moves); err != nil || len(moves) < 2 {
		t.Fatalf("want at least 2 moves: %v %v", moves, err)
	}
	var rep struct {
		Deleted int64 `json:"deleted"`
		Pruned  int   `json:"history_pruned"`
	}
	if err := json.Unmarshal([]byte(mustData(t, cmd("gc", "--grace", "0s", "--json")...)), &rep); err != nil || rep.Deleted == 0 || rep.Pruned == 0 {
		t.Fatalf("gc: %+v %v", rep, err)
	}
	for _, id := range []string{"pg1", "pg2", "pg3"} {
		if r := runData(t, cmd("node", "check", id)...); r.code != 0 {
			t.Errorf("node check %s after a rebalance and GC: exit %d\n%s%s", id, r.code, r.stdout, r.stderr)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	exec := func(c *pgx.Conn, sql string, args ...any) {
		t.Helper()
		if _, err := c.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	expect := func(id string, kinds ...string) {
		t.Helper()
		r := runData(t, cmd("node", "check", id)...)
		for _, k := range kinds {
			if r.code != 1 || !strings.Contains(r.stdout, "MISMATCH "+k) {
				t.Errorf("node check %s: exit %d, want 1 naming %s:\n%s%s", id, r.code, k, r.stdout, r.stderr)
			}
		}
	}
	// An edited epoch, higher than any map version the fence applied.
	var lo, epoch int64
	if err := conns[0].QueryRow(ctx, `SELECT lo, epoch FROM shardvisor.ownership ORDER BY lo LIMIT 1`).Scan(&lo, &epoch); err != nil {
		t.Fatal(err)
	}
	exec(conns[0], `UPDATE shardvisor.ownership SET epoch = 999 WHERE lo = $1`, lo)
	expect("pg1", fence.KindFenceEpoch)
	// ... and lower than the version at which the node got the range.
	exec(conns[0], `UPDATE shardvisor.ownership SET epoch = 0 WHERE lo = $1`, lo)
	expect("pg1", fence.KindFenceEpoch)
	exec(conns[0], `UPDATE shardvisor.ownership SET epoch = $2 WHERE lo = $1`, lo, epoch)
	mustData(t, cmd("node", "check", "pg1")...)

	// An edited owned range.
	exec(conns[1], `UPDATE shardvisor.ownership SET hi = hi - 1 WHERE lo = (SELECT min(lo) FROM shardvisor.ownership)`)
	expect("pg2", fence.KindFenceRange)
	mustData(t, cmd("node", "reconcile", "pg2")...)
	mustData(t, cmd("node", "check", "pg2")...)

	// An edited map version: behind the fence's own rows, then ahead of
	// the map.
	var mapVersion int64
	conns[2].QueryRow(ctx, `SELECT map_version FROM shardvisor.fence_meta`).Scan(&mapVersion)
	exec(conns[2], `UPDATE shardvisor.fence_meta SET map_version = 0`)
	expect("pg3", fence.KindFenceVersion)
	exec(conns[2], `UPDATE shardvisor.fence_meta SET map_version = map_version + 1000`)
	expect("pg3", fence.KindFenceVersion)
	r := runData(t, cmd("node", "reconcile")...)
	if r.code != 1 || !strings.Contains(r.stdout, "node pg3: AHEAD") || !strings.Contains(r.stderr, "ahead of the map") {
		t.Fatalf("reconcile with pg3's fence ahead of the map: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	exec(conns[2], `UPDATE shardvisor.fence_meta SET map_version = $1`, mapVersion)
	mustData(t, cmd("node", "reconcile")...)
	for _, id := range []string{"pg1", "pg2", "pg3"} {
		mustData(t, cmd("node", "check", id)...)
	}
}

// Finding 16.4: a node stopped, marked down and restarted refuses writes
// to the buckets it lost within the reconciler's bound, with nobody doing
// anything but `shardctl node reconcile --watch` running; the row it
// accepted before it went down is reported by `node check` and GC.
func TestFaultsReturningNodeRefusesLostBuckets(t *testing.T) {
	testenv.Faults(t)
	testenv.Exclusive(t)
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 2)
	cmd := dataCluster(t, z, pg, "heal", 3, 2)
	ctx := context.Background()
	// A row written to pg2 before it goes down: bucket 6 at level 3.
	if _, err := pg.Nodes[1].Conn(t).Exec(ctx, `INSERT INTO app.events VALUES ($1, 1)`, keyOf(3, 6)); err != nil {
		t.Fatal(err)
	}

	// The unattended reconciler.
	const retry = 200 * time.Millisecond
	wctx, stop := context.WithCancel(ctx)
	var wout, werr bytes.Buffer
	done := make(chan int, 1)
	// The watch parses its flags under cliMu, as runData does (urfave/cli
	// writes its package variables then), and lets go once it runs.
	wapp := dataApp(&wout, &werr)
	cliMu.Lock()
	var once sync.Once
	release := func() { once.Do(cliMu.Unlock) }
	for _, c := range wapp.Commands {
		if c.Name != "node" {
			continue
		}
		for _, sc := range c.Subcommands {
			if sc.Name == "reconcile" {
				action := sc.Action
				sc.Action = func(cc *cli.Context) error { release(); return action(cc) }
			}
		}
	}
	go func() {
		defer release()
		done <- cliutil.Exec(wctx, wapp, append([]string{"shardctl"}, cmd("node", "reconcile", "--watch", "--retry", retry.String())...))
	}()
	t.Cleanup(func() {
		stop()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("the reconciler did not stop")
		}
	})

	if err := pg.Nodes[1].Stop(); err != nil {
		t.Fatal(err)
	}
	r := runData(t, cmd("node", "down", "pg2")...)
	if r.code != 0 || !strings.Contains(r.stderr, "fence drift: node pg2") {
		t.Fatalf("node down: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if err := pg.Nodes[1].Start(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	// The bound: the reconciler's retry interval plus one sync (connect
	// and one fence flip); generous for a loaded 2-core machine.
	const bound = retry + 3*time.Second
	accepted := 0
	for id := 100; ; id++ {
		c, err := pgx.Connect(ctx, pg.Nodes[1].DSNWithPassword)
		if err == nil {
			_, err = c.Exec(ctx, `INSERT INTO app.events VALUES ($1, $2)`, keyOf(3, 6), id)
			c.Close(ctx)
			if fence.IsRejected(err) {
				t.Logf("pg2 refused writes to its lost bucket %v after it answered (%d accepted meanwhile)", time.Since(back).Round(time.Millisecond), accepted)
				break
			}
			if err == nil {
				accepted++
			}
		}
		if time.Since(back) > bound {
			t.Fatalf("pg2 still accepts writes to bucket 6, reassigned away while it was down, %v after it came back (%d accepted; last error %v)\nreconciler:\n%s%s",
				bound, accepted, err, wout.String(), werr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Nothing that pg2 accepted is silently lost: node check names the
	// rows it holds in the buckets it lost without a copy, GC keeps them.
	r = runData(t, cmd("node", "check", "pg2")...)
	if r.code != 1 || !strings.Contains(r.stdout, "MISMATCH "+fence.KindStrandedRows+" app.events") || !strings.Contains(r.stdout, fmt.Sprintf("%d rows", 1+accepted)) {
		t.Fatalf("node check pg2: exit %d, want the stranded row reported:\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runData(t, cmd("gc", "--grace", "0s", "--dry-run")...)
	if r.code != 1 || !strings.Contains(r.stdout, "on pg2: owner-rows") {
		t.Fatalf("gc dry run: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
