package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/internal/testenv"
)

// Schema changes end to end on real PostgreSQL: the first schema before
// any table is sharded, a node down leaving the change partial and a
// resume, a no-op re-apply, an edit refused, a bad statement stopped on
// its canary with no other node touched (then fixed under the same id),
// CREATE INDEX CONCURRENTLY statement by statement, a new node prepared
// from the history, and drift made by hand found by `schema diff`.
func TestIntegrationSchemaCommands(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 4)
	cmd := clusterCmd(z, "sch")
	pw := "file:" + pg.Nodes[0].PasswordFile
	conns := []*pgx.Conn{pg.Nodes[0].Conn(t), pg.Nodes[1].Conn(t), pg.Nodes[2].Conn(t), pg.Nodes[3].Conn(t)}
	dir := t.TempDir()
	file := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rowsOf := func(i int) string { // the node's own history
		var ids []string
		r, err := conns[i].Query(context.Background(), `SELECT id FROM shardvisor.schema_changes WHERE done ORDER BY seq`)
		if err == nil {
			ids, err = pgx.CollectRows(r, pgx.RowTo[string])
		}
		if err != nil {
			return "none: " + err.Error()
		}
		return strings.Join(ids, ",")
	}
	// pg3 is registered at an address where nothing listens: down.
	mustData(t, cmd("init", "--level", "3", "--seed", seed, "--password", pw, "--node", "pg1="+pg.Nodes[0].DSN,
		"--node", "pg2="+pg.Nodes[1].DSN, "--node", "pg3=postgres://postgres@127.0.0.1:1/nope?sslmode=disable")...)

	// 1. The first schema, a reference table with it, before any table
	// is declared sharded. pg3 is unreachable: partial, exit 1, named.
	initSQL := `CREATE SCHEMA app;
CREATE TABLE app.events (bkey bigint NOT NULL, id bigint NOT NULL, body text, PRIMARY KEY (bkey, id));
CREATE TABLE app.countries (code text PRIMARY KEY); -- a reference table
INSERT INTO app.countries VALUES ('fr'), ('de');`
	f1 := file("001-init.sql", initSQL)
	r := runData(t, cmd("schema", "apply", f1)...)
	if r.code != 1 || !strings.Contains(r.stdout, "pg3") || !strings.Contains(r.stderr, "missing on pg3") || !strings.Contains(r.stdout, ": partial") {
		t.Fatalf("apply with pg3 down: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := rowsOf(0) + "|" + rowsOf(1); got != "001-init|001-init" {
		t.Fatalf("history on pg1|pg2: %s", got)
	}
	r = runData(t, cmd("schema", "status")...)
	if r.code != 1 || !strings.Contains(r.stdout, "001-init") || !strings.Contains(r.stdout, "missing on pg3 (unreachable") {
		t.Fatalf("status of a partial change: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// 2. pg3 is back: the same apply resumes there only.
	mustData(t, cmd("node", "set-dsn", "pg3", pg.Nodes[2].DSN)...)
	var res struct {
		State string `json:"state"`
		New   bool   `json:"new"`
		Nodes []struct {
			Node  string   `json:"node"`
			State string   `json:"state"`
			Ran   []string `json:"ran"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(mustData(t, cmd("--json", "schema", "apply", f1)...)), &res); err != nil {
		t.Fatal(err)
	}
	ran := map[string]int{}
	for _, n := range res.Nodes {
		ran[n.Node] = len(n.Ran)
	}
	if res.State != "applied" || res.New || ran["pg1"] != 0 || ran["pg2"] != 0 || ran["pg3"] != 1 {
		t.Fatalf("resume: %+v", res)
	}
	var n int
	if err := conns[2].QueryRow(context.Background(), `SELECT count(*) FROM app.countries`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("pg3's reference table: %d rows, %v", n, err)
	}
	// Again: nothing to do anywhere.
	if out := mustData(t, cmd("schema", "apply", f1)...); strings.Count(out, "nothing to run") != 3 {
		t.Fatalf("a second apply ran something:\n%s", out)
	}
	// An edit of an applied change is refused, naming what to do.
	file("001-init.sql", initSQL+"\nCREATE TABLE app.more (x int);")
	if r := runData(t, cmd("schema", "apply", f1)...); r.code != 1 || !strings.Contains(r.stderr, "cannot be edited") || !strings.Contains(r.stderr, "new change") {
		t.Fatalf("edited change: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// 3. A bad statement: the canary fails and no other node is touched.
	f2 := file("002-flag.sql", "ALTER TABLE app.nope ADD COLUMN flag boolean;")
	r = runData(t, cmd("schema", "apply", "--canary", "pg2", f2)...)
	if r.code != 1 || !strings.Contains(r.stderr, "canary") || !strings.Contains(r.stderr, `relation "app.nope" does not exist`) || !strings.Contains(r.stdout, "applied nowhere: fix the file") {
		t.Fatalf("bad change: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if strings.Contains(r.stdout, "pg1") || strings.Contains(r.stdout, "pg3") {
		t.Fatalf("other nodes were touched:\n%s", r.stdout)
	}
	for i := range 3 {
		if got := rowsOf(i); got != "001-init" {
			t.Fatalf("node %d history after the failed canary: %s", i+1, got)
		}
	}
	// Applied nowhere, so it may be fixed under the same id.
	file("002-flag.sql", "ALTER TABLE app.events ADD COLUMN flag boolean NOT NULL DEFAULT false;")
	mustData(t, cmd("schema", "apply", f2)...)

	// 4. The tables become sharded; an index built concurrently.
	mustData(t, cmd("table", "add", "app.events", "--key", "bkey")...)
	for _, id := range []string{"pg1", "pg2", "pg3"} {
		mustData(t, cmd("node", "prepare", id)...)
	}
	f3 := file("003-index.sql", "-- shardvisor:id 003-events-by-id\nCREATE INDEX CONCURRENTLY events_by_id ON app.events (id);\nANALYZE app.events;")
	out := mustData(t, cmd("schema", "apply", f3)...)
	if !strings.Contains(out, "003-events-by-id") || !strings.Contains(out, "statements") {
		t.Fatalf("concurrent index:\n%s", out)
	}

	// 5. A new node, empty: node prepare replays the history in order.
	mustData(t, cmd("node", "add", "--password", pw, "pg4", pg.Nodes[3].DSN)...)
	out = mustData(t, cmd("node", "prepare", "pg4")...)
	if !strings.Contains(out, "ran 001-init, 002-flag, 003-events-by-id") {
		t.Fatalf("prepare of a new node:\n%s", out)
	}
	if got := rowsOf(3); got != "001-init,002-flag,003-events-by-id" {
		t.Fatalf("pg4's history: %s", got)
	}
	mustData(t, cmd("node", "check", "pg4")...)
	if out := mustData(t, cmd("schema", "diff")...); !strings.Contains(out, "no drift") {
		t.Fatalf("diff before drift:\n%s", out)
	}

	// 6. Drift by hand: found, with node, table and difference.
	if _, err := conns[1].Exec(context.Background(), `ALTER TABLE app.events ALTER COLUMN body TYPE varchar(20)`); err != nil {
		t.Fatal(err)
	}
	r = runData(t, cmd("schema", "diff")...)
	if r.code != 1 || !strings.Contains(r.stdout, "node pg2: DIFF schema-column-type app.events") || !strings.Contains(r.stdout, "character varying(20)") {
		t.Fatalf("diff after drift: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if out := runData(t, cmd("schema", "status")...).stdout; !strings.Contains(out, "last diff") || !strings.Contains(out, "1 differences") {
		t.Fatalf("status after the diff:\n%s", out)
	}
}

// A cluster made before its history was kept: adopt takes pg1's schema
// (pg_dump, without the fence's objects) as the baseline and marks the
// nodes that match it; a new empty node is prepared by replaying it.
func TestIntegrationSchemaAdopt(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 3)
	cmd := clusterCmd(z, "adopt")
	pw := "file:" + pg.Nodes[0].PasswordFile
	ddl := `CREATE SCHEMA app;
CREATE TABLE app.events (bkey bigint NOT NULL, id bigint NOT NULL, note text DEFAULT 'x', PRIMARY KEY (bkey, id));
CREATE INDEX events_note ON app.events (bkey, note);
CREATE TABLE app.countries (code text PRIMARY KEY);
CREATE VIEW app.recent AS SELECT bkey, id FROM app.events WHERE id > 100;`
	for i := range 2 {
		if _, err := pg.Nodes[i].Conn(t).Exec(context.Background(), ddl); err != nil {
			t.Fatal(err)
		}
	}
	mustData(t, cmd("init", "--level", "2", "--seed", seed, "--password", pw, "--node", "pg1="+pg.Nodes[0].DSN, "--node", "pg2="+pg.Nodes[1].DSN)...)
	mustData(t, cmd("table", "add", "app.events", "--key", "bkey")...)
	mustData(t, cmd("node", "prepare", "pg1")...)
	mustData(t, cmd("node", "prepare", "pg2")...)
	// Without a history, an empty node cannot be prepared; the error says
	// what to run.
	mustData(t, cmd("node", "add", "--password", pw, "pg3", pg.Nodes[2].DSN)...)
	if r := runData(t, cmd("node", "prepare", "pg3")...); r.code != 1 || !strings.Contains(r.stderr, "no schema history is recorded") || !strings.Contains(r.stderr, "\nhint: run `shardctl schema adopt --from NODE`") {
		t.Fatalf("prepare without a history: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r := runData(t, cmd("schema", "adopt", "--from", "pg1")...)
	if r.code != 0 || !strings.Contains(r.stdout, "in step: pg1, pg2") || !strings.Contains(r.stdout, "node pg3 has no tables") {
		t.Fatalf("adopt: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	out := mustData(t, cmd("node", "prepare", "pg3")...)
	if !strings.Contains(out, "ran baseline") {
		t.Fatalf("prepare after adopt:\n%s", out)
	}
	mustData(t, cmd("node", "check", "pg3")...)
	if out := mustData(t, cmd("schema", "diff")...); !strings.Contains(out, "no drift") {
		t.Fatalf("diff after the replay:\n%s", out)
	}
	var n int
	if err := pg.Nodes[2].Conn(t).QueryRow(context.Background(), `SELECT count(*) FROM app.recent`).Scan(&n); err != nil {
		t.Fatalf("the view did not come with the baseline: %v", err)
	}
	// A change follows the baseline. A node that missed adopt and has the
	// schema already (its table of changes lost, here) fails the replay,
	// told what to run; adopt, run again after the change, marks it with
	// the baseline and the change once it matches a node that has both.
	f := filepath.Join(t.TempDir(), "002-more.sql")
	if err := os.WriteFile(f, []byte("ALTER TABLE app.countries ADD COLUMN name text;"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustData(t, cmd("schema", "apply", f)...)
	if _, err := pg.Nodes[1].Conn(t).Exec(context.Background(), `DROP TABLE shardvisor.schema_changes`); err != nil {
		t.Fatal(err)
	}
	r = runData(t, cmd("node", "prepare", "pg2")...)
	if r.code != 1 || !strings.Contains(r.stderr, "does not record the change") || !strings.Contains(r.stderr, "\nhint: if the node is in step, `shardctl schema adopt --from NODE`") {
		t.Fatalf("prepare of a node with the schema but no record of it: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := runData(t, cmd("schema", "adopt", "--from", "pg2")...); r.code != 1 || !strings.Contains(r.stderr, "--from pg2 lacks change baseline") {
		t.Fatalf("adopt from a node behind: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if out := mustData(t, cmd("schema", "adopt", "--from", "pg1")...); !strings.Contains(out, "in step: pg1, pg2, pg3") {
		t.Fatalf("adopt after the change:\n%s", out)
	}
	mustData(t, cmd("node", "prepare", "pg2")...)
	mustData(t, cmd("schema", "status")...)
}
