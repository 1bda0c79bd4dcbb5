"""shardvisor.db through a transaction-mode PgBouncer: a node record's
pool_dsn is the application path, dsn the direct one.

The integration tests need a PgBouncer (pool_mode = transaction, a
wildcard database) in front of the pg fixture's node 1, named by
SHARDVISOR_TEST_POOL_DSN_1 (conftest's pooler fixture); they skip without
it. The Django and SQLAlchemy tests need no server."""

import threading
import time

import pytest

from conftest import TEST_FENCE, map_doc, wait_for
from shardvisor import Router, RoutingTable
from shardvisor import db as svdb
from shardvisor.routing import Node

DRIVERS = ["psycopg2", "psycopg"]

SCHEMA = """
CREATE SCHEMA app;
CREATE TABLE app.notes (bkey bigint NOT NULL, uid text NOT NULL, id bigint NOT NULL, body text NOT NULL,
                        PRIMARY KEY (bkey, uid, id));
""" + TEST_FENCE

# psycopg 3 prepares a query on the server once it has run it
# prepare_threshold times on a connection (5 by default): the 6th run
# prepares it, the runs after it execute the prepared statement by name.
RUNS = 12


@pytest.fixture(scope="module")
def nodes(pg, node_dbs):
    for i in (0, 1):
        pg.exec(i, node_dbs, SCHEMA)
    return node_dbs


class Env:
    def __init__(self, pg, pooler, db, driver):
        self.pg, self.pooler, self.db, self.driver = pg, pooler, db, driver
        pw = f"file:{pg.password_file}"
        self.specs = [(f"pg{i + 1}", pg.dsn(i, db), pw, pooler.dsn(i, db) if i in pooler.dsns else "") for i in (0, 1)]
        self.version = 1
        self.router = Router.from_map(map_doc(self.specs, [0], level=0))  # one bucket, on pg1
        self.pools = []

    def make_pools(self, **kw):
        p = svdb.Pools(self.router, driver=self.driver, retry_for=5, **kw)
        self.pools.append(p)
        return p

    def move_to(self, owner: int):
        self.version += 1
        self.router.update(RoutingTable(map_doc(self.specs, [owner], level=0, version=self.version)))

    def sql(self, i, q, args=()):
        return self.pg.exec(i, self.db, q, args)

    def end_backend(self, pid: int):
        """Ends a server session from outside, as a pooler's recycling of
        its server connections does (server_lifetime, server_idle_timeout,
        a restart), and waits until it is gone."""
        self.sql(0, "SELECT pg_terminate_backend(%s)", (pid,))
        wait_for(lambda: not self.sql(0, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)), 5, f"backend {pid} to end")
        time.sleep(0.05)  # and PgBouncer to drop its end of it


@pytest.fixture(params=DRIVERS)
def env(request, pg, pooler, nodes):
    if request.param == "psycopg":
        pytest.importorskip("psycopg")
    for i in (0, 1):
        pg.exec(i, nodes, "TRUNCATE app.notes, app.frozen")
    e = Env(pg, pooler, nodes, request.param)
    yield e
    for p in e.pools:
        p.close()


def test_run_through_the_pooler_repeats_one_query_on_one_connection(env):
    """The same parameterised INSERT, once per run(), RUNS times on one
    client connection to the pooler, each transaction on a server session
    of its own. psycopg 3 with its default prepare_threshold fails from the
    7th run on ("prepared statement "_pg3_0" does not exist": the 6th
    prepared it in a session the pooler has since handed on); with the
    pooler's path it connects with prepare_threshold=None."""
    pools = env.make_pools()
    key = env.router.key("pia")
    seen = []

    def insert(i):
        def fn(conn):
            with conn.cursor() as cur:
                cur.execute("INSERT INTO app.notes (bkey, uid, id, body) VALUES (%s, %s, %s, %s) RETURNING pg_backend_pid()",
                            (key, "pia", i, f"note {i}"))
                seen.append((cur.fetchone()[0], conn.info.port))
            return i
        return fn

    for i in range(RUNS):
        assert pools.run("pia", insert(i)) == i
        env.end_backend(seen[-1][0])
    assert env.sql(0, "SELECT count(*) FROM app.notes WHERE uid = 'pia'")[0][0] == RUNS
    assert pools.pool("pg1").pooled and pools.pool("pg1").connects == 1  # one client connection throughout
    assert {port for _, port in seen} == {env.pooler.port(0)}
    assert len({pid for pid, _ in seen}) == RUNS  # every transaction on another server session
    assert pools.retries == {"fence": 0, "connect": 0, "standby": 0, "pooler": 0, "lost": 0}


