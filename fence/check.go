package fence

import (
	"context"
	"errors"
	"fmt"
	"strings"

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
	KindConstraintMissing = "fence-constraint-missing"
	KindConstraintWrong   = "fence-constraint-wrong"
	KindTriggerAfterFence = "trigger-after-fence"
	KindFencePrivileges   = "fence-privileges"
	KindFenceEpoch        = "fence-epoch"
	KindStrandedRows      = "stranded-rows"
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
// node and cluster, objects of this version, the fence's triggers enabled
// (for ordinary sessions only) on every sharded table and on no other, no
// BEFORE ROW trigger that runs after the fence's first check, no role but
// the fence's owner able to write the fence or create objects in its
// schema, and the ownership table equal to what Sync would write (Wanted:
// incoming ranges that the map does not contradict are accepted, a move
// may be copying; so is a moving bucket frozen or not, its mover may be in
// its write pause). It changes nothing.
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
	for _, fn := range sharedFunctions {
		_, same, err := functionState(ctx, q, fn)
		if err != nil {
			return nil, err
		}
		if !same {
			add(KindFenceObjects, "", "function %s is missing or differs from this version's; run `shardctl node prepare %s`", fn, node)
		}
	}
	privs, err := fencePrivileges(ctx, q)
	if err != nil {
		return nil, err
	}
	for _, p := range privs {
		add(KindFencePrivileges, "", "%s has %s on %s: only the fence's owner may change the fence or what its functions run (REVOKE %s ON %s FROM %s)", p.grantee, p.privs, p.object, p.privs, p.object, p.grantee)
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
		fn := tableFunction(t)
		exists, same, err := functionState(ctx, q, fn)
		if err != nil {
			return nil, err
		}
		if !exists {
			add(KindTriggerMissing, t.Name, "trigger function shardvisor.%s for %s is missing", fn.name, t.Name)
		} else if !same {
			add(KindFenceObjects, t.Name, "trigger function shardvisor.%s for %s differs from this version's (edited, older, or for another key column)", fn.name, t.Name)
		}
		for _, tr := range tableTriggers(t) {
			if err := checkTrigger(ctx, q, add, t, *rel, tr); err != nil {
				return nil, err
			}
		}
		attnum, err := keyAttnum(ctx, q, *rel, t.KeyColumn)
		if err != nil {
			return nil, err
		}
		var hasCon, conOK bool
		err = q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conrelid = $1 AND c.conname = $2),
			EXISTS (SELECT 1 FROM pg_constraint c WHERE `+constraintOK+`)`,
			*rel, ConstraintName, attnum).Scan(&hasCon, &conOK)
		if err != nil {
			return nil, err
		}
		switch {
		case !hasCon:
			add(KindConstraintMissing, t.Name, "table %s has no fence constraint %s; INSERTs into it are not fenced", t.Name, ConstraintName)
		case !conOK:
			add(KindConstraintWrong, t.Name, "the constraint %s on %s is not the fence's CHECK (shardvisor.check_row(%s, tableoid)); run `shardctl node prepare %s`", ConstraintName, t.Name, t.KeyColumn, node)
		}
		late, err := triggersAfterFence(ctx, q, *rel)
		if err != nil {
			return nil, err
		}
		for _, name := range late {
			add(KindTriggerAfterFence, t.Name, "trigger %s on %s is a BEFORE UPDATE trigger that sorts after %s, so it can change a row after the fence's trigger looked at it; the fence's constraint and %s still refuse the update if the row leaves or lands outside this node's buckets, but rename it to sort before %s (or drop it if nobody here made it)", name, t.Name, TriggerName, FinalTrigger, TriggerName)
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
	out = append(out, checkVersions(f, m)...)
	want := Wanted(f.Spans, m, node)
	for _, d := range Compare(want, f.Spans) {
		add(KindFenceRange, "", "%s (keys %d..%d): the map says %s, the fence says %s", BucketsOf(m, d.Lo, d.Hi), d.Lo, d.Hi, d.Want, d.Got)
	}
	stranded, err := CheckStranded(ctx, q, tables, m, node)
	if err != nil {
		return nil, err
	}
	return append(out, stranded...), nil
}

// checkVersions checks the map versions a fence records against each
// other and against map m. A fence is not expected to be at m's version:
// a move syncs only its two nodes and GC's history prune syncs none, so a
// node that no change since involved stays at an older version with the
// right ranges (the ranges are checked on their own). What is exact:
//
//   - no ownership row was written for a map version newer than the map's
//     (fence-epoch), nor for version 0, which no map has;
//   - the meta row's version is not newer than the map's (a fence ahead of
//     the map: a map restored from an older copy, or an edit), and not
//     older than the newest row's epoch (every flip writes both in one
//     transaction, so only an edit makes it older) (fence-map-version).
func checkVersions(f *Fence, m *bucketmap.Map) []Mismatch {
	var out []Mismatch
	add := func(kind, format string, args ...any) {
		out = append(out, Mismatch{Kind: kind, Message: fmt.Sprintf(format, args...)})
	}
	var newest uint64
	for _, s := range f.Spans {
		switch {
		case s.Epoch > m.Version:
			add(KindFenceEpoch, "the %s row for %s (keys %d..%d) says map version %d, newer than the map (version %d): the row was edited, or the map is older than the fence",
				s.State, BucketsOf(m, s.Lo, s.Hi), s.Lo, s.Hi, s.Epoch, m.Version)
			continue
		case s.Epoch == 0:
			add(KindFenceEpoch, "the %s row for %s (keys %d..%d) says map version 0, which no map has: the row was edited", s.State, BucketsOf(m, s.Lo, s.Hi), s.Lo, s.Hi)
		}
		newest = max(newest, s.Epoch)
	}
	switch {
	case f.MapVersion > m.Version:
		add(KindFenceVersion, "the fence is at map version %d, ahead of the map (version %d): the map was restored from an older copy, or the fence was edited; no sync will take it back in time (see docs/data-contract.md, \"A fence ahead of the map\")", f.MapVersion, m.Version)
	case f.MapVersion < newest:
		add(KindFenceVersion, "the fence's meta row says map version %d, older than its own ownership rows (written for version %d): the meta row was edited; `shardctl node reconcile` sets it again", f.MapVersion, newest)
	}
	return out
}

// keyAttnum is the attribute number of table rel's column col, or 0 if
// there is none (CheckTables reports that).
func keyAttnum(ctx context.Context, q Querier, rel uint32, col string) (int16, error) {
	var n int16
	err := q.QueryRow(ctx, `SELECT attnum FROM pg_attribute WHERE attrelid = $1 AND attname = $2 AND attnum > 0 AND NOT attisdropped`, rel, col).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return n, err
}

// triggerPurpose says, for people, what goes unguarded without a trigger.
var triggerPurpose = map[string]string{
	TriggerName:     "its UPDATEs and DELETEs are not fenced",
	FinalTrigger:    "an UPDATE whose key a later BEFORE trigger changes may take a row out of a range this node does not own",
	TruncateTrigger: "TRUNCATE of it is not refused",
}

// checkTrigger reports how one of the fence's triggers on table t differs
// from this version's.
func checkTrigger(ctx context.Context, q Querier, add func(kind, table, format string, args ...any), t topo.TableRecord, rel uint32, tr trigger) error {
	the := "the fence trigger " + tr.name + " on " + t.Name
	if tr.name == TriggerName {
		the = "the fence trigger on " + t.Name
	}
	var enabled, fn string
	var tgtype int16
	var ok bool
	err := q.QueryRow(ctx, `SELECT t.tgenabled::text, t.tgtype, t.tgfoid::regprocedure::text, EXISTS (SELECT 1 FROM pg_trigger t WHERE `+triggerOK+`)
		FROM pg_trigger t WHERE t.tgrelid = $1 AND t.tgname = $2`, rel, tr.name, tr.fn, tr.tgtype, tr.when).Scan(&enabled, &tgtype, &fn, &ok)
	if errors.Is(err, pgx.ErrNoRows) {
		add(KindTriggerMissing, t.Name, "table %s has no fence trigger %s; %s", t.Name, tr.name, triggerPurpose[tr.name])
		return nil
	}
	if err != nil {
		return err
	}
	switch enabled {
	case "O":
	case "D":
		add(KindTriggerDisabled, t.Name, "%s is disabled; %s", the, triggerPurpose[tr.name])
	case "A":
		add(KindTriggerDisabled, t.Name, "%s is ENABLE ALWAYS: it would reject logical-replication apply during moves", the)
	case "R":
		add(KindTriggerDisabled, t.Name, "%s is ENABLE REPLICA: it fires only for replication apply, not for applications", the)
	}
	if !ok && enabled == "O" {
		add(KindTriggerWrong, t.Name, "%s is not this version's: it calls %s, type %d; want %s", the, fn, tgtype, strings.TrimPrefix(tr.create, "CREATE OR REPLACE TRIGGER "))
	}
	return nil
}

// triggersAfterFence lists the enabled BEFORE ROW UPDATE triggers on table
// rel that PostgreSQL fires after the fence's trigger (it fires BEFORE
// triggers in name order, byte order as COLLATE "C"), so after the fence's
// first look at an updated row. INSERT-only ones are not listed: an INSERT
// is checked only by the constraint, after every BEFORE trigger. Triggers
// enabled for replication only never run with the fence.
func triggersAfterFence(ctx context.Context, q Querier, rel uint32) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT t.tgname::text FROM pg_trigger t
		WHERE t.tgrelid = $1 AND NOT t.tgisinternal AND t.tgname::text COLLATE "C" > $2::text COLLATE "C"
		AND t.tgtype & 3 = 3 AND t.tgtype & 16 <> 0 AND t.tgenabled IN ('O', 'A') ORDER BY 1`, rel, TriggerName)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

