"""Connections to the right db node: one pool per node, and run(), which
runs a transaction on a user's node and retries what a move held back.

    from shardvisor import Router
    from shardvisor.db import Pools

    pools = Pools(Router.from_env())           # psycopg 3 if installed, else psycopg2

    def add_note(conn):
        with conn.cursor() as cur:
            cur.execute("INSERT INTO app.notes (bkey, uid, id, body) VALUES (%s, %s, %s, %s)",
                        (pools.router.key("alice"), "alice", 1, "hi"))

    pools.run("alice", add_note)

What run() retries, and what it never does: it retries an attempt that
certainly did not commit, re-reading the route each time: no connection
to the node could be made (nothing was sent; a Patroni group between
primaries), or the node's fence refused a statement with SQLSTATE SV001
(the bucket is in a move's write pause, or has moved: PostgreSQL rolled
the transaction back). Anything else is raised at once. A connection lost
while fn ran or during COMMIT is retried only when the caller says
idempotent=True: a loss during COMMIT leaves the outcome unknown
(OutcomeUnknown), and run() cannot know what fn did. fn must not commit
or roll back itself; it may run more than once, so what it does outside
the transaction must be safe to repeat.

Two paths to a node. A node whose map record has a pool_dsn sits behind a
PgBouncer in transaction mode: Pools connect there by default (the
application path, Node.app_dsn), with psycopg 3's prepared statements off
(prepare_threshold=None; PgBouncer before 1.21 cannot carry them). Work
that needs session state (SET without LOCAL, session advisory locks,
LISTEN, WITH HOLD cursors, temporary tables across transactions) uses
Pools(router, direct=True), or direct_pools() for the process's: the same
run() and connection(), on the node's dsn (the direct path).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import random
import select
import threading
import weakref
import time
import urllib.parse
from typing import Callable, Dict, Iterator, List, Optional, Tuple, TypeVar

from .routing import MapError, Node, Route, Router, RoutingTable

T = TypeVar("T")

FENCE_SQLSTATE = "SV001"
# A write a group's standby refused: through a member's pooler after a
# failover, the pooler's server connections reach a demoted server while
# the client's connection to the pooler lives on (router.Do does the same;
# on a plain node the code is raised).
READ_ONLY_SQLSTATE = "25006"
# PgBouncer's errors (SQLSTATE 08P01) for a query it found no server for:
# its server down or restarting (a failover), or every server busy for
# query_wait_timeout. PgBouncer sends them only to a client waiting for a
# server, never to one in a transaction: the query reached no server, so
# it is retried on any node, as router.Do does (sqlstate.IsPoolerNoServer).
# Its other errors ("server conn crashed?") come after the query was sent
# and are not. "server login has been failing" ends with a cached error
# from PgBouncer 1.24 on; "pgbouncer cannot connect to server" is 1.16's.
POOLER_SQLSTATE = "08P01"
POOLER_NO_SERVER = (
    "query_wait_timeout",
    "client_login_timeout (server down)",
    "pgbouncer cannot connect to server",
)
POOLER_LOGIN_FAILING = "server login has been failing"
DEFAULT_RETRY_FOR = 10.0  # seconds, as router.DefaultRetryFor: a pause lasts well under a second
IDLE_PING_AFTER = 1.0  # seconds idle after which a pooled connection is pinged before use
DEFAULT_MAX_SIZE = 2  # connections per node and process: a prefork worker serves one request at a time
DEFAULT_MAX_IDLE = 60.0  # seconds idle after which a pooled connection is closed (at the next checkout or return)


class Error(Exception):
    """Base of the errors shardvisor.db raises itself."""


class GaveUp(Error):
    """run() retried until its bound and the last attempt still failed."""

    def __init__(self, uid: str, attempts: int, route: Optional[Route], cause: BaseException, why: str = ""):
        self.uid, self.attempts, self.route, self.cause = uid, attempts, route, cause
        where = f" on db node {route.node}" if route else ""
        super().__init__(f"shardvisor: gave up on {uid!r} after {attempts} attempts{where}{why}: {cause}")


class NoPrimary(GaveUp):
    """No server of the user's node accepted a read-write connection until
    the bound: a plain node that is down, or a Patroni group whose standby
    was not promoted in time. (A server's own refusal, a wrong password, a
    missing database, too many connections, is raised at once, unretried.)"""


class OutcomeUnknown(Error):
    """The connection was lost during COMMIT: the transaction may have
    committed or not. run() retries it only with idempotent=True."""


class PoolClosed(Error):
    """The node's pool was closed by a new map (the node was removed, or its
    DSN or password reference changed) between the route and the checkout:
    nothing was sent, and run() retries on the new map."""


class TransactionAborted(Error):
    """fn returned with its transaction aborted by an error it caught:
    nothing was committed (a COMMIT would have rolled it back silently)."""


class _Driver:
    """What run() needs of a DB-API driver: psycopg 3 or psycopg2."""

    def __init__(self, name: str):
        self.name = name
        if name == "psycopg":
            import psycopg  # noqa: F401

            self.mod = psycopg
        elif name == "psycopg2":
            import psycopg2
            import psycopg2.extensions

            self.mod = psycopg2
        else:
            raise ValueError(f"driver must be psycopg or psycopg2, not {name!r}")

    def connect(self, dsn: str, password: Optional[str], connect_timeout: float, pooled: bool = False):
        """A connection on dsn. pooled: dsn is a transaction-mode pooler,
        where psycopg 3 must not prepare statements (psycopg2 never does)."""
        kw = {}
        if password is not None:
            kw["password"] = password
        if "connect_timeout" not in dsn:
            kw["connect_timeout"] = max(1, int(connect_timeout))
        kw.update(driver_options(self.name, pooled))
        return self.mod.connect(dsn, **kw)

    def is_error(self, e: BaseException) -> bool:
        return isinstance(e, self.mod.Error)

    def broken(self, conn) -> bool:
        if self.name == "psycopg":
            return conn.closed or conn.broken
        return conn.closed != 0

    def in_error(self, conn) -> bool:
        """The transaction was aborted by an error that fn caught: COMMIT
        would only roll it back, silently."""
        st = conn.info.transaction_status
        if self.name == "psycopg":
            from psycopg.pq import TransactionStatus

            return st == TransactionStatus.INERROR
        import psycopg2.extensions as ext

        return st == ext.TRANSACTION_STATUS_INERROR


def sqlstate(e: BaseException) -> Optional[str]:
    """The SQLSTATE of a driver's error: psycopg 3's sqlstate, psycopg2's pgcode."""
    return getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)


