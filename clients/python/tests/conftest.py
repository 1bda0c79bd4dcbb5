"""Fixtures: the package from this checkout, the devenv's PostgreSQL and
ZooKeeper (scripts/devenv), and the Go binaries.

Tests that need servers skip when they are not up, except under CI=true,
where a skip would hide a missing piece: there they fail.
"""

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(PKG))
sys.path.insert(0, PKG)

DEVENV = os.environ.get("SHARDVISOR_DEVENV_DIR", "/tmp/shardvisor-devenv")
PG_BASE = int(os.environ.get("SHARDVISOR_PG_PORT_BASE", "25432"))
ZK_BASE = int(os.environ.get("SHARDVISOR_ZK_PORT_BASE", "21811"))
# The Go test that runs this suite (clients/python/pytest_test.go) passes
# the servers internal/testenv gave it; by hand the devenv's defaults hold.
PG_PORTS = [int(p) for p in os.environ.get("SHARDVISOR_PY_PG_PORTS", f"{PG_BASE},{PG_BASE + 1}").split(",")]
PG_PASSWORD_FILE = os.environ.get("SHARDVISOR_PY_PG_PASSWORD_FILE", os.path.join(DEVENV, "pg", "password"))
ZK_ROOT = os.environ.get("SHARDVISOR_PY_ZK_ROOT", "/shardvisor")
SEED = "000102030405060708090a0b0c0d0e0f"


def need(what: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} (required when CI=true)")
    pytest.skip(what)


def need_psycopg2():
    """Skips (fails under CI=true) where psycopg2 is not installed: every
    test that uses it, with servers or without, says so the same way."""
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        need("psycopg2 is not installed (python3-psycopg2)")


