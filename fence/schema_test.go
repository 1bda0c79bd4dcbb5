package fence

import (
	"strings"
	"testing"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
)

// Constraints are matched by definition, whatever their names; what is
// left is paired by name or is on one node only. Every difference in a
// definition blocks a move; a constraint validated on one node only does
// not (both enforce it on every new row).
func TestCompareSchemasConstraints(t *testing.T) {
	cols := []ColumnSchema{{Name: "bkey", Type: "bigint", NotNull: true}, {Name: "id", Type: "bigint", NotNull: true}, {Name: "v", Type: "integer"}}
	base := func() TableSchema {
		return TableSchema{Table: "app.t", Columns: cols, PrimaryKey: []string{"bkey", "id"}, KeyIndexes: []string{"(bkey, id)"}, ReplicaIdentity: "default"}
	}
	fk := ConstraintSchema{Name: "t_v_fkey", Def: "FOREIGN KEY (v) REFERENCES app.parent(id)", Columns: []string{"v"}, RefTable: "app.parent", RefColumns: []string{"id"}}
	a, b := base(), base()
	a.Constraints = []ConstraintSchema{
		{Name: "renamed_a", Def: "CHECK (v > 0)"},                        // same definition, other name on b: equal
		{Name: "small_v", Def: "CHECK (v < 100)"},                        // another definition on b
		{Name: "not_valid_here", Def: "CHECK (v <> 13)", NotValid: true}, // validated on b: not blocking
	}
	b.Constraints = []ConstraintSchema{
		{Name: "not_valid_here", Def: "CHECK (v <> 13)"},
		{Name: "renamed_b", Def: "CHECK (v > 0)"},
		{Name: "small_v", Def: "CHECK (v < 200)"},
		{Name: "only_b", Def: "EXCLUDE USING gist (v WITH =)"},
	}
	b.ForeignKeys = []ConstraintSchema{fk}
	a.UniqueIndexes = []ConstraintSchema{{Name: "t_v_key", Def: "UNIQUE USING btree (bkey, v)"}}

	diffs := CompareSchemas("source pg1", []TableSchema{a}, "target pg2", []TableSchema{b})
	got := map[string]SchemaDiff{}
	for _, d := range diffs {
		got[d.Message] = d
	}
	want := []struct {
		kind, msg string
		blocking  bool
	}{
		{KindSchemaConstraint, "app.t: the constraint small_v is CHECK (v < 100) on source pg1, CHECK (v < 200) on target pg2", true},
		{KindSchemaConstraint, "app.t: the constraint not_valid_here is CHECK (v <> 13) NOT VALID on source pg1, CHECK (v <> 13) on target pg2", false},
		{KindSchemaConstraint, "app.t: the constraint only_b is missing on source pg1, EXCLUDE USING gist (v WITH =) on target pg2", true},
		{KindSchemaForeignKey, "app.t: the foreign key t_v_fkey is missing on source pg1, FOREIGN KEY (v) REFERENCES app.parent(id) on target pg2", true},
		{KindSchemaUniqueIndex, "app.t: the unique index t_v_key is UNIQUE USING btree (bkey, v) on source pg1, missing on target pg2", true},
	}
	for _, w := range want {
		d, ok := got[w.msg]
		if !ok {
			t.Errorf("missing difference %q", w.msg)
			continue
		}
		if d.Kind != w.kind || d.Blocking != w.blocking || d.Table != "app.t" || d.Constraint == "" {
			t.Errorf("%q: %+v, want kind %s blocking %v", w.msg, d, w.kind, w.blocking)
		}
	}
	if len(diffs) != len(want) {
		t.Errorf("%d differences, want %d: %s", len(diffs), len(want), DescribeDiffs(diffs))
	}
	if len(Blocking(diffs)) != 4 {
		t.Errorf("blocking: %s", DescribeDiffs(Blocking(diffs)))
	}
	// The same the other way round: what each node has swaps sides.
	back := CompareSchemas("target pg2", []TableSchema{b}, "source pg1", []TableSchema{a})
	if len(back) != len(want) || len(Blocking(back)) != 4 {
		t.Errorf("reversed: %s", DescribeDiffs(back))
	}
	// Equal: nothing.
	if d := CompareSchemas("a", []TableSchema{a}, "b", []TableSchema{a}); len(d) != 0 {
		t.Errorf("a table against itself: %s", DescribeDiffs(d))
	}
}

