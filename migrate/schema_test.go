package migrate

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/internal/testenv"
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

// The apply error's diagnostic pages through the range 500 rows at a time
// in primary key order; past the first page its query was wrong ("subquery
// has too few columns") and the move's error said the failing row could
// not be found. Here the range has 1,200 rows and the row the target
// refuses is on the third page.
func TestIntegrationApplyErrorPastTheFirstPage(t *testing.T) {
	f := newFixture(t, 2, 2)
	ctx := context.Background()
	seeded := f.seedRows("s", 20)
	lo, _, _ := keystream.Range(2, 0)
	if _, err := f.conn("pg1").Exec(ctx, `INSERT INTO app.kv (bkey, uid, v) SELECT $1::bigint + g, 'p-' || g, CASE WHEN g = 1100 THEN 500 ELSE 1 END FROM generate_series(1, 1200) g`, lo); err != nil {
		t.Fatal(err)
	}
	if n := f.rowsIn("pg1", 2, 0); n <= 2*reproducePageRows {
		t.Fatalf("%d rows in the range: the failing row must be past the first page", n)
	}
	if _, err := f.conn("pg1").Exec(ctx, `ALTER TABLE app.kv ADD CONSTRAINT small_v CHECK (v < 100) NOT VALID`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.conn("pg2").Exec(ctx, `ALTER TABLE app.kv ADD CONSTRAINT small_v CHECK (v < 100)`); err != nil {
		t.Fatal(err)
	}
	rec, err := f.mover(Options{}).Move(ctx, 0, "pg2", false)
	if err == nil || rec.State != topo.MoveAborted {
		t.Fatalf("move into a target that refuses a row: %v (state %s)", err, rec.State)
	}
	want := "table app.kv, row (bkey, uid) = (" + strconv.FormatInt(lo+1100, 10) + ", 'p-1100'): ERROR: new row for relation \"kv\" violates check constraint \"small_v\" (SQLSTATE 23514)"
	if !strings.Contains(rec.Error, want) || strings.Contains(rec.Error, "could not be found") {
		t.Fatalf("the record's error %q lacks %q", rec.Error, want)
	}
	if _, err := f.conn("pg1").Exec(ctx, `DELETE FROM app.kv WHERE uid LIKE 'p-%'`); err != nil {
		t.Fatal(err)
	}
	f.checkClean(seeded)
}

// reproduceApply pages through tables whose primary key has one column
// too (a row constructor of one column, ROW(k), against the next page's
// start) and several, and finds a row past the first page in each.
func TestIntegrationReproduceApplyPages(t *testing.T) {
	pg := testenv.StartPGNodes(t, 2)
	ctx := context.Background()
	src, dst := pg.Nodes[0].Conn(t), pg.Nodes[1].Conn(t)
	lo, hi, _ := keystream.Range(2, 1)
	ddl := `CREATE SCHEMA app;
CREATE TABLE app.one (bkey bigint PRIMARY KEY, v int NOT NULL);
CREATE TABLE app.two (bkey bigint NOT NULL, name text NOT NULL, v int NOT NULL, PRIMARY KEY (name, bkey))`
	for _, c := range []*pgx.Conn{src, dst} {
		if _, err := c.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	one := topo.TableRecord{Name: "app.one", KeyColumn: "bkey"}
	two := topo.TableRecord{Name: "app.two", KeyColumn: "bkey"}
	for _, q := range []string{
		`INSERT INTO app.one SELECT $1::bigint + g, CASE WHEN g = 777 THEN 500 ELSE 1 END FROM generate_series(1, 1100) g`,
		`INSERT INTO app.two SELECT $1::bigint + g % 7, 'n' || lpad(g::text, 5, '0'), CASE WHEN g = 1050 THEN 500 ELSE 1 END FROM generate_series(1, 1100) g`,
		`INSERT INTO app.one VALUES ($1::bigint - 1, 500)`, // another bucket's
	} {
		if _, err := src.Exec(ctx, q, lo); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := dst.Exec(ctx, `ALTER TABLE app.one ADD CONSTRAINT one_small CHECK (v < 100)`); err != nil {
		t.Fatal(err)
	}
	got, err := reproduceApply(ctx, src, dst, []topo.TableRecord{one, two}, lo, hi)
	if err != nil {
		t.Fatal(err)
	}
	if want := "table app.one, row (bkey) = (" + strconv.FormatInt(lo+777, 10) + "): ERROR: new row for relation \"one\" violates check constraint \"one_small\""; !strings.HasPrefix(got, want) {
		t.Fatalf("one-column key: %q, want %q", got, want)
	}
	if _, err := dst.Exec(ctx, `ALTER TABLE app.one DROP CONSTRAINT one_small; ALTER TABLE app.two ADD CONSTRAINT two_small CHECK (v < 100)`); err != nil {
		t.Fatal(err)
	}
	got, err = reproduceApply(ctx, src, dst, []topo.TableRecord{one, two}, lo, hi)
	if err != nil {
		t.Fatal(err)
	}
	if want := "table app.two, row (name, bkey) = ('n01050', " + strconv.FormatInt(lo+1050%7, 10) + "): ERROR: new row for relation \"two\" violates check constraint \"two_small\""; !strings.HasPrefix(got, want) {
		t.Fatalf("two-column key: %q, want %q", got, want)
	}
	// Nothing applied stays: the diagnostic rolls back.
	var n int64
	if err := dst.QueryRow(ctx, `SELECT (SELECT count(*) FROM app.one) + (SELECT count(*) FROM app.two)`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows left on the target (%v)", n, err)
	}
}
