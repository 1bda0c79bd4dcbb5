package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/shardvisor/shardvisor/internal/testenv"
)

// node check compares the sharded tables across nodes, not only against
// the contract: a column that is timestamp on pg1 and timestamptz on pg2
// passed the contract checks on both ("ok"); now each node's check names
// the table, the column and both types, and exits 1.
func TestIntegrationNodeCheckComparesSchemasAcrossNodes(t *testing.T) {
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 2)
	t.Setenv("PGPASSFILE", pg.Nodes[0].PGPassFile)
	zk := []string{"--zk", z.ConnectString, "--zk-root", z.Root, "--cluster", "sch"}
	cmd := func(args ...string) []string { return append(append([]string{}, zk...), args...) }
	for i, typ := range []string{"timestamp", "timestamptz"} {
		if _, err := pg.Nodes[i].Conn(t).Exec(context.Background(), `CREATE SCHEMA app; CREATE TABLE app.events (bkey bigint NOT NULL, id bigint NOT NULL, at `+typ+`, PRIMARY KEY (bkey, id))`); err != nil {
			t.Fatal(err)
		}
	}
	pw := "file:" + pg.Nodes[0].PasswordFile
	mustData(t, cmd("init", "--level", "2", "--seed", seed, "--password", pw, "--node", "pg1="+pg.Nodes[0].DSN, "--node", "pg2="+pg.Nodes[1].DSN)...)
	mustData(t, cmd("table", "add", "app.events", "--key", "bkey")...)
	mustData(t, cmd("node", "prepare", "pg1")...)
	mustData(t, cmd("node", "prepare", "pg2")...)

	r := runData(t, cmd("node", "check", "pg2")...)
	want := "node pg2: MISMATCH schema-column-type app.events: app.events: the type of column at is timestamp with time zone on pg2, timestamp without time zone on pg1"
	if r.code != 1 || !strings.Contains(r.stdout, want) {
		t.Fatalf("node check pg2: exit %d, want 1 and %q:\n%s%s", r.code, want, r.stdout, r.stderr)
	}
	r = runData(t, cmd("node", "check", "pg1", "--json")...)
	var out struct {
		Mismatches []struct{ Kind, Table, Message string } `json:"mismatches"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != 1 {
		t.Fatalf("node check pg1 --json: exit %d, %v:\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	if len(out.Mismatches) != 1 || out.Mismatches[0].Kind != "schema-column-type" || out.Mismatches[0].Table != "app.events" ||
		!strings.Contains(out.Mismatches[0].Message, "timestamp without time zone on pg1, timestamp with time zone on pg2") {
		t.Fatalf("mismatches: %+v", out.Mismatches)
	}

	// Equal again: ok on both.
	if _, err := pg.Nodes[1].Conn(t).Exec(context.Background(), `ALTER TABLE app.events ALTER COLUMN at TYPE timestamp`); err != nil {
		t.Fatal(err)
	}
	if out := mustData(t, cmd("node", "check", "pg2")...); !strings.Contains(out, "node pg2: ok") {
		t.Fatalf("after the fix: %s", out)
	}
}

// move abort documents --after-failure, with its environment variable.
func TestMoveAbortAfterFailureHelp(t *testing.T) {
	r := runData(t, "move", "abort", "--help")
	for _, want := range []string{"--after-failure", "SHARDVISOR_MOVE_ABORT_AFTER_FAILURE", "REFUSES", "release GC"} {
		if !strings.Contains(r.stdout+r.stderr, want) {
			t.Errorf("move abort --help lacks %q:\n%s%s", want, r.stdout, r.stderr)
		}
	}
}
