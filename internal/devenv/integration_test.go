package devenv_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/internal/sqlstate"
	"github.com/shardvisor/shardvisor/internal/testenv"
)

// The environment of these tests: a state directory of its own and ports
// of their own, below the kernel's ephemeral range (a port there can be
// taken by an outgoing connection, ZooKeeper's own, before a server binds
// it) and below testenv.FreePort's: ZooKeeper on 7811-7813 (quorum
// 8881-8883, election 9881-9883), PostgreSQL on 7432 (groups: 7432 +
// 100*(m-1), REST API 8432 + ..., PgBouncer 9432 + ...). A lock file
// keeps two test processes (two checkouts) from using them at once.
func throwaway(t *testing.T, nodes, ha int) *devenv.Env {
	t.Helper()
	return throwawayWith(t, devenv.Config{PGNodes: nodes, HA: ha})
}

// throwawayWith is throwaway with more of the configuration: its
// directory, ports, timeout and log are the test's.
func throwawayWith(t *testing.T, c devenv.Config) *devenv.Env {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: starts ZooKeeper and PostgreSQL; skipped with -short")
	}
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "shardvisor-devenv-test.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() })
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "shardvisor-devenv-test-")
	if err != nil {
		t.Fatal(err)
	}
	// The postgres user must traverse it.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	c.Dir, c.ZKPortBase, c.PGPortBase, c.Timeout, c.Log = dir, 7811, 7432, 2*time.Minute, &log
	e := devenv.New(c)
	t.Cleanup(func() {
		if err := e.Down(); err != nil {
			t.Errorf("down: %v", err)
		}
		if e.AnythingRunning() {
			t.Errorf("down left servers running in %s", dir)
		} else {
			os.RemoveAll(dir)
		}
		if t.Failed() {
			t.Logf("devenv's log:\n%s", log.String())
		}
	})
	return e
}

func status(t *testing.T, e *devenv.Env) (string, bool) {
	t.Helper()
	var b bytes.Buffer
	ok := e.Status(&b)
	return b.String(), ok
}