@pytest.mark.parametrize("direct", [False, True], ids=["pooler", "direct"])
def test_a_fenced_write_is_retried_and_follows_the_map_on_both_paths(env, direct):
    """SV001 through the pooler is what it is on the node's own session: the
    write is retried until the map names the new owner, and lands there."""
    pools = env.make_pools(direct=direct)
    env.sql(0, "INSERT INTO app.frozen VALUES (true)")
    out, ports = {}, []

    def fn(conn):
        ports.append(conn.info.port)
        with conn.cursor() as cur:
            cur.execute("INSERT INTO app.notes VALUES (%s, 'quin', 1, 'x')", (env.router.key("quin"),))
        return 1

    t = threading.Thread(target=lambda: out.update(id=pools.run("quin", fn)))
    t.start()
    wait_for(lambda: pools.retries["fence"] >= 3, 5, "refused attempts")
    env.move_to(1)
    t.join(5)
    assert out == {"id": 1}
    assert env.pg.exec(1, env.db, "SELECT count(*) FROM app.notes WHERE uid = 'quin'")[0][0] == 1
    pg1_port = env.pg.ports[0] if direct else env.pooler.port(0)
    assert ports[0] == pg1_port and ports.count(pg1_port) >= 3


def test_the_direct_path_keeps_session_state_across_transactions(env):
    """The escape hatch: Pools(router, direct=True) connects on the node's
    dsn, so a session SET and a session advisory lock taken in one run()
    are there in the next run() on the same connection."""
    direct = env.make_pools(direct=True)

    def take(conn):
        with conn.cursor() as cur:
            cur.execute("SET application_name = 'sv-direct'")
            cur.execute("SET shardvisor_test.tag = 'kept'")  # a setting no pooler tracks
            cur.execute("SELECT pg_advisory_lock(4242), pg_backend_pid()")
            return cur.fetchone()[1], conn.info.port

    def read(conn):
        with conn.cursor() as cur:
            cur.execute("SELECT current_setting('application_name'), current_setting('shardvisor_test.tag', true), "
                        "pg_backend_pid(), (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                        "AND objid = 4242 AND pid = pg_backend_pid())")
            row = cur.fetchone()
            cur.execute("SELECT pg_advisory_unlock(4242)")
            return row

    pid, port = direct.run("rue", take)
    assert port == env.pg.ports[0] and not direct.pool("pg1").pooled
    assert direct.run("rue", read) == ("sv-direct", "kept", pid, 1)
    assert direct.pool("pg1").connects == 1


POOLED = Node("pg6", "postgres://app@db6:5432/app?sslmode=require", "", "active", 1, None,
              "postgres://app@pgb6:6432/app?sslmode=require")


def test_django_settings_take_the_pooler_with_the_backends_options(monkeypatch):
    pytest.importorskip("django")
    import django

    import shardvisor.django as svdj

    # Django before 4.2 has only a psycopg2 backend; 4.2 and later use psycopg 3 when it is installed.
    if django.VERSION < (4, 2):
        assert svdj.backend_driver() == "psycopg2"
    monkeypatch.setattr(svdj, "backend_driver", lambda: "psycopg")
    e = svdj.database_settings(POOLED, {"CONN_MAX_AGE": 60})
    assert (e["HOST"], e["PORT"], e["NAME"], e["USER"]) == ("pgb6", "6432", "app", "app")
    assert e["OPTIONS"] == {"sslmode": "require", "prepare_threshold": None} and e["CONN_MAX_AGE"] == 60
    assert e["DISABLE_SERVER_SIDE_CURSORS"] is True  # iterator() in autocommit would DECLARE ... WITH HOLD
    assert svdj.database_settings(POOLED, {"DISABLE_SERVER_SIDE_CURSORS": False})["DISABLE_SERVER_SIDE_CURSORS"] is False
    d = svdj.database_settings(POOLED, direct=True)
    assert (d["HOST"], d["PORT"], d["OPTIONS"]) == ("db6", "5432", {"sslmode": "require"})
    assert "DISABLE_SERVER_SIDE_CURSORS" not in d
    monkeypatch.setattr(svdj, "backend_driver", lambda: "psycopg2")
    assert svdj.database_settings(POOLED)["OPTIONS"] == {"sslmode": "require"}  # psycopg2 would refuse the keyword


@pytest.mark.parametrize("driver", DRIVERS)
def test_sqlalchemy_connects_through_the_pooler_with_the_drivers_options(monkeypatch, driver):
    pytest.importorskip("sqlalchemy")
    mod = pytest.importorskip(driver)
    import shardvisor.sqlalchemy as svsa

    calls = []
    monkeypatch.setattr(mod, "connect", lambda **kw: calls.append(kw))
    svsa.connect(POOLED, driver)
    svsa.connect(POOLED, driver, direct=True)
    want = {"host": "pgb6", "port": "6432", "dbname": "app", "user": "app", "sslmode": "require"}
    assert calls[0] == ({**want, "prepare_threshold": None} if driver == "psycopg" else want)
    assert calls[1] == {**want, "host": "db6", "port": "5432"}
