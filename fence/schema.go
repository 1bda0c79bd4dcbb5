package fence

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/topo"
)

// The sharded tables' schemas compared between two db nodes. The contract
// checks (CheckTables) look at one node; a move also needs the source and
// the target to agree, column by column: logical replication sends each
// value in the source column's binary format and the target reads it in
// its own column's, so a timestamp column on one node and a timestamptz
// column on the other copies without an error and shifts every value.

// ColumnSchema is one column of a sharded table as a node has it.
type ColumnSchema struct {
	Name string `json:"name"`
	// Type is format_type(atttypid, atttypmod): with the type modifier,
	// e.g. "numeric(10,2)", "character varying(20)".
	Type      string `json:"type"`
	NotNull   bool   `json:"not_null"`
	Default   string `json:"default,omitempty"` // pg_get_expr of the default, "" if none
	Collation string `json:"collation,omitempty"`
	Generated string `json:"generated,omitempty"` // "s" for a stored generated column
	Identity  string `json:"identity,omitempty"`  // "a" (ALWAYS) or "d" (BY DEFAULT)
}

// TableSchema is what a node has of one sharded table; Missing if it has
// no such table.
type TableSchema struct {
	Table   string         `json:"table"`
	Missing bool           `json:"missing,omitempty"`
	Columns []ColumnSchema `json:"columns,omitempty"`
	// PrimaryKey lists the primary key's columns in order (none: empty).
	PrimaryKey []string `json:"primary_key,omitempty"`
	// KeyIndexes lists the valid, non-partial B-tree indexes that lead
	// with the bucket key, each as its column list, sorted.
	KeyIndexes []string `json:"key_indexes,omitempty"`
	// ReplicaIdentity is "default", "full", "nothing" or "index (a, b)".
	ReplicaIdentity string `json:"replica_identity"`
	// Constraints lists the table's CHECK and EXCLUDE constraints (the
	// fence's own, ConstraintName, excepted), ForeignKeys its foreign
	// keys, and UniqueIndexes its unique indexes other than the primary
	// key's (those of UNIQUE constraints included), each sorted by name.
	Constraints   []ConstraintSchema `json:"constraints,omitempty"`
	ForeignKeys   []ConstraintSchema `json:"foreign_keys,omitempty"`
	UniqueIndexes []ConstraintSchema `json:"unique_indexes,omitempty"`
}

// ConstraintSchema is one constraint or unique index of a sharded table.
// Def is its definition as the node prints it with every name qualified
// (read with search_path = pg_catalog, so two nodes whose sessions have
// different search paths print the same text): pg_get_constraintdef for a
// constraint, without NOT VALID; for a unique index, pg_get_indexdef from
// USING on (without the index's and the table's names and without storage
// parameters), e.g. "UNIQUE USING btree (bkey, lower(email)) WHERE
// (deleted IS NULL)", with " DEFERRABLE" for a deferrable one. Two nodes'
// constraints are the same when their Def is: names may differ.
type ConstraintSchema struct {
	Name string `json:"name"`
	Def  string `json:"def"`
	// NotValid: a constraint added NOT VALID and not validated since, or
	// a unique index not valid (a failed CREATE INDEX CONCURRENTLY). Both
	// still hold for every new row.
	NotValid bool `json:"not_valid,omitempty"`
	// A foreign key's columns, the table it references (quoted and
	// schema-qualified, as regclass prints it with search_path =
	// pg_catalog), that table's columns, and MATCH FULL.
	Columns    []string `json:"columns,omitempty"`
	RefTable   string   `json:"ref_table,omitempty"`
	RefColumns []string `json:"ref_columns,omitempty"`
	MatchFull  bool     `json:"match_full,omitempty"`
}

// SchemaDiff is one way two nodes' sharded tables differ. Nodes names the
// two sides as the caller labelled them, Values what each side has.
// Blocking differences break a move's copy (or what the target would do
// with the rows after the flip); the others (a column default, the column
// order: replication matches columns by name) are reported but do not stop
// a move.
type SchemaDiff struct {
	Kind       string    `json:"kind"`
	Table      string    `json:"table"`
	Column     string    `json:"column,omitempty"`
	Constraint string    `json:"constraint,omitempty"` // the constraint's or unique index's name
	Nodes      [2]string `json:"nodes"`
	Values     [2]string `json:"values"`
	Blocking   bool      `json:"blocking"`
	Message    string    `json:"message"`
}

