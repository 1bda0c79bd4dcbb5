"""shardvisor.db against real PostgreSQL (two databases of the devenv as two
db nodes), with psycopg2 and psycopg 3: what run() retries, and what it
never retries. The fence's refusal is played by a trigger raising SQLSTATE
SV001, as the fence does; test_move.py runs a real move."""

import os
import threading
import time

import pytest

from conftest import TEST_FENCE, map_doc, wait_for
from shardvisor import MapError, Router, RoutingTable
from shardvisor import db as svdb
from shardvisor.routing import Node

DRIVERS = ["psycopg2", "psycopg"]

SCHEMA = """
CREATE SCHEMA app;
CREATE TABLE app.notes (bkey bigint NOT NULL, uid text NOT NULL, id bigint NOT NULL, body text NOT NULL,
                        PRIMARY KEY (bkey, uid, id));
""" + TEST_FENCE + """-- A COMMIT that takes a while, for the outcome-unknown test.
CREATE TABLE app.slow_commit (x int);
CREATE FUNCTION app.slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(30); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON app.slow_commit DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION app.slow();
"""


@pytest.fixture(scope="module")
def nodes(pg, node_dbs):
    for i in (0, 1):
        pg.exec(i, node_dbs, SCHEMA)
    return node_dbs


class Cluster:
    def __init__(self, pg, db, driver):
        self.pg, self.db = pg, db
        self.specs = [("pg1", pg.dsn(0, db), f"file:{pg.password_file}"), ("pg2", pg.dsn(1, db), f"file:{pg.password_file}")]
        self.version = 1
        self.router = Router.from_map(map_doc(self.specs, [0], level=0))  # one bucket, on pg1
        self.pools = svdb.Pools(self.router, driver=driver, retry_for=5)

    def move_to(self, owner: int, specs=None):
        self.version += 1
        self.router.update(RoutingTable(map_doc(specs or self.specs, [owner], level=0, version=self.version)))

    def sql(self, i, q, args=()):
        return self.pg.exec(i, self.db, q, args)

    def count(self, i, where="true"):
        return self.sql(i, f"SELECT count(*) FROM app.notes WHERE {where}")[0][0]

    def freeze(self, i, on=True):
        self.sql(i, "INSERT INTO app.frozen VALUES (true)" if on else "DELETE FROM app.frozen")

    def insert(self, uid, nid, body="x", calls=None):
        def fn(conn):
            if calls is not None:
                calls.append(1)
            with conn.cursor() as cur:
                cur.execute("INSERT INTO app.notes VALUES (%s, %s, %s, %s)", (self.router.key(uid), uid, nid, body))
            return nid
        return fn


@pytest.fixture(params=DRIVERS)
def cluster(request, pg, nodes):
    if request.param == "psycopg":
        pytest.importorskip("psycopg")
    for i in (0, 1):
        pg.exec(i, nodes, "TRUNCATE app.notes, app.frozen, app.slow_commit")
    c = Cluster(pg, nodes, request.param)
    yield c
    c.pools.close()


def test_run_commits_on_the_users_node(cluster):
    for i in range(10):
        assert cluster.pools.run(f"u{i}", cluster.insert(f"u{i}", i)) == i
    assert cluster.count(0) == 10 and cluster.count(1) == 0
    cluster.move_to(1)
    cluster.pools.run("u0", cluster.insert("u0", 100))
    assert cluster.count(1) == 1
    assert cluster.pools.retries == {"fence": 0, "connect": 0, "standby": 0, "pooler": 0, "lost": 0}