// ReadSchemas reads CHECK, EXCLUDE and foreign key constraints and unique
// indexes (not the fence's constraint, not the primary key), with every
// name qualified whatever the session's search_path, and leaves that
// search_path as it was.
func TestIntegrationReadSchemasConstraints(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPGNodes(t, 2)
	ctx := ctxT(t)
	table := topo.TableRecord{Name: "app.c", KeyColumn: "bkey"}
	ddl := `CREATE SCHEMA app;
CREATE TABLE app.parent (id int PRIMARY KEY);
CREATE TABLE app.c (bkey bigint NOT NULL, id int NOT NULL, parent_id int, v int, u text, PRIMARY KEY (bkey, id))`
	a, b := pg.Nodes[0].Conn(t), pg.Nodes[1].Conn(t)
	exec(t, a, ddl)
	exec(t, b, ddl)
	// The same on both, spelt differently: other names, other storage
	// parameters, validated later.
	exec(t, a, `ALTER TABLE app.c ADD CONSTRAINT c_parent FOREIGN KEY (parent_id) REFERENCES app.parent (id) ON DELETE CASCADE;
		ALTER TABLE app.c ADD CONSTRAINT pos CHECK (v >= 0);
		CREATE UNIQUE INDEX c_u ON app.c (bkey, lower(u)) WITH (fillfactor = 70) WHERE u <> '';
		ALTER TABLE app.c ADD CONSTRAINT c_excl EXCLUDE USING btree (u WITH =) WHERE (v > 5)`)
	exec(t, b, `ALTER TABLE app.c ADD CONSTRAINT c_parent_id_fkey FOREIGN KEY (parent_id) REFERENCES app.parent (id) ON DELETE CASCADE;
		ALTER TABLE app.c ADD CONSTRAINT positive CHECK (v >= 0);
		CREATE UNIQUE INDEX c_lower_u ON app.c (bkey, lower(u)) WHERE u <> '';
		ALTER TABLE app.c ADD CONSTRAINT c_excl EXCLUDE USING btree (u WITH =) WHERE (v > 5)`)
	// The fence's constraint is the fence's business, not compared.
	if _, err := Install(ctx, a, "c1", "a", []topo.TableRecord{table}); err != nil {
		t.Fatal(err)
	}
	// a's session finds app first: it would print app.parent as "parent".
	exec(t, a, `SET search_path = app, public`)

	sa, err := ReadSchemas(ctx, a, []topo.TableRecord{table})
	if err != nil {
		t.Fatal(err)
	}
	var path string
	if err := a.QueryRow(ctx, `SHOW search_path`).Scan(&path); err != nil || path != "app, public" {
		t.Fatalf("search_path after ReadSchemas: %q, %v", path, err)
	}
	sb, err := ReadSchemas(ctx, b, []topo.TableRecord{table})
	if err != nil {
		t.Fatal(err)
	}
	if d := CompareSchemas("a", sa, "b", sb); len(d) != 0 {
		t.Fatalf("the same constraints compare different: %s\na: %+v\nb: %+v", DescribeDiffs(d), sa[0], sb[0])
	}
	ts := sa[0]
	if len(ts.ForeignKeys) != 1 || ts.ForeignKeys[0].RefTable != "app.parent" || ts.ForeignKeys[0].Def != "FOREIGN KEY (parent_id) REFERENCES app.parent(id) ON DELETE CASCADE" ||
		strings.Join(ts.ForeignKeys[0].Columns, ",") != "parent_id" || strings.Join(ts.ForeignKeys[0].RefColumns, ",") != "id" {
		t.Errorf("foreign keys: %+v", ts.ForeignKeys)
	}
	if len(ts.Constraints) != 2 {
		t.Errorf("constraints (the fence's must not be one): %+v", ts.Constraints)
	}
	if len(ts.UniqueIndexes) != 1 || ts.UniqueIndexes[0].Def != "UNIQUE USING btree (bkey, lower(u)) WHERE (u <> ''::text)" {
		t.Errorf("unique indexes (not the primary key's): %+v", ts.UniqueIndexes)
	}

	// Inside the caller's transaction: a savepoint, rolled back.
	tx, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ReadSchemas(ctx, tx, []topo.TableRecord{table}); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SHOW search_path`).Scan(&path); err != nil || path != "app, public" {
		t.Fatalf("search_path in the caller's transaction after ReadSchemas: %q, %v", path, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// Now they differ: a CHECK on b only, a unique index on a only, a
	// foreign key on b only, a check validated on a only.
	exec(t, b, `ALTER TABLE app.c ADD CONSTRAINT small_v CHECK (v < 100);
		ALTER TABLE app.c ADD CONSTRAINT c_v_fkey FOREIGN KEY (v) REFERENCES app.parent (id);
		ALTER TABLE app.c ADD CONSTRAINT not_13 CHECK (v <> 13) NOT VALID`)
	exec(t, a, `CREATE UNIQUE INDEX c_id ON app.c (id, v); ALTER TABLE app.c ADD CONSTRAINT not_13 CHECK (v <> 13)`)
	if sa, err = ReadSchemas(ctx, a, []topo.TableRecord{table}); err != nil {
		t.Fatal(err)
	}
	if sb, err = ReadSchemas(ctx, b, []topo.TableRecord{table}); err != nil {
		t.Fatal(err)
	}
	diffs := CompareSchemas("source a", sa, "target b", sb)
	for _, w := range []struct {
		kind, msg string
		blocking  bool
	}{
		{KindSchemaConstraint, "app.c: the constraint small_v is missing on source a, CHECK (v < 100) on target b", true},
		{KindSchemaConstraint, "app.c: the constraint not_13 is CHECK (v <> 13) on source a, CHECK (v <> 13) NOT VALID on target b", false},
		{KindSchemaForeignKey, "app.c: the foreign key c_v_fkey is missing on source a, FOREIGN KEY (v) REFERENCES app.parent(id) on target b", true},
		{KindSchemaUniqueIndex, "app.c: the unique index c_id is UNIQUE USING btree (id, v) on source a, missing on target b", true},
	} {
		found := false
		for _, d := range diffs {
			if d.Kind == w.kind && d.Message == w.msg {
				found = true
				if d.Blocking != w.blocking {
					t.Errorf("%q: blocking %v", w.msg, d.Blocking)
				}
			}
		}
		if !found {
			t.Errorf("no %s difference %q", w.kind, w.msg)
		}
	}
	if len(diffs) != 4 {
		t.Errorf("differences: %s", DescribeDiffs(diffs))
	}
}