// SchemaDiff kinds.
const (
	KindSchemaTable           = "schema-table"            // the table is on one node only
	KindSchemaColumnMissing   = "schema-column-missing"   // a column is on one node only
	KindSchemaColumnType      = "schema-column-type"      // type or type modifier
	KindSchemaColumnNullable  = "schema-column-nullable"  // NOT NULL on one node only
	KindSchemaColumnCollation = "schema-column-collation" // collation
	KindSchemaColumnGenerated = "schema-column-generated" // generated or identity
	KindSchemaColumnDefault   = "schema-column-default"   // not blocking
	KindSchemaColumnOrder     = "schema-column-order"     // not blocking
	KindSchemaPrimaryKey      = "schema-primary-key"
	KindSchemaKeyIndex        = "schema-key-index"
	KindSchemaReplicaIdentity = "schema-replica-identity"
	KindSchemaConstraint      = "schema-constraint"   // a CHECK or EXCLUDE constraint
	KindSchemaForeignKey      = "schema-foreign-key"  // a foreign key
	KindSchemaUniqueIndex     = "schema-unique-index" // a unique index, or UNIQUE constraint
)

// ReadSchemas reads the sharded tables' schemas on a node, in the order of
// tables. It changes nothing. On a *pgx.Conn or a pgx.Tx it reads with
// search_path = pg_catalog, pg_temp (in a read-only transaction it rolls
// back, or a savepoint inside the caller's, so the caller's search_path is
// unchanged afterwards): every name in a type, a default or a constraint
// is then printed schema-qualified, the same on every node.
func ReadSchemas(ctx context.Context, q Querier, tables []topo.TableRecord) ([]TableSchema, error) {
	out := make([]TableSchema, 0, len(tables))
	err := withCatalogSearchPath(ctx, q, func(q Querier) error {
		for _, t := range tables {
			ts, err := readSchema(ctx, q, t)
			if err != nil {
				return fmt.Errorf("reading the schema of %s: %w", t.Name, err)
			}
			out = append(out, ts)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// withCatalogSearchPath runs fn with search_path = pg_catalog, pg_temp: in
// a read-only transaction rolled back afterwards on an idle connection, in
// a savepoint rolled back afterwards inside a transaction (SET LOCAL is
// undone with it). Any other Querier runs fn as it is.
func withCatalogSearchPath(ctx context.Context, q Querier, fn func(Querier) error) error {
	const setPath = `SET LOCAL search_path = pg_catalog, pg_temp`
	var tx pgx.Tx
	var err error
	switch c := q.(type) {
	case pgx.Tx:
		tx, err = c.Begin(ctx) // a savepoint
	case *pgx.Conn:
		if c.PgConn().TxStatus() == 'I' {
			tx, err = c.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
			break
		}
		// A transaction begun with SQL, which pgx does not know of.
		if _, err := c.Exec(ctx, `SAVEPOINT shardvisor_read_schema`); err != nil {
			return err
		}
		defer c.Exec(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT shardvisor_read_schema; RELEASE SAVEPOINT shardvisor_read_schema`) //nolint:errcheck
		if _, err := c.Exec(ctx, setPath); err != nil {
			return err
		}
		return fn(c)
	default:
		return fn(q)
	}
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	if _, err := tx.Exec(ctx, setPath); err != nil {
		return err
	}
	return fn(tx)
}

func readSchema(ctx context.Context, q Querier, t topo.TableRecord) (TableSchema, error) {
	ts := TableSchema{Table: t.Name}
	var rel *uint32
	if err := q.QueryRow(ctx, `SELECT to_regclass($1)::oid`, qualified(t)).Scan(&rel); err != nil {
		return ts, err
	}
	if rel == nil {
		ts.Missing = true
		return ts, nil
	}
	rows, err := q.Query(ctx, `SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull,
		coalesce(pg_get_expr(d.adbin, d.adrelid), ''),
		CASE WHEN a.attcollation = 0 OR a.attcollation = ty.typcollation THEN '' ELSE co.collname::text END,
		a.attgenerated::text, a.attidentity::text
	FROM pg_attribute a
	JOIN pg_type ty ON ty.oid = a.atttypid
	LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
	LEFT JOIN pg_collation co ON co.oid = a.attcollation
	WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, *rel)
	if err != nil {
		return ts, err
	}
	ts.Columns, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ColumnSchema, error) {
		var c ColumnSchema
		return c, r.Scan(&c.Name, &c.Type, &c.NotNull, &c.Default, &c.Collation, &c.Generated, &c.Identity)
	})
	if err != nil {
		return ts, err
	}
	if err := q.QueryRow(ctx, `SELECT coalesce((SELECT array_agg(a.attname::text ORDER BY k.ord)
		FROM pg_constraint c CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY k(n, ord)
		JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n
		WHERE c.conrelid = $1 AND c.contype = 'p'), '{}')`, *rel).Scan(&ts.PrimaryKey); err != nil {
		return ts, err
	}
	rows, err = q.Query(ctx, `SELECT '(' || (SELECT string_agg(pg_get_indexdef(i.indexrelid, k, true), ', ' ORDER BY k)
			FROM generate_series(1, i.indnkeyatts) k) || ')'
		FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_am am ON am.oid = ic.relam
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = $1 AND a.attname = $2 AND i.indisvalid AND i.indisready AND i.indpred IS NULL AND am.amname = 'btree'
		ORDER BY 1`, *rel, t.KeyColumn)
	if err != nil {
		return ts, err
	}
	if ts.KeyIndexes, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return ts, err
	}
	ts.KeyIndexes = slices.Compact(ts.KeyIndexes)
	err = q.QueryRow(ctx, `SELECT CASE c.relreplident WHEN 'd' THEN 'default' WHEN 'f' THEN 'full' WHEN 'n' THEN 'nothing'
		ELSE 'index (' || coalesce((SELECT string_agg(pg_get_indexdef(i.indexrelid, k, true), ', ' ORDER BY k)
			FROM pg_index i CROSS JOIN generate_series(1, i.indnkeyatts) k
			WHERE i.indrelid = c.oid AND i.indisreplident), '?') || ')' END
		FROM pg_class c WHERE c.oid = $1`, *rel).Scan(&ts.ReplicaIdentity)
	if err != nil {
		return ts, err
	}
	return ts, readConstraints(ctx, q, *rel, &ts)
}

// readConstraints reads a table's CHECK, EXCLUDE and foreign key
// constraints (top-level ones: not the clones PostgreSQL adds for a
// foreign key to a partitioned table) and its unique indexes but the
// primary key's, for CompareSchemas. Names are printed qualified when the
// caller pinned search_path (ReadSchemas does).
func readConstraints(ctx context.Context, q Querier, rel uint32, ts *TableSchema) error {
	rows, err := q.Query(ctx, `SELECT c.conname::text, c.contype::text, pg_get_constraintdef(c.oid, true), NOT c.convalidated,
		coalesce((SELECT array_agg(a.attname::text ORDER BY k.ord) FROM unnest(c.conkey) WITH ORDINALITY k(n, ord)
			JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n), '{}'),
		CASE WHEN c.contype = 'f' THEN c.confrelid::regclass::text ELSE '' END,
		coalesce((SELECT array_agg(a.attname::text ORDER BY k.ord) FROM unnest(c.confkey) WITH ORDINALITY k(n, ord)
			JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n), '{}'),
		c.confmatchtype = 'f'
	FROM pg_constraint c
	WHERE c.conrelid = $1 AND c.contype IN ('c', 'f', 'x') AND c.conparentid = 0 AND c.conname <> $2
	ORDER BY c.conname`, rel, ConstraintName)
	if err != nil {
		return err
	}
	type conRow struct {
		kind string
		c    ConstraintSchema
	}
	cons, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (conRow, error) {
		var x conRow
		err := r.Scan(&x.c.Name, &x.kind, &x.c.Def, &x.c.NotValid, &x.c.Columns, &x.c.RefTable, &x.c.RefColumns, &x.c.MatchFull)
		x.c.Def = strings.TrimSuffix(x.c.Def, " NOT VALID")
		return x, err
	})
	if err != nil {
		return err
	}
	for _, x := range cons {
		if x.kind == "f" {
			ts.ForeignKeys = append(ts.ForeignKeys, x.c)
			continue
		}
		x.c.Columns, x.c.RefColumns, x.c.MatchFull = nil, nil, false
		ts.Constraints = append(ts.Constraints, x.c)
	}
	rows, err = q.Query(ctx, `SELECT ic.relname::text, pg_get_indexdef(i.indexrelid), am.amname::text, NOT i.indisvalid, NOT i.indimmediate
	FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_am am ON am.oid = ic.relam
	WHERE i.indrelid = $1 AND i.indisunique AND NOT i.indisprimary AND i.indisready
	ORDER BY 1`, rel)
	if err != nil {
		return err
	}
	ts.UniqueIndexes, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ConstraintSchema, error) {
		var c ConstraintSchema
		var am string
		var deferrable bool
		if err := r.Scan(&c.Name, &c.Def, &am, &c.NotValid, &deferrable); err != nil {
			return c, err
		}
		c.Def = uniqueIndexDef(c.Def, am)
		if deferrable {
			c.Def += " DEFERRABLE"
		}
		return c, nil
	})
	return err
}