// Up, status, env; the node's PgBouncer; a node killed (a client held
// at its pooler gets a no-server error) and started again; down leaves no
// process. The whole ensemble's kill and freeze are
// TestFaultsEnsembleDownAndFrozen's.
func TestUpFaultsDown(t *testing.T) {
	e := throwaway(t, 1, 0)
	if err := e.Up(); err != nil {
		t.Fatal(err)
	}
	st, ok := status(t, e)
	if !ok {
		t.Fatalf("not healthy after up:\n%s", st)
	}
	lines := strings.Split(strings.TrimSpace(st), "\n")
	if len(lines) != 6 || !strings.HasPrefix(lines[0], "SERVER      PORT   PID      STATE") ||
		!strings.HasPrefix(lines[4], "pg1         7432   ") || !strings.HasSuffix(lines[4], " accepting") ||
		!strings.HasPrefix(lines[5], "pg1.pool    9432   "+strconv.Itoa(e.PoolPid(1))+" ") || !strings.HasSuffix(lines[5], " accepting") {
		t.Errorf("status table:\n%s", st)
	}
	var env bytes.Buffer
	e.Exports(&env)
	for _, want := range []string{
		"export SHARDVISOR_ZK='127.0.0.1:7811,127.0.0.1:7812,127.0.0.1:7813'\n",
		"export SHARDVISOR_PG1_DSN='postgres://postgres:" + e.Password() + "@127.0.0.1:7432/postgres?sslmode=disable'\n",
		"export PGPASSFILE='" + e.PGPassFile() + "'\n",
		"export SHARDVISOR_PG1_POOL_DSN='postgres://postgres:" + e.Password() + "@127.0.0.1:9432/postgres?sslmode=disable'\n",
		"export SHARDVISOR_PG_POOL_DSNS='postgres://postgres:" + e.Password() + "@127.0.0.1:9432/postgres?sslmode=disable'\n",
		"export SHARDVISOR_PGBACKREST_CONFIG='" + e.Dir() + "/backup/pgbackrest.conf'\n",
	} {
		if !strings.Contains(env.String(), want) {
			t.Errorf("env lacks %q:\n%s", want, env.String())
		}
	}
	if err := testenv.Exec(t.Context(), e.NodeDSN(1), "SELECT 1"); err != nil {
		t.Fatalf("pg1 with the env DSN: %v", err)
	}
	// Its WAL archiving into the pgBackRest repository (the group's, and
	// older devenvs' servers restarted: TestFaultsWALArchiving).
	nodeArchives(t, e, 1, 1)

	// The node's PgBouncer: real clients through it; its open-file limit
	// raised for its 2000 clients.
	t.Run("PgBouncer", func(t *testing.T) { poolerServes(t, e, 1) })
	b, err := os.ReadFile("/proc/" + strconv.Itoa(e.PoolPid(1)) + "/limits")
	if m := regexp.MustCompile(`Max open files +([0-9]+) `).FindSubmatch(b); err != nil || m == nil {
		t.Errorf("pg1's PgBouncer: no open-file limit (%v):\n%s", err, b)
	} else if n, _ := strconv.Atoi(string(m[1])); n < 4096 {
		t.Errorf("pg1's PgBouncer: open-file limit %d, want 4096 or more", n)
	}

	// A client logged in at the pooler before its server died.
	held, err := pgx.Connect(t.Context(), e.NodePoolDSN(1))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close(context.Background())
	if _, err := held.Exec(t.Context(), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if n := poolerServers(t, e, 1, "postgres"); n == 0 {
		t.Fatal("SHOW POOLS: no server connection for postgres after a query through the pooler")
	}

	// pg-kill: the postmaster and its children are dead when it returns.
	k, err := e.PGKill(1)
	if err != nil {
		t.Fatal(err)
	}
	// The pooler drops its server connections as it sees them close (a
	// query given one first would meet "server conn crashed?").
	testenv.WaitFor(t, 30*time.Second, func() bool { return poolerServers(t, e, 1, "postgres") == 0 }, "the pooler dropping its dead servers")
	// The pooler, alive, cannot give that client a server: after its
	// query_wait_timeout (5 s; PgBouncer's default, 120 s, would outlast
	// the minute given here) the query fails with an error the router
	// retries, as nothing reached a server.
	qctx, qcancel := context.WithTimeout(t.Context(), time.Minute)
	defer qcancel()
	if _, err := held.Exec(qctx, "SELECT 1"); !sqlstate.IsPoolerNoServer(err) {
		t.Errorf("a query through the pooler of a killed server: %v, want one of PgBouncer's no-server errors (08P01) within the minute", err)
	}
	if devenv.Alive(k.PostmasterPid, "") || !strings.HasPrefix(k.String(), "pg1: killed (postmaster pid ") {
		t.Errorf("after %q the postmaster is alive: %v", k, devenv.Alive(k.PostmasterPid, ""))
	}
	if st, ok := status(t, e); ok || !strings.Contains(st, "pg1         7432   -        stopped") {
		t.Errorf("status after pg-kill:\n%s", st)
	}
	if err := e.PGStart(1); err != nil {
		t.Fatal(err)
	}
	if err := testenv.Exec(t.Context(), e.NodeDSN(1), "SELECT 1"); err != nil {
		t.Fatalf("pg1 after pg-start: %v", err)
	}
	// Its PgBouncer lived through the kill and serves again at once.
	if err := testenv.Exec(t.Context(), e.NodePoolDSN(1), "SELECT 1"); err != nil {
		t.Fatalf("pg1's PgBouncer after pg-start: %v", err)
	}

	poolPid := e.PoolPid(1)
	if poolPid == 0 || len(poolerProcesses(t, e.Dir())) != 1 {
		t.Errorf("before down: PgBouncer pid %d, processes %q; want one", poolPid, poolerProcesses(t, e.Dir()))
	}
	if err := e.Down(); err != nil {
		t.Fatal(err)
	}
	if e.AnythingRunning() {
		st, _ := status(t, e)
		t.Errorf("down left servers running:\n%s", st)
	}
	if ps := poolerProcesses(t, e.Dir()); len(ps) != 0 || devenv.Alive(poolPid, "") {
		t.Errorf("down left PgBouncer running: %q", ps)
	}
}

// TestFaultsEnsembleDownAndFrozen: the whole ensemble killed, then
// started a server at a time (each start returns once its server
// listens; one alone serves nothing), and a server frozen and thawed. Six
// JVM starts: make test-faults runs it.
func TestFaultsEnsembleDownAndFrozen(t *testing.T) {
	testenv.Faults(t)
	e := throwaway(t, 1, 0)
	if err := e.Up(); err != nil {
		t.Fatal(err)
	}
	// The whole ensemble down; each start returns once its server listens.
	var zkPids []int
	for i := 1; i <= devenv.ZKServers; i++ {
		zkPids = append(zkPids, e.ZKPid(i))
		if err := e.ZKKill(i); err != nil {
			t.Fatal(err)
		}
	}
	for i, pid := range zkPids {
		if devenv.Alive(pid, "") || e.ZKPid(i+1) != 0 {
			t.Errorf("zk%d (pid %d) alive after zk-kill", i+1, pid)
		}
	}
	if err := e.ZKStart(1); err != nil {
		t.Fatalf("zk-start 1 without a quorum: %v", err)
	}
	if mode := e.ZKMode(1); mode != "not-serving" {
		t.Errorf("zk1 alone: mode %q, want not-serving", mode)
	}
	for i := 2; i <= devenv.ZKServers; i++ {
		if err := e.ZKStart(i); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, time.Minute, func() bool { _, ok := status(t, e); return ok }, "the ensemble serving again")

	// Freeze and thaw: the process stays, and answers again.
	if err := e.ZKFreeze(2); err != nil {
		t.Fatal(err)
	}
	if mode := e.ZKMode(2); mode != "down" {
		t.Errorf("zk2 frozen: mode %q, want down (no answer)", mode)
	}
	if err := e.ZKThaw(2); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, func() bool { m := e.ZKMode(2); return m == "leader" || m == "follower" }, "zk2 serving after thaw")

	if err := e.Down(); err != nil {
		t.Fatal(err)
	}
}