# A server that answered a connection with a refusal of its own is not a
# failover: retrying a wrong password, a missing database or "too many
# connections" a hundred times only makes it worse (router.noPrimary).
REFUSED_STATES = ("28000", "28P01", "3D000", "53300", "42501")
REFUSED_TEXT = ("password authentication failed", "no pg_hba.conf entry", "does not exist",
                "too many clients", "too many connections", "permission denied", 'role "')


def pooler_no_server(e: BaseException) -> bool:
    """Whether e is PgBouncer refusing a query it found no server for
    (nothing was sent). The primary message decides, as in Go; psycopg2
    may report PgBouncer's FATAL without its code, and then the error's
    first line ("FATAL:  query_wait_timeout") stands for it."""
    code = sqlstate(e)
    if code not in (None, POOLER_SQLSTATE):
        return False
    diag = getattr(e, "diag", None)
    msg = getattr(diag, "message_primary", None) if diag is not None else None
    if not msg:
        if code is not None:
            return False
        first = str(e).strip().split("\n", 1)[0]
        msg = first.split(":", 1)[1].strip() if first.startswith("FATAL:") else first
    msg = msg.strip()
    return msg in POOLER_NO_SERVER or (msg.startswith(POOLER_LOGIN_FAILING) and msg.endswith("(server_login_retry)"))


def refused(e: BaseException) -> bool:
    """Whether a connect error is the server's own refusal. A connection
    refused before any SQLSTATE exists is known by its message only."""
    code = sqlstate(e)
    if code:
        return code in REFUSED_STATES
    return any(t in str(e) for t in REFUSED_TEXT)


