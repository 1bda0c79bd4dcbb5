package migrate

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
)

// A column that is timestamp on the source and timestamptz on the target:
// the move is refused, with the table, the column and both types, before
// any row is copied or the range is marked on the target (it used to copy,
// flip, and end failed at verification).
func TestIntegrationMoveRefusesSchemaDifference(t *testing.T) {
	f := newFixture(t, 2, 2)
	ctx := context.Background()
	if _, err := f.conn("pg1").Exec(ctx, `ALTER TABLE app.kv ADD COLUMN at timestamp DEFAULT '2024-05-01 12:00:00'`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.conn("pg2").Exec(ctx, `ALTER TABLE app.kv ADD COLUMN at timestamptz DEFAULT '2024-05-01 12:00:00'`); err != nil {
		t.Fatal(err)
	}
	seeded := f.seedRows("s", 60)
	if f.rowsIn("pg1", 2, 0) == 0 {
		t.Fatal("no rows in bucket 0")
	}
	rec, err := f.mover(Options{}).Move(ctx, 0, "pg2", false)
	if !errors.Is(err, ErrSchemaDiff) {
		t.Fatalf("move across a timestamp/timestamptz difference: %v (state %s, error %q)", err, rec.State, rec.Error)
	}
	for _, want := range []string{"app.kv: the type of column at is timestamp without time zone on source pg1, timestamp with time zone on target pg2", "nothing was copied"} {
		if !strings.Contains(rec.Error, want) {
			t.Errorf("the record's error %q lacks %q", rec.Error, want)
		}
	}
	if rec.State != topo.MoveAborted {
		t.Fatalf("state %s", rec.State)
	}
	for _, st := range rec.Steps {
		if st.State == topo.MoveCopy || st.State == topo.MoveFence {
			t.Fatalf("the move reached %s", st.State)
		}
	}
	if f.mapNow().Owner(0) != "pg1" || f.rowsIn("pg2", 2, 0) != 0 {
		t.Fatal("the refused move changed ownership or copied rows")
	}
	f.checkClean(seeded)
}

// An apply error on the target (here a CHECK constraint only the target
// has, which the source's rows break) is reported with the table, the
// row's primary key and PostgreSQL's error, not only "see the target's
// log".
func TestIntegrationApplyErrorNamesTableAndRow(t *testing.T) {
	f := newFixture(t, 2, 2)
	ctx := context.Background()
	seeded := f.seedRows("s", 40)
	lo, _, _ := keystream.Range(2, 0)
	if _, err := f.conn("pg1").Exec(ctx, `INSERT INTO app.kv (bkey, uid, v) VALUES ($1, 'too-big', 500)`, lo+7); err != nil {
		t.Fatal(err)
	}
	if _, err := f.conn("pg2").Exec(ctx, `ALTER TABLE app.kv ADD CONSTRAINT small_v CHECK (v < 100)`); err != nil {
		t.Fatal(err)
	}
	rec, err := f.mover(Options{}).Move(ctx, 0, "pg2", false)
	if err == nil || rec.State != topo.MoveAborted {
		t.Fatalf("move into a target that refuses a row: %v (state %s)", err, rec.State)
	}
	for _, want := range []string{"during the initial copy", "table app.kv, row (bkey, uid) = (" + strconv.FormatInt(lo+7, 10) + ", 'too-big')", `violates check constraint "small_v"`, "SQLSTATE 23514"} {
		if !strings.Contains(rec.Error, want) {
			t.Errorf("the record's error %q lacks %q", rec.Error, want)
		}
	}
	t.Logf("error: %s", rec.Error)
	if strings.Contains(rec.Error, "see the target's log") {
		t.Errorf("the error still sends the operator to the log: %q", rec.Error)
	}
	if _, err := f.conn("pg1").Exec(ctx, `DELETE FROM app.kv WHERE uid = 'too-big'`); err != nil {
		t.Fatal(err)
	}
	f.checkClean(seeded)
}
