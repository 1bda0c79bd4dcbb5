"""Django: one database alias per db node, and a database router that sends
the models of sharded apps to the current user's node.

settings.py::

    import shardvisor.django

    DATABASES = {
        "default": {...},                        # auth, sessions, admin: not sharded
        **shardvisor.django.databases(),         # "pg1", "pg2", ...: one per node of the map
    }
    DATABASE_ROUTERS = ["shardvisor.django.Router"]
    SHARDVISOR_SHARDED_APPS = ["notes"]          # apps whose rows live on the users' nodes
    MIDDLEWARE = [..., "shardvisor.django.UserMiddleware"]
    SHARDVISOR_USER_ID = "myapp.auth.user_id"    # optional: request -> user id (default: request.user.pk)

and in code, outside a request (or to act for another user)::

    with shardvisor.django.for_user("alice"):
        Note.objects.create(uid="alice", body="hi")       # on alice's node

    shardvisor.django.run("alice", lambda: Note.objects.create(...))   # retried through a move's pause

The map comes from Router.from_env() (the supervisor's SHARDVISOR_MAP_FILE,
followed in reload mode), or from the setting SHARDVISOR_MAP_FILE.

Nodes added later. Django reads DATABASES once, at start. In the
supervisor's swap mode every map change starts new workers, which read the
new map. In reload mode the worker keeps running on the new map: the router
adds an alias for a node it has not seen the first time a user routes to
it (the connection is opened then, like any Django connection), and a
node whose DSN changed gets the new settings for its next connection.

Poolers. Each alias connects on its node's application path: the node's
pool_dsn when it has one (a PgBouncer in transaction mode), with
prepare_threshold=None under psycopg 3 and server-side cursors off
(database_settings). Work that needs session state goes on the direct
path: shardvisor.db.direct_pools(), or an alias of your own built with
database_settings(node, direct=True).
"""

from __future__ import annotations

import contextvars
import importlib
import threading
from typing import Callable, Dict, Optional, TypeVar

from django.conf import settings
from django.db import DatabaseError, connections, transaction

from . import db as _db
from .context import current_user, for_user, reset_user, set_user
from .routing import MapError, Node, Router as MapRouter

T = TypeVar("T")

__all__ = ["Router", "UserMiddleware", "databases", "for_user", "current_user", "run", "NoCurrentUser"]

_router: Optional[MapRouter] = None
_router_lock = threading.Lock()


class NoCurrentUser(LookupError):
    """A sharded model was queried with no current user."""


def map_router() -> MapRouter:
    """The process's shardvisor Router: settings.SHARDVISOR_ROUTER (a
    Router, or a callable returning one), settings.SHARDVISOR_MAP_FILE, or
    Router.from_env()."""
    global _router
    with _router_lock:
        if _router is None:
            r = getattr(settings, "SHARDVISOR_ROUTER", None)
            if callable(r) and not isinstance(r, MapRouter):
                r = r()
            if r is None:
                path = getattr(settings, "SHARDVISOR_MAP_FILE", None)
                r = MapRouter.from_map_file(path) if path else MapRouter.from_env()
            _router = r
        return _router


def use_router(r: Optional[MapRouter]) -> None:
    """Sets the process's Router (tests, apps that build their own)."""
    global _router
    with _router_lock:
        _router = r


def _prefix() -> str:
    return getattr(settings, "SHARDVISOR_ALIAS_PREFIX", "")


def alias_for(node_id: str) -> str:
    return _prefix() + node_id


def backend_driver() -> str:
    """The driver Django's postgresql backend uses: psycopg (3) from Django
    4.2 when it is installed, else psycopg2 (Django before 4.2 has no other)."""
    try:
        from django.db.backends.postgresql.psycopg_any import is_psycopg3
    except ImportError:
        return "psycopg2"
    return "psycopg" if is_psycopg3 else "psycopg2"


