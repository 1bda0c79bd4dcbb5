package fence

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/topo"
)

// Mismatch is one way a node differs from the data-side contract. Kind is
// stable, for scripts; Message says exactly what is wrong, for people.
type Mismatch struct {
	Kind    string `json:"kind"`
	Table   string `json:"table,omitempty"`
	Message string `json:"message"`
}

// Mismatch kinds.
const (
	KindTableMissing      = "table-missing"
	KindKeyColumnMissing  = "key-column-missing"
	KindKeyColumnType     = "key-column-type"
	KindKeyColumnNullable = "key-column-nullable"
	KindPrimaryKeyMissing = "primary-key-missing"
	KindPrimaryKeyWithout = "primary-key-without-key-column"
	KindKeyIndexMissing   = "key-index-missing"
	KindFenceNotInstalled = "fence-not-installed"
	KindFenceWrongNode    = "fence-wrong-node"
	KindFenceObjects      = "fence-objects-outdated"
	KindTriggerMissing    = "trigger-missing"
	KindTriggerDisabled   = "trigger-not-enabled"
	KindTriggerWrong      = "trigger-wrong"
	KindTriggerStale      = "trigger-on-unsharded-table"
	KindFenceVersion      = "fence-map-version"
	KindFenceRange        = "fence-range"
)

// CheckTables verifies the sharded-table contract on a node: each table
// exists; its key column exists, is bigint and NOT NULL; its primary key
// includes the key column; a valid, non-partial B-tree index leads with the
// key column. It changes nothing.
func CheckTables(ctx context.Context, q Querier, tables []topo.TableRecord) ([]Mismatch, error) {
	var out []Mismatch
	add := func(kind string, t topo.TableRecord, format string, args ...any) {
		out = append(out, Mismatch{Kind: kind, Table: t.Name, Message: fmt.Sprintf(format, args...)})
	}
	for _, t := range tables {
		var rel *uint32
		if err := q.QueryRow(ctx, `SELECT to_regclass($1)::oid`, qualified(t)).Scan(&rel); err != nil {
			return nil, err
		}
		if rel == nil {
			add(KindTableMissing, t, "table %s does not exist", t.Name)
			continue
		}
		var attnum int16
		var typ string
		var notNull bool
		err := q.QueryRow(ctx, `SELECT attnum, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute WHERE attrelid = $1 AND attname = $2 AND attnum > 0 AND NOT attisdropped`, *rel, t.KeyColumn).Scan(&attnum, &typ, &notNull)
		if errors.Is(err, pgx.ErrNoRows) {
			add(KindKeyColumnMissing, t, "table %s has no bucket key column %s", t.Name, t.KeyColumn)
			continue
		}
		if err != nil {
			return nil, err
		}
		if typ != "bigint" {
			add(KindKeyColumnType, t, "column %s.%s is %s; the bucket key must be bigint", t.Name, t.KeyColumn, typ)
		}
		if !notNull {
			add(KindKeyColumnNullable, t, "column %s.%s allows NULL; the bucket key must be NOT NULL (a primary key column is)", t.Name, t.KeyColumn)
		}
		var pkName *string
		var inPK bool
		err = q.QueryRow(ctx, `SELECT conname, $2 = ANY(conkey) FROM pg_constraint WHERE conrelid = $1 AND contype = 'p'`, *rel, attnum).Scan(&pkName, &inPK)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			add(KindPrimaryKeyMissing, t, "table %s has no primary key; it needs one that includes %s", t.Name, t.KeyColumn)
		case err != nil:
			return nil, err
		case !inPK:
			add(KindPrimaryKeyWithout, t, "the primary key %s of %s does not include %s (logical replication filters rows on it, so it must be in the replica identity)", *pkName, t.Name, t.KeyColumn)
		}
		var indexed bool
		err = q.QueryRow(ctx, `SELECT EXISTS (
	SELECT 1 FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_am am ON am.oid = ic.relam
	WHERE i.indrelid = $1 AND i.indkey[0] = $2 AND i.indisvalid AND i.indisready AND i.indpred IS NULL AND am.amname = 'btree')`, *rel, attnum).Scan(&indexed)
		if err != nil {
			return nil, err
		}
		if !indexed {
			add(KindKeyIndexMissing, t, "no valid, non-partial B-tree index of %s leads with %s (CREATE INDEX ON %s (%s))", t.Name, t.KeyColumn, t.Name, t.KeyColumn)
		}
	}
	return out, nil
}

