package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/keystream"
)

// The case at the command line: 3 nodes at level 2. `split 0`
// splits that bucket only (5 buckets); status, its JSON, the grid, route
// and hash show the depths; every node's fence agrees with the map (node
// check); every user's route names the node whose fence accepts its
// write; and a half moves with NUMBER/DEPTH.
func TestIntegrationSplitOneBucket(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 3)
	cmd := dataCluster(t, z, pg, "hot", 2, 3)
	conns := []*pgx.Conn{pg.Nodes[0].Conn(t), pg.Nodes[1].Conn(t), pg.Nodes[2].Conn(t)}

	out := mustData(t, cmd("split", "0")...)
	if !strings.Contains(out, "split bucket 0/2 into 0/3 and 1/3 on pg1") || !strings.Contains(out, "5 buckets at depths 2..3") {
		t.Fatalf("split 0: %s", out)
	}
	var s bucketmap.Summary
	if err := json.Unmarshal([]byte(mustData(t, cmd("status", "--json")...)), &s); err != nil {
		t.Fatal(err)
	}
	if s.Buckets != 5 || s.Level != nil || s.MinDepth != 2 || s.MaxDepth != 3 || !strings.Contains(mustData(t, cmd("status")...), "mixed depths 2..3 (5 buckets)") {
		t.Fatalf("status after split 0: %+v", s)
	}
	grid := mustData(t, cmd("status", "--grid")...)
	for _, row := range []string{"0/3", "1/3", "1/2", "2/2", "3/2"} {
		if !strings.Contains(grid, "\n"+row+" ") {
			t.Fatalf("grid lacks row %s:\n%s", row, grid)
		}
	}
	// A bare number is now ambiguous, and said so; a bucket split further
	// is refused with the reason.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"split", "1"}, "name one with its depth"},
		{[]string{"split", "0/2"}, "split further"},
		{[]string{"move", "1", "--to", "pg2"}, "name one with its depth"},
		{[]string{"split", "x"}, "not a bucket number"},
	} {
		if r := runData(t, cmd(tc.args...)...); r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d %q, want %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	// Every route names a node whose fence takes the user's write, and
	// only that node's does.
	sd, _ := keystream.ParseSeed(seed)
	ks, _ := keystream.New(sd)
	depths := map[int]bool{}
	for i := range 40 {
		uid := "user-" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		var rt struct {
			Bucket uint32 `json:"bucket"`
			Level  int    `json:"level"`
			Node   string `json:"node"`
		}
		if err := json.Unmarshal([]byte(mustData(t, cmd("route", "--json", uid)...)), &rt); err != nil {
			t.Fatal(err)
		}
		depths[rt.Level] = true
		var h hashLine
		json.Unmarshal([]byte(mustData(t, cmd("hash", "--json", uid)...)), &h)
		if h.Bucket != rt.Bucket || h.Level != rt.Level {
			t.Fatalf("%s: hash says %d/%d, route %d/%d", uid, h.Bucket, h.Level, rt.Bucket, rt.Level)
		}
		key := keystream.Key(ks.Prefix64(uid))
		for j, c := range conns {
			_, err := c.Exec(context.Background(), `INSERT INTO app.events VALUES ($1, $2)`, key, i)
			if owner := j == int(rt.Node[2]-'1'); (err == nil) != owner {
				t.Fatalf("%s routed to %s: write on pg%d: %v", uid, rt.Node, j+1, err)
			}
		}
	}
	if !depths[2] || !depths[3] {
		t.Fatalf("the users tested reach depths %v only", depths)
	}
	for _, id := range []string{"pg1", "pg2", "pg3"} {
		if out := mustData(t, cmd("node", "check", id)...); !strings.Contains(out, "ok") {
			t.Fatalf("check %s: %s", id, out)
		}
	}
	out = mustData(t, cmd("move", "1/3", "--to", "pg3", "--window", "0")...)
	if !strings.Contains(out, "bucket 1 (level 3)") || !strings.Contains(out, "done") {
		t.Fatalf("move 1/3: %s", out)
	}
	if out := mustData(t, cmd("route", "user-a")...); !strings.Contains(out, "bucket ") {
		t.Fatal(out)
	}
	for _, id := range []string{"pg1", "pg3"} {
		if out := mustData(t, cmd("node", "check", id)...); !strings.Contains(out, "ok") {
			t.Fatalf("check %s after the move: %s", id, out)
		}
	}
	var m bucketmap.Summary
	json.Unmarshal([]byte(mustData(t, cmd("status", "--json")...)), &m)
	if m.Buckets != 5 {
		t.Fatalf("after the move: %+v", m)
	}
	// Sizes: the 40 rows written above, measured on their owners.
	var rep struct {
		Buckets []struct {
			Bucket uint32 `json:"bucket"`
			Level  int    `json:"level"`
			Name   string `json:"name"`
			Rows   int64  `json:"rows"`
		} `json:"buckets"`
		Nodes []struct {
			Owned struct{ Rows int64 } `json:"owned"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(mustData(t, cmd("buckets", "--top", "2", "--json")...)), &rep); err != nil {
		t.Fatal(err)
	}
	var owned int64
	for _, n := range rep.Nodes {
		owned += n.Owned.Rows
	}
	if len(rep.Buckets) != 2 || rep.Buckets[0].Rows < rep.Buckets[1].Rows || owned != 40 {
		t.Fatalf("buckets --top 2: %+v (owned %d)", rep, owned)
	}
	if out := mustData(t, cmd("buckets")...); !strings.Contains(out, "exact") || !strings.Contains(out, "1/3") {
		t.Fatalf("buckets: %s", out)
	}
	if out := mustData(t, cmd("plan", "--by", "rows")...); !strings.Contains(out, "plan by rows") || !strings.Contains(out, "AFTER/FAIR") {
		t.Fatalf("plan --by rows: %s", out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--by", "weight"}, "--by must be count, size (bytes) or rows"},
		{[]string{"plan", "--by", "size", "--tolerance", "0"}, "--tolerance must be above 0"},
		{[]string{"buckets", "--top", "-1"}, "--top must not be negative"},
		{[]string{"rebalance", "--by", "size", "--watch"}, "runs once, not with --watch"},
	} {
		if r := runData(t, cmd(tc.args...)...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d %q, want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	// rebalance --by rows records the mode; a later plan keeps to it.
	mustData(t, cmd("rebalance", "--by", "rows", "--window", "0")...)
	if out := mustData(t, cmd("plan")...); !strings.Contains(out, "plan by rows") {
		t.Fatalf("plan after rebalance --by rows: %s", out)
	}
	mustData(t, cmd("rebalance", "--by", "count", "--window", "0")...)
	if out := mustData(t, cmd("plan")...); strings.Contains(out, "plan by") {
		t.Fatalf("plan after rebalance --by count: %s", out)
	}
}