def database_settings(node: Node, base: Optional[dict] = None, direct: bool = False) -> dict:
    """A DATABASES entry for one node. base (say CONN_MAX_AGE, TIME_ZONE)
    is copied in first.

    The node's application path: its pool_dsn when it has one (a PgBouncer
    in transaction mode), else its dsn; direct=True: its dsn. Through a
    pooler, OPTIONS get prepare_threshold=None when the backend runs on
    psycopg 3 (Django 4.2+ defaults to it too; psycopg2 takes no such
    option), and DISABLE_SERVER_SIDE_CURSORS is True unless base sets it:
    QuerySet.iterator() in autocommit declares a WITH HOLD cursor, which
    lives in the server session the pooler hands to others."""
    kw = _db.connection_kwargs(node, direct=direct, driver=backend_driver())
    entry = dict(base or {})
    if node.pooled(direct):
        entry.setdefault("DISABLE_SERVER_SIDE_CURSORS", True)
    entry.update({
        "ENGINE": "django.db.backends.postgresql",
        "NAME": kw.pop("dbname"),
        "USER": kw.pop("user", ""),
        "PASSWORD": kw.pop("password", ""),
        "HOST": kw.pop("host"),
        "PORT": kw.pop("port"),
    })
    options = dict(entry.get("OPTIONS") or {})
    options.update(kw)  # sslmode, target_session_attrs, connect_timeout, ...
    entry["OPTIONS"] = options
    return entry


def databases(router: Optional[MapRouter] = None, base: Optional[dict] = None, prefix: str = "",
              map_file: Optional[str] = None) -> Dict[str, dict]:
    """DATABASES entries, one per node of the map that is not removed,
    named by node id (plus prefix: give the same as SHARDVISOR_ALIAS_PREFIX).
    Call it in settings.py: the map is read then, from router, map_file, or
    Router.from_env(), and that router becomes the process's."""
    if router is None and map_file:
        router = MapRouter.from_map_file(map_file)
    if router is not None:
        use_router(router)
    r = router or _settings_router()
    out = {}
    for n in r.nodes.values():
        if n.state == "removed":
            continue
        if prefix + n.id == "default":
            raise MapError(f"db node {n.id!r} would be the alias 'default': set a prefix (SHARDVISOR_ALIAS_PREFIX)")
        out[prefix + n.id] = database_settings(n, base)
    return out


def _settings_router() -> MapRouter:
    # databases() runs while settings.py is imported, before settings are
    # configured: it cannot read SHARDVISOR_* settings yet.
    global _router
    with _router_lock:
        if _router is None:
            _router = MapRouter.from_env()
        return _router


_known: Dict[str, tuple] = {}  # alias -> (application DSN, password ref) its settings were built from


def _ensure_alias(node_id: str) -> str:
    """The alias of a node, added to Django's connections at run time when
    the map gained the node after start (reload mode), and refreshed when
    its DSN or password reference changed. Called on every query: the
    settings are built (a URL parse, a password file read) only when the
    node's connection changed."""
    alias = alias_for(node_id)
    node = map_router().node(node_id)
    if _known.get(alias) == (node.app_dsn, node.password) and alias in connections.databases:
        return alias
    want = database_settings(node, getattr(settings, "SHARDVISOR_DATABASE_BASE", None))
    dbs = connections.databases
    have = dbs.get(alias)
    if have is None:
        with _router_lock:
            if alias not in connections.databases:
                # A new dict, swapped in: another thread may be iterating
                # the old one (close_old_connections at a request's end).
                new = dict(connections.databases)
                new[alias] = want
                connections.settings = new  # ConnectionHandler.databases reads .settings
                connections.ensure_defaults(alias)
                connections.prepare_test_settings(alias)
    else:
        have.update({k: want[k] for k in ("NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS")})  # for its next connection
        have["DISABLE_SERVER_SIDE_CURSORS"] = want.get("DISABLE_SERVER_SIDE_CURSORS", False)
    _known[alias] = (node.app_dsn, node.password)
    return alias


def _sharded(model) -> bool:
    return model._meta.app_label in getattr(settings, "SHARDVISOR_SHARDED_APPS", ())


# run()'s attempt pins its user's alias: a map that changes while fn runs
# must not send the rest of fn's queries to another node, outside the
# transaction.
_pinned: contextvars.ContextVar[Optional[tuple]] = contextvars.ContextVar("shardvisor_django_pin", default=None)


def _user_alias(model) -> str:
    uid = current_user()
    pin = _pinned.get()
    if pin is not None and pin[0] == uid:
        return pin[1]
    if uid is None:
        raise NoCurrentUser(
            f"shardvisor.django: {model._meta.label} is in a sharded app ({model._meta.app_label}) and there is no current "
            "user: wrap the code in shardvisor.django.for_user(uid), or add shardvisor.django.UserMiddleware")
    return _ensure_alias(map_router().node_for(uid))


