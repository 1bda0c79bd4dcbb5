package fence

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/shardvisor/shardvisor/internal/sqlstate"
	"github.com/shardvisor/shardvisor/topo"
)

// Schema is the PostgreSQL schema that holds the fence on every db node.
const Schema = "shardvisor"

// Version is the version of the fence's SQL objects. `shardctl node
// prepare` replaces objects of another version; `node check` reports them.
// Version 2 pins search_path and qualifies every name in the functions,
// checks INSERTs and new rows with a CHECK constraint instead of the
// trigger, and adds the final UPDATE trigger, the TRUNCATE guard and
// shardvisor.owns.
const Version = 2

// The fence's objects on every sharded table.
const (
	// ConstraintName is the fence's check of the row as stored, a NOT
	// VALID CHECK constraint calling shardvisor.check_row(key, tableoid).
	// PostgreSQL evaluates CHECK constraints after every BEFORE trigger
	// (whatever their names, so no trigger can change the row after it)
	// and before the unique indexes and ON CONFLICT, so a misrouted INSERT
	// fails with SV001 rather than a unique violation, and it costs one
	// function call per row, as a row trigger did. NOT VALID because the
	// node holds rows it does not own (leftovers for GC, a move's copy),
	// which must never be validated. Constraints, unlike triggers, also
	// run for replication apply; check_row lets sessions with
	// session_replication_role = replica through, as triggers do.
	ConstraintName = "zz_shardvisor_fence"
	// TriggerName is the fence's trigger for UPDATE and DELETE, BEFORE
	// ROW: it checks the old row's key, which the constraint cannot see,
	// and both keys, with their lock granules in order, when an UPDATE
	// moves a row. It starts with "zz_" because PostgreSQL fires BEFORE
	// triggers in name order and it should see the row as the
	// application's own BEFORE triggers left it.
	TriggerName = "zz_shardvisor_fence"
	// FinalTrigger re-checks, AFTER UPDATE, a row whose key the stored row
	// does not share with the old one: a BEFORE trigger sorting after
	// TriggerName may have moved it out of a range this node does not own
	// after TriggerName let the update through. Its WHEN condition keeps
	// updates that keep the key from queueing anything.
	FinalTrigger = "zz_shardvisor_fence_final"
	// TruncateTrigger is the TRUNCATE guard, BEFORE TRUNCATE FOR EACH
	// STATEMENT (TRUNCATE fires no row trigger and checks no constraint).
	TruncateTrigger = "zz_shardvisor_truncate_guard"
)

// triggerNames are all of the fence's trigger names.
var triggerNames = []string{TriggerName, FinalTrigger, TruncateTrigger}

// AllowTruncate is the setting an admin turns on, in their own session, to
// TRUNCATE a sharded table: SET shardvisor.allow_truncate = on. It is a
// custom setting, which any role can set, so the guard also requires the
// role to be the table's owner or a superuser (who could drop the guard
// anyway): it stops accidents and every other role.
const AllowTruncate = "shardvisor.allow_truncate"

// SQLState is the SQLSTATE of a write the fence rejects: the node does not
// own the row's bucket (or the bucket is frozen for a move, or incoming),
// or the bucket key is null. shardvisor.owns raises it too. The message
// names the bucket, its level and the map version the fence is at. Class
// "SV" is not used by PostgreSQL.
const SQLState = sqlstate.FenceRejected

// SQLStateIsolation is the SQLSTATE of a fenced write attempted in a
// transaction above READ COMMITTED: such a transaction reads the ownership
// table through a snapshot that may predate a flip, so the fence cannot
// guarantee that it drains it.
const SQLStateIsolation = "SV002"

// SQLStateTruncate is the SQLSTATE of a TRUNCATE of a sharded table that
// the guard refused (see AllowTruncate). It is not SV001 because retrying
// elsewhere cannot help.
const SQLStateTruncate = "SV003"

