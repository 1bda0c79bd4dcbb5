package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/urfave/cli/v2"

	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/keystream"
)

// dataApp is shardctl, run in this process.
func dataApp(stdout, stderr *bytes.Buffer) *cli.App {
	app := newApp()
	app.Writer, app.ErrWriter = stdout, stderr
	return app
}

// runData runs one command line in process and returns its output and exit
// status (0, 1 or 2, as the binary would).
func runData(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cliMu.Lock()
	defer cliMu.Unlock()
	code := cliutil.Exec(ctx, dataApp(&out, &errb), append([]string{"shardctl"}, args...))
	return result{out.String(), errb.String(), code}
}

// cliMu runs one in-process command line at a time: urfave/cli writes its
// package variables (HelpFlag, the help command) on every Run, so parallel
// tests take turns there and overlap in the rest.
var cliMu sync.Mutex

func mustData(t *testing.T, args ...string) string {
	t.Helper()
	r := runData(t, args...)
	if r.code != 0 {
		t.Fatalf("shardctl %v: exit %d\n%s%s", args, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// clusterCmd returns the command-line prefix of the cluster name on z: a
// command line is cmd("status") and so on.
func clusterCmd(z *testenv.ZK, name string) func(args ...string) []string {
	zk := []string{"--zk", z.ConnectString, "--zk-root", z.Root, "--cluster", name}
	return func(args ...string) []string { return append(append([]string{}, zk...), args...) }
}

// eventsDDL creates the sharded table most tests use.
const eventsDDL = `CREATE SCHEMA app; CREATE TABLE app.events (bkey bigint NOT NULL, id bigint NOT NULL, PRIMARY KEY (bkey, id))`

// initCluster sets PGPASSFILE (usePGPass), runs ddl(i) on every node i
// of pg, and inits the cluster name at level with pg's first members nodes
// as pg1, pg2, ... (the buckets split evenly in that order: at level 3 with two,
// pg1 holds 0..3 and pg2 4..7), their password from the first node's
// file. It returns the command prefix.
func initCluster(t *testing.T, z *testenv.ZK, pg *testenv.PG, name string, level, members int, ddl func(i int) string) func(args ...string) []string {
	t.Helper()
	usePGPass(t, pg)
	cmd := clusterCmd(z, name)
	for i, n := range pg.Nodes {
		if _, err := n.Conn(t).Exec(context.Background(), ddl(i)); err != nil {
			t.Fatalf("%s on %s: %v", ddl(i), n.Name, err)
		}
	}
	args := []string{"init", "--level", strconv.Itoa(level), "--seed", seed, "--password", "file:" + pg.Nodes[0].PasswordFile}
	for i, n := range pg.Nodes[:members] {
		args = append(args, "--node", fmt.Sprintf("pg%d=%s", i+1, n.DSN))
	}
	mustData(t, cmd(args...)...)
	return cmd
}

// prepareTable declares table sharded by bkey and prepares the fence on
// pg1 ... pg<members>.
func prepareTable(t *testing.T, cmd func(args ...string) []string, table string, members int) {
	t.Helper()
	mustData(t, cmd("table", "add", table, "--key", "bkey")...)
	for i := range members {
		mustData(t, cmd("node", "prepare", fmt.Sprintf("pg%d", i+1))...)
	}
}

// dataCluster sets up the cluster name at level with pg's first members
// nodes (as initCluster), the sharded table app.events on every node of pg,
// and the fence prepared on the members. It returns the command prefix.
func dataCluster(t *testing.T, z *testenv.ZK, pg *testenv.PG, name string, level, members int) func(args ...string) []string {
	t.Helper()
	cmd := initCluster(t, z, pg, name, level, members, func(int) string { return eventsDDL })
	prepareTable(t, cmd, "app.events", members)
	return cmd
}

func keyOf(level int, b uint32) int64 {
	lo, hi, _ := keystream.Range(level, b)
	return lo + (hi-lo)/3
}

// The data side end to end: table add, node prepare/check, writes fenced,
// the fence following split and assign through the hook, drift repaired,
// an unreachable node reported without failing the map change, and GC.
func TestIntegrationDataSideCommands(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 2)
	cmd := initCluster(t, z, pg, "data", 3, 2, func(int) string { return eventsDDL })
	conns := []*pgx.Conn{pg.Nodes[0].Conn(t), pg.Nodes[1].Conn(t)}
	exec := func(c *pgx.Conn, sql string, args ...any) {
		t.Helper()
		if _, err := c.Exec(context.Background(), sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	// Tables.
	mustData(t, cmd("table", "add", "app.events", "--key", "bkey")...)
	for _, tc := range []struct {
		args   []string
		code   int
		errHas string
	}{
		{[]string{"table", "add", "app.events", "--key", "bkey"}, 1, "already sharded"},
		{[]string{"table", "add", "events", "--key", "bkey"}, 2, "schema-qualified"},
		{[]string{"table", "add", "app.x"}, 2, "key"},
		{[]string{"table", "remove", "app.nope"}, 1, "not a sharded table"},
		{[]string{"node", "check", "ghost"}, 1, "unknown db node"},
		{[]string{"gc", "--batch", "0"}, 2, "--batch"},
		{[]string{"gc", "--parallel", "0"}, 2, "--parallel"},
		{[]string{"gc", "--order", "random"}, 2, "--order"},
	} {
		r := runData(t, cmd(tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.errHas) {
			t.Errorf("%v: exit %d, %q; want %d mentioning %q", tc.args, r.code, r.stderr, tc.code, tc.errHas)
		}
	}
	var tables []map[string]string
	json.Unmarshal([]byte(mustData(t, cmd("table", "list", "--json")...)), &tables)
	if len(tables) != 1 || tables[0]["name"] != "app.events" || tables[0]["key_column"] != "bkey" {
		t.Fatalf("table list: %v", tables)
	}

	// Before prepare, check reports the missing fence.
	r := runData(t, cmd("node", "check", "pg1")...)
	if r.code != 1 || !strings.Contains(r.stdout, "fence-not-installed") {
		t.Fatalf("check before prepare: %d %s %s", r.code, r.stdout, r.stderr)
	}
	for _, id := range []string{"pg1", "pg2"} {
		out := mustData(t, cmd("node", "prepare", id)...)
		if !strings.Contains(out, "installed the fence trigger on app.events") {
			t.Fatalf("prepare %s: %s", id, out)
		}
		if out := mustData(t, cmd("node", "prepare", id)...); !strings.Contains(out, "nothing changed") {
			t.Fatalf("second prepare %s: %s", id, out)
		}
		if out := mustData(t, cmd("node", "check", id)...); !strings.Contains(out, "ok") {
			t.Fatalf("check %s: %s", id, out)
		}
	}
	// pg1 owns buckets 0..3 at level 3, pg2 4..7.
	insert := func(c *pgx.Conn, k int64, id int) error {
		_, err := c.Exec(context.Background(), `INSERT INTO app.events VALUES ($1, $2)`, k, id)
		return err
	}
	if err := insert(conns[0], keyOf(3, 1), 1); err != nil {
		t.Fatal(err)
	}
	if err := insert(conns[0], keyOf(3, 6), 1); !fence.IsRejected(err) {
		t.Fatalf("pg1 accepted a write to pg2's bucket: %v", err)
	}

	// The hook follows split and assign.
	mustData(t, cmd("split")...)
	mustData(t, cmd("assign", "3", "pg2", "--no-copy")...) // bucket 3 at level 4: pg1 -> pg2
	for i, c := range conns {
		f, err := fence.Read(context.Background(), c)
		if err != nil || f.MapVersion != 3 || f.Level != 4 {
			t.Fatalf("pg%d fence after split and assign: %+v %v", i+1, f, err)
		}
	}
	if err := insert(conns[0], keyOf(4, 3), 2); !fence.IsRejected(err) || !strings.Contains(err.Error(), "bucket 3 at level 4") {
		t.Fatalf("pg1 after assign: %v", err)
	}
	if err := insert(conns[1], keyOf(4, 3), 2); err != nil {
		t.Fatalf("pg2 after assign: %v", err)
	}

	// Drift: check reports it precisely, reconcile repairs it.
	exec(conns[1], `DELETE FROM shardvisor.ownership`)
	r = runData(t, cmd("node", "check", "pg2")...)
	if r.code != 1 || !strings.Contains(r.stdout, "MISMATCH fence-range: buckets 8..15 at level 4") || !strings.Contains(r.stdout, "the map says owned, the fence says absent") {
		t.Fatalf("check with drift: %d %s", r.code, r.stdout)
	}
	out := mustData(t, cmd("node", "reconcile")...)
	if !strings.Contains(out, "node pg2: DRIFT repaired") || !strings.Contains(out, "node pg1: in step") {
		t.Fatalf("reconcile: %s", out)
	}
	mustData(t, cmd("node", "check", "pg2")...)

	// A missing index and a wrong column type.
	exec(conns[0], `CREATE TABLE app.bad (k integer NOT NULL, id int PRIMARY KEY)`)
	mustData(t, cmd("table", "add", "app.bad", "--key", "k")...)
	r = runData(t, cmd("node", "check", "pg1")...)
	for _, want := range []string{"key-column-type app.bad: column app.bad.k is integer", "key-index-missing app.bad", "primary-key-without-key-column app.bad", "trigger-missing app.bad"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("check lacks %q:\n%s", want, r.stdout)
		}
	}
	if r.code != 1 {
		t.Fatalf("check exit %d", r.code)
	}
	mustData(t, cmd("table", "remove", "app.bad")...)

	// An unreachable node does not fail a map change; it is reported.
	r = runData(t, cmd("node", "add", "pg9", "postgres://postgres@127.0.0.1:1/x?sslmode=disable")...)
	if r.code != 0 || !strings.Contains(r.stderr, "fence drift: node pg9 was not brought to map version") {
		t.Fatalf("node add of an unreachable node: %d %s", r.code, r.stderr)
	}
	mustData(t, cmd("node", "remove", "pg9")...)

	// GC: bucket 3's rows on pg1 were reassigned without copying, so the
	// owner has fewer: skipped as uncertain, nothing deleted.
	exec(conns[0], `SET session_replication_role = replica`)
	exec(conns[0], `INSERT INTO app.events SELECT $1::bigint + g, g FROM generate_series(1, 50) g`, keyOf(4, 3))
	exec(conns[0], `RESET session_replication_role`)
	r = runData(t, cmd("gc", "--grace", "0s", "--dry-run")...)
	if r.code != 1 || !strings.Contains(r.stdout, "SKIPPED (uncertain): bucket 3 at level 4 on pg1: owner-rows") {
		t.Fatalf("gc dry run: %d %s %s", r.code, r.stdout, r.stderr)
	}
	// Once the owner holds them (as after a copy), GC deletes them.
	exec(conns[1], `SET session_replication_role = replica`)
	exec(conns[1], `INSERT INTO app.events SELECT $1::bigint + g, g FROM generate_series(1, 50) g`, keyOf(4, 3))
	exec(conns[1], `RESET session_replication_role`)
	out = mustData(t, cmd("gc", "--grace", "0s", "--dry-run")...)
	if !strings.Contains(out, "pg1") || !strings.Contains(out, "app.events") || !strings.Contains(out, "would delete 50 rows in 1 ranges") {
		t.Fatalf("dry run: %s", out)
	}
	var rep struct {
		Deleted int64 `json:"deleted"`
		Pruned  int   `json:"history_pruned"`
	}
	if err := json.Unmarshal([]byte(mustData(t, cmd("gc", "--grace", "0s", "--json", "--batch", "7")...)), &rep); err != nil || rep.Deleted != 50 || rep.Pruned != 1 {
		t.Fatalf("gc: %+v %v", rep, err)
	}
	var left int
	conns[0].QueryRow(context.Background(), `SELECT count(*) FROM app.events WHERE bkey BETWEEN $1 AND $1 + 100`, keyOf(4, 3)).Scan(&left)
	if left != 0 {
		t.Fatalf("%d rows left", left)
	}
	// The default grace keeps a recent change.
	mustData(t, cmd("assign", "2", "pg2", "--no-copy")...)
	if out := mustData(t, cmd("gc", "--dry-run")...); !strings.Contains(out, "grace") {
		t.Fatalf("gc within the grace period: %s", out)
	}
}
