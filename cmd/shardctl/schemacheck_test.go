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
	t.Parallel()
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 2)
	cmd := initCluster(t, z, pg, "sch", 2, 2, func(i int) string {
		typ := []string{"timestamp", "timestamptz"}[i]
		return `CREATE SCHEMA app; CREATE TABLE app.events (bkey bigint NOT NULL, id bigint NOT NULL, at ` + typ + `, PRIMARY KEY (bkey, id))`
	})
	prepareTable(t, cmd, "app.events", 2)

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

// node check reports constraints that differ between nodes, with the
// kinds moves refuse: a foreign key and a CHECK only pg2 has, a unique
// index only pg1 has; a CHECK validated on one node only is reported as
// not blocking moves.
func TestIntegrationNodeCheckComparesConstraints(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 2)
	cmd := initCluster(t, z, pg, "con", 2, 2, func(int) string {
		return `CREATE SCHEMA app; CREATE TABLE app.parent (id bigint PRIMARY KEY);
			CREATE TABLE app.c (bkey bigint NOT NULL, id bigint NOT NULL, parent_id bigint, v int, PRIMARY KEY (bkey, id))`
	})
	prepareTable(t, cmd, "app.c", 2)
	ctx := context.Background()
	c1, c2 := pg.Nodes[0].Conn(t), pg.Nodes[1].Conn(t)
	if out := mustData(t, cmd("node", "check", "pg2")...); !strings.Contains(out, "node pg2: ok") {
		t.Fatalf("equal schemas, the fence's constraint on both: %s", out)
	}
	if _, err := c2.Exec(ctx, `ALTER TABLE app.c ADD CONSTRAINT c_parent_id_fkey FOREIGN KEY (parent_id) REFERENCES app.parent (id);
		ALTER TABLE app.c ADD CONSTRAINT small_v CHECK (v < 100); ALTER TABLE app.c ADD CONSTRAINT not_13 CHECK (v <> 13) NOT VALID`); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Exec(ctx, `CREATE UNIQUE INDEX c_v ON app.c (v); ALTER TABLE app.c ADD CONSTRAINT not_13 CHECK (v <> 13)`); err != nil {
		t.Fatal(err)
	}
	r := runData(t, cmd("node", "check", "pg2")...)
	for _, want := range []string{
		"node pg2: MISMATCH schema-foreign-key app.c: app.c: the foreign key c_parent_id_fkey is FOREIGN KEY (parent_id) REFERENCES app.parent(id) on pg2, missing on pg1\n",
		"node pg2: MISMATCH schema-constraint app.c: app.c: the constraint small_v is CHECK (v < 100) on pg2, missing on pg1\n",
		"node pg2: MISMATCH schema-unique-index app.c: app.c: the unique index c_v is missing on pg2, UNIQUE USING btree (v) on pg1\n",
		"node pg2: MISMATCH schema-constraint app.c: app.c: the constraint not_13 is CHECK (v <> 13) NOT VALID on pg2, CHECK (v <> 13) on pg1 (not blocking moves)\n",
	} {
		if r.code != 1 || !strings.Contains(r.stdout, want) {
			t.Errorf("node check pg2: exit %d, want 1 and %q:\n%s%s", r.code, want, r.stdout, r.stderr)
		}
	}
	r = runData(t, cmd("node", "check", "pg1", "--json")...)
	var out struct {
		Mismatches []struct{ Kind, Table, Message string } `json:"mismatches"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != 1 {
		t.Fatalf("node check pg1 --json: exit %d, %v:\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	kinds := map[string]int{}
	for _, m := range out.Mismatches {
		kinds[m.Kind]++
	}
	if len(out.Mismatches) != 4 || kinds["schema-foreign-key"] != 1 || kinds["schema-constraint"] != 2 || kinds["schema-unique-index"] != 1 {
		t.Fatalf("mismatches: %+v", out.Mismatches)
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