def test_a_query_the_pooler_found_no_server_for_is_retried(cluster):
    """PgBouncer's no-server errors (SQLSTATE 08P01: its server down or
    restarting, every server busy for query_wait_timeout) reached no server:
    retried on any node. Its error after a query was sent ("server conn
    crashed?") may have committed: raised. The server raises the same code
    and message here, as PgBouncer sends them."""
    calls = []

    def fn_for(uid, message):
        insert = cluster.insert(uid, 1)

        def fn(conn):
            calls.append(id(conn))
            if len(calls) == 1:
                with conn.cursor() as cur:
                    cur.execute("DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '08P01', MESSAGE = %s; END $$"
                                % svdb_quote(message))
            return insert(conn)
        return fn

    assert cluster.pools.run("frank", fn_for("frank", "query_wait_timeout")) == 1
    assert len(calls) == 2 and cluster.pools.retries["pooler"] == 1
    calls.clear()
    with pytest.raises(Exception) as e:
        cluster.pools.run("grace", fn_for("grace", "server conn crashed?"))
    assert svdb.sqlstate(e.value) == "08P01" and len(calls) == 1 and cluster.pools.retries["pooler"] == 1


def svdb_quote(s):
    return "'" + s.replace("'", "''") + "'"


def test_a_write_a_groups_standby_refused_is_retried_on_a_fresh_connection(cluster):
    """25006 on a Patroni group's node, what a failover looks like through a
    member's pooler: the connection and the node's idle ones are dropped,
    the write retried. On a plain node it is the application's own READ
    ONLY transaction: raised at once."""
    calls = []

    def fn_for(uid):
        insert = cluster.insert(uid, len(calls) + 1)

        def fn(conn):
            calls.append(id(conn))
            if len(calls) == 1:
                with conn.cursor() as cur:
                    cur.execute("SET TRANSACTION READ ONLY")
            return insert(conn)
        return fn

    with pytest.raises(Exception) as e:
        cluster.pools.run("erin", fn_for("erin"))
    assert svdb.sqlstate(e.value) == "25006" and len(calls) == 1 and cluster.pools.retries["standby"] == 0

    group = {"namespace": "/service/", "scope": "g1"}
    cluster.move_to(0, specs=[(cluster.specs[0][0], cluster.specs[0][1] + "&target_session_attrs=read-write", cluster.specs[0][2], None, group),
                              cluster.specs[1]])
    warm = cluster.pools.pool("pg1")
    c1, c2 = warm.get(), warm.get()
    warm.put(c1)
    warm.put(c2)
    assert len(warm._idle) == 2
    calls.clear()
    assert cluster.pools.run("dave", fn_for("dave")) == 1
    assert len(calls) == 2 and cluster.pools.retries["standby"] == 1
    assert cluster.count(0) == 1
    # The refused connection and the other idle one were closed: the
    # retry ran on a connection made after the refusal.
    assert c1.closed and c2.closed


def test_a_fenced_write_waits_and_follows_the_map_to_the_new_owner(cluster):
    """A move's pause: the old owner refuses (SV001) until the map names the
    new owner; the write lands there once, after retries."""
    cluster.freeze(0)
    out = {}

    def write():
        out["id"] = cluster.pools.run("alice", cluster.insert("alice", 1))

    t = threading.Thread(target=write)
    t.start()
    wait_for(lambda: cluster.pools.retries["fence"] >= 3, 5, "refused attempts")
    cluster.move_to(1)
    t.join(5)
    assert out == {"id": 1}
    assert cluster.count(0) == 0 and cluster.count(1) == 1


def test_a_pause_that_ends_on_the_same_node(cluster):
    """A move aborted in its pause: the source thaws; the write lands there."""
    cluster.freeze(0)
    threading.Timer(0.3, cluster.freeze, (0, False)).start()
    cluster.pools.run("bob", cluster.insert("bob", 1))
    assert cluster.count(0) == 1 and cluster.pools.retries["fence"] >= 1