// psql runs one query with libpq's psql and returns its unaligned output.
func psql(dsn, query string) (string, error) {
	out, err := exec.Command("/usr/lib/postgresql/15/bin/psql", "-X", "-A", "-t", "-q", dsn, "-c", query).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// A Patroni group of 2: up, the primary's host killed, the other member
// takes over, the killed one rejoins; a member cut from ZooKeeper and
// healed. Long (Patroni's ttl is 10 s): make test-faults runs it.
func TestFaultsGroup(t *testing.T) {
	testenv.Faults(t)
	e := throwaway(t, 1, 2)
	if err := e.Up(); err != nil {
		t.Fatal(err)
	}
	name, _, ok, err := e.Primary(1)
	if err != nil || !ok {
		t.Fatalf("no primary after up: %v", err)
	}
	// The standby's PgBouncer caches the server parameters of its first
	// server connection, a standby's (in_hot_standby on).
	standby := 2
	if name == devenv.MemberName(1, 2) {
		standby = 1
	}
	if out, err := psql(e.MemberPoolDSN(1, standby), "SHOW in_hot_standby"); err != nil || out != "on" {
		t.Fatalf("the standby through its pooler: in_hot_standby %q, %v", out, err)
	}
	k, err := e.PGKill(1)
	if err != nil {
		t.Fatal(err)
	}
	if k.Member != name || devenv.Alive(k.PatroniPid, "") || devenv.Alive(k.PostmasterPid, "") || e.MemberPoolPid(1, 3-standby) != 0 {
		t.Errorf("killed %+v, primary was %s; its pooler: pid %d", k, name, e.MemberPoolPid(1, 3-standby))
	}
	testenv.WaitFor(t, time.Minute, func() bool { n, _, ok, _ := e.Primary(1); return ok && n != name }, "the other member promoted")
	// libpq (psql, psycopg) with target_session_attrs=read-write through
	// the group's pool DSN finds the new primary: its Patroni had its
	// pooler reconnect (pgbouncer-role-change), or the pooler would go on
	// saying in_hot_standby on.
	testenv.WaitFor(t, 30*time.Second, func() bool {
		out, err := psql(e.NodePoolDSN(1), "SELECT pg_is_in_recovery()")
		return err == nil && out == "f"
	}, "libpq through the pool DSN reaching the new primary")
	if err := e.PGStart(1); err != nil {
		t.Fatal(err)
	}
	if err := e.ZKCut(1, 1); err != nil {
		t.Fatal(err)
	}
	if err := e.ZKHeal(1, 1); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, func() bool { _, ok := status(t, e); return ok }, "the group healthy after the heal")
}