// storageParams matches the WITH (...) of an index definition.
var storageParams = regexp.MustCompile(` WITH \((?:[^()']|'(?:[^']|'')*')*\)`)

// uniqueIndexDef turns "CREATE UNIQUE INDEX name ON schema.table USING
// btree (a, b) INCLUDE (c) WITH (fillfactor='70') WHERE (p)" into "UNIQUE
// USING btree (a, b) INCLUDE (c) WHERE (p)": what makes rows unique, not
// what the index is called or how it is stored.
func uniqueIndexDef(def, am string) string {
	i := strings.Index(def, " USING "+am+" (")
	if i < 0 {
		return def
	}
	def = def[i+1:]
	where := ""
	if j := strings.Index(def, " WHERE "); j >= 0 {
		def, where = def[:j], def[j:]
	}
	return "UNIQUE " + storageParams.ReplaceAllString(def, "") + where
}

// CompareSchemas lists every difference between the schemas a and b of
// the same sharded tables (as ReadSchemas reads them, in the same order)
// on two nodes, labelled nameA and nameB in the messages (e.g. "source
// pg1", "target pg2"). No differences: nil.
func CompareSchemas(nameA string, a []TableSchema, nameB string, b []TableSchema) []SchemaDiff {
	var out []SchemaDiff
	nodes := [2]string{nameA, nameB}
	add := func(kind, table, column string, blocking bool, va, vb, what string) {
		msg := fmt.Sprintf("%s: %s is %s on %s, %s on %s", table, what, va, nameA, vb, nameB)
		out = append(out, SchemaDiff{Kind: kind, Table: table, Column: column, Nodes: nodes, Values: [2]string{va, vb}, Blocking: blocking, Message: msg})
	}
	addConstraint := func(kind, table string, d constraintDiff, what string) {
		name := ""
		switch {
		case d.a != nil && d.b != nil && d.a.Name != d.b.Name:
			name = d.a.Name + " (" + d.b.Name + " on " + nameB + ")"
		case d.a != nil:
			name = d.a.Name
		default:
			name = d.b.Name
		}
		blocking := d.a == nil || d.b == nil || d.a.Def != d.b.Def
		va, vb := constraintText(d.a), constraintText(d.b)
		msg := fmt.Sprintf("%s: %s %s is %s on %s, %s on %s", table, what, name, va, nameA, vb, nameB)
		c := name
		if d.a != nil {
			c = d.a.Name
		}
		out = append(out, SchemaDiff{Kind: kind, Table: table, Constraint: c, Nodes: nodes, Values: [2]string{va, vb}, Blocking: blocking, Message: msg})
	}
	bt := map[string]TableSchema{}
	for _, t := range b {
		bt[t.Table] = t
	}
	for _, ta := range a {
		tb, ok := bt[ta.Table]
		if !ok {
			tb = TableSchema{Table: ta.Table, Missing: true}
		}
		if ta.Missing || tb.Missing {
			if ta.Missing != tb.Missing {
				add(KindSchemaTable, ta.Table, "", true, present(!ta.Missing), present(!tb.Missing), "the table")
			}
			continue
		}
		ca, cb := columnMap(ta.Columns), columnMap(tb.Columns)
		for _, x := range ta.Columns {
			y, ok := cb[x.Name]
			if !ok {
				add(KindSchemaColumnMissing, ta.Table, x.Name, true, x.Type, "missing", "column "+x.Name)
				continue
			}
			col := "column " + x.Name
			if x.Type != y.Type {
				add(KindSchemaColumnType, ta.Table, x.Name, true, x.Type, y.Type, "the type of "+col)
			}
			if x.NotNull != y.NotNull {
				add(KindSchemaColumnNullable, ta.Table, x.Name, true, nullability(x.NotNull), nullability(y.NotNull), col)
			}
			if x.Collation != y.Collation {
				add(KindSchemaColumnCollation, ta.Table, x.Name, true, orDefault(x.Collation), orDefault(y.Collation), "the collation of "+col)
			}
			if gx, gy := generated(x), generated(y); gx != gy {
				add(KindSchemaColumnGenerated, ta.Table, x.Name, true, gx, gy, col)
			}
			if x.Default != y.Default && x.Generated == "" && y.Generated == "" {
				add(KindSchemaColumnDefault, ta.Table, x.Name, false, orNone(x.Default), orNone(y.Default), "the default of "+col)
			}
		}
		for _, y := range tb.Columns {
			if _, ok := ca[y.Name]; !ok {
				add(KindSchemaColumnMissing, ta.Table, y.Name, true, "missing", y.Type, "column "+y.Name)
			}
		}
		if na, nb := commonOrder(ta.Columns, cb), commonOrder(tb.Columns, ca); !slices.Equal(na, nb) {
			add(KindSchemaColumnOrder, ta.Table, "", false, "("+strings.Join(na, ", ")+")", "("+strings.Join(nb, ", ")+")", "the column order")
		}
		if !slices.Equal(ta.PrimaryKey, tb.PrimaryKey) {
			add(KindSchemaPrimaryKey, ta.Table, "", true, keyList(ta.PrimaryKey), keyList(tb.PrimaryKey), "the primary key")
		}
		if !slices.Equal(ta.KeyIndexes, tb.KeyIndexes) {
			// Only a node without any index on the key breaks moves and
			// GC; other differences are reported, not blocking.
			blocking := len(ta.KeyIndexes) == 0 || len(tb.KeyIndexes) == 0
			add(KindSchemaKeyIndex, ta.Table, "", blocking, indexList(ta.KeyIndexes), indexList(tb.KeyIndexes), "the B-tree index on the bucket key")
		}
		if ta.ReplicaIdentity != tb.ReplicaIdentity {
			add(KindSchemaReplicaIdentity, ta.Table, "", true, ta.ReplicaIdentity, tb.ReplicaIdentity, "the replica identity")
		}
		for _, d := range compareConstraints(ta.Constraints, tb.Constraints) {
			addConstraint(KindSchemaConstraint, ta.Table, d, "the constraint")
		}
		for _, d := range compareConstraints(ta.ForeignKeys, tb.ForeignKeys) {
			addConstraint(KindSchemaForeignKey, ta.Table, d, "the foreign key")
		}
		for _, d := range compareConstraints(ta.UniqueIndexes, tb.UniqueIndexes) {
			addConstraint(KindSchemaUniqueIndex, ta.Table, d, "the unique index")
		}
	}
	return out
}

