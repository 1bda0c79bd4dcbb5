package fence

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/shardvisor/shardvisor/topo"
)

// Schema is the PostgreSQL schema that holds the fence on every db node.
const Schema = "shardvisor"

// Version is the version of the fence's SQL objects. `shardctl node
// prepare` replaces objects of another version; `node check` reports them.
const Version = 1

// TriggerName is the name of the fence trigger on every sharded table. It
// starts with "zz_" because PostgreSQL fires BEFORE triggers in name order
// and the fence must see the row as the application's own BEFORE triggers
// left it (one of them may compute the bucket key).
const TriggerName = "zz_shardvisor_fence"

// SQLState is the SQLSTATE of a write the fence rejects: the node does not
// own the row's bucket (or the bucket is frozen for a move, or incoming),
// or the bucket key is null. The message names the bucket, its level and
// the map version the fence is at. Class "SV" is not used by PostgreSQL.
const SQLState = "SV001"

// SQLStateIsolation is the SQLSTATE of a fenced write attempted in a
// transaction above READ COMMITTED: such a transaction reads the ownership
// table through a snapshot that may predate a flip, so the fence cannot
// guarantee that it drains it.
const SQLStateIsolation = "SV002"

// schemaSQL creates the schema, the ownership and meta tables and the
// shared error function. Every statement is idempotent.
var schemaSQL = []string{
	`CREATE SCHEMA IF NOT EXISTS shardvisor`,
	`CREATE TABLE IF NOT EXISTS shardvisor.fence_meta (
	singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
	fence_version integer NOT NULL,
	cluster      text NOT NULL,
	node         text NOT NULL,
	map_version  bigint NOT NULL DEFAULT 0 CHECK (map_version >= 0),
	level        integer NOT NULL DEFAULT 0 CHECK (level BETWEEN 0 AND 32),
	updated_at   timestamptz NOT NULL DEFAULT now()
)`,
	`CREATE TABLE IF NOT EXISTS shardvisor.ownership (
	lo    bigint PRIMARY KEY,
	hi    bigint NOT NULL,
	state text NOT NULL CHECK (state IN ('owned', 'frozen', 'incoming')),
	epoch bigint NOT NULL CHECK (epoch >= 0),
	CONSTRAINT ownership_range CHECK (lo <= hi),
	CONSTRAINT ownership_disjoint EXCLUDE USING gist (numrange(lo, hi, '[]') WITH &&)
)`,
	`COMMENT ON TABLE shardvisor.ownership IS 'shardvisor write fence: the bucket key ranges this node may write (inclusive bounds), kept in step with the bucket map by shardctl; see docs/data-contract.md'`,
	`GRANT USAGE ON SCHEMA shardvisor TO PUBLIC`,
	`GRANT SELECT ON shardvisor.ownership, shardvisor.fence_meta TO PUBLIC`,
}

// rejectFn explains a rejected write. It only runs on the error path, so it
// may take its time: it reads the meta row and the ownership row again.
const rejectFn = `CREATE OR REPLACE FUNCTION shardvisor.reject(k bigint, tbl text, op text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
	m record;
	o record;
	lvl integer := 0;
	mv bigint := 0;
	b bigint := 0;
	what text;
BEGIN
	SELECT level, map_version, node INTO m FROM shardvisor.fence_meta;
	IF FOUND THEN lvl := m.level; mv := m.map_version; END IF;
	IF k IS NULL THEN
		RAISE EXCEPTION USING ERRCODE = 'SV001',
			MESSAGE = format('shardvisor fence: %s on %s rejected: the bucket key is null (fence at map version %s)', op, tbl, mv),
			HINT = 'Set the bucket key column to keystream Key(Prefix64(user id)).';
	END IF;
	IF lvl > 0 THEN b := (k >> (64 - lvl)) + (1::bigint << (lvl - 1)); END IF;
	SELECT lo, hi, state, epoch INTO o FROM shardvisor.ownership WHERE lo <= k ORDER BY lo DESC LIMIT 1;
	IF FOUND AND o.hi >= k AND o.state = 'frozen' THEN
		what := format('bucket %s at level %s is frozen for a move away from this node (since map version %s)', b, lvl, o.epoch);
	ELSIF FOUND AND o.hi >= k AND o.state = 'incoming' THEN
		what := format('bucket %s at level %s is still being moved to this node (incoming since map version %s)', b, lvl, o.epoch);
	ELSE
		what := format('this node does not own bucket %s at level %s', b, lvl);
	END IF;
	RAISE EXCEPTION USING ERRCODE = 'SV001',
		MESSAGE = format('shardvisor fence: %s on %s rejected: %s; fence at map version %s', op, tbl, what, mv),
		DETAIL = format('bucket key %s, node %s', k, coalesce(m.node, '?')),
		HINT = 'Re-read the bucket map and send the write to the bucket''s owner; while a bucket moves, wait and retry.';
END
$fn$`

const rejectIsolationFn = `CREATE OR REPLACE FUNCTION shardvisor.reject_isolation(tbl text, op text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
	RAISE EXCEPTION USING ERRCODE = 'SV002',
		MESSAGE = format('shardvisor fence: %s on %s rejected: fenced writes must run at READ COMMITTED, not %s', op, tbl, current_setting('transaction_isolation')),
		HINT = 'Run writes to sharded tables at READ COMMITTED (the PostgreSQL default); see docs/data-contract.md.';
END
$fn$`

