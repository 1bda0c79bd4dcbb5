package fence

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
)

// The attacks of issue 13, part 2, each run as a role that is neither a
// superuser nor the owner of app.events: it may read and write app.events
// and owns a schema of its own, evil. The tests owner (the superuser that
// created app.events and prepared the fence) plays the admin.

// newAttacker creates such a role on node, with extra privileges on
// app.events (for example "TRIGGER" or "TRUNCATE"), and returns a
// connection as it. The role is dropped when the test ends.
// attackScene is the scene of every attack: one node, prepared as "a" of
// a two-node map at level 4 (a owns buckets 0..7), a connection as the
// table's owner and one as the attacker (granted extra as well).
type attackScene struct {
	m     *bucketmap.Map
	owner *pgx.Conn
	ev    *pgx.Conn
	ctx   context.Context
	node  *testenv.PGNode
}

func newAttackScene(t *testing.T, viaPooler bool, extra ...string) attackScene {
	t.Helper()
	pg := testenv.StartPGNodes(t, 1)
	m := testMap(t, 4, "a", "b")
	owner := prepared(t, pg.Nodes[0], m, "a")
	return attackScene{m: m, owner: owner, ev: attacker(t, pg.Nodes[0], viaPooler, extra...), ctx: ctxT(t), node: pg.Nodes[0]}
}

// attackBoth runs an attack on both ways into a node: a session of the
// attacker's own, and through the node's pooler in transaction mode
// (issue 42), where the attacker's statements run in server sessions the
// pooler lends it. The attacker is its pool's only client, so the pooler
// keeps lending it the one server session it opened, and the attacks
// that rely on a session SET still hold it; the fence must hold either
// way.
func attackBoth(t *testing.T, attack func(t *testing.T, sc attackScene), extra ...string) {
	for _, via := range []string{"direct", "pooler"} {
		t.Run(via, func(t *testing.T) { attack(t, newAttackScene(t, via == "pooler", extra...)) })
	}
}

func newAttacker(t *testing.T, node *testenv.PGNode, extra ...string) *pgx.Conn {
	return attacker(t, node, false, extra...)
}