@pytest.fixture
def psycopg2_installed():
    need_psycopg2()


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class PG:
    """The devenv's plain PostgreSQL nodes (pg1 on PG_BASE, pg2 on PG_BASE+1)."""

    def __init__(self):
        self.password_file = PG_PASSWORD_FILE
        with open(self.password_file) as f:
            self.password = f.readline().strip()
        self.ports = PG_PORTS

    def dsn(self, i: int, db: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.ports[i]}/{db}?sslmode=disable"

    def admin(self, i: int, db: str = "postgres"):
        import psycopg2

        c = psycopg2.connect(self.dsn(i, db), password=self.password)
        c.autocommit = True
        return c

    def exec(self, i: int, db: str, sql: str, args=()):
        """Runs sql in autocommit on node i's database db; rows or None."""
        c = self.admin(i, db)
        try:
            with c.cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchall() if cur.description else None
        finally:
            c.close()

    def create_db(self, i: int, name: str) -> None:
        self.exec(i, "postgres", f'CREATE DATABASE "{name}"')

    def drop_db(self, i: int, name: str) -> None:
        self.exec(i, "postgres", f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg():
    if len(PG_PORTS) < 2 or not os.path.exists(PG_PASSWORD_FILE) or not all(_listening(p) for p in PG_PORTS[:2]):
        need("PostgreSQL of scripts/devenv is not up (scripts/devenv --plain up)")
    need_psycopg2()
    return PG()


class Pooler:
    """A transaction-mode PgBouncer in front of each of the pg fixture's
    nodes: a postgres:// URL per node index, its password (if any) left
    out (the nodes' password reference applies) and its database replaced
    by the test's (the pooler must take any database: `* = host=...
    port=...`)."""

    def __init__(self, dsns):
        self.dsns = dsns  # node index -> URL

    def dsn(self, i: int, db: str) -> str:
        u = urllib.parse.urlsplit(self.dsns[i])
        netloc = u.netloc
        user, at, hosts = netloc.rpartition("@")
        if at and ":" in user:
            netloc = user.split(":", 1)[0] + "@" + hosts
        query = urllib.parse.urlencode([(k, v) for k, v in urllib.parse.parse_qsl(u.query) if k != "password"])
        return urllib.parse.urlunsplit((u.scheme, netloc, "/" + db, query, ""))

    def port(self, i: int) -> int:
        return urllib.parse.urlsplit(self.dsns[i]).port or 5432


@pytest.fixture(scope="session")
def pooler(pg):
    """The poolers in front of the pg fixture's nodes 1 (and 2):
    SHARDVISOR_TEST_POOL_DSN_<N> (the Go test that runs this suite is to
    pass them), else the devenv's SHARDVISOR_PG<N>_POOL_DSN (`eval
    "$(scripts/devenv env)"`) when it reaches the same server. Skips when
    node 1 has none."""
    import psycopg2

    dsns = {}
    for i in (0, 1):
        for var in (f"SHARDVISOR_TEST_POOL_DSN_{i + 1}", f"SHARDVISOR_PG{i + 1}_POOL_DSN"):
            raw = os.environ.get(var)
            if not raw:
                continue
            p = Pooler({i: raw})
            try:
                c = psycopg2.connect(p.dsn(i, "postgres"), password=pg.password, connect_timeout=5)
                try:
                    with c.cursor() as cur:
                        # Not inet_server_port(): a pooler may reach its
                        # server over the unix socket, where it is NULL.
                        cur.execute("SELECT current_setting('port')::int")
                        port = cur.fetchone()[0]
                finally:
                    c.close()
                why = "" if port == pg.ports[i] else f"it reaches PostgreSQL on port {port}, not node {i + 1}'s ({pg.ports[i]})"
            except psycopg2.Error as e:
                why = f"no connection through it: {e}"
            if not why:
                dsns[i] = raw
                break
            if var.startswith("SHARDVISOR_TEST_"):
                raise AssertionError(f"{var}: {why}")  # named for these tests: a wrong one is an error
    if 0 not in dsns:
        need("no transaction-mode pooler: set SHARDVISOR_TEST_POOL_DSN_1 to the postgres:// URL of a PgBouncer "
                    f"with pool_mode = transaction and a wildcard database in front of PostgreSQL node 1 (port {PG_PORTS[0]})")
    return Pooler(dsns)


@pytest.fixture(scope="module")
def node_dbs(pg):
    """Two fresh databases, one on pg1 and one on pg2: two db nodes."""
    name = "svpy_" + uuid.uuid4().hex[:10]
    pg.create_db(0, name)
    pg.create_db(1, name)
    yield name
    pg.drop_db(0, name)
    pg.drop_db(1, name)


# The fence's refusal as a test plays it: SQLSTATE SV001 from every write
# to app.notes while app.frozen has a row (a move's write pause).
TEST_FENCE = """
CREATE TABLE app.frozen (on_ boolean);
CREATE FUNCTION app.fence() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT FROM app.frozen) THEN
    RAISE EXCEPTION 'bucket frozen (test fence)' USING ERRCODE = 'SV001';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER fence BEFORE INSERT OR UPDATE ON app.notes FOR EACH ROW EXECUTE FUNCTION app.fence();
"""


def map_doc(nodes, owners, level, version=1, buckets=None, seed=SEED):
    """A map file document (format 1, map format 1) for tests: nodes is a
    list of (id, dsn, password ref), optionally with pool_dsn and a
    Patroni group ({"namespace", "scope"}), owners one node index per
    bucket."""
    raw = b"".join(o.to_bytes(2, "big") for o in owners)
    recs = []
    for spec in nodes:
        rec = {"id": spec[0], "dsn": spec[1], "password": spec[2], "weight": 1, "state": "active"}
        if len(spec) > 3 and spec[3]:
            rec["pool_dsn"] = spec[3]
        if len(spec) > 4 and spec[4]:
            rec["patroni"] = spec[4]
        recs.append(rec)
    return {
        "version": 1,
        "cluster": "pytest",
        "seed": seed,
        "map": {
            "version": 1,
            "map_version": version,
            "level": level,
            "updated_at": "2026-11-27T00:00:00Z",
            "nodes": recs,
            "owners": base64.b64encode(raw).decode(),
            "buckets": buckets or [],
        },
    }


def write_json(path: str, doc) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)  # as the supervisor does: a reader sees the old file or the new


