package migrate

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
)

// A column that is timestamp on the source and timestamptz on the target:
// the move is refused, with the table, the column and both types, before
// any row is copied or the range is marked on the target (it used to copy,
// flip, and end failed at verification).
func TestIntegrationMoveRefusesSchemaDifference(t *testing.T) {
	f := parallelFixture(t, 2, 2)
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

// An apply error on the target is reported with the table, the row's
// primary key and PostgreSQL's error, not only "see the target's log".
// Here both nodes have the CHECK constraint small_v, but the source's was
// added NOT VALID after a row that breaks it: the schemas compare equal
// (validation is not a blocking difference: both check every new row),
// and the target refuses that row in the copy. (A CHECK the target alone
// has is refused before the copy now: TestIntegrationMoveRefusesConstraintDifferences.)
func TestIntegrationApplyErrorNamesTableAndRow(t *testing.T) {
	f := parallelFixture(t, 2, 2)
	ctx := context.Background()
	seeded := f.seedRows("s", 40)
	lo, _, _ := keystream.Range(2, 0)
	if _, err := f.conn("pg1").Exec(ctx, `INSERT INTO app.kv (bkey, uid, v) VALUES ($1, 'too-big', 500)`, lo+7); err != nil {
		t.Fatal(err)
	}
	rec := f.moveRefusedByCheck(ctx)
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
	f := parallelFixture(t, 2, 2)
	ctx := context.Background()
	seeded := f.seedRows("s", 20)
	lo, _, _ := keystream.Range(2, 0)
	if _, err := f.conn("pg1").Exec(ctx, `INSERT INTO app.kv (bkey, uid, v) SELECT $1::bigint + g, 'p-' || g, CASE WHEN g = 1100 THEN 500 ELSE 1 END FROM generate_series(1, 1200) g`, lo); err != nil {
		t.Fatal(err)
	}
	if n := f.rowsIn("pg1", 2, 0); n <= 2*reproducePageRows {
		t.Fatalf("%d rows in the range: the failing row must be past the first page", n)
	}
	rec := f.moveRefusedByCheck(ctx)
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
	t.Parallel()
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

var childTable = topo.TableRecord{Name: "app.c", KeyColumn: "bkey"}

// childDDL is a second sharded table whose rows reference a reference
// table that is not sharded (app.parent: the same rows wanted on every
// node, kept so by the application).
const childDDL = `CREATE TABLE app.parent (id bigint PRIMARY KEY);
CREATE TABLE app.c (bkey bigint NOT NULL, id bigint NOT NULL, parent_id bigint, PRIMARY KEY (bkey, id))`

// addTable creates another sharded table on every node (ddl), fences it
// and adds it to the cluster record.
func (f *fixture) addTable(tr topo.TableRecord, ddl string) {
	f.t.Helper()
	ctx := context.Background()
	m := f.mapNow()
	for _, n := range f.nodes {
		c := f.conn(n.ID)
		if _, err := c.Exec(ctx, ddl); err != nil {
			f.t.Fatal(err)
		}
		if _, err := fence.Install(ctx, c, "mv", n.ID, []topo.TableRecord{kvTable, tr}); err != nil {
			f.t.Fatal(err)
		}
		if _, err := fence.Sync(ctx, c, m, n.ID); err != nil {
			f.t.Fatal(err)
		}
	}
	if _, err := topo.AddTable(ctx, f.s, f.st.Paths(), tr); err != nil {
		f.t.Fatal(err)
	}
}

// count is the number of rows of a table in bucket b's range at level 2.
func (f *fixture) count(id bucketmap.NodeID, table string, b uint32) int64 {
	f.t.Helper()
	lo, hi, _ := keystream.Range(2, b)
	var n int64
	if err := f.conn(id).QueryRow(context.Background(), "SELECT count(*) FROM "+table+" WHERE bkey BETWEEN $1 AND $2", lo, hi).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// refusedBeforeCopy checks a move refused by a schema difference: aborted,
// never in copy, nothing copied, the source still the owner.
func (f *fixture) refusedBeforeCopy(rec *topo.MoveRecord, err error, want ...string) {
	f.t.Helper()
	if !errors.Is(err, ErrSchemaDiff) {
		f.t.Fatalf("move: %v (state %s, error %q), want %v", err, rec.State, rec.Error, ErrSchemaDiff)
	}
	for _, w := range append(want, "nothing was copied") {
		if !strings.Contains(rec.Error, w) {
			f.t.Errorf("the record's error %q lacks %q", rec.Error, w)
		}
	}
	if rec.State != topo.MoveAborted {
		f.t.Fatalf("state %s", rec.State)
	}
	for _, st := range rec.Steps {
		if st.State == topo.MoveCopy || st.State == topo.MoveFence {
			f.t.Fatalf("the move reached %s", st.State)
		}
	}
	if f.mapNow().Owner(0) != "pg1" || f.rowsIn("pg2", 2, 0) != 0 {
		f.t.Fatal("the refused move changed ownership or copied rows")
	}
}

// Issue 23: the target's app.c had a foreign key to its app.parent, which
// was empty, and the source had no such constraint. The subscription
// applies as a replica, which fires no foreign key trigger: the move
// copied 300 rows, verified them and left the target breaking its own
// constraint. Now the foreign key only the target has is a schema
// difference that refuses the move before any row is copied.
func TestIntegrationMoveRefusesTargetOnlyForeignKey(t *testing.T) {
	f := parallelFixture(t, 2, 2)
	ctx := context.Background()
	f.addTable(childTable, childDDL)
	if _, err := f.conn("pg2").Exec(ctx, `ALTER TABLE app.c ADD CONSTRAINT c_parent_id_fkey FOREIGN KEY (parent_id) REFERENCES app.parent (id)`); err != nil {
		t.Fatal(err)
	}
	lo, _, _ := keystream.Range(2, 0)
	if _, err := f.conn("pg1").Exec(ctx, `INSERT INTO app.c SELECT $1::bigint + g, g, g FROM generate_series(1, 300) g`, lo); err != nil {
		t.Fatal(err)
	}
	seeded := f.seedRows("s", 40)
	rec, err := f.mover(Options{}).Move(ctx, 0, "pg2", false)
	f.refusedBeforeCopy(rec, err, "app.c: the foreign key c_parent_id_fkey is missing on source pg1, FOREIGN KEY (parent_id) REFERENCES app.parent(id) on target pg2")
	if n := f.count("pg2", "app.c", 0); n != 0 {
		t.Fatalf("%d rows of app.c copied to the target", n)
	}
	f.checkClean(seeded)
}

// A CHECK constraint only the target has (the apply would refuse the
// rows breaking it, after copying the others) and a unique index only the
// source has (the target would accept, after the flip, rows the source
// refuses) refuse the move too, each named with what each node has.
func TestIntegrationMoveRefusesConstraintDifferences(t *testing.T) {
	f := parallelFixture(t, 2, 2)
	ctx := context.Background()
	if _, err := f.conn("pg2").Exec(ctx, `ALTER TABLE app.kv ADD CONSTRAINT small_v CHECK (v < 100)`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.conn("pg1").Exec(ctx, `CREATE UNIQUE INDEX kv_uid ON app.kv (uid)`); err != nil {
		t.Fatal(err)
	}
	seeded := f.seedRows("s", 40)
	rec, err := f.mover(Options{}).Move(ctx, 0, "pg2", false)
	f.refusedBeforeCopy(rec, err,
		"app.kv: the constraint small_v is missing on source pg1, CHECK (v < 100) on target pg2",
		"app.kv: the unique index kv_uid is UNIQUE USING btree (uid) on source pg1, missing on target pg2")
	f.checkClean(seeded)
}

// A foreign key both nodes have, to a reference table the target lacks
// rows of: the schemas are equal, the copy applies the rows without
// checking them, and checkForeignKeys finds them before the fence; the
// move aborts (before its flip) and the target's copy is removed.
func TestIntegrationMoveAbortsOnForeignKeyBrokenOnTarget(t *testing.T) {
	f := parallelFixture(t, 2, 2)
	ctx := context.Background()
	f.addTable(childTable, childDDL+`;
ALTER TABLE app.c ADD CONSTRAINT c_parent_id_fkey FOREIGN KEY (parent_id) REFERENCES app.parent (id)`)
	lo, _, _ := keystream.Range(2, 0)
	if _, err := f.conn("pg1").Exec(ctx, `INSERT INTO app.parent SELECT generate_series(1, 300)`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.conn("pg1").Exec(ctx, `INSERT INTO app.c SELECT $1::bigint + g, g, g FROM generate_series(1, 300) g`, lo); err != nil {
		t.Fatal(err)
	}
	// pg2's app.parent has the first 100 only.
	if _, err := f.conn("pg2").Exec(ctx, `INSERT INTO app.parent SELECT generate_series(1, 100)`); err != nil {
		t.Fatal(err)
	}
	seeded := f.seedRows("s", 40)
	rec, err := f.mover(Options{}).Move(ctx, 0, "pg2", false)
	if !errors.Is(err, ErrForeignKey) || rec.State != topo.MoveAborted {
		t.Fatalf("move: %v (state %s, error %q)", err, rec.State, rec.Error)
	}
	want := "target pg2: rows copied to the target break a foreign key there: table app.c, foreign key c_parent_id_fkey (FOREIGN KEY (parent_id) REFERENCES app.parent(id)): row (bkey, id) = (" +
		strconv.FormatInt(lo+101, 10) + ", 101) references app.parent (id) = (101), which the target does not have; 200 rows of the range break it"
	if !strings.Contains(rec.Error, want) {
		t.Fatalf("the record's error %q lacks %q", rec.Error, want)
	}
	for _, st := range rec.Steps {
		if st.State == topo.MoveFence || st.State == topo.MoveFlip {
			t.Fatalf("the move reached %s", st.State)
		}
	}
	if f.mapNow().Owner(0) != "pg1" || f.count("pg2", "app.c", 0) != 0 || f.rowsIn("pg2", 2, 0) != 0 {
		t.Fatal("the aborted move changed ownership or left rows on the target")
	}
	f.checkClean(seeded)
}

// checkForeignKeys on a real target: rows applied as a replica (as the
// subscription does: no foreign key trigger) that reference rows the
// target's reference table lacks are found, by table, constraint and a
// row; rows outside the range and rows a NULL exempts are not; MATCH FULL
// is honoured.
func TestIntegrationCheckForeignKeys(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPGNodes(t, 1)
	ctx := context.Background()
	dst := pg.Nodes[0].Conn(t)
	if _, err := dst.Exec(ctx, `CREATE SCHEMA app;
CREATE TABLE app.parent (id bigint PRIMARY KEY);
CREATE TABLE app.pair (a int, b int, PRIMARY KEY (a, b));
CREATE TABLE app.c (bkey bigint NOT NULL, id bigint NOT NULL, parent_id bigint REFERENCES app.parent (id), a int, b int,
	PRIMARY KEY (bkey, id), FOREIGN KEY (a, b) REFERENCES app.pair (a, b) MATCH FULL)`); err != nil {
		t.Fatal(err)
	}
	tables := []topo.TableRecord{kvTable, childTable}
	if _, err := dst.Exec(ctx, kvDDL); err != nil {
		t.Fatal(err)
	}
	lo, hi, _ := keystream.Range(2, 1)
	// Rows written as the subscription writes them: as a replica.
	replica := func(sql string, args ...any) {
		t.Helper()
		tx, err := dst.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "SET LOCAL session_replication_role = replica"); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	replica(`INSERT INTO app.c (bkey, id, parent_id) SELECT $1::bigint + g, g, g FROM generate_series(1, 300) g`, lo)
	replica(`INSERT INTO app.c (bkey, id, parent_id) VALUES ($1::bigint + 1000, 1000, NULL)`, lo) // exempt: NULL
	replica(`INSERT INTO app.c (bkey, id, parent_id) VALUES ($1::bigint, 1, 999), ($2::bigint, 1, 999)`, lo-1, hi+1)
	if _, err := dst.Exec(ctx, `INSERT INTO app.parent SELECT generate_series(1, 250)`); err != nil {
		t.Fatal(err)
	}

	err := checkForeignKeys(ctx, dst, tables, lo, hi)
	want := "table app.c, foreign key c_parent_id_fkey (FOREIGN KEY (parent_id) REFERENCES app.parent(id)): row (bkey, id) = (" +
		strconv.FormatInt(lo+251, 10) + ", 251) references app.parent (id) = (251), which the target does not have; 50 rows of the range break it"
	if !errors.Is(err, ErrForeignKey) || !strings.Contains(err.Error(), want) {
		t.Fatalf("checkForeignKeys: %v, want %q", err, want)
	}
	// The reference table complete: nothing (the rows outside the range
	// that break it are another bucket's business).
	if _, err := dst.Exec(ctx, `INSERT INTO app.parent SELECT generate_series(251, 300)`); err != nil {
		t.Fatal(err)
	}
	if err := checkForeignKeys(ctx, dst, tables, lo, hi); err != nil {
		t.Fatalf("checkForeignKeys with every referenced row there: %v", err)
	}
	// MATCH FULL: a row with a and no b breaks it; one with neither does
	// not (the 301 rows above).
	replica(`INSERT INTO app.c (bkey, id, a, b) VALUES ($1::bigint + 2000, 2000, 1, NULL)`, lo)
	err = checkForeignKeys(ctx, dst, tables, lo, hi)
	want = "table app.c, foreign key c_a_b_fkey (FOREIGN KEY (a, b) REFERENCES app.pair(a, b) MATCH FULL): row (bkey, id) = (" +
		strconv.FormatInt(lo+2000, 10) + ", 2000) references app.pair (a, b) = (1, NULL), which the target does not have; 1 row of the range breaks it"
	if !errors.Is(err, ErrForeignKey) || !strings.Contains(err.Error(), want) {
		t.Fatalf("checkForeignKeys, MATCH FULL: %v, want %q", err, want)
	}
}

// moveRefusedByCheck gives both nodes the CHECK constraint small_v (v <
// 100), the source's added NOT VALID after rows that break it, and moves
// bucket 0 to pg2, which refuses such a row in the copy: the move aborts.
func (f *fixture) moveRefusedByCheck(ctx context.Context) *topo.MoveRecord {
	f.t.Helper()
	if _, err := f.conn("pg1").Exec(ctx, `ALTER TABLE app.kv ADD CONSTRAINT small_v CHECK (v < 100) NOT VALID`); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.conn("pg2").Exec(ctx, `ALTER TABLE app.kv ADD CONSTRAINT small_v CHECK (v < 100)`); err != nil {
		f.t.Fatal(err)
	}
	rec, err := f.mover(Options{}).Move(ctx, 0, "pg2", false)
	if err == nil || rec.State != topo.MoveAborted {
		f.t.Fatalf("move into a target that refuses a row: %v (state %s)", err, rec.State)
	}
	return rec
}