// searchPath is pinned on every fence function, as PostgreSQL's "Writing
// SECURITY DEFINER Functions Safely" advises for any function that must
// not run a caller's objects: pg_catalog first, so nothing shadows a
// built-in, and pg_temp last (it is then never searched for functions or
// operators). The bodies also qualify every operator, function and cast,
// so they mean the same even without it.
const searchPath = "pg_catalog, pg_temp"

// schemaSQL creates the schema, the ownership and meta tables and their
// privileges. Every statement is idempotent, and the REVOKEs repair drift:
// every role may read the fence (the functions run as the writer, see
// docs/data-contract.md), none but its owner may write it or create
// objects in its schema.
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
	`REVOKE CREATE ON SCHEMA shardvisor FROM PUBLIC`,
	`GRANT USAGE ON SCHEMA shardvisor TO PUBLIC`,
	`REVOKE ALL ON shardvisor.ownership, shardvisor.fence_meta FROM PUBLIC`,
	`GRANT SELECT ON shardvisor.ownership, shardvisor.fence_meta TO PUBLIC`,
}

// qualify writes the {op} placeholders of the function bodies as
// OPERATOR(pg_catalog.op): an unqualified operator is looked up in the
// caller's search_path, where a role may have put its own.
var qualify = strings.NewReplacer(
	"{=}", "OPERATOR(pg_catalog.=)",
	"{<>}", "OPERATOR(pg_catalog.<>)",
	"{<=}", "OPERATOR(pg_catalog.<=)",
	"{>=}", "OPERATOR(pg_catalog.>=)",
	"{>}", "OPERATOR(pg_catalog.>)",
	"{<}", "OPERATOR(pg_catalog.<)",
	"{>>}", "OPERATOR(pg_catalog.>>)",
	"{<<}", "OPERATOR(pg_catalog.<<)",
	"{+}", "OPERATOR(pg_catalog.+)",
	"{-}", "OPERATOR(pg_catalog.-)",
)

// function is one of the fence's PL/pgSQL functions in schema shardvisor.
// All are SECURITY INVOKER (they run as the writer; docs/data-contract.md
// says why) with search_path pinned.
type function struct {
	name    string
	params  string // as declared: "k bigint, tbl text"
	args    string // argument types, for to_regprocedure: "bigint, text"
	returns string
	stable  bool   // else volatile
	body    string // between the $fn$ quotes, operators qualified
	comment string // for trigger functions: marks them as the fence's
}

func (f function) signature() string { return "shardvisor." + quoteIdent(f.name) + "(" + f.args + ")" }

// String is the signature for people (the names need no quotes).
func (f function) String() string { return "shardvisor." + f.name + "(" + f.args + ")" }

func (f function) createSQL() string {
	vol := "VOLATILE"
	if f.stable {
		vol = "STABLE"
	}
	return fmt.Sprintf("CREATE OR REPLACE FUNCTION shardvisor.%s(%s) RETURNS %s LANGUAGE plpgsql %s SECURITY INVOKER SET search_path = %s AS $fn$%s$fn$",
		quoteIdent(f.name), f.params, f.returns, vol, searchPath, f.body)
}