func attacker(t *testing.T, node *testenv.PGNode, viaPooler bool, extra ...string) *pgx.Conn {
	t.Helper()
	ctx := ctxT(t)
	b := make([]byte, 6)
	rand.Read(b)
	role := "sv_attacker_" + hex.EncodeToString(b)
	pw := hex.EncodeToString(b) + "pw"
	admin, err := pgx.Connect(ctx, node.DSNWithPassword)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	privs := append([]string{"SELECT", "INSERT", "UPDATE", "DELETE"}, extra...)
	for _, sql := range []string{
		fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s' NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION`, role, pw),
		fmt.Sprintf(`GRANT USAGE ON SCHEMA app TO %s`, role),
		fmt.Sprintf(`GRANT %s ON app.events TO %s`, strings.Join(privs, ", "), role),
		fmt.Sprintf(`CREATE SCHEMA evil AUTHORIZATION %s`, role),
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// Registered before the attacker's connection, so it runs after that
	// connection is closed.
	t.Cleanup(func() {
		ctx := context.Background()
		c, err := pgx.Connect(ctx, node.DSNWithPassword)
		if err != nil {
			t.Errorf("dropping role %s: %v", role, err)
			return
		}
		defer c.Close(ctx)
		for _, sql := range []string{`DROP OWNED BY ` + role + ` CASCADE`, `DROP ROLE ` + role} {
			if _, err := c.Exec(ctx, sql); err != nil {
				t.Errorf("%s: %v", sql, err)
			}
		}
	})
	port, query := node.Port, testenv.SSLParams()
	if viaPooler {
		// No named prepared statements through PgBouncer 1.18, as the
		// router's pools (dbnode.AppPoolConfig).
		port, query = node.PoolPort, query+"&default_query_exec_mode=cache_describe"
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword(role, pw), Host: net.JoinHostPort(node.Host, strconv.Itoa(port)),
		Path: "/" + node.Database, RawQuery: query}
	c, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	var super, owner bool
	if err := c.QueryRow(ctx, `SELECT rolsuper, pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = 'app.events'::regclass), 'MEMBER') FROM pg_roles WHERE rolname = current_user`).Scan(&super, &owner); err != nil || super || owner {
		t.Fatalf("the attacker must be neither superuser (%v) nor owner (%v): %v", super, owner, err)
	}
	if viaPooler {
		// The pooler's admin console lists the attacker among its clients:
		// its statements do go through the pooler.
		cfg, err := pgx.ParseConfig(node.PoolDSNWithPassword)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Database, cfg.DefaultQueryExecMode = "pgbouncer", pgx.QueryExecModeSimpleProtocol
		admin, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(ctx)
		res, err := admin.PgConn().Exec(ctx, "SHOW CLIENTS").ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		seen := false
		for _, r := range res {
			for _, row := range r.Rows {
				for i, f := range r.FieldDescriptions {
					seen = seen || f.Name == "user" && string(row[i]) == role
				}
			}
		}
		if !seen {
			t.Fatalf("the pooler lists no client %s", role)
		}
	}
	return c
}

// lastOwned is the last key node "a" owns in testMap(4, "a", "b").
func lastOwned() int64 {
	_, hi, _ := keystream.Range(4, 7)
	return hi
}

func wantState(t *testing.T, err error, state string, has ...string) {
	t.Helper()
	if sqlState(err) != state {
		t.Fatalf("want SQLSTATE %s, got %v", state, err)
	}
	for _, h := range has {
		if !strings.Contains(err.Error(), h) {
			t.Fatalf("error %q does not mention %q", err, h)
		}
	}
}

func count(t *testing.T, c *pgx.Conn, where string, args ...any) int {
	t.Helper()
	var n int
	if err := c.QueryRow(context.Background(), `SELECT count(*) FROM app.events WHERE `+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Operators and functions of the attacker's own, first in its search_path,
// that make every comparison true and every isolation level READ
// COMMITTED: the fence must still use PostgreSQL's.
func TestIntegrationFenceHoldsAgainstSearchPathHijack(t *testing.T) {
	attackBoth(t, func(t *testing.T, sc attackScene) {
		owner, ev, ctx := sc.owner, sc.ev, sc.ctx
		exec(t, ev, `CREATE FUNCTION evil.yes(bigint, bigint) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT true'`)
		exec(t, ev, `CREATE FUNCTION evil.yes(text, text) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT true'`)
		for _, op := range []string{">=", "<=", "="} {
			exec(t, ev, fmt.Sprintf(`CREATE OPERATOR evil.%s (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.yes)`, op))
		}
		exec(t, ev, `CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.yes)`)
		exec(t, ev, `CREATE FUNCTION evil.current_setting(text) RETURNS text LANGUAGE sql AS $$SELECT 'read committed'::pg_catalog.text$$`)
		exec(t, ev, `SET search_path = evil, pg_catalog`)

		// The hijack is live in the attacker's session...
		var yes bool
		if err := ev.QueryRow(ctx, `SELECT 12::bigint >= 13::bigint AND 'a'::text = 'b'::text`).Scan(&yes); err != nil || !yes {
			t.Fatalf("the attacker's operators are not in effect: %v %v", yes, err)
		}
		// ...and the fence ignores it.
		wantRejected(t, insert(ev, keyIn(4, 12), 1), "does not own bucket 12")
		_, hi7, _ := keystream.Range(4, 7)
		wantRejected(t, insert(ev, hi7+1, 2), "bucket 8")
		if err := insert(ev, keyIn(4, 3), 3); err != nil {
			t.Fatalf("an owned insert under the hijack: %v", err)
		}
		// A row in an unowned range (put there by replication apply) cannot be
		// moved into an owned one: the hijacked = must not hide the key change.
		exec(t, owner, `SET session_replication_role = replica`)
		exec(t, owner, `INSERT INTO app.events VALUES ($1, 4, 'incoming')`, keyIn(4, 13))
		exec(t, owner, `RESET session_replication_role`)
		_, err := ev.Exec(ctx, `UPDATE app.events SET bkey = $1 WHERE id = 4`, keyIn(4, 2))
		wantRejected(t, err, "UPDATE", "bucket 13")
		// The hijacked current_setting must not let a write through above READ
		// COMMITTED.
		tx, err := ev.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		err = insert(ev, keyIn(4, 2), 5)
		tx.Rollback(ctx)
		wantState(t, err, SQLStateIsolation, "READ COMMITTED")
		// The application role may read the fence but never write it.
		_, err = ev.Exec(ctx, `INSERT INTO shardvisor.ownership VALUES (0, 1, 'owned', 99)`)
		wantState(t, err, "42501")
		_, err = ev.Exec(ctx, `CREATE FUNCTION shardvisor.reject(bigint, unknown, text) RETURNS void LANGUAGE sql AS ''`)
		wantState(t, err, "42501")

		if n := count(t, owner, `bkey > $1`, lastOwned()); n != 1 { // the replicated row only
			t.Fatalf("%d rows in unowned buckets, want 1 (the replicated one)", n)
		}
	})
}

// A type of the attacker's own named like the built-in one the fence casts
// to, with a cast path into it and a check that runs the attacker's code:
// the fence must not resolve it (nor run that code), and still refuse.
func TestIntegrationFenceHoldsAgainstCustomCast(t *testing.T) {
	attackBoth(t, func(t *testing.T, sc attackScene) {
		owner, ev, ctx := sc.owner, sc.ev, sc.ctx
		exec(t, ev, `CREATE TABLE evil.ran (at text)`)
		exec(t, ev, `CREATE FUNCTION evil.spy(v pg_catalog.text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO evil.ran VALUES (COALESCE(v, 'null'));
	RETURN true;
END $$`)
		// A cast to "text" in the fence lands on this domain, whose check runs
		// evil.spy; casts from bigint and int4 into it are the attacker's own.
		exec(t, ev, `CREATE DOMAIN evil.text AS pg_catalog.text CHECK (evil.spy(VALUE))`)
		exec(t, ev, `CREATE TYPE evil.int4 AS (v bigint)`)
		exec(t, ev, `CREATE FUNCTION evil.to_int4(bigint) RETURNS evil.int4 LANGUAGE sql AS 'SELECT ROW($1)::evil.int4'`)
		exec(t, ev, `CREATE CAST (bigint AS evil.int4) WITH FUNCTION evil.to_int4(bigint) AS IMPLICIT`)
		exec(t, ev, `SET search_path = evil, pg_catalog`)

		wantRejected(t, insert(ev, keyIn(4, 12), 1), "does not own bucket 12")
		if err := insert(ev, keyIn(4, 3), 2); err != nil {
			t.Fatalf("an owned insert with the attacker's types in the path: %v", err)
		}
		exec(t, ev, `RESET search_path`)
		var ran int
		if err := ev.QueryRow(ctx, `SELECT count(*) FROM evil.ran`).Scan(&ran); err != nil {
			t.Fatal(err)
		}
		if ran != 0 {
			t.Fatalf("the attacker's code ran %d times inside the fence (its type and cast were used)", ran)
		}
		if n := count(t, owner, `true`); n != 1 {
			t.Fatalf("%d rows, want 1", n)
		}
	})
}

// A BEFORE trigger that sorts after the fence's (here created by the
// attacker, which was granted TRIGGER on app.events) changes the bucket key
// after the fence looked at it: the row that lands must still be checked,
// and `node check` must name the trigger.
func TestIntegrationFenceChecksTheFinalRow(t *testing.T) {
	t.Parallel()
	attackBoth(t, func(t *testing.T, sc attackScene) {
		m, owner, ev, ctx := sc.m, sc.owner, sc.ev, sc.ctx
		exec(t, owner, `INSERT INTO app.events VALUES ($1, 1, 'mine')`, keyIn(4, 1))
		exec(t, ev, `CREATE FUNCTION evil.rekey() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	NEW.bkey := TG_ARGV[0]::bigint;
	RETURN NEW;
END $$`)
		exec(t, ev, fmt.Sprintf(`CREATE TRIGGER zzz_rekey BEFORE INSERT OR UPDATE ON app.events FOR EACH ROW EXECUTE FUNCTION evil.rekey('%d')`, keyIn(4, 12)))
		if TriggerName >= "zzz_rekey" {
			t.Fatalf("zzz_rekey must sort after %s", TriggerName)
		}

		wantRejected(t, insert(ev, keyIn(4, 3), 2), "INSERT", "bucket 12")
		_, err := ev.Exec(ctx, `UPDATE app.events SET body = 'moved' WHERE bkey = $1 AND id = 1`, keyIn(4, 1))
		wantRejected(t, err, "UPDATE", "bucket 12")
		// COPY too.
		_, err = ev.CopyFrom(ctx, pgx.Identifier{"app", "events"}, []string{"bkey", "id"}, pgx.CopyFromRows([][]any{{keyIn(4, 2), int64(3)}}))
		wantRejected(t, err, "bucket 12")
		if n := count(t, owner, `bkey > $1`, lastOwned()); n != 0 {
			t.Fatalf("%d rows landed in unowned buckets", n)
		}

		mm, err := CheckFence(ctx, owner, "c1", []topo.TableRecord{events}, m, "a")
		if err != nil {
			t.Fatal(err)
		}
		var found bool
		for _, x := range mm {
			t.Logf("%s: %s", x.Kind, x.Message)
			found = found || (x.Kind == KindTriggerAfterFence && x.Table == "app.events" && strings.Contains(x.Message, "zzz_rekey"))
		}
		if !found || len(mm) != 1 {
			t.Fatalf("check must report zzz_rekey (and nothing else): %+v", mm)
		}
		// A trigger that sorts before the fence (the app computing its key) is
		// what the contract expects: not reported, and its key is checked.
		exec(t, owner, `DROP TRIGGER zzz_rekey ON app.events`)
		exec(t, owner, fmt.Sprintf(`CREATE TRIGGER aa_rekey BEFORE INSERT ON app.events FOR EACH ROW EXECUTE FUNCTION evil.rekey('%d')`, keyIn(4, 5)))
		if err := insert(ev, keyIn(4, 12), 4); err != nil {
			t.Fatalf("the key computed before the fence is owned: %v", err)
		}
		if mm, err := CheckFence(ctx, owner, "c1", []topo.TableRecord{events}, m, "a"); err != nil || len(mm) != 0 {
			t.Fatalf("a trigger sorting before the fence: %+v %v", mm, err)
		}
	}, "TRIGGER")
}

// TRUNCATE empties every bucket at once, owned or not: refused unless an
// admin (the owner or a superuser) turns shardvisor.allow_truncate on.
func TestIntegrationTruncateGuard(t *testing.T) {
	t.Parallel()
	attackBoth(t, func(t *testing.T, sc attackScene) {
		owner, ev, ctx := sc.owner, sc.ev, sc.ctx
		exec(t, owner, `INSERT INTO app.events VALUES ($1, 1, 'x')`, keyIn(4, 1))

		_, err := ev.Exec(ctx, `TRUNCATE app.events`)
		wantState(t, err, SQLStateTruncate, "TRUNCATE", "app.events")
		// The setting is a custom one: anybody can set it, so it is not enough
		// for a role that could not disable the guard anyway.
		exec(t, ev, `SET shardvisor.allow_truncate = on`)
		_, err = ev.Exec(ctx, `TRUNCATE app.events`)
		wantState(t, err, SQLStateTruncate, "owner")
		_, err = owner.Exec(ctx, `TRUNCATE app.events`)
		wantState(t, err, SQLStateTruncate, "shardvisor.allow_truncate")
		if n := count(t, owner, `true`); n != 1 {
			t.Fatalf("%d rows after refused TRUNCATEs, want 1", n)
		}
		exec(t, owner, `SET shardvisor.allow_truncate = on`)
		exec(t, owner, `TRUNCATE app.events`)
		if n := count(t, owner, `true`); n != 0 {
			t.Fatalf("%d rows after an allowed TRUNCATE", n)
		}
	}, "TRUNCATE")
}

// A stale client's UPDATE or DELETE sent to a node that does not own (or
// has frozen) the key matches no row there, so no row trigger fires: with
// shardvisor.owns it fails with SV001 instead of "0 rows", even though no
// row matches, because PostgreSQL evaluates it once before the scan.
func TestIntegrationMisroutedUpdateDeleteFail(t *testing.T) {
	t.Parallel()
	attackBoth(t, func(t *testing.T, sc attackScene) {
		owner, app, ctx := sc.owner, sc.ev, sc.ctx
		const del = `DELETE FROM app.events WHERE bkey = $1 AND id = $2 AND shardvisor.owns($1)`
		const upd = `UPDATE app.events SET body = 'y' WHERE bkey = $1 AND id = $2 AND shardvisor.owns($1)`

		// Without the check, the misrouted statements look acknowledged.
		for _, sql := range []string{`DELETE FROM app.events WHERE bkey = $1 AND id = $2`, `UPDATE app.events SET body = 'y' WHERE bkey = $1 AND id = $2`} {
			tag, err := app.Exec(ctx, sql, keyIn(4, 12), 1)
			if err != nil || tag.RowsAffected() != 0 {
				t.Fatalf("%s: %v %v", sql, tag, err)
			}
		}
		for _, sql := range []string{del, upd} {
			_, err := app.Exec(ctx, sql, keyIn(4, 12), 1)
			wantRejected(t, err, "shardvisor.owns", "does not own bucket 12")
		}
		// One evaluation before the scan, whether or not a row matches.
		var plan []string
		rows, err := app.Query(ctx, `EXPLAIN (COSTS OFF) `+del, keyIn(4, 12), 1)
		if err == nil {
			plan, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil || !strings.Contains(strings.Join(plan, "\n"), "One-Time Filter: shardvisor.owns(") {
			t.Fatalf("plan of a checked DELETE: %v\n%s", err, strings.Join(plan, "\n"))
		}
		// On the owner: ordinary results, including 0 rows for a missing row.
		exec(t, owner, `INSERT INTO app.events VALUES ($1, 1, 'x')`, keyIn(4, 6))
		for _, c := range []struct {
			sql  string
			id   int
			want int64
		}{{upd, 1, 1}, {upd, 2, 0}, {del, 2, 0}} {
			tag, err := app.Exec(ctx, c.sql, keyIn(4, 6), c.id)
			if err != nil || tag.RowsAffected() != c.want {
				t.Fatalf("%s (id %d) on the owner: %v %v, want %d rows", c.sql, c.id, tag, err, c.want)
			}
		}
		// Inside a move's write pause the source has frozen the bucket.
		lo, hi, _ := keystream.Range(4, 6)
		if _, err := Freeze(ctx, owner, lo, hi, 2); err != nil {
			t.Fatal(err)
		}
		for _, id := range []int{1, 2} { // the row exists / does not
			_, err := app.Exec(ctx, del, keyIn(4, 6), id)
			wantRejected(t, err, "bucket 6 at level 4 is frozen")
			_, err = app.Exec(ctx, upd, keyIn(4, 6), id)
			wantRejected(t, err, "frozen")
		}
		// ...and an incoming range is not writable either.
		lo12, hi12, _ := keystream.Range(4, 12)
		if _, err := SetIncoming(ctx, owner, lo12, hi12, 2); err != nil {
			t.Fatal(err)
		}
		_, err = app.Exec(ctx, del, keyIn(4, 12), 1)
		wantRejected(t, err, "still being moved to this node")
		// A null key (in a WHERE, bkey = NULL alone already matches nothing),
		// and an isolation level the fence cannot drain.
		var ok bool
		wantRejected(t, app.QueryRow(ctx, `SELECT shardvisor.owns(NULL)`).Scan(&ok), "null")
		tx, err := app.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		_, err = tx.Exec(ctx, del, keyIn(4, 3), 1)
		tx.Rollback(ctx)
		wantState(t, err, SQLStateIsolation)
		if n := count(t, owner, `true`); n != 1 {
			t.Fatalf("%d rows, want 1", n)
		}
		var pe *pgconn.PgError
		_, err = app.Exec(ctx, del, keyIn(4, 13), 1)
		if !errors.As(err, &pe) || !strings.Contains(pe.Detail, "node a") {
			t.Fatalf("the error names the node: %+v", pe)
		}
	})
}

// A node prepared by the previous version (one BEFORE INSERT OR UPDATE OR
// DELETE trigger, functions without a pinned search_path, no constraint,
// guard or shardvisor.owns), with PUBLIC granted INSERT on the ownership
// table besides: check names every difference, prepare repairs them all,
// and the hijack is then refused.
func TestIntegrationPrepareUpgradesVersion1(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPGNodes(t, 1)
	m := testMap(t, 4, "a", "b")
	c := prepared(t, pg.Nodes[0], m, "a")
	ctx := ctxT(t)
	fn := "shardvisor." + quoteIdent(funcName(events)) + "()"
	for _, sql := range []string{
		`DROP TRIGGER zz_shardvisor_fence_final ON app.events`,
		`DROP TRIGGER zz_shardvisor_truncate_guard ON app.events`,
		`ALTER TABLE app.events DROP CONSTRAINT zz_shardvisor_fence`,
		`CREATE OR REPLACE TRIGGER zz_shardvisor_fence BEFORE INSERT OR UPDATE OR DELETE ON app.events FOR EACH ROW EXECUTE FUNCTION ` + fn,
		`DROP FUNCTION shardvisor.owns(bigint), shardvisor.check_row(bigint, oid), shardvisor.truncate_guard()`,
		`ALTER FUNCTION shardvisor.reject(bigint, text, text) RESET ALL`,
		`ALTER FUNCTION shardvisor.reject_isolation(text, text) RESET ALL`,
		`ALTER FUNCTION ` + fn + ` RESET ALL`,
		`COMMENT ON FUNCTION ` + fn + ` IS 'shardvisor fence v1 for app.events (bkey)'`,
		`UPDATE shardvisor.fence_meta SET fence_version = 1`,
		`GRANT INSERT ON shardvisor.ownership TO PUBLIC`,
	} {
		exec(t, c, sql)
	}
	mm, err := CheckFence(ctx, c, "c1", []topo.TableRecord{events}, m, "a")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, x := range mm {
		got[x.Kind]++
		t.Logf("%s: %s", x.Kind, x.Message)
	}
	for kind, n := range map[string]int{KindFenceObjects: 7, KindTriggerMissing: 2, KindTriggerWrong: 1, KindConstraintMissing: 1, KindFencePrivileges: 1} {
		if got[kind] != n {
			t.Errorf("%d mismatches of kind %s, want %d", got[kind], kind, n)
		}
	}
	res, err := Install(ctx, c, "c1", "a", []topo.TableRecord{events})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("prepare: %q", res.Actions)
	if mm, err := CheckFence(ctx, c, "c1", []topo.TableRecord{events}, m, "a"); err != nil || len(mm) != 0 {
		t.Fatalf("after prepare: %+v %v", mm, err)
	}
	if res, err := Install(ctx, c, "c1", "a", []topo.TableRecord{events}); err != nil || len(res.Actions) != 0 {
		t.Fatalf("a second prepare changed things: %+v %v", res, err)
	}
	ev := newAttacker(t, pg.Nodes[0])
	exec(t, ev, `CREATE FUNCTION evil.yes(bigint, bigint) RETURNS boolean LANGUAGE sql AS 'SELECT true'`)
	exec(t, ev, `CREATE OPERATOR evil.>= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.yes)`)
	exec(t, ev, `CREATE OPERATOR evil.<= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.yes)`)
	exec(t, ev, `SET search_path = evil, pg_catalog`)
	wantRejected(t, insert(ev, keyIn(4, 12), 1), "bucket 12")
	_, err = ev.Exec(ctx, `INSERT INTO shardvisor.ownership VALUES (0, 1, 'owned', 99)`)
	wantState(t, err, "42501")
}
