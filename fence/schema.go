package fence

import (
	"context"
	"fmt"
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
}

// SchemaDiff is one way two nodes' sharded tables differ. Nodes names the
// two sides as the caller labelled them, Values what each side has.
// Blocking differences break a move's copy (or what the target would do
// with the rows after the flip); the others (a column default, the column
// order: replication matches columns by name) are reported but do not stop
// a move.
type SchemaDiff struct {
	Kind     string    `json:"kind"`
	Table    string    `json:"table"`
	Column   string    `json:"column,omitempty"`
	Nodes    [2]string `json:"nodes"`
	Values   [2]string `json:"values"`
	Blocking bool      `json:"blocking"`
	Message  string    `json:"message"`
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
)

// ReadSchemas reads the sharded tables' schemas on a node, in the order of
// tables. It changes nothing.
func ReadSchemas(ctx context.Context, q Querier, tables []topo.TableRecord) ([]TableSchema, error) {
	out := make([]TableSchema, 0, len(tables))
	for _, t := range tables {
		ts, err := readSchema(ctx, q, t)
		if err != nil {
			return nil, fmt.Errorf("reading the schema of %s: %w", t.Name, err)
		}
		out = append(out, ts)
	}
	return out, nil
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
	return ts, err
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
	}
	return out
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