// rejectFn explains a rejected write. It only runs on the error path, so it
// may take its time: it reads the meta row and the ownership row again.
// tbl is null when shardvisor.owns calls it (op then says it all).
var rejectFn = function{name: "reject", params: "k bigint, tbl text, op text", args: "bigint, text, text", returns: "void", body: qualify.Replace(`
DECLARE
	m record;
	o record;
	lvl integer := 0;
	mv bigint := 0;
	b bigint := 0;
	what pg_catalog.text;
	act pg_catalog.text := op;
BEGIN
	IF tbl IS NOT NULL THEN act := pg_catalog.format('%s on %s', op, tbl); END IF;
	SELECT f.level, f.map_version, f.node INTO m FROM shardvisor.fence_meta f;
	IF FOUND THEN lvl := m.level; mv := m.map_version; END IF;
	IF k IS NULL THEN
		RAISE EXCEPTION USING ERRCODE = 'SV001',
			MESSAGE = pg_catalog.format('shardvisor fence: %s rejected: the bucket key is null (fence at map version %s)', act, mv),
			HINT = 'Set the bucket key column to keystream Key(Prefix64(user id)).';
	END IF;
	IF lvl {>} 0 THEN b := (k {>>} (64 {-} lvl)) {+} (1::pg_catalog.int8 {<<} (lvl {-} 1)); END IF;
	SELECT x.lo, x.hi, x.state, x.epoch INTO o FROM shardvisor.ownership x WHERE x.lo {<=} k ORDER BY x.lo DESC LIMIT 1;
	IF FOUND AND o.hi {>=} k AND o.state {=} 'frozen' THEN
		what := pg_catalog.format('bucket %s at level %s is frozen for a move away from this node (since map version %s)', b, lvl, o.epoch);
	ELSIF FOUND AND o.hi {>=} k AND o.state {=} 'incoming' THEN
		what := pg_catalog.format('bucket %s at level %s is still being moved to this node (incoming since map version %s)', b, lvl, o.epoch);
	ELSE
		what := pg_catalog.format('this node does not own bucket %s at level %s', b, lvl);
	END IF;
	RAISE EXCEPTION USING ERRCODE = 'SV001',
		MESSAGE = pg_catalog.format('shardvisor fence: %s rejected: %s; fence at map version %s', act, what, mv),
		DETAIL = pg_catalog.format('bucket key %s, node %s', k, COALESCE(m.node, '?')),
		HINT = 'Re-read the bucket map and send the write to the bucket''s owner; while a bucket moves, wait and retry.';
END
`)}

var rejectIsolationFn = function{name: "reject_isolation", params: "tbl text, op text", args: "text, text", returns: "void", body: qualify.Replace(`
DECLARE
	act pg_catalog.text := op;
BEGIN
	IF tbl IS NOT NULL THEN act := pg_catalog.format('%s on %s', op, tbl); END IF;
	RAISE EXCEPTION USING ERRCODE = 'SV002',
		MESSAGE = pg_catalog.format('shardvisor fence: %s rejected: fenced writes must run at READ COMMITTED, not %s', act, pg_catalog.current_setting('transaction_isolation')),
		HINT = 'Run writes to sharded tables at READ COMMITTED (the PostgreSQL default); see docs/data-contract.md.';
END
`)}

// ownsFn is shardvisor.owns(key): true if this node owns key, else SV001
// (SV002 above READ COMMITTED). Applications add it to UPDATE and DELETE
// (WHERE bkey = $1 AND shardvisor.owns($1)) so that a misrouted statement
// that matches no row fails instead of answering "0 rows": the row
// triggers never fire without a row. STABLE with only parameters for
// arguments, PostgreSQL evaluates it once, as a one-time filter before the
// scan, with the statement's snapshot; the row triggers still check every
// row the statement touches, under the lock granule, with a fresh one. It
// takes no lock: waiting for a flip would not let it see the flip.
var ownsFn = function{name: "owns", params: "k bigint", args: "bigint", returns: "boolean", stable: true, body: qualify.Replace(`
DECLARE
	ok boolean;
BEGIN
	IF k IS NULL THEN PERFORM shardvisor.reject(NULL::pg_catalog.int8, NULL::pg_catalog.text, 'shardvisor.owns'::pg_catalog.text); END IF;
	IF pg_catalog.current_setting('transaction_isolation') {<>} 'read committed' THEN
		PERFORM shardvisor.reject_isolation(NULL::pg_catalog.text, 'shardvisor.owns'::pg_catalog.text);
	END IF;
	SELECT o.hi {>=} k AND o.state {=} 'owned' INTO ok FROM shardvisor.ownership o WHERE o.lo {<=} k ORDER BY o.lo DESC LIMIT 1;
	IF ok IS NOT TRUE THEN PERFORM shardvisor.reject(k, NULL::pg_catalog.text, pg_catalog.format('shardvisor.owns(%s)', k)); END IF;
	RETURN true;
END
`)}