// constraintDiff is one constraint that differs between two nodes: on one
// only (the other is nil), with the same name and another definition, or
// the same definition, validated on one node only (not blocking: both
// enforce it on every new row).
type constraintDiff struct {
	a, b *ConstraintSchema
}

// compareConstraints matches two nodes' constraints of one kind by
// definition (names may differ), then pairs what is left by name.
func compareConstraints(a, b []ConstraintSchema) []constraintDiff {
	var out []constraintDiff
	usedB := make([]bool, len(b))
	var restA []int
	for i := range a {
		j := -1
		for k := range b {
			if !usedB[k] && b[k].Def == a[i].Def && (j < 0 || b[k].Name == a[i].Name) {
				j = k
			}
		}
		if j < 0 {
			restA = append(restA, i)
			continue
		}
		usedB[j] = true
		if a[i].NotValid != b[j].NotValid {
			out = append(out, constraintDiff{&a[i], &b[j]})
		}
	}
	for _, i := range restA {
		j := slices.IndexFunc(b, func(y ConstraintSchema) bool { return y.Name == a[i].Name })
		if j >= 0 && !usedB[j] {
			usedB[j] = true
			out = append(out, constraintDiff{&a[i], &b[j]})
			continue
		}
		out = append(out, constraintDiff{&a[i], nil})
	}
	for j := range b {
		if !usedB[j] {
			out = append(out, constraintDiff{nil, &b[j]})
		}
	}
	return out
}

