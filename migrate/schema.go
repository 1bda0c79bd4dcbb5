package migrate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/topo"
)

// ErrFailover: the source's or the target's primary is not the one the
// move began on (a Patroni failover or switchover). The move aborts
// before its flip and may be started again on the new primaries
// (Mover.Move does that by itself).
var ErrFailover = errors.New("a db node failed over during the move")

// ErrSchemaDiff is a move refused because the source's and the target's
// sharded tables differ in a way that breaks the copy.
var ErrSchemaDiff = errors.New("the source's and the target's sharded tables differ")

// compareSchemas compares every sharded table of the move on the source
// and the target (fence.CompareSchemas) and refuses the move, with every
// blocking difference, before any row is copied or the range is marked
// incoming on the target. Differences that do not block (a default, the
// column order) are logged.
func (r *run) compareSchemas(ctx context.Context, src, dst *pgx.Conn) error {
	// Both nodes at once, each on its own connection: a schema is read
	// in tens of round trips, each a wait on a loaded node.
	var ss, ts []fence.TableSchema
	var srcErr, dstErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		ss, srcErr = fence.ReadSchemas(ctx, src, r.rec.Tables)
	}()
	ts, dstErr = fence.ReadSchemas(ctx, dst, r.rec.Tables)
	<-done
	if srcErr != nil {
		return fmt.Errorf("source: %w", srcErr)
	}
	if dstErr != nil {
		return fmt.Errorf("target: %w", dstErr)
	}
	diffs := fence.CompareSchemas("source "+r.rec.Source, ss, "target "+r.rec.Target, ts)
	for _, d := range diffs {
		if !d.Blocking {
			r.mv.log.Warn("schema difference between source and target (not blocking the move)", zap.String("move", r.rec.ID),
				zap.String("kind", d.Kind), zap.String("table", d.Table), zap.String("column", d.Column), zap.String("constraint", d.Constraint), zap.String("detail", d.Message))
		}
	}
	if b := fence.Blocking(diffs); len(b) > 0 {
		for _, d := range b {
			r.mv.log.Error("schema difference between source and target: refusing the move", zap.String("move", r.rec.ID),
				zap.String("kind", d.Kind), zap.String("table", d.Table), zap.String("column", d.Column), zap.String("constraint", d.Constraint),
				zap.String("source", d.Values[0]), zap.String("target", d.Values[1]))
		}
		return hint.New(fmt.Errorf("%w (nothing was copied): %s", ErrSchemaDiff, fence.DescribeDiffs(b)), "make them equal; see shardctl node check "+r.rec.Target)
	}
	return nil
}

// ErrForeignKey is a move aborted because rows of the range on the target
// reference rows the target does not have.
var ErrForeignKey = errors.New("rows copied to the target break a foreign key there")

// fkCountCap bounds how many rows breaking one foreign key
// checkForeignKeys counts.
const fkCountCap = 1000

// checkForeignKeys checks, on the target, every foreign key of the
// sharded tables for the range's rows: that each row's referenced row
// exists there (an anti-join per foreign key over the range, MATCH SIMPLE
// or FULL as declared, NOT VALID ones included). The move's subscription
// applies rows as a replica (session_replication_role = replica), which
// fires no foreign key trigger: a row the source accepted and whose
// referenced row the target lacks (a reference table that is not sharded,
// with fewer rows on the target) would be copied without an error and
// stay there, breaking the target's own constraint. The schema comparison
// has already made sure both nodes declare the same foreign keys. The
// first foreign key broken is an ErrForeignKey naming the table, the
// constraint, a row (by primary key) and the key it references, and how
// many rows of the range break it (counted up to fkCountCap).
func checkForeignKeys(ctx context.Context, dst *pgx.Conn, tables []topo.TableRecord, lo, hi int64) error {
	schemas, err := fence.ReadSchemas(ctx, dst, tables)
	if err != nil {
		return err
	}
	for i, t := range tables {
		ts := schemas[i]
		for _, fk := range ts.ForeignKeys {
			q := orphanQuery(t, ts, fk)
			var row []byte
			var n int64
			err := dst.QueryRow(ctx, q, lo, hi).Scan(&row, &n)
			if errors.Is(err, pgx.ErrNoRows) {
				continue
			}
			if err != nil {
				return fmt.Errorf("checking the foreign key %s of %s: %w", fk.Name, t.Name, err)
			}
			count := fmt.Sprintf("%d rows of the range break it", n)
			if n == 1 {
				count = "1 row of the range breaks it"
			} else if n > fkCountCap {
				count = fmt.Sprintf("more than %d rows of the range break it", fkCountCap)
			}
			key := "(no primary key)"
			if len(ts.PrimaryKey) > 0 {
				key = rowKey(row, ts.PrimaryKey)
			}
			return hint.New(fmt.Errorf("%w: table %s, foreign key %s (%s): row %s references %s %s, which the target does not have; %s "+
				"(logical replication does not check foreign keys)",
				ErrForeignKey, t.Name, fk.Name, fk.Def, key, fk.RefTable, rowKeyAs(row, fk.Columns, fk.RefColumns), count),
				fmt.Sprintf("give the target's %s the rows the source's has, then move again", fk.RefTable))
		}
	}
	return nil
}