// checkRowFn is the CHECK constraint's function: the row as stored (for
// INSERT, COPY, and the new row of an UPDATE) must have an owned key. It
// takes the same steps as the trigger (triggerBody).
var checkRowFn = function{name: "check_row", params: "k bigint, tbl oid", args: "bigint, oid", returns: "boolean", body: qualify.Replace(strings.ReplaceAll(`
DECLARE
	ok boolean;
	lk pg_catalog.text;
BEGIN
	-- Replication apply (a move's copy) and GC run as replica; the fence's
	-- triggers do not fire for them and neither may this.
	IF pg_catalog.current_setting('session_replication_role') {=} 'replica' THEN RETURN true; END IF;
	IF k IS NULL THEN PERFORM shardvisor.reject(NULL::pg_catalog.int8, tbl::pg_catalog.regclass::pg_catalog.text, 'INSERT or UPDATE'::pg_catalog.text); END IF;
	IF pg_catalog.current_setting('transaction_isolation') {<>} 'read committed' THEN
		PERFORM shardvisor.reject_isolation(tbl::pg_catalog.regclass::pg_catalog.text, 'INSERT or UPDATE'::pg_catalog.text);
	END IF;
	lk := pg_catalog.pg_advisory_xact_lock_shared({class}, ((k {>>} 54) {+} 512)::pg_catalog.int4)::pg_catalog.text;
	SELECT o.hi {>=} k AND o.state {=} 'owned' INTO ok FROM shardvisor.ownership o WHERE o.lo {<=} k ORDER BY o.lo DESC LIMIT 1;
	IF ok IS NOT TRUE THEN PERFORM shardvisor.reject(k, tbl::pg_catalog.regclass::pg_catalog.text, 'INSERT or UPDATE'::pg_catalog.text); END IF;
	RETURN true;
END
`, "{class}", fmt.Sprint(LockClass)))}

// truncateGuardFn refuses a TRUNCATE of a sharded table (it would empty
// owned and unowned buckets alike, and replicas of a move ignore it)
// unless AllowTruncate is on and the role could drop the guard anyway.
var truncateGuardFn = function{name: "truncate_guard", returns: "trigger", body: qualify.Replace(`
DECLARE
	tbl_owner pg_catalog.oid;
BEGIN
	IF COALESCE(pg_catalog.current_setting('shardvisor.allow_truncate', true), '') {=} 'on' THEN
		SELECT c.relowner INTO tbl_owner FROM pg_catalog.pg_class c WHERE c.oid {=} TG_RELID;
		IF pg_catalog.pg_has_role(CURRENT_USER, tbl_owner, 'USAGE'::pg_catalog.text) THEN
			RETURN NULL;
		END IF;
		RAISE EXCEPTION USING ERRCODE = 'SV003',
			MESSAGE = pg_catalog.format('shardvisor fence: TRUNCATE of %s.%s refused: only its owner or a superuser may truncate a sharded table, even with shardvisor.allow_truncate on', TG_TABLE_SCHEMA, TG_TABLE_NAME),
			HINT = 'Delete rows by key range, or ask an admin; see docs/data-contract.md.';
	END IF;
	RAISE EXCEPTION USING ERRCODE = 'SV003',
		MESSAGE = pg_catalog.format('shardvisor fence: TRUNCATE of %s.%s refused: it empties every bucket, owned or not; an admin who means it sets shardvisor.allow_truncate = on first', TG_TABLE_SCHEMA, TG_TABLE_NAME),
		HINT = 'As the table''s owner or a superuser: SET shardvisor.allow_truncate = on; see docs/data-contract.md.';
END
`)}

// sharedFunctions are the functions every node has, whatever its tables.
var sharedFunctions = []function{rejectFn, rejectIsolationFn, checkRowFn, ownsFn, truncateGuardFn}

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

// tableFunction is the trigger function of a sharded table.
func tableFunction(t topo.TableRecord) function {
	return function{name: funcName(t), returns: "trigger", body: triggerBody(t), comment: funcComment(t)}
}

