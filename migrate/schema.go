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
	ss, err := fence.ReadSchemas(ctx, src, r.rec.Tables)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	ts, err := fence.ReadSchemas(ctx, dst, r.rec.Tables)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	diffs := fence.CompareSchemas("source "+r.rec.Source, ss, "target "+r.rec.Target, ts)
	for _, d := range diffs {
		if !d.Blocking {
			r.mv.log.Warn("schema difference between source and target (not blocking the move)", zap.String("move", r.rec.ID),
				zap.String("kind", d.Kind), zap.String("table", d.Table), zap.String("column", d.Column), zap.String("detail", d.Message))
		}
	}
	if b := fence.Blocking(diffs); len(b) > 0 {
		for _, d := range b {
			r.mv.log.Error("schema difference between source and target: refusing the move", zap.String("move", r.rec.ID),
				zap.String("kind", d.Kind), zap.String("table", d.Table), zap.String("column", d.Column),
				zap.String("source", d.Values[0]), zap.String("target", d.Values[1]))
		}
		return fmt.Errorf("%w (nothing was copied; make them equal, see `shardctl node check %s`): %s", ErrSchemaDiff, r.rec.Target, fence.DescribeDiffs(b))
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
func rowKey(row []byte, pk []string) string {
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(row))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return string(row)
	}
	vals := make([]string, len(pk))
	for i, c := range pk {
		switch v := m[c].(type) {
		case string:
			vals[i] = literal(v)
		case nil:
			vals[i] = "NULL"
		default:
			vals[i] = fmt.Sprint(v)
		}
	}
	return "(" + strings.Join(pk, ", ") + ") = (" + strings.Join(vals, ", ") + ")"
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