// funcName is the trigger function of a sharded table: a hash of its name
// (so that names never collide or exceed 63 bytes) and, for people, as much
// of the name as fits.
func funcName(t topo.TableRecord) string {
	h := sha256.Sum256([]byte(t.Name))
	n := "fence_" + hex.EncodeToString(h[:4]) + "_" + strings.ReplaceAll(t.Name, ".", "_")
	if len(n) > 63 {
		n = n[:63]
	}
	return n
}

// funcComment marks a trigger function as the fence's, with its version and
// table, so that check and prepare recognise their own.
func funcComment(t topo.TableRecord) string {
	return fmt.Sprintf("shardvisor fence v%d for %s (%s)", Version, t.Name, t.KeyColumn)
}

// triggerBody is the trigger function's body for one table. The order of
// its steps is the fence's correctness argument (docs/data-contract.md):
//
//  1. take the key's lock granule SHARED (both granules, ascending, for an
//     UPDATE that moves a row to another key), held to the end of the
//     transaction;
//  2. only then read the ownership row. At READ COMMITTED this statement
//     takes a new snapshot, so it sees every flip that committed before the
//     lock was granted; a flip in progress holds the granule EXCLUSIVE, so
//     the writer waits for it. A flip in turn waits for every writer that
//     already holds the granule, so when it commits no writer that passed
//     the old check is still in flight.
//
// The lock is taken by assignment rather than PERFORM: PL/pgSQL evaluates
// an assignment as a simple expression, without a trip through the
// executor.
func triggerBody(t topo.TableRecord) string {
	col := `"` + t.KeyColumn + `"`
	r := strings.NewReplacer("{col}", col, "{class}", fmt.Sprint(LockClass), "{tbl}", t.Name)
	return r.Replace(`
DECLARE
	k bigint;
	k2 bigint;
	g integer;
	g2 integer;
	ok boolean;
	lk text;
BEGIN
	IF TG_OP = 'INSERT' THEN
		-- The common case, kept short: PL/pgSQL sets up every expression it
		-- meets once per transaction.
		k := NEW.{col};
		IF k IS NULL THEN PERFORM shardvisor.reject(NULL, '{tbl}', TG_OP); END IF;
		IF current_setting('transaction_isolation') <> 'read committed' THEN
			PERFORM shardvisor.reject_isolation('{tbl}', TG_OP);
		END IF;
		lk := pg_catalog.pg_advisory_xact_lock_shared({class}, ((k >> 54) + 512)::integer)::text;
		SELECT o.hi >= k AND o.state = 'owned' INTO ok FROM shardvisor.ownership o WHERE o.lo <= k ORDER BY o.lo DESC LIMIT 1;
		IF ok IS NOT TRUE THEN PERFORM shardvisor.reject(k, '{tbl}', TG_OP); END IF;
		RETURN NEW;
	END IF;
	IF TG_OP = 'DELETE' THEN
		k := OLD.{col};
	ELSE
		k := NEW.{col};
		IF OLD.{col} IS DISTINCT FROM NEW.{col} THEN
			k2 := OLD.{col};
			IF k2 IS NULL THEN PERFORM shardvisor.reject(NULL, '{tbl}', TG_OP); END IF;
		END IF;
	END IF;
	IF k IS NULL THEN PERFORM shardvisor.reject(NULL, '{tbl}', TG_OP); END IF;
	IF current_setting('transaction_isolation') <> 'read committed' THEN
		PERFORM shardvisor.reject_isolation('{tbl}', TG_OP);
	END IF;
	g := ((k >> 54) + 512)::integer;
	IF k2 IS NULL THEN
		lk := pg_catalog.pg_advisory_xact_lock_shared({class}, g)::text;
	ELSE
		-- Both granules, ascending, so that writers and flips never deadlock.
		g2 := ((k2 >> 54) + 512)::integer;
		lk := pg_catalog.pg_advisory_xact_lock_shared({class}, least(g, g2))::text;
		IF g2 <> g THEN
			lk := pg_catalog.pg_advisory_xact_lock_shared({class}, greatest(g, g2))::text;
		END IF;
	END IF;
	SELECT o.hi >= k AND o.state = 'owned' INTO ok FROM shardvisor.ownership o WHERE o.lo <= k ORDER BY o.lo DESC LIMIT 1;
	IF ok IS NOT TRUE THEN PERFORM shardvisor.reject(k, '{tbl}', TG_OP); END IF;
	IF k2 IS NOT NULL THEN
		SELECT o.hi >= k2 AND o.state = 'owned' INTO ok FROM shardvisor.ownership o WHERE o.lo <= k2 ORDER BY o.lo DESC LIMIT 1;
		IF ok IS NOT TRUE THEN PERFORM shardvisor.reject(k2, '{tbl}', TG_OP); END IF;
	END IF;
	IF TG_OP = 'DELETE' THEN
		RETURN OLD;
	END IF;
	RETURN NEW;
END
`)
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func quoteLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

// qualified is the quoted schema.table of a validated table record.
func qualified(t topo.TableRecord) string {
	return quoteIdent(t.Schema()) + "." + quoteIdent(t.Table())
}