// triggerBody is the trigger function's body for one table, for UPDATE
// and DELETE (INSERT has only the constraint). The order of its steps is
// the fence's correctness argument (docs/data-contract.md), and
// shardvisor.check_row takes the same ones:
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
// An UPDATE that keeps the key is left to the constraint, which checks the
// row as stored, whose key is then the old row's. FinalTrigger runs the
// same function after the update when the stored key differs from the old
// one (its return value is ignored).
//
// The lock is taken by assignment rather than PERFORM: PL/pgSQL evaluates
// an assignment as a simple expression, without a trip through the
// executor.
func triggerBody(t topo.TableRecord) string {
	col := quoteIdent(t.KeyColumn)
	r := strings.NewReplacer("{col}", col, "{class}", fmt.Sprint(LockClass), "{tbl}", t.Name)
	return qualify.Replace(r.Replace(`
DECLARE
	k bigint;
	k2 bigint;
	g integer;
	g2 integer;
	ok boolean;
	lk pg_catalog.text;
BEGIN
	IF TG_OP {=} 'DELETE' THEN
		k := OLD.{col};
		IF k IS NULL THEN PERFORM shardvisor.reject(NULL::pg_catalog.int8, '{tbl}'::pg_catalog.text, TG_OP); END IF;
	ELSE
		k := NEW.{col};
		k2 := OLD.{col};
		IF k IS NULL OR k2 IS NULL THEN PERFORM shardvisor.reject(NULL::pg_catalog.int8, '{tbl}'::pg_catalog.text, TG_OP); END IF;
		IF k2 {=} k THEN
			-- The constraint checks the row as stored.
			RETURN NEW;
		END IF;
	END IF;
	IF pg_catalog.current_setting('transaction_isolation') {<>} 'read committed' THEN
		PERFORM shardvisor.reject_isolation('{tbl}'::pg_catalog.text, TG_OP);
	END IF;
	g := ((k {>>} 54) {+} 512)::pg_catalog.int4;
	IF k2 IS NULL THEN
		lk := pg_catalog.pg_advisory_xact_lock_shared({class}, g)::pg_catalog.text;
	ELSE
		-- Both granules, ascending, so that writers and flips never deadlock.
		g2 := ((k2 {>>} 54) {+} 512)::pg_catalog.int4;
		IF g2 {<} g THEN
			lk := pg_catalog.pg_advisory_xact_lock_shared({class}, g2)::pg_catalog.text;
			lk := pg_catalog.pg_advisory_xact_lock_shared({class}, g)::pg_catalog.text;
		ELSE
			lk := pg_catalog.pg_advisory_xact_lock_shared({class}, g)::pg_catalog.text;
			IF g2 {<>} g THEN
				lk := pg_catalog.pg_advisory_xact_lock_shared({class}, g2)::pg_catalog.text;
			END IF;
		END IF;
	END IF;
	SELECT o.hi {>=} k AND o.state {=} 'owned' INTO ok FROM shardvisor.ownership o WHERE o.lo {<=} k ORDER BY o.lo DESC LIMIT 1;
	IF ok IS NOT TRUE THEN PERFORM shardvisor.reject(k, '{tbl}'::pg_catalog.text, TG_OP); END IF;
	IF k2 IS NOT NULL THEN
		SELECT o.hi {>=} k2 AND o.state {=} 'owned' INTO ok FROM shardvisor.ownership o WHERE o.lo {<=} k2 ORDER BY o.lo DESC LIMIT 1;
		IF ok IS NOT TRUE THEN PERFORM shardvisor.reject(k2, '{tbl}'::pg_catalog.text, TG_OP); END IF;
	END IF;
	IF TG_OP {=} 'DELETE' THEN
		RETURN OLD;
	END IF;
	RETURN NEW;
END
`))
}