// orphanQuery selects the range's rows of t that break the foreign key fk
// (as json), with how many do, up to fkCountCap + 1; none: no row.
func orphanQuery(t topo.TableRecord, ts fence.TableSchema, fk fence.ConstraintSchema) string {
	var join, set []string
	for i, c := range fk.Columns {
		join = append(join, fmt.Sprintf("r.%s = t.%s", colIdent(fk.RefColumns[i]), colIdent(c)))
		set = append(set, fmt.Sprintf("t.%s IS NOT NULL", colIdent(c)))
	}
	// The rows the foreign key applies to: MATCH SIMPLE exempts a row with
	// any of its columns NULL; MATCH FULL only one with all of them NULL
	// (a row with some NULL breaks it: it has no match below).
	checked := strings.Join(set, " AND ")
	if fk.MatchFull {
		checked = "(" + strings.Join(set, " OR ") + ")"
	}
	order := "t." + ident(t.KeyColumn)
	if len(ts.PrimaryKey) > 0 {
		pk := make([]string, len(ts.PrimaryKey))
		for i, c := range ts.PrimaryKey {
			pk[i] = "t." + ident(c)
		}
		order = strings.Join(pk, ", ")
	}
	// fk.RefTable is quoted and qualified already (regclass's text).
	return fmt.Sprintf(`SELECT to_jsonb(o), (SELECT count(*) FROM (SELECT 1 FROM %[1]s t WHERE t.%[2]s BETWEEN $1 AND $2 AND %[3]s
			AND NOT EXISTS (SELECT 1 FROM %[4]s r WHERE %[5]s) LIMIT %[6]d) c)
		FROM (SELECT t.* FROM %[1]s t WHERE t.%[2]s BETWEEN $1 AND $2 AND %[3]s
			AND NOT EXISTS (SELECT 1 FROM %[4]s r WHERE %[5]s) ORDER BY %[7]s LIMIT 1) o`,
		ident(t.Name), ident(t.KeyColumn), checked, fk.RefTable, strings.Join(join, " AND "), fkCountCap+1, order)
}

func colIdent(c string) string { return pgx.Identifier{c}.Sanitize() }

// checkForeignKeysOnTarget is checkForeignKeys for the move: on its
// target, over its range.
func (r *run) checkForeignKeysOnTarget(ctx context.Context) error {
	if r.rec.NoCopy {
		return nil
	}
	dst, err := r.target(ctx)
	if err != nil {
		return err
	}
	if err := checkForeignKeys(ctx, dst, r.rec.Tables, r.rec.Lo, r.rec.Hi); err != nil {
		if errors.Is(err, ErrForeignKey) {
			r.mv.log.Error("rows copied to the target break a foreign key there: refusing to fence", zap.String("move", r.rec.ID), zap.Error(err))
		}
		return fmt.Errorf("target %s: %w", r.rec.Target, err)
	}
	return nil
}

