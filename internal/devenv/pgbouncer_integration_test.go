package devenv_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/internal/testenv"
)

// withUser is dsn with user and password in place of its own.
func withUser(t *testing.T, dsn, user, password string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, password)
	return u.String()
}

// withParam is dsn with one more query parameter.
func withParam(dsn, kv string) string {
	if strings.Contains(dsn, "?") {
		return dsn + "&" + kv
	}
	return dsn + "?" + kv
}

// poolerServes checks node i's PgBouncer (transaction mode) with real
// clients through e.NodePoolDSN(i): pgx in cache_describe mode on one
// connection, a transaction's SET LOCAL, a wrong password refused, a
// second role (no superuser) logged in as itself and no role without a
// password, the admin console for postgres, psycopg 3 and psycopg2.
func poolerServes(t *testing.T, e *devenv.Env, i int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn := e.NodePoolDSN(i)

	t.Run("pgx cache_describe on one connection", func(t *testing.T) {
		cfg, err := pgxpool.ParseConfig(withParam(dsn, "default_query_exec_mode=cache_describe"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 1
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		for k := range 10 {
			var got int
			var s string
			if err := pool.QueryRow(ctx, "SELECT $1::int * 2, $2::text || '!'", k, "x"+strconv.Itoa(k)).Scan(&got, &s); err != nil {
				t.Fatalf("query %d through the pooler: %v", k, err)
			}
			if got != 2*k || s != "x"+strconv.Itoa(k)+"!" {
				t.Fatalf("query %d: got %d %q, want %d %q", k, got, s, 2*k, "x"+strconv.Itoa(k)+"!")
			}
		}
	})

	t.Run("a transaction sees its SET LOCAL", func(t *testing.T) {
		c, err := pgx.Connect(ctx, withParam(dsn, "default_query_exec_mode=cache_describe"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var in, app string
		if _, err := tx.Exec(ctx, "SET LOCAL statement_timeout = '4321ms'"); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SET LOCAL application_name = 'pool-probe'"); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, "SELECT current_setting('statement_timeout'), current_setting('application_name')").Scan(&in, &app); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if in != "4321ms" || app != "pool-probe" {
			t.Errorf("inside the transaction: statement_timeout %q, application_name %q; want its SET LOCALs", in, app)
		}
		var after string
		if err := c.QueryRow(ctx, "SELECT current_setting('statement_timeout')").Scan(&after); err != nil || after == "4321ms" {
			t.Errorf("after the commit: statement_timeout %q (%v), want the default", after, err)
		}
	})

	t.Run("a wrong password is refused", func(t *testing.T) {
		if err := testenv.Exec(ctx, withUser(t, dsn, "postgres", "wrong"), "SELECT 1"); !authFailed(err) {
			t.Fatalf("postgres with a wrong password: %v, want refused", err)
		}
	})

	t.Run("a second role logs in as itself", func(t *testing.T) {
		role := "pool_probe_" + strconv.Itoa(os.Getpid())
		admin, err := pgx.Connect(ctx, e.NodeDSN(i))
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(context.Background())
		if _, err := admin.Exec(ctx, "DROP ROLE IF EXISTS "+role+"; CREATE ROLE "+role+" LOGIN NOSUPERUSER PASSWORD 'probe-pw'"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
		var user, super string
		c, err := pgx.Connect(ctx, withUser(t, dsn, role, "probe-pw"))
		if err != nil {
			t.Fatalf("%s through the pooler: %v", role, err)
		}
		err = c.QueryRow(ctx, "SELECT current_user, current_setting('is_superuser')").Scan(&user, &super)
		c.Close(ctx)
		if err != nil || user != role || super != "off" {
			t.Errorf("through the pooler: current_user %q, is_superuser %q (%v); want %s, off", user, super, err, role)
		}
		if err := testenv.Exec(ctx, withUser(t, dsn, role, "postgres-pw?"), "SELECT 1"); !authFailed(err) {
			t.Errorf("%s with a wrong password: %v, want refused", role, err)
		}
		// A role without a password (the moves' stream user) has nothing
		// to log in with.
		if err := testenv.Exec(ctx, withUser(t, dsn, devenv.StreamUser, "x"), "SELECT 1"); err == nil {
			t.Errorf("%s logged in through the pooler", devenv.StreamUser)
		}
	})

	// A database's owner points its search_path at functions and
	// operators of its own: the pooler's auth_query, which runs there as
	// the superuser before any client is authenticated, must not run
	// them.
	t.Run("auth_query ignores a database's search_path", func(t *testing.T) {
		suffix := strconv.Itoa(os.Getpid())
		owner, db := "pool_dbowner_"+suffix, "pool_evil_"+suffix
		admin, err := pgx.Connect(ctx, e.NodeDSN(i))
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(context.Background())
		for _, q := range []string{"DROP DATABASE IF EXISTS " + db, "DROP ROLE IF EXISTS " + owner,
			"CREATE ROLE " + owner + " LOGIN NOSUPERUSER PASSWORD 'owner-pw'", "CREATE DATABASE " + db + " OWNER " + owner} {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		t.Cleanup(func() {
			_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
			_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+owner)
		})
		u, err := url.Parse(e.NodeDSN(i))
		if err != nil {
			t.Fatal(err)
		}
		u.User, u.Path = url.UserPassword(owner, "owner-pw"), "/"+db
		oc, err := pgx.Connect(ctx, u.String())
		if err != nil {
			t.Fatal(err)
		}
		defer oc.Close(context.Background())
		for _, q := range []string{
			`CREATE SCHEMA evil`,
			`CREATE TABLE evil.ran (who text)`,
			`GRANT ALL ON SCHEMA evil TO PUBLIC`, `GRANT ALL ON evil.ran TO PUBLIC`,
			`CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql AS $$INSERT INTO evil.ran VALUES (current_user) RETURNING pg_catalog.now()$$`,
			`CREATE FUNCTION evil.eq(name, text) RETURNS boolean LANGUAGE sql AS $$INSERT INTO evil.ran VALUES (current_user) RETURNING true$$`,
			`CREATE OPERATOR evil.= (LEFTARG = name, RIGHTARG = text, FUNCTION = evil.eq)`,
			`ALTER DATABASE ` + db + ` SET search_path = evil, pg_catalog`,
		} {
			if _, err := oc.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		// Logins through the pooler to that database: a right password
		// and a wrong one each make the pooler run its auth_query there.
		pu, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		pu.Path = "/" + db
		if err := testenv.Exec(ctx, withUser(t, pu.String(), owner, "owner-pw"), "SELECT 1"); err != nil {
			t.Fatalf("the owner through the pooler: %v", err)
		}
		_ = testenv.Exec(ctx, withUser(t, pu.String(), owner, "wrong"), "SELECT 1")
		var ran int
		if err := oc.QueryRow(ctx, `SELECT count(*) FROM evil.ran`).Scan(&ran); err != nil {
			t.Fatal(err)
		}
		if ran != 0 {
			t.Fatalf("the database owner's functions ran %d times in the pooler's auth_query", ran)
		}
	})

	t.Run("admin console for postgres", func(t *testing.T) {
		u, err := url.Parse(withParam(dsn, "default_query_exec_mode=simple_protocol"))
		if err != nil {
			t.Fatal(err)
		}
		u.Path = "/pgbouncer"
		c, err := pgx.Connect(ctx, u.String())
		if err != nil {
			t.Fatalf("the admin console as postgres: %v", err)
		}
		defer c.Close(ctx)
		for _, show := range []string{"SHOW POOLS", "SHOW STATS"} {
			rows, err := c.Query(ctx, show)
			if err != nil {
				t.Fatalf("%s: %v", show, err)
			}
			var dbs []string
			for rows.Next() {
				v, err := rows.Values()
				if err != nil {
					t.Fatal(err)
				}
				dbs = append(dbs, v[0].(string))
			}
			if rows.Err() != nil || !strings.Contains(strings.Join(dbs, ","), "postgres") {
				t.Errorf("%s: databases %v (%v), want postgres among them", show, dbs, rows.Err())
			}
		}
	})

	t.Run("psycopg 3 and psycopg2", func(t *testing.T) {
		const py = "/usr/bin/python3"
		if _, err := os.Stat(py); err != nil {
			t.Skip("no " + py)
		}
		// psycopg 3 prepares a statement run 5 times: not through a
		// transaction pooler (prepare_threshold=None).
		script := `
import os, sys
dsn = os.environ["DSN"]
import psycopg, psycopg2
with psycopg.connect(dsn, prepare_threshold=None) as c:
    got = [c.execute("SELECT %s::int + 1", (k,)).fetchone()[0] for k in range(10)]
    assert got == list(range(1, 11)), got
    with c.transaction():
        c.execute("SET LOCAL statement_timeout = '1234ms'")
        assert c.execute("SHOW statement_timeout").fetchone()[0] == "1234ms"
c = psycopg2.connect(dsn)
cur = c.cursor()
for k in range(10):
    cur.execute("SELECT %s::int + 1", (k,))
    assert cur.fetchone()[0] == k + 1
c.commit()
c.close()
print("ok")
`
		cmd := exec.Command(py, "-c", script)
		cmd.Env = append(os.Environ(), "DSN="+dsn)
		out, err := cmd.CombinedOutput()
		if strings.Contains(string(out), "ModuleNotFoundError") {
			t.Skipf("%s lacks psycopg or psycopg2 (scripts/install-deps installs them): %s", py, out)
		}
		if err != nil || strings.TrimSpace(string(out)) != "ok" {
			t.Fatalf("python through the pooler: %v\n%s", err, out)
		}
	})
}

// authFailed: PgBouncer refused the login's password ("SASL
// authentication failed", which 1.18 sends as SQLSTATE 08P01).
func authFailed(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && strings.Contains(pe.Message, "authentication failed")
}

// poolerProcesses are the pgbouncer processes whose command line names a
// file under dir (pgrep).
func poolerProcesses(t *testing.T, dir string) []string {
	t.Helper()
	out, err := exec.Command("pgrep", "-a", "-f", "pgbouncer "+dir+"/").Output()
	var xe *exec.ExitError
	if errors.As(err, &xe) && xe.ExitCode() == 1 {
		return nil // none
	}
	if err != nil {
		t.Fatalf("pgrep: %v", err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// poolerOverTLSOnly: with TLS, the PgBouncer of each server on ports
// refuses a plain client and one that verifies it against another CA, and
// serves over TLS one that verifies it against the environment's CA
// (verify-full: the server's names).
func poolerOverTLSOnly(t *testing.T, e *devenv.Env, ports map[string]int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rogue := rogueCA(t)
	for name, port := range ports {
		dsn := func(ssl string) string {
			return "postgres://postgres:" + e.Password() + "@127.0.0.1:" + strconv.Itoa(port) + "/postgres?connect_timeout=5&" + ssl
		}
		if err := testenv.Exec(ctx, dsn("sslmode=disable"), "SELECT 1"); err == nil {
			t.Errorf("%s: a plain client got in", name)
		}
		if err := testenv.Exec(ctx, dsn("sslmode=verify-full&sslrootcert="+rogue), "SELECT 1"); err == nil {
			t.Errorf("%s: a client trusting another CA got in", name)
		}
		if err := testenv.Exec(ctx, dsn("sslmode=verify-full&sslrootcert="+e.TLSFiles("").CA), "SELECT 1"); err != nil {
			t.Errorf("%s: verify-full with the environment's CA: %v", name, err)
		}
	}
}

// poolerServers is how many server connections node i's PgBouncer holds
// for database db, in any state (SHOW POOLS through its admin console).
func poolerServers(t *testing.T, e *devenv.Env, i int, db string) int {
	t.Helper()
	u, err := url.Parse(withParam(e.NodePoolDSN(i), "default_query_exec_mode=simple_protocol"))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/pgbouncer"
	c, err := pgx.Connect(t.Context(), u.String())
	if err != nil {
		t.Fatalf("the admin console: %v", err)
	}
	defer c.Close(context.Background())
	rows, err := c.Query(t.Context(), "SHOW POOLS")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		m, err := pgx.RowToMap(rows)
		if err != nil {
			t.Fatal(err)
		}
		if m["database"] == db {
			for _, k := range []string{"sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login"} {
				v, err := strconv.Atoi(fmt.Sprint(m[k])) // int4, int8 or text by the version
				if err != nil {
					t.Fatalf("SHOW POOLS: %s = %v", k, m[k])
				}
				n += v
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