def test_gives_up_at_the_bound_naming_user_node_and_cause(cluster):
    # A bound of seconds, not tenths: on a loaded machine (a cold Go build
    # beside the tests) one attempt, a new connection included, took more
    # than 0.4 s, and the run gave up after it (CI run 15). The elapsed
    # time is checked against the bound with room for one slow attempt.
    cluster.freeze(0)
    t0 = time.monotonic()
    with pytest.raises(svdb.GaveUp) as e:
        cluster.pools.run("carol", cluster.insert("carol", 1), retry_for=3.0)
    assert time.monotonic() - t0 < 3.0 + 5
    msg = str(e.value)
    assert "gave up on 'carol'" in msg and "db node pg1" in msg and "bucket frozen" in msg
    assert e.value.attempts >= 2 and not isinstance(e.value, svdb.NoPrimary)
    assert cluster.count(0) == 0


def test_other_errors_are_raised_at_once(cluster):
    cluster.pools.run("dave", cluster.insert("dave", 1))
    calls = []
    with pytest.raises(Exception) as e:
        cluster.pools.run("dave", cluster.insert("dave", 1, calls=calls))  # a duplicate key
    assert "duplicate key" in str(e.value) and len(calls) == 1
    assert cluster.count(0) == 1


def _backend_pid(conn):
    with conn.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        return cur.fetchone()[0]


def test_a_lost_connection_is_not_retried_unless_idempotent(cluster):
    calls = []

    def fn(conn):
        calls.append(1)
        with conn.cursor() as cur:
            cur.execute("INSERT INTO app.notes VALUES (%s, 'erin', %s, 'x')", (cluster.router.key("erin"), len(calls)))
        if len(calls) == 1:
            cluster.sql(0, "SELECT pg_terminate_backend(%s)", (_backend_pid(conn),))
            with conn.cursor() as cur:
                cur.execute("SELECT 1")

    with pytest.raises(Exception) as e:
        cluster.pools.run("erin", fn)
    assert not isinstance(e.value, svdb.Error) and len(calls) == 1
    assert cluster.count(0) == 0
    calls.clear()
    cluster.pools.run("erin", fn, idempotent=True)
    assert len(calls) == 2 and cluster.count(0) == 1 and cluster.pools.retries["lost"] == 1


def test_a_connection_lost_in_commit_is_outcome_unknown(cluster):
    def fn(conn):
        with conn.cursor() as cur:
            cur.execute("INSERT INTO app.slow_commit VALUES (1)")  # its deferred trigger sleeps at COMMIT

    def kill_in_commit():
        pids = wait_for(lambda: cluster.sql(0, "SELECT pid FROM pg_stat_activity WHERE query LIKE 'COMMIT%%' AND wait_event = 'PgSleep'"), 10, "the COMMIT to run")
        cluster.sql(0, "SELECT pg_terminate_backend(%s)", (pids[0][0],))

    t = threading.Thread(target=kill_in_commit)
    t.start()
    with pytest.raises(svdb.OutcomeUnknown, match="lost during COMMIT of 'frank'.*may have committed"):
        cluster.pools.run("frank", fn)
    t.join()


def test_an_error_caught_by_fn_aborts_the_transaction(cluster):
    def fn(conn):
        with conn.cursor() as cur:
            cur.execute("INSERT INTO app.notes VALUES (%s, 'gus', 1, 'x')", (cluster.router.key("gus"),))
            try:
                cur.execute("SELECT 1/0")
            except Exception:
                pass

    with pytest.raises(svdb.TransactionAborted, match="aborted by an error it caught"):
        cluster.pools.run("gus", fn)
    assert cluster.count(0) == 0


def test_no_primary_after_the_bound(cluster):
    specs = [("pg1", "postgres://postgres@127.0.0.1:1/x?sslmode=disable", ""), cluster.specs[1]]
    cluster.move_to(0, specs)
    with pytest.raises(svdb.NoPrimary) as e:
        cluster.pools.run("hank", cluster.insert("hank", 1), retry_for=1.0)
    assert "db node pg1" in str(e.value) and cluster.pools.retries["connect"] >= 2