// constraintText is what a node has of a constraint, for a message.
func constraintText(c *ConstraintSchema) string {
	switch {
	case c == nil:
		return "missing"
	case c.NotValid:
		return c.Def + " NOT VALID"
	}
	return c.Def
}

// Blocking returns the differences that must stop a move.
func Blocking(diffs []SchemaDiff) []SchemaDiff {
	var out []SchemaDiff
	for _, d := range diffs {
		if d.Blocking {
			out = append(out, d)
		}
	}
	return out
}

// DescribeDiffs joins the differences' messages for an error.
func DescribeDiffs(diffs []SchemaDiff) string {
	parts := make([]string, len(diffs))
	for i, d := range diffs {
		parts[i] = d.Message
	}
	return strings.Join(parts, "; ")
}

// SchemaMismatches turns differences into node check mismatches (the
// diff's kind and message; a difference that does not block moves says
// so).
func SchemaMismatches(diffs []SchemaDiff) []Mismatch {
	out := make([]Mismatch, len(diffs))
	for i, d := range diffs {
		msg := d.Message
		if !d.Blocking {
			msg += " (not blocking moves)"
		}
		out[i] = Mismatch{Kind: d.Kind, Table: d.Table, Message: msg}
	}
	return out
}

func columnMap(cols []ColumnSchema) map[string]ColumnSchema {
	m := make(map[string]ColumnSchema, len(cols))
	for _, c := range cols {
		m[c.Name] = c
	}
	return m
}

// commonOrder is the names of cols that other has too, in cols' order.
func commonOrder(cols []ColumnSchema, other map[string]ColumnSchema) []string {
	var out []string
	for _, c := range cols {
		if _, ok := other[c.Name]; ok {
			out = append(out, c.Name)
		}
	}
	return out
}

func present(ok bool) string {
	if ok {
		return "present"
	}
	return "missing"
}

func nullability(notNull bool) string {
	if notNull {
		return "NOT NULL"
	}
	return "nullable"
}

func orDefault(s string) string {
	if s == "" {
		return "the type's default"
	}
	return s
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func generated(c ColumnSchema) string {
	switch {
	case c.Generated == "s":
		return "GENERATED ALWAYS AS (" + c.Default + ") STORED"
	case c.Identity == "a":
		return "GENERATED ALWAYS AS IDENTITY"
	case c.Identity == "d":
		return "GENERATED BY DEFAULT AS IDENTITY"
	}
	return "not generated"
}

func keyList(cols []string) string {
	if len(cols) == 0 {
		return "none"
	}
	return "(" + strings.Join(cols, ", ") + ")"
}

func indexList(idx []string) string {
	if len(idx) == 0 {
		return "none"
	}
	return strings.Join(idx, " and ")
}