// trigger is one of the fence's triggers on a sharded table.
type trigger struct {
	name   string
	tgtype int16  // pg_trigger.tgtype: ROW 1 | BEFORE 2 | INSERT 4 | DELETE 8 | UPDATE 16 | TRUNCATE 32
	when   bool   // has a WHEN condition
	fn     string // the function, as regprocedure text
	create string // CREATE OR REPLACE TRIGGER statement
}

// tableTriggers are the fence's triggers on table t.
func tableTriggers(t topo.TableRecord) []trigger {
	fn := "shardvisor." + quoteIdent(funcName(t)) + "()"
	col := quoteIdent(t.KeyColumn)
	mk := func(name string, tgtype int16, when bool, fn, spec string) trigger {
		return trigger{name: name, tgtype: tgtype, when: when, fn: fn,
			create: fmt.Sprintf("CREATE OR REPLACE TRIGGER %s %s", quoteIdent(name), strings.ReplaceAll(spec, "{t}", qualified(t)))}
	}
	return []trigger{
		mk(TriggerName, 1|2|8|16, false, fn, "BEFORE UPDATE OR DELETE ON {t} FOR EACH ROW EXECUTE FUNCTION "+fn),
		mk(FinalTrigger, 1|16, true, fn, fmt.Sprintf("AFTER UPDATE ON {t} FOR EACH ROW WHEN ((OLD.%s OPERATOR(pg_catalog.=) NEW.%s) IS NOT TRUE) EXECUTE FUNCTION %s", col, col, fn)),
		mk(TruncateTrigger, 2|32, false, "shardvisor.truncate_guard()", "BEFORE TRUNCATE ON {t} FOR EACH STATEMENT EXECUTE FUNCTION shardvisor.truncate_guard()"),
	}
}

// constraintSQL adds the fence's CHECK constraint to table t. The cast is
// resolved now, not when rows are written, and is a no-op for the bigint
// key the contract asks for. A replica session (replication apply, a
// move's copy, GC) is let through before check_row is called, as check_row
// itself would: the call, with its pinned search_path saved and restored
// for every row, cost about a third of the target's CPU in a move's copy.
// Only a superuser can make a session a replica.
func constraintSQL(t topo.TableRecord) string {
	return fmt.Sprintf("ALTER TABLE %s ADD CONSTRAINT %s CHECK (%s OR shardvisor.check_row(%s::pg_catalog.int8, tableoid)) NOT VALID",
		qualified(t), quoteIdent(ConstraintName), replicaTest, quoteIdent(t.KeyColumn))
}

// replicaTest is the constraint's test for a replica session, every name
// qualified.
const replicaTest = `pg_catalog.current_setting('session_replication_role'::pg_catalog.text) OPERATOR(pg_catalog.=) 'replica'::pg_catalog.text`

// constraintCurrent is constraintOK for a constraint that also lets
// replica sessions through before calling check_row (constraintSQL):
// Install replaces an older fence constraint, which `node check` still
// accepts (it fences the same writes, more slowly for replication).
const constraintCurrent = constraintOK + `
	AND pg_catalog.pg_get_constraintdef(c.oid) LIKE '%session_replication_role%'`

// constraintOK is the condition on pg_constraint (alias c) under which the
// constraint named $2 on table $1 is the fence's for key column number $3:
// a CHECK on that column and tableoid (attribute -6), inherited by
// partitions and children, that calls shardvisor.check_row.
const constraintOK = `c.conrelid = $1 AND c.conname = $2 AND c.contype = 'c' AND NOT c.connoinherit
	AND c.conkey::int2[] @> ARRAY[$3::int2, -6::int2] AND cardinality(c.conkey) = 2
	AND EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_constraint'::regclass AND d.objid = c.oid
		AND d.refclassid = 'pg_proc'::regclass AND d.refobjid = to_regprocedure('shardvisor.check_row(bigint, oid)'))`

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func quoteLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

// qualified is the quoted schema.table of a validated table record.
func qualified(t topo.TableRecord) string {
	return quoteIdent(t.Schema()) + "." + quoteIdent(t.Table())
}