// applyError explains why the move's subscription was disabled
// (disable_on_error): the initial copy (table sync) or the apply of a
// change failed on the target. PostgreSQL 15 keeps the error itself only
// in the target's server log, so this reproduces it: it applies the
// source's rows of the range to the target as the apply worker does (as a
// replication session, insert or update by primary key), in a transaction
// that is always rolled back, and reports the first row that fails, by
// table and primary key, with PostgreSQL's error. What it returns is an
// error for the move record.
func (r *run) applyError(ctx context.Context, src, dst *pgx.Conn) error {
	base := fmt.Sprintf("target: subscription %s was disabled by an error applying the source's rows", r.rec.Subscription)
	var syncErrs, applyErrs int64
	_ = dst.QueryRow(ctx, `SELECT s.sync_error_count, s.apply_error_count FROM pg_stat_subscription_stats s WHERE s.subname = $1`, r.rec.Subscription).Scan(&syncErrs, &applyErrs)
	var notReady []string
	if rows, err := dst.Query(ctx, `SELECT r.srrelid::regclass::text || ' (' || r.srsubstate::text || ')' FROM pg_subscription_rel r
		JOIN pg_subscription s ON s.oid = r.srsubid WHERE s.subname = $1 AND r.srsubstate <> 'r' ORDER BY 1`, r.rec.Subscription); err == nil {
		notReady, _ = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	// The statistics reach pg_stat_subscription_stats a moment after the
	// error (they are flushed, not written at once): with no count yet,
	// tables still in their initial copy say which phase failed.
	phase := "while applying changes"
	if (syncErrs > 0 && applyErrs == 0) || (syncErrs == 0 && applyErrs == 0 && len(notReady) > 0) {
		phase = "during the initial copy"
	}
	detail, err := reproduceApply(ctx, src, dst, r.rec.Tables, r.rec.Lo, r.rec.Hi)
	if err != nil {
		detail = "the failing row could not be found (" + err.Error() + "); see the target's server log"
	}
	msg := base + " " + phase + ": " + detail
	if len(notReady) > 0 {
		msg += fmt.Sprintf(" (tables not yet copied: %s)", strings.Join(notReady, ", "))
	}
	r.mv.log.Error("replication apply error on the target", zap.String("move", r.rec.ID), zap.String("subscription", r.rec.Subscription),
		zap.String("phase", phase), zap.String("detail", detail), zap.Strings("tables_not_ready", notReady))
	return errors.New(msg)
}

// reproduceMaxRows bounds how many of the range's rows, over all tables,
// reproduceApply tries before it gives up.
const reproduceMaxRows = 200_000

// reproduceApply applies the range's source rows to the target, chunk by
// chunk, in one transaction that is rolled back, and describes the first
// row that fails: "table T, row (pk) = (values): ERROR ...".
func reproduceApply(ctx context.Context, src, dst *pgx.Conn, tables []topo.TableRecord, lo, hi int64) (string, error) {
	schemas, err := fence.ReadSchemas(ctx, dst, tables)
	if err != nil {
		return "", err
	}
	tx, err := dst.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SET LOCAL session_replication_role = replica"); err != nil {
		return "", err
	}
	tried := 0
	for i, t := range tables {
		ts := schemas[i]
		if ts.Missing {
			return fmt.Sprintf("table %s does not exist on the target", t.Name), nil
		}
		if len(ts.PrimaryKey) == 0 {
			continue
		}
		ins := applyStmt(t, ts)
		var after []byte // the last row seen, as json: the next page starts after its primary key
		for tried < reproduceMaxRows {
			q, args := reproducePage(t, ts, lo, hi, after)
			rows, err := src.Query(ctx, q, args...)
			if err != nil {
				return "", fmt.Errorf("source: %w", err)
			}
			chunk, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
			if err != nil {
				return "", fmt.Errorf("source: %w", err)
			}
			if len(chunk) == 0 {
				break
			}
			tried += len(chunk)
			after = chunk[len(chunk)-1]
			if _, err := tx.Exec(ctx, "SAVEPOINT chunk"); err != nil {
				return "", err
			}
			if _, err := tx.Exec(ctx, ins, chunkJSON(chunk)); err == nil {
				if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT chunk"); err != nil {
					return "", err
				}
				continue
			}
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT chunk"); err != nil {
				return "", err
			}
			// The chunk fails: find its first row that does.
			for _, row := range chunk {
				if _, err := tx.Exec(ctx, "SAVEPOINT one"); err != nil {
					return "", err
				}
				_, err := tx.Exec(ctx, ins, chunkJSON([][]byte{row}))
				if err != nil {
					return fmt.Sprintf("table %s, row %s: %s", t.Name, rowKey(row, ts.PrimaryKey), pgError(err)), nil
				}
				if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT one"); err != nil {
					return "", err
				}
			}
			return "", fmt.Errorf("a chunk of %s failed but none of its rows alone", t.Name)
		}
	}
	if tried >= reproduceMaxRows {
		return fmt.Sprintf("none of the first %d rows of the range fails when applied again; see the target's server log", tried), nil
	}
	return "every row of the range applies cleanly now (the cause is gone, or was not a row: see the target's server log)", nil
}

