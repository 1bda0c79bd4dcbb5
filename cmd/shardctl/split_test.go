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
	// only that node's does. 16 users reach both depths (checked below):
	// each costs two command lines and three writes, and the test's time
	// is make test's.
	sd, _ := keystream.ParseSeed(seed)
	ks, _ := keystream.New(sd)
	depths := map[int]bool{}
	for i := range 16 {
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
	// Sizes: the 16 rows written above, measured on their owners.
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
	if len(rep.Buckets) != 2 || rep.Buckets[0].Rows < rep.Buckets[1].Rows || owned != 16 {
		t.Fatalf("buckets --top 2: %+v (owned %d)", rep, owned)
	}
	if out := mustData(t, cmd("buckets")...); !strings.Contains(out, "exact") || !strings.Contains(out, "1/3") {
		t.Fatalf("buckets: %s", out)
	}
	if out := mustData(t, cmd("plan", "--by", "rows")...); !strings.Contains(out, "plan by rows") || !strings.Contains(out, "AFTER/FAIR") {
		t.Fatalf("plan --by rows: %s", out)
	}
	// plan --by size: now and after in live bytes, and the measurement's
	// leftovers, dead rows and size on disk apart.
	if out := mustData(t, cmd("plan", "--by", "size")...); !strings.Contains(out, "plan by size (live bytes of the owned rows)") || !strings.Contains(out, "NOW/FAIR") ||
		!strings.Contains(out, "ON DISK") || !strings.Contains(out, "DEAD ROWS") || !strings.Contains(out, "LEFTOVER") {
		t.Fatalf("plan --by size: %s", out)
	}
	var sp struct {
		By       string `json:"by"`
		Measured []struct {
			Node     string `json:"node"`
			Physical int64  `json:"physical_bytes"`
			Owned    struct{ Rows, Bytes int64 }
		} `json:"measured"`
	}
	if err := json.Unmarshal([]byte(mustData(t, cmd("plan", "--by", "size", "--json")...)), &sp); err != nil {
		t.Fatal(err)
	}
	if sp.By != "size" || len(sp.Measured) != 3 {
		t.Fatalf("plan --by size --json: %+v", sp)
	}
	for _, n := range sp.Measured {
		if n.Owned.Rows > 0 && (n.Owned.Bytes == 0 || n.Physical <= n.Owned.Bytes) {
			t.Fatalf("plan --by size --json: node %+v", n)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--by", "weight"}, "--by must be count, size or rows"},
		{[]string{"rebalance", "--set-mode"}, "--set-mode records the mode --by names"},
		{[]string{"rebalance", "mode", "weight"}, "rebalance mode: want count, size or rows"},
		{[]string{"plan", "--by", "size", "--tolerance", "0"}, "--tolerance must be above 0"},
		{[]string{"buckets", "--top", "-1"}, "--top must not be negative"},
		{[]string{"rebalance", "--by", "size", "--watch"}, "runs once, not with --watch"},
	} {
		if r := runData(t, cmd(tc.args...)...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d %q, want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	// The balance mode changes only when asked to: a one-off rebalance
	// by another mode than the recorded one is refused, naming the way
	// to change it, and changes nothing.
	if out := mustData(t, cmd("status")...); !strings.Contains(out, "rebalancer: balances by count; `rebalance --watch` plans moves by bucket count") {
		t.Fatalf("status before any mode was set: %s", out)
	}
	if r := runData(t, cmd("rebalance", "--by", "rows", "--window", "0")...); r.code != 1 || !strings.Contains(r.stderr, "the cluster balances by count") ||
		!strings.Contains(r.stderr, "shardctl rebalance --by rows --set-mode") {
		t.Fatalf("rebalance --by rows of a cluster by count: exit %d %s", r.code, r.stderr)
	}
	if out := mustData(t, cmd("plan")...); strings.Contains(out, "plan by") {
		t.Fatalf("plan after a refused rebalance --by rows: %s", out)
	}
	// --set-mode records it, who and when; status shows it; a later plan
	// keeps to it.
	if r := runData(t, cmd("rebalance", "--by", "rows", "--set-mode", "--window", "0")...); r.code != 0 || !strings.Contains(r.stderr, "balance mode changed from count to rows") {
		t.Fatalf("rebalance --by rows --set-mode: exit %d %s%s", r.code, r.stdout, r.stderr)
	}
	if out := mustData(t, cmd("plan")...); !strings.Contains(out, "plan by rows") {
		t.Fatalf("plan after rebalance --by rows --set-mode: %s", out)
	}
	if out := mustData(t, cmd("status")...); !strings.Contains(out, "rebalancer: balances by rows (set by shardctl rebalance --by rows --set-mode (") ||
		!strings.Contains(out, "`shardctl rebalance mode count` balances bucket counts again") {
		t.Fatalf("status after the mode was set: %s", out)
	}
	var st struct {
		Rebalance struct {
			Mode  string `json:"mode"`
			SetBy string `json:"set_by"`
			SetAt string `json:"set_at"`
		} `json:"rebalance"`
	}
	if err := json.Unmarshal([]byte(mustData(t, cmd("status", "--json")...)), &st); err != nil || st.Rebalance.Mode != "rows" || st.Rebalance.SetAt == "" ||
		!strings.HasPrefix(st.Rebalance.SetBy, "shardctl rebalance --by rows --set-mode") {
		t.Fatalf("status --json: %+v %v", st, err)
	}
	// rebalance mode shows it and sets it back.
	if out := mustData(t, cmd("rebalance", "mode")...); !strings.Contains(out, "rebalancer: balances by rows") {
		t.Fatalf("rebalance mode: %s", out)
	}
	if out := mustData(t, cmd("rebalance", "mode", "count")...); !strings.Contains(out, "balance mode changed from rows to count") ||
		!strings.Contains(out, "balances by count (set by shardctl rebalance mode count (") {
		t.Fatalf("rebalance mode count: %s", out)
	}
	if out := mustData(t, cmd("plan")...); strings.Contains(out, "plan by") {
		t.Fatalf("plan after rebalance mode count: %s", out)
	}
}