def driver_options(driver: str, pooled: bool) -> dict:
    """Arguments of the driver's connect() (not libpq keywords) for a path:
    through a transaction-mode pooler, psycopg 3 gets prepare_threshold=None.
    Past its threshold (5 executions of a query on a connection) it would
    prepare named statements on the server, which PgBouncer before 1.21
    does not carry from one transaction's server connection to the next
    ("prepared statement ... does not exist"). psycopg2 binds parameters
    on the client and never prepares."""
    if pooled and driver == "psycopg":
        return {"prepare_threshold": None}
    return {}


def default_driver() -> str:
    """psycopg (3) when it can be imported, else psycopg2."""
    try:
        import psycopg  # noqa: F401

        return "psycopg"
    except ImportError:
        import psycopg2  # noqa: F401

        return "psycopg2"


class NodePool:
    """Connections to one db node on one path: idle ones reused last-in
    first-out, at most max_size open. A connection idle for over a second
    (IDLE_PING_AFTER), or whose socket is readable, is pinged before it is
    handed out, so one left broken by a failover or a server restart is
    replaced before fn sends anything on it. One idle for over max_idle
    seconds is closed at the next checkout or return (None: kept)."""

    def __init__(self, node: Node, driver: _Driver, max_size: int = DEFAULT_MAX_SIZE, connect_timeout: float = 5.0,
                 checkout_timeout: float = 30.0, direct: bool = False, max_idle: Optional[float] = DEFAULT_MAX_IDLE):
        self.node = node
        self.driver = driver
        self.max_size = max_size
        self.connect_timeout = connect_timeout
        self.checkout_timeout = checkout_timeout
        self.direct = direct
        self.dsn = node.path_dsn(direct)  # pool_dsn (a pooler) or dsn
        self.pooled = node.pooled(direct)
        self.max_idle = max_idle
        self._idle: List[Tuple[object, float]] = []  # (conn, idle since), oldest first
        self._slots = threading.BoundedSemaphore(max_size)
        self._lock = threading.Lock()
        self.closed = False
        self.connects = 0  # connections made, for tests and metrics
        self.idle_closed = 0  # connections closed for idling over max_idle
        self._in_use: set = set()  # connections handed out and not returned (for a fork)

    def get(self):
        """A connection in a fresh transaction state. Raises the driver's
        error when none can be made (nothing was sent)."""
        if not self._slots.acquire(timeout=self.checkout_timeout):
            raise Error(f"db node {self.node.id}: no connection free after {self.checkout_timeout} s (max_size {self.max_size})")
        try:
            self._close_idle()
            while True:
                with self._lock:
                    if self.closed:
                        raise PoolClosed(f"db node {self.node.id}: its pool was closed by a new map")
                    item = self._idle.pop() if self._idle else None
                if item is None:
                    conn = self.driver.connect(self.dsn, self.node.resolve_password(), self.connect_timeout, self.pooled)
                    with self._lock:
                        self.connects += 1
                        self._in_use.add(conn)
                    return conn
                conn, since = item
                if self.driver.broken(conn):
                    self._close(conn)
                    continue
                # Idle a while, or the server already sent something (an
                # idle session gets nothing but its end: a terminated
                # backend, a restart): ping before fn sends anything.
                if time.monotonic() - since > IDLE_PING_AFTER or _readable(conn):
                    try:
                        with conn.cursor() as cur:
                            cur.execute("SELECT 1")
                        conn.rollback()
                    except self.driver.mod.Error:
                        self._close(conn)
                        continue
                with self._lock:
                    self._in_use.add(conn)
                return conn
        except BaseException:
            self._slots.release()
            raise

    def put(self, conn, discard: bool = False) -> None:
        with self._lock:
            self._in_use.discard(conn)
        try:
            if discard or self.closed or self.driver.broken(conn):
                self._close(conn)
                return
            with self._lock:
                if not self.closed:
                    self._idle.append((conn, time.monotonic()))
                    return
            self._close(conn)
        finally:
            self._slots.release()
            self._close_idle()

    def _close_idle(self) -> None:
        """Closes the connections idle for over max_idle. The idle list is
        oldest first, the newest is reused first: under a steady load one
        connection stays warm and the others age out."""
        if self.max_idle is None:
            return
        cutoff = time.monotonic() - self.max_idle
        with self._lock:
            n = 0
            while n < len(self._idle) and self._idle[n][1] < cutoff:
                n += 1
            if not n:
                return
            old, self._idle = self._idle[:n], self._idle[n:]
            self.idle_closed += n
        for conn, _ in old:
            self._close(conn)

    def discard_idle(self) -> None:
        """Closes every idle connection: after a failover seen through a
        pooler each of them may lead to the standby."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            self._close(conn)

    def close(self) -> None:
        """Closes the idle connections; those in use close when returned."""
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            self._close(conn)

    @staticmethod
    def _close(conn) -> None:
        try:
            conn.close()
        except Exception:
            pass


def _readable(conn) -> bool:
    try:
        return bool(select.select([conn.fileno()], [], [], 0)[0])
    except (OSError, ValueError, AttributeError):
        return True


# Connections a forked child inherited: its parent's sessions. The child
# must never use them (two processes' statements on one session) nor close
# them (closing sends the server a Terminate: it would end the parent's
# session too), so it keeps them, unused, for its life.
_inherited: List[object] = []


class Pools:
    """One NodePool per db node of the router's map, opened on first use.

    Paths: by default each node is reached on its application path, its
    pool_dsn when it has one (a PgBouncer in transaction mode; psycopg 3
    then connects with prepare_threshold=None), else its dsn. direct=True
    connects on the dsn always: a session of its own, for work that needs
    session state (SET without LOCAL, session advisory locks, LISTEN, WITH
    HOLD cursors, temporary tables across transactions). run() and
    connection() behave the same on either path: the same routing, the
    same retries.

    Sizes: at most max_size connections per node (default 2, for a
    prefork worker that serves one request at a time; raise it for a
    threaded one), idle ones closed after max_idle seconds (default 60).

    It follows the router: when a map removes a node, or changes the DSN of
    its path or its password reference, that node's pool is closed
    (connections in use close when returned) and the next use opens a new
    one. A Patroni group's DSN names every member with
    target_session_attrs=read-write, so a new connection reaches the
    current primary; connections to a primary that failed are found broken
    and replaced.
    """

    def __init__(self, router: Router, driver: Optional[str] = None, max_size: int = DEFAULT_MAX_SIZE,
                 connect_timeout: float = 5.0, retry_for: float = DEFAULT_RETRY_FOR, direct: bool = False,
                 max_idle: Optional[float] = DEFAULT_MAX_IDLE):
        self.router = router
        self.driver = _Driver(driver or default_driver())
        self.max_size = max_size
        self.connect_timeout = connect_timeout
        self.retry_for = retry_for
        self.direct = direct
        self.max_idle = max_idle
        self._pools: Dict[str, NodePool] = {}
        self._lock = threading.Lock()
        self._closed = False
        # Counts of run()'s retries by cause: "fence" (SV001), "connect"
        # (no connection), "standby" (25006: a write a standby refused), "pooler"
        # (the node's PgBouncer found no server), "lost" (a lost connection,
        # idempotent work).
        self.retries: Dict[str, int] = {"fence": 0, "connect": 0, "standby": 0, "pooler": 0, "lost": 0}
        router.on_change(self._on_map)
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: ref() is not None and ref()._after_fork_child())

    def _after_fork_child(self) -> None:
        """A forked child (a pre-forking server's worker) starts with no
        connections: the parent's stay the parent's."""
        self._lock = threading.Lock()
        for p in self._pools.values():
            _inherited.extend(conn for conn, _ in p._idle)
            _inherited.extend(p._in_use)  # other threads' connections: their threads are gone
            p._idle, p._in_use = [], set()
        self._pools = {}

    def pool(self, node_id: str) -> NodePool:
        with self._lock:
            if self._closed:
                raise Error("pools are closed")
            p = self._pools.get(node_id)
            if p is None:
                p = NodePool(self.router.node(node_id), self.driver, self.max_size, self.connect_timeout,
                             direct=self.direct, max_idle=self.max_idle)
                self._pools[node_id] = p
            return p

    def open_nodes(self) -> List[str]:
        with self._lock:
            return sorted(self._pools)

    def _on_map(self, old: RoutingTable, new: RoutingTable) -> None:
        gone = []
        with self._lock:
            for nid, p in list(self._pools.items()):
                n = new.nodes.get(nid)
                if n is None or n.state == "removed" or (n.path_dsn(self.direct), n.password) != (p.dsn, p.node.password):
                    gone.append(self._pools.pop(nid))
        for p in gone:
            p.close()

    def close(self) -> None:
        self.router.remove_listener(self._on_map)
        with self._lock:
            self._closed = True
            pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            p.close()

    @contextlib.contextmanager
    def connection(self, uid: str) -> Iterator[Tuple[object, Route]]:
        """(conn, route) for uid's node, without retries: commits when the
        block ends, rolls back on an exception."""
        rt = self.router.route(uid)
        p = self.pool(rt.node)
        conn = p.get()
        broken = False
        try:
            yield conn, rt
            conn.commit()
        except BaseException:
            broken = self._rollback(conn)
            raise
        finally:
            p.put(conn, discard=broken)

    def _count(self, why: str) -> None:
        with self._lock:
            self.retries[why] += 1

    def _rollback(self, conn) -> bool:
        """Rolls back; True when the connection is no longer usable."""
        try:
            conn.rollback()
        except Exception:
            return True
        return self.driver.broken(conn)

    def run(self, uid: str, fn: Callable[[object], T], idempotent: bool = False,
            retry_for: Optional[float] = None) -> T:
        """Runs fn(conn) in a transaction on uid's node and commits it.

        Retries (after a jittered wait of 2 ms doubling up to 100 ms, and
        re-reading the route) while the attempt certainly did not commit:
        no connection could be made, or the fence refused it (SV001). While
        the bucket's map state is moving, the route is re-read every 2 ms
        and the write is tried again as soon as the map names the new owner.
        With idempotent=True a connection lost during fn or COMMIT is
        retried too. Gives up after retry_for seconds (default 10) with
        GaveUp (NoPrimary when no connection could be made), which names the
        user, the node, the attempts and the last error.
        """
        bound = self.retry_for if retry_for is None else retry_for
        return retrying(uid, self.router.route, lambda rt: self._attempt(uid, rt, fn, idempotent), bound)

    def _attempt(self, uid: str, rt: Route, fn, idempotent: bool):
        """One try. Returns ((result,), False) on success, or (error,
        connect_failed) for an error worth retrying; raises the others."""
        try:
            p = self.pool(rt.node)
        except MapError as e:
            return e, False  # a map without the node came in after the route: nothing was sent
        try:
            conn = p.get()
        except PoolClosed as e:
            return e, False  # nothing was sent; the next attempt routes on the new map
        except Exception as e:
            if self.driver.is_error(e) and not refused(e):
                self._count("connect")
                return e, True  # nothing was sent
            raise
        broken = False
        committing = False
        try:
            result = fn(conn)
            if self.driver.in_error(conn):
                raise TransactionAborted(
                    f"shardvisor: fn for {uid!r} returned with its transaction aborted by an error it caught "
                    f"(db node {rt.node}): nothing was committed")
            committing = True
            conn.commit()
            return (result,), False
        except BaseException as e:
            broken = self._rollback(conn)
            if not self.driver.is_error(e):
                raise
            if sqlstate(e) == FENCE_SQLSTATE:
                self._count("fence")
                return e, False  # rolled back by the fence
            if sqlstate(e) == READ_ONLY_SQLSTATE and p.node.patroni:
                # A group's standby wrote nothing: drop this connection and
                # the idle ones, whose next checks find the primary's
                # pooler. On a plain node 25006 is the application's own
                # READ ONLY transaction, which no retry mends: raised.
                self._count("standby")
                broken = True
                p.discard_idle()
                return e, True
            if pooler_no_server(e):
                # PgBouncer closed this connection; the query reached no
                # server.
                self._count("pooler")
                broken = True
                return e, True
            lost = broken or self.driver.broken(conn)
            if lost and idempotent:
                self._count("lost")
                return e, False
            if lost and committing:
                raise OutcomeUnknown(
                    f"shardvisor: the connection to db node {rt.node} was lost during COMMIT of {uid!r}'s transaction: "
                    f"it may have committed (pass idempotent=True to retry such work): {e}") from e
            raise
        finally:
            p.put(conn, discard=broken)

def retrying(uid: str, route: Callable[[str], Route], attempt: Callable[[Route], tuple], retry_for: float):
    """The retry loop of run() (and of shardvisor.django.run): attempt(rt)
    returns ((result,), False) on success or (error, connect_failed) for an
    error that certainly did not commit, and raises anything else."""
    deadline = time.monotonic() + retry_for
    delay = 0.002
    n = 0
    while True:
        n += 1
        rt = route(uid)
        out, connect_failed = attempt(rt)
        if not isinstance(out, BaseException):
            return out[0]
        wait = delay * (0.5 + random.random() / 2)  # jitter: writers held by one pause do not return together
        delay = min(delay * 2, 0.1)
        if time.monotonic() + wait > deadline:
            why = f" (bucket {rt.bucket} is still moving to {rt.target})" if rt.state == "moving" and rt.target else ""
            cls = NoPrimary if connect_failed else GaveUp
            raise cls(uid, n, rt, out, why) from out
        if rt.state != "moving":
            time.sleep(wait)
            continue
        # The route changes the moment the map flips, and route() is in
        # memory: watch it closely rather than sleep the whole backoff.
        end = time.monotonic() + wait
        while time.monotonic() < end:
            time.sleep(0.002)
            now = route(uid)
            if now.node != rt.node or now.state != rt.state:
                break


_default: Optional[Pools] = None
_direct: Optional[Pools] = None
_default_lock = threading.Lock()


def default_pools() -> Pools:
    """The process's Pools on Router.from_env(), made on first use: the
    application path (a node's pooler when it has one)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Pools(Router.from_env())
        return _default


def direct_pools() -> Pools:
    """The process's Pools on the direct path (every node's dsn), on
    Router.from_env(), made on first use: for work that needs session
    state, which a transaction-mode pooler does not keep.

        shardvisor.db.direct_pools().run(uid, fn)
    """
    global _direct
    with _default_lock:
        if _direct is None:
            _direct = Pools(Router.from_env(), direct=True)
        return _direct


def run(uid: str, fn: Callable[[object], T], idempotent: bool = False, retry_for: Optional[float] = None) -> T:
    """default_pools().run(...): for a worker of the supervisor."""
    return default_pools().run(uid, fn, idempotent=idempotent, retry_for=retry_for)


def connection_kwargs(node: Node, direct: bool = False, driver: Optional[str] = None) -> dict:
    """Keywords to connect to a node (host, port, dbname, user, password and
    the URL's parameters), for frameworks that want them apart rather than
    a URL: Django's DATABASES, SQLAlchemy's creator. A multi-host DSN gives
    comma-separated host and port lists, which libpq reads the same way.

    The application path by default (the node's pool_dsn when it has one,
    else its dsn); direct=True: the dsn. driver ("psycopg" or "psycopg2";
    default: default_driver()) is the driver the keywords go to: on a
    pooler's path psycopg 3 also gets prepare_threshold=None, an argument
    of psycopg.connect rather than a libpq keyword (driver_options)."""
    dsn = node.path_dsn(direct)
    field = "pool_dsn" if node.pooled(direct) else "dsn"
    u = urllib.parse.urlsplit(dsn)
    if u.scheme not in ("postgres", "postgresql"):
        raise MapError(f"db node {node.id}: {field} is not a postgres:// URL")
    netloc = u.netloc
    user = ""
    if "@" in netloc:
        user, netloc = netloc.rsplit("@", 1)
        if ":" in user:
            user = user.split(":", 1)[0]
    hosts, ports = [], []
    for hp in netloc.split(","):
        if hp.startswith("["):
            h, _, rest = hp[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ""
        else:
            h, _, port = hp.partition(":")
        hosts.append(urllib.parse.unquote(h))
        ports.append(port or "5432")
    user = urllib.parse.unquote(user) or os.environ.get("PGUSER") or getpass.getuser()
    # As libpq: no database in the URL means PGDATABASE, else the user's name.
    dbname = urllib.parse.unquote(u.path.lstrip("/")) or os.environ.get("PGDATABASE") or user
    kw = {"host": ",".join(hosts), "port": ",".join(ports), "dbname": dbname, "user": user}
    for k, v in urllib.parse.parse_qsl(u.query):
        kw[k] = v
    pw = node.resolve_password()
    if pw is not None:
        kw["password"] = pw
    if driver is None:
        try:
            driver = default_driver()
        except ImportError:
            driver = ""  # neither installed: libpq keywords only
    kw.update(driver_options(driver, node.pooled(direct)))
    return kw