type fencePrivilege struct{ object, grantee, privs string }

// fencePrivileges lists the roles other than the owner that may write the
// fence's tables (or create triggers on them, which would run as whoever
// flips the fence) or create objects in schema shardvisor.
func fencePrivileges(ctx context.Context, q Querier) ([]fencePrivilege, error) {
	rows, err := q.Query(ctx, `SELECT object, grantee, string_agg(privilege_type, ', ' ORDER BY privilege_type) FROM (
		SELECT 'shardvisor.' || c.relname AS object, a.grantee AS who, a.privilege_type
		FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
		WHERE c.oid IN (to_regclass('shardvisor.ownership'), to_regclass('shardvisor.fence_meta'))
			AND a.grantee <> c.relowner AND a.privilege_type <> 'SELECT'
		UNION ALL
		SELECT 'SCHEMA shardvisor', a.grantee, a.privilege_type
		FROM pg_namespace n CROSS JOIN LATERAL aclexplode(n.nspacl) a
		WHERE n.nspname = 'shardvisor' AND a.grantee <> n.nspowner AND a.privilege_type = 'CREATE'
	) p CROSS JOIN LATERAL (SELECT CASE WHEN p.who = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(p.who)) END AS grantee) g
	GROUP BY object, grantee ORDER BY object, grantee`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (fencePrivilege, error) {
		var p fencePrivilege
		return p, r.Scan(&p.object, &p.grantee, &p.privs)
	})
}

// fencedTables lists the tables that carry any of the fence's triggers or
// its constraint, as schema and name: their own, not the clones and
// inherited copies PostgreSQL keeps on the partitions of a partitioned
// sharded table (they follow the parent's, and cannot be dropped alone).
func fencedTables(ctx context.Context, q Querier) ([][2]string, error) {
	rows, err := q.Query(ctx, `SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND t.tgname = ANY($1) AND t.tgparentid = 0)
			OR EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conrelid = c.oid AND k.contype = 'c' AND k.conname = $2 AND k.coninhcount = 0)
		ORDER BY 1, 2`, triggerNames, ConstraintName)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var s [2]string
		return s, r.Scan(&s[0], &s[1])
	})
}