class Router:
    """For DATABASE_ROUTERS: models of SHARDVISOR_SHARDED_APPS go to the
    current user's node; other models are left to the next router (and so
    to "default")."""

    def db_for_read(self, model, **hints):
        if not _sharded(model):
            return None
        inst = hints.get("instance")
        if inst is not None and inst._state.db:
            return inst._state.db  # related objects of a row stay on its node
        return _user_alias(model)

    def db_for_write(self, model, **hints):
        if not _sharded(model):
            return None
        inst = hints.get("instance")
        if inst is not None and inst._state.db:
            return inst._state.db  # a row is saved or deleted where it was read
        return _user_alias(model)

    def allow_relation(self, obj1, obj2, **hints):
        s1, s2 = _sharded(type(obj1)), _sharded(type(obj2))
        if s1 or s2:
            return s1 and s2 and obj1._state.db == obj2._state.db
        return None

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        sharded = app_label in getattr(settings, "SHARDVISOR_SHARDED_APPS", ())
        is_node = db != "default" and db.startswith(_prefix()) and db[len(_prefix()):] in map_router().nodes
        if sharded:
            return is_node
        return False if is_node else None


def _default_user_id(request) -> Optional[str]:
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return str(user.pk)
    return None


class UserMiddleware:
    """Sets the current user for the request: settings.SHARDVISOR_USER_ID
    (a dotted path to a function of the request returning a user id or
    None), by default request.user's primary key when authenticated."""

    def __init__(self, get_response):
        self.get_response = get_response
        path = getattr(settings, "SHARDVISOR_USER_ID", None)
        if path:
            mod, _, name = path.rpartition(".")
            self.user_id: Callable = getattr(importlib.import_module(mod), name)
        else:
            self.user_id = _default_user_id

    def __call__(self, request):
        token = set_user(self.user_id(request))
        try:
            return self.get_response(request)
        finally:
            reset_user(token)


def _driver_error(e: BaseException) -> BaseException:
    """The driver's error a Django DatabaseError wraps."""
    return e.__cause__ or e.__context__ or e


def _fence_refused(e: BaseException) -> bool:
    return _db.sqlstate(_driver_error(e)) == _db.FENCE_SQLSTATE


def run(uid, fn: Callable[[], T], idempotent: bool = False, retry_for: float = _db.DEFAULT_RETRY_FOR) -> T:
    """Runs fn() for user uid in one transaction (transaction.atomic) on
    the user's node, with the rules of shardvisor.db's run(): retried while
    no connection can be made, on the fence's refusal (SQLSTATE SV001, a
    move's write pause), on PgBouncer's no-server errors and, on a Patroni
    group's node, on a standby's refusal (25006), re-routed each time, up
    to retry_for seconds.
    fn's queries all go to the node the attempt started on, whatever the
    map does meanwhile. A connection lost during fn is retried only with
    idempotent=True, one lost during COMMIT raises OutcomeUnknown (or is
    retried with idempotent=True), and fn returning with its transaction
    marked for rollback (it caught a database error) raises
    TransactionAborted: nothing was committed."""
    uid = str(uid)
    r = map_router()

    def attempt(rt):
        alias = _ensure_alias(rt.node)
        conn = connections[alias]
        with for_user(uid):
            token = _pinned.set((uid, alias))
            try:
                try:
                    conn.ensure_connection()
                except DatabaseError as e:
                    if _db.refused(_driver_error(e)):
                        raise
                    return e, True  # nothing was sent
                done = False
                try:
                    with transaction.atomic(using=alias):
                        result = fn()
                        done = True
                        aborted = transaction.get_rollback(using=alias)
                    if aborted:
                        raise _db.TransactionAborted(
                            f"shardvisor: fn for {uid!r} returned with its transaction marked for rollback by an error it "
                            f"caught (db node {rt.node}): nothing was committed")
                    return (result,), False
                except DatabaseError as e:
                    if _fence_refused(e):
                        return e, False
                    cause = _driver_error(e)
                    if _db.pooler_no_server(cause) or (_db.sqlstate(cause) == _db.READ_ONLY_SQLSTATE and rt.group):
                        # PgBouncer found no server for the query, or a
                        # group's standby refused the write (a failover
                        # seen through a member's pooler): nothing was
                        # written. A new connection finds the primary's
                        # pooler (target_session_attrs).
                        conn.close()
                        return e, True
                    lost = conn.connection is None or getattr(conn.connection, "closed", 0) != 0
                    if lost:
                        conn.close()
                        if idempotent:
                            return e, False
                        if done:
                            raise _db.OutcomeUnknown(
                                f"shardvisor: the connection to db node {rt.node} was lost during COMMIT of {uid!r}'s "
                                f"transaction: it may have committed (pass idempotent=True to retry such work): {e}") from e
                    raise
            finally:
                _pinned.reset(token)

    return _db.retrying(uid, r.route, attempt, retry_for)

