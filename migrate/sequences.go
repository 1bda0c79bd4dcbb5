package migrate

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/topo"
)

// Sequences do not move with a bucket: logical replication carries rows,
// not sequence values. A sharded table whose id comes from a sequence
// (serial, identity, or a nextval default) would then hand out, on the
// new owner, ids its moved rows already have: the first insert for a
// moved user failed with a duplicate key (issue 25). So before the flip
// every sequence the sharded tables draw from is advanced on the target
// to at least the source's value: once outside the write pause (most of
// the distance) and once inside it, after the barrier, when the source
// can no longer write the bucket (the exact value: every id of the moved
// rows is at most what the source's sequence had handed out by then).
//
// Only ever forward (setval to the source's value where the target's is
// lower), and only ascending sequences (a descending one is left alone
// and logged). A sequence is shared by every bucket on its node: the
// target's own buckets keep drawing from it meanwhile, and a value one of
// them draws between the read and the setval may be handed out again
// after it. That is harmless with the data contract's keys, which include
// the bucket key: two rows of different users may share an id, one user's
// never (docs/data-contract.md, "Ids across nodes").

// sequencesQuery lists the sequences that columns of the tables draw
// from: owned by a column (serial, identity: pg_depend 'a' or 'i') or
// named by a column default's nextval (pg_attrdef's dependency), with
// their increment. Named schema-qualified whatever the session's
// search_path (regclass's text leaves the schema out where the path finds
// it): the name is resolved again on the target, whose path may differ.
const sequencesQuery = `
SELECT format('%I.%I', n.nspname, s.relname), q.seqincrement
FROM pg_class s JOIN pg_sequence q ON q.seqrelid = s.oid JOIN pg_namespace n ON n.oid = s.relnamespace
WHERE s.relkind = 'S' AND s.oid IN (
  SELECT d.objid FROM pg_depend d
   WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
     AND d.refobjid = ANY($1::regclass[]) AND d.deptype IN ('a', 'i')
  UNION
  SELECT d.refobjid FROM pg_attrdef ad
    JOIN pg_depend d ON d.classid = 'pg_attrdef'::regclass AND d.objid = ad.oid AND d.refclassid = 'pg_class'::regclass
   WHERE ad.adrelid = ANY($1::regclass[]))
ORDER BY 1`

// tableSequences lists the ascending sequences the tables draw from, and
// the descending ones apart (left alone).
func tableSequences(ctx context.Context, c *pgx.Conn, tables []topo.TableRecord) (asc, desc []string, err error) {
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = t.Name
	}
	rows, err := c.Query(ctx, sequencesQuery, names)
	if err != nil {
		return nil, nil, fmt.Errorf("listing the sequences of the sharded tables: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var inc int64
		if err := rows.Scan(&name, &inc); err != nil {
			return nil, nil, err
		}
		if inc > 0 {
			asc = append(asc, name)
		} else {
			desc = append(desc, name)
		}
	}
	return asc, desc, rows.Err()
}

// sequenceValues reads the last value each sequence handed out (no value:
// never used, nothing to carry).
func sequenceValues(ctx context.Context, c *pgx.Conn, seqs []string) (names []string, values []int64, err error) {
	rows, err := c.Query(ctx, `SELECT s, pg_sequence_last_value(s::regclass) FROM unnest($1::text[]) AS s WHERE pg_sequence_last_value(s::regclass) IS NOT NULL`, seqs)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the source's sequences: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var n string
		var v int64
		if err := rows.Scan(&n, &v); err != nil {
			return nil, nil, err
		}
		names, values = append(names, n), append(values, v)
	}
	return names, values, rows.Err()
}

// advanceSequences sets each sequence on c to its value where the next
// value c's sequence would hand out is not above it, in one statement,
// and returns the ones it moved.
//
// The next value is read from the sequence itself (last_value and
// is_called): a sequence set but not yet called (setval(s, n, false),
// ALTER SEQUENCE ... RESTART WITH n, the usual start after loaded ids)
// hands out n next, and pg_sequence_last_value says nothing of it (NULL):
// taking that for unused set such a target back below ids its own rows
// had (found in review). The names come from the source's catalog quoted
// by format('%I.%I'), so they are safe in the statement's text.
func advanceSequences(ctx context.Context, c *pgx.Conn, names []string, values []int64) ([]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	var q strings.Builder
	args := make([]any, 0, 2*len(names))
	for i, n := range names {
		if i > 0 {
			q.WriteString("\nUNION ALL\n")
		}
		// CASE, not AND: SQL does not promise to evaluate the comparison
		// before the setval.
		fmt.Fprintf(&q, `SELECT $%[1]d::text WHERE (SELECT CASE WHEN (CASE WHEN is_called THEN last_value < $%[2]d ELSE last_value <= $%[2]d END)
  THEN setval($%[1]d::regclass, $%[2]d, true) END FROM %[3]s) IS NOT NULL`, 2*i+1, 2*i+2, n)
		args = append(args, n, values[i])
	}
	rows, err := c.Query(ctx, q.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("advancing the target's sequences: %w", err)
	}
	defer rows.Close()
	var moved []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		moved = append(moved, n)
	}
	return moved, rows.Err()
}

// checkTargetSequences says, before the pause, which sequences the target
// lacks or may not read and set (SELECT and UPDATE): found inside the
// pause they would cost an abort.
func checkTargetSequences(ctx context.Context, c *pgx.Conn, names []string) error {
	var bad []string
	err := c.QueryRow(ctx, `SELECT coalesce(array_agg(s ORDER BY s), '{}') FROM unnest($1::text[]) AS s
WHERE to_regclass(s) IS NULL OR NOT has_sequence_privilege(s, 'SELECT, UPDATE')`, names).Scan(&bad)
	if err != nil {
		return fmt.Errorf("checking the target's sequences: %w", err)
	}
	if len(bad) > 0 {
		return fmt.Errorf("the target lacks these sequences of the sharded tables, or the mover's role may not SELECT and UPDATE them: %s", strings.Join(bad, ", "))
	}
	return nil
}

// carrySequences advances the target's sequences of the move's tables to
// at least the source's values (see the top of this file). where says
// when, for the log.
func (r *run) carrySequences(ctx context.Context, src, dst *pgx.Conn, where string) error {
	if r.rec.NoCopy || len(r.rec.Tables) == 0 {
		return nil
	}
	if r.seqs == nil {
		asc, desc, err := tableSequences(ctx, src, r.rec.Tables)
		if err != nil {
			return err
		}
		if len(desc) > 0 {
			r.mv.log.Warn("descending sequences of sharded tables are not carried to the target", zap.String("move", r.rec.ID), zap.Strings("sequences", desc))
		}
		r.seqs = append([]string{}, asc...) // non-nil: listed
	}
	if len(r.seqs) == 0 {
		return nil
	}
	if where == "before the pause" {
		if err := checkTargetSequences(ctx, dst, r.seqs); err != nil {
			return fmt.Errorf("target: %w", err)
		}
	}
	names, values, err := sequenceValues(ctx, src, r.seqs)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	moved, err := advanceSequences(ctx, dst, names, values)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	if len(moved) > 0 {
		r.mv.log.Info("advanced the target's sequences to the source's", zap.String("move", r.rec.ID), zap.String("when", where), zap.Strings("sequences", moved))
	}
	return nil
}