@pytest.fixture(scope="session")
def zk():
    hosts = os.environ.get("SHARDVISOR_TEST_ZK") or ",".join(f"127.0.0.1:{ZK_BASE + i}" for i in range(3))
    if not any(_listening(int(h.rsplit(":", 1)[1])) for h in hosts.split(",")):
        need("ZooKeeper of scripts/devenv is not up (scripts/devenv --plain up)")
    return hosts


@pytest.fixture(scope="session")
def bins():
    """The Go binaries: SHARDVISOR_BIN_DIR (the Go test that runs this
    suite builds them there), else built from this checkout."""
    d = os.environ.get("SHARDVISOR_BIN_DIR")
    if d:
        return d
    if not shutil.which("go"):
        need("go is not installed and SHARDVISOR_BIN_DIR is not set")
    d = tempfile.mkdtemp(prefix="svpy-bin-")
    subprocess.run(["go", "build", "-o", d + "/", "./cmd/shardctl", "./cmd/supervisor", "./cmd/router"], cwd=REPO, check=True)
    return d


def wait_for(cond, timeout: float, what: str, every: float = 0.05):
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


class Writers:
    """n writer threads, run until stop(): writer k calls write(k, i) for
    i = 0, 1, ...; what a call returns is acknowledged (acked, with its time
    in stamps), what it raises is counted (failed, its repr)."""

    def __init__(self, n: int, write):
        self.acked, self.stamps, self.failed = [], [], []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(k, write)) for k in range(n)]
        for t in self._threads:
            t.start()

    def _run(self, k, write):
        i = 0
        while not self._stop.is_set():
            try:
                done = write(k, i)
                with self._lock:
                    self.acked.append(done)
                    self.stamps.append(time.monotonic())
            except Exception as e:
                with self._lock:
                    self.failed.append(repr(e))
            i += 1

    def stop(self, timeout: float):
        self._stop.set()
        for t in self._threads:
            t.join(timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ZKCluster:
    """A cluster of the devenv's ZooKeeper made with the real shardctl: two
    db nodes (a fresh database on pg1 and one on pg2), the notes schema
    recorded and applied, app.notes sharded and fenced on both."""

    def __init__(self, bins, zk, pg, db, level=2):
        self.bins, self.zk, self.pg, self.db = bins, zk, pg, db
        self.name = "py" + uuid.uuid4().hex[:8]
        self.flags = ["--zk", zk, "--zk-root", ZK_ROOT, "--cluster", self.name]  # for shardctl, supervisor and router
        pw = f"file:{pg.password_file}"
        self.ctl("init", "--level", str(level), "--seed", SEED, "--password", pw,
                 "--node", f"pg1={pg.dsn(0, db)}", "--node", f"pg2={pg.dsn(1, db)}")
        self.ctl("schema", "apply", os.path.join(REPO, "examples", "notes", "schema", "001-notes.sql"))
        self.ctl("table", "add", "app.notes", "--key", "bkey")
        for n in ("pg1", "pg2"):
            self.ctl("node", "prepare", n)

    def ctl(self, *args, timeout=60):
        p = subprocess.run([os.path.join(self.bins, "shardctl"), *self.flags, *args],
                           capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise AssertionError(f"shardctl {' '.join(args)}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p.stdout

    def ctl_json(self, *args):
        return json.loads(self.ctl("--json", *args))


@pytest.fixture(scope="module")
def zk_cluster(bins, zk, pg, node_dbs):
    return ZKCluster(bins, zk, pg, node_dbs)