def test_pools_follow_the_map(cluster, monkeypatch):
    cluster.pools.run("ivy", cluster.insert("ivy", 1))
    p1 = cluster.pools.pool("pg1")
    assert cluster.pools.open_nodes() == ["pg1"]
    # A new DSN for pg1 (a server moved): its pool is closed, the next use opens one.
    specs = [("pg1", cluster.specs[0][1] + "&application_name=moved", cluster.specs[0][2]), cluster.specs[1]]
    cluster.move_to(0, specs)
    assert p1.closed and cluster.pools.open_nodes() == []
    cluster.pools.run("ivy", cluster.insert("ivy", 2))
    assert cluster.sql(0, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'moved'")[0][0] == 1
    # An idle connection killed under the pool (a failover, a restart) is
    # found by the ping and replaced before fn runs.
    monkeypatch.setattr(svdb, "IDLE_PING_AFTER", 0.0)
    cluster.sql(0, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'moved'")
    before = cluster.pools.pool("pg1").connects
    cluster.pools.run("ivy", cluster.insert("ivy", 3))
    assert cluster.pools.pool("pg1").connects == before + 1 and cluster.count(0) == 3


def test_connection_kwargs_of_a_group_dsn():
    n = Node("pg5", "postgres://app@10.0.0.1:5432,10.0.0.2:5433/app?target_session_attrs=read-write&connect_timeout=2", "", "active", 1, None)
    assert svdb.connection_kwargs(n) == {"host": "10.0.0.1,10.0.0.2", "port": "5432,5433", "dbname": "app", "user": "app",
                                         "target_session_attrs": "read-write", "connect_timeout": "2"}


POOLED = Node("pg6", "postgres://app@db6:5432/app?sslmode=require", "", "active", 1, None,
              "postgres://app@pgb6:6432/app?sslmode=require&application_name=web")


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_connection_kwargs_take_the_application_path_and_direct_the_dsn(driver):
    app = svdb.connection_kwargs(POOLED, driver=driver)
    want = {"host": "pgb6", "port": "6432", "dbname": "app", "user": "app", "sslmode": "require", "application_name": "web"}
    # psycopg 3 through the pooler: no server-side prepared statements
    # (prepare_threshold=None, an argument of psycopg.connect); psycopg2
    # never prepares, and its connect() would refuse the keyword.
    assert app == ({**want, "prepare_threshold": None} if driver == "psycopg" else want)
    direct = svdb.connection_kwargs(POOLED, direct=True, driver=driver)
    assert direct == {"host": "db6", "port": "5432", "dbname": "app", "user": "app", "sslmode": "require"}
    plain = POOLED._replace(pool_dsn="")  # no pooler: dsn on both paths, and no option
    assert svdb.connection_kwargs(plain, driver=driver) == svdb.connection_kwargs(plain, direct=True, driver=driver) == direct
    assert svdb.driver_options(driver, pooled=False) == {}


def test_connection_kwargs_name_the_pool_dsn_it_cannot_read():
    bad = POOLED._replace(pool_dsn="pgb6:6432")  # a record made by hand, not a parsed map
    with pytest.raises(MapError, match="db node pg6: pool_dsn is not a postgres:// URL"):
        svdb.connection_kwargs(bad)
    assert svdb.connection_kwargs(bad, direct=True)["host"] == "db6"


class _FakeConn:
    closed = 0

    def close(self):
        self.closed = 1


class _FakeDriver:
    """A driver for NodePool without a server: it records connect()'s arguments."""

    name = "psycopg"

    class mod:
        Error = Exception

    def __init__(self):
        self.calls = []

    def connect(self, dsn, password, connect_timeout, pooled=False):
        self.calls.append((dsn, pooled))
        return _FakeConn()

    def broken(self, conn):
        return bool(conn.closed)


def test_node_pools_default_to_two_connections_and_close_idle_ones(monkeypatch, psycopg2_installed):
    """Sizes for a prefork worker: 2 connections per node by default; one
    idle longer than max_idle is closed at the next checkout or return,
    while the one in steady use stays."""
    r = Router.from_map(map_doc([("pg1", "postgres://x@127.0.0.1:1/x", "")], [0], level=0))
    pools = svdb.Pools(r, driver="psycopg2")
    assert pools.max_size == svdb.DEFAULT_MAX_SIZE == 2 and pools.pool("pg1").max_size == 2
    assert pools.pool("pg1").max_idle == svdb.DEFAULT_MAX_IDLE == 60.0 and not pools.direct
    pools.close()

    monkeypatch.setattr(svdb, "_readable", lambda conn: False)
    drv = _FakeDriver()
    p = svdb.NodePool(POOLED, drv, max_idle=0.5)
    a, b = p.get(), p.get()
    assert drv.calls == [(POOLED.pool_dsn, True)] * 2  # the pooler's path, flagged for the driver
    p.put(b)
    time.sleep(0.6)
    p.put(a)  # closes b, idle for over max_idle
    assert b.closed and not a.closed and p.idle_closed == 1
    assert p.get() is a and len(drv.calls) == 2
    p.put(a)
    assert [c for c, _ in p._idle] == [a]
    d = svdb.NodePool(POOLED, drv, direct=True)
    d.get()
    assert drv.calls[-1] == (POOLED.dsn, False) and d.max_idle == 60.0


def test_a_forked_child_never_uses_or_ends_its_parents_connections(cluster):
    """gunicorn --preload with a pool used in the arbiter: each worker gets
    connections of its own, and the arbiter's session survives them."""
    cluster.pools.run("kim", cluster.insert("kim", 1))
    with cluster.pools.connection("kim") as (conn, _):
        parent_backend = _backend_pid(conn)
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rd)
        code = 1
        try:
            with cluster.pools.connection("kim") as (conn, _):
                os.write(wr, str(_backend_pid(conn)).encode())
            cluster.pools.run("kim", cluster.insert("kim", 2))
            code = 0
        finally:
            os._exit(code)
    os.close(wr)
    child_backend = int(os.read(rd, 32) or b"0")
    os.close(rd)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert child_backend and child_backend != parent_backend
    with cluster.pools.connection("kim") as (conn, _):  # the parent's session is alive and its own
        assert _backend_pid(conn) == parent_backend
    assert cluster.count(0) == 2


def test_a_servers_refusal_is_not_retried(cluster):
    specs = [("pg1", cluster.specs[0][1].replace(cluster.db, "no_such_db"), cluster.specs[0][2]), cluster.specs[1]]
    cluster.move_to(0, specs)
    t0 = time.monotonic()
    with pytest.raises(Exception) as e:
        cluster.pools.run("lou", cluster.insert("lou", 1), retry_for=5)
    assert "does not exist" in str(e.value) and not isinstance(e.value, svdb.GaveUp)
    assert time.monotonic() - t0 < 2 and cluster.pools.retries["connect"] == 0


def test_a_connection_ended_a_moment_ago_is_replaced_before_use(cluster):
    cluster.pools.run("max", cluster.insert("max", 1))
    with cluster.pools.connection("max") as (conn, _):
        backend = _backend_pid(conn)
    cluster.sql(0, "SELECT pg_terminate_backend(%s)", (backend,))
    wait_for(lambda: not cluster.sql(0, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend,)), 5, "the backend to end")
    cluster.pools.run("max", cluster.insert("max", 2))  # well within IDLE_PING_AFTER
    assert cluster.count(0) == 2


def test_a_route_to_a_node_a_new_map_removed_is_retried(psycopg2_installed):
    """The route was read, then a map without its node was applied before
    the pool was opened: nothing was sent, so the attempt is retried."""
    r = Router.from_map(map_doc([("pg1", "postgres://x@127.0.0.1:1/x", "")], [0], level=0))
    pools = svdb.Pools(r, driver="psycopg2")
    gone = r.route("ann")._replace(node="pg9")
    err, connect_failed = pools._attempt("ann", gone, lambda conn: None, False)
    assert isinstance(err, MapError) and "pg9" in str(err) and not connect_failed