// CheckFence verifies a node's fence against map m: installed for this
// node and cluster, objects of this version, the trigger enabled (for
// ordinary sessions only) on every sharded table and on no other, and the
// ownership table equal to what Sync would write (incoming ranges that the
// map does not contradict are accepted: a move may be copying). It changes
// nothing.
func CheckFence(ctx context.Context, q Querier, cluster string, tables []topo.TableRecord, m *bucketmap.Map, node bucketmap.NodeID) ([]Mismatch, error) {
	var out []Mismatch
	add := func(kind, table, format string, args ...any) {
		out = append(out, Mismatch{Kind: kind, Table: table, Message: fmt.Sprintf(format, args...)})
	}
	f, err := Read(ctx, q)
	if errors.Is(err, ErrNotInstalled) {
		add(KindFenceNotInstalled, "", "the fence is not installed (no shardvisor.ownership); run `shardctl node prepare %s`", node)
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	if f.Node != string(node) || f.Cluster != cluster {
		add(KindFenceWrongNode, "", "this database's fence was prepared as node %s of cluster %s, not node %s of cluster %s (do two registry entries point at one database?)", f.Node, f.Cluster, node, cluster)
	}
	if f.FenceVersion != Version {
		add(KindFenceObjects, "", "fence objects are version %d, this shardctl installs version %d; run `shardctl node prepare %s`", f.FenceVersion, Version, node)
	}
	for _, fn := range []struct{ name, sql string }{{"reject", rejectFn}, {"reject_isolation", rejectIsolationFn}} {
		same, err := sameFunction(ctx, q, fn.name, fn.sql)
		if err != nil {
			return nil, err
		}
		if !same {
			add(KindFenceObjects, "", "function shardvisor.%s is missing or differs from this version's", fn.name)
		}
	}
	sharded := map[string]bool{}
	for _, t := range tables {
		sharded[t.Name] = true
		var rel *uint32
		if err := q.QueryRow(ctx, `SELECT to_regclass($1)::oid`, qualified(t)).Scan(&rel); err != nil {
			return nil, err
		}
		if rel == nil {
			continue // CheckTables reports it
		}
		fn := funcName(t)
		var src, comment *string
		err := q.QueryRow(ctx, `SELECT prosrc, obj_description(oid, 'pg_proc') FROM pg_proc WHERE pronamespace = 'shardvisor'::regnamespace AND proname = $1`, fn).Scan(&src, &comment)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, err
		}
		if src == nil {
			add(KindTriggerMissing, t.Name, "trigger function shardvisor.%s for %s is missing", fn, t.Name)
		} else if *src != triggerBody(t) || comment == nil || *comment != funcComment(t) {
			add(KindFenceObjects, t.Name, "trigger function shardvisor.%s for %s differs from this version's (edited, or for another key column)", fn, t.Name)
		}
		var enabled string
		var tgtype int16
		var tgfn string
		err = q.QueryRow(ctx, `SELECT tgenabled::text, tgtype, tgfoid::regproc::text FROM pg_trigger WHERE tgrelid = $1 AND tgname = $2`, *rel, TriggerName).Scan(&enabled, &tgtype, &tgfn)
		if errors.Is(err, pgx.ErrNoRows) {
			add(KindTriggerMissing, t.Name, "table %s has no fence trigger %s; writes to it are not fenced", t.Name, TriggerName)
			continue
		}
		if err != nil {
			return nil, err
		}
		switch enabled {
		case "O":
		case "D":
			add(KindTriggerDisabled, t.Name, "the fence trigger on %s is disabled; writes to it are not fenced", t.Name)
		case "A":
			add(KindTriggerDisabled, t.Name, "the fence trigger on %s is ENABLE ALWAYS: it would reject logical-replication apply during moves", t.Name)
		case "R":
			add(KindTriggerDisabled, t.Name, "the fence trigger on %s is ENABLE REPLICA: it fires only for replication apply, not for applications", t.Name)
		}
		if tgtype != triggerTypeWant || tgfn != "shardvisor."+fn {
			add(KindTriggerWrong, t.Name, "the fence trigger on %s is not BEFORE INSERT OR UPDATE OR DELETE FOR EACH ROW calling shardvisor.%s (it calls %s, type %d)", t.Name, fn, tgfn, tgtype)
		}
	}
	fenced, err := fencedTables(ctx, q)
	if err != nil {
		return nil, err
	}
	for _, st := range fenced {
		if name := st[0] + "." + st[1]; !sharded[name] {
			add(KindTriggerStale, name, "table %s has a fence trigger but is not a sharded table; `shardctl node prepare %s` drops it", name, node)
		}
	}
	if f.MapVersion != m.Version {
		add(KindFenceVersion, "", "the fence is at map version %d, the map is at version %d", f.MapVersion, m.Version)
	}
	want := overlay(Only(f.Spans, Incoming), Desired(m, node))
	for _, d := range Compare(want, f.Spans) {
		add(KindFenceRange, "", "%s (keys %d..%d): the map says %s, the fence says %s", BucketsOf(m.Level, d.Lo, d.Hi), d.Lo, d.Hi, d.Want, d.Got)
	}
	return out, nil
}

// fencedTables lists the tables that carry the fence trigger, as schema
// and name.
func fencedTables(ctx context.Context, q Querier) ([][2]string, error) {
	rows, err := q.Query(ctx, `SELECT n.nspname, c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE t.tgname = $1 ORDER BY 1, 2`, TriggerName)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var s [2]string
		return s, r.Scan(&s[0], &s[1])
	})
}