// reproducePageRows is how many rows reproduceApply reads and applies at
// a time.
const reproducePageRows = 500

// reproducePage is the query for the next page of t's rows in the range,
// in primary key order, each as json: the first page if after is nil, or
// the rows whose primary key is past after's (a row as json, the last of
// the page before). The row comparison takes the columns of the row
// decoded from after, one per column of the primary key.
func reproducePage(t topo.TableRecord, ts fence.TableSchema, lo, hi int64, after []byte) (string, []any) {
	pk := make([]string, len(ts.PrimaryKey))
	for j, c := range ts.PrimaryKey {
		pk[j] = "t." + ident(c)
	}
	order := strings.Join(pk, ", ")
	q := fmt.Sprintf(`SELECT to_jsonb(t) FROM %s t WHERE t.%s BETWEEN $1 AND $2`, ident(t.Name), ident(t.KeyColumn))
	args := []any{lo, hi}
	if after != nil {
		q += fmt.Sprintf(` AND %s > (SELECT %s FROM jsonb_populate_record(NULL::%s, $3) x)`, rowOf(pk), qualifiedCols(ts.PrimaryKey, "x"), ident(t.Name))
		args = append(args, after)
	}
	q += fmt.Sprintf(" ORDER BY %s LIMIT %d", order, reproducePageRows)
	return q, args
}

// rowOf is a row constructor of the expressions: ROW(a) for one, which a
// bare (a) is not.
func rowOf(exprs []string) string { return "ROW(" + strings.Join(exprs, ", ") + ")" }

// applyStmt inserts a json array of rows into table t, or updates the row
// with the same primary key, as the apply worker would.
func applyStmt(t topo.TableRecord, ts fence.TableSchema) string {
	var cols, sets []string
	pk := map[string]bool{}
	for _, c := range ts.PrimaryKey {
		pk[c] = true
	}
	for _, c := range ts.Columns {
		if c.Generated != "" {
			continue
		}
		cols = append(cols, ident(c.Name))
		if !pk[c.Name] {
			sets = append(sets, fmt.Sprintf("%s = EXCLUDED.%s", ident(c.Name), ident(c.Name)))
		}
	}
	pkCols := make([]string, len(ts.PrimaryKey))
	for i, c := range ts.PrimaryKey {
		pkCols[i] = ident(c)
	}
	conflict := "DO NOTHING"
	if len(sets) > 0 {
		conflict = "DO UPDATE SET " + strings.Join(sets, ", ")
	}
	list := strings.Join(cols, ", ")
	return fmt.Sprintf(`INSERT INTO %s (%s) SELECT %s FROM jsonb_populate_recordset(NULL::%s, $1) ON CONFLICT (%s) %s`,
		ident(t.Name), list, list, ident(t.Name), strings.Join(pkCols, ", "), conflict)
}

func qualifiedCols(cols []string, alias string) string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = alias + "." + ident(c)
	}
	return strings.Join(out, ", ")
}

func chunkJSON(rows [][]byte) string {
	parts := make([]string, len(rows))
	for i, r := range rows {
		parts[i] = string(r)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// rowKey names a row (json) by its primary key: "(bkey, uid) = (12, 'a')".
func rowKey(row []byte, pk []string) string { return rowKeyAs(row, pk, pk) }

// rowKeyAs is rowKey of the row's columns cols, named as names: a foreign
// key's values under the referenced table's column names.
func rowKeyAs(row []byte, cols, names []string) string {
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(row))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return string(row)
	}
	vals := make([]string, len(cols))
	for i, c := range cols {
		switch v := m[c].(type) {
		case string:
			vals[i] = literal(v)
		case nil:
			vals[i] = "NULL"
		default:
			vals[i] = fmt.Sprint(v)
		}
	}
	return "(" + strings.Join(names, ", ") + ") = (" + strings.Join(vals, ", ") + ")"
}

// pgError formats a PostgreSQL error with its detail and SQLSTATE.
func pgError(err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err.Error()
	}
	s := fmt.Sprintf("ERROR: %s (SQLSTATE %s)", pe.Message, pe.Code)
	if pe.Detail != "" {
		s += "; DETAIL: " + pe.Detail
	}
	return s
}
