"""Routing from a map file: which db node holds a user.

A map file is what the supervisor hands its workers (SHARDVISOR_MAP_FILE)
and what the router sidecar serves at GET /v1/map: the cluster's seed and
its bucket map exactly as stored in ZooKeeper (docs/bucket-map.md). With
it a user id is routed with no network at all: one HMAC-SHA256 of the id
(the keystream), a shift, one list index.

Map formats 1 (every bucket at the map's level) and 2 (mixed depths: single
buckets split deeper) are read. Either way the map is flattened into a
directory of 2**level slots, each naming its bucket's owner, so a lookup
costs the same at any depth. A newer format is refused, never guessed at.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import threading
import urllib.parse
import weakref
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

from . import keystream
from .notify import sd_notify

MAP_FILE_FORMATS = (1,)
MAP_FORMATS = (1, 2)
MAX_LEVEL = 17  # bucketmap.MaxLevel: a map at one depth
MAX_DEPTH = 20  # bucketmap.MaxDepth: the deepest bucket of a mixed map
NODE_STATES = ("active", "draining", "down", "removed")
BUCKET_STATES = ("active", "moving")

ENV_MAP_FILE = "SHARDVISOR_MAP_FILE"
ENV_MAP_DELIVERY = "SHARDVISOR_MAP_DELIVERY"
ENV_MAP_SIGNAL = "SHARDVISOR_MAP_SIGNAL"


class MapError(ValueError):
    """A map file or map document that cannot be used, with what is wrong."""


class Node(NamedTuple):
    """A db node of the map's registry.

    dsn is the node's direct path: a session of its own on the server, for
    work that needs session state. pool_dsn, when set, is its application
    path: a PgBouncer in transaction mode in front of the node (same form,
    same password reference). app_dsn is the path applications use."""

    id: str
    dsn: str  # a postgres:// URL without a password; multi-host for a Patroni group
    password: str  # "env:NAME", "file:/path" or "" (libpq's own sources)
    state: str  # active, draining, down, removed
    weight: int
    patroni: Optional[dict]  # {"namespace", "scope"} for a Patroni group
    pool_dsn: str = ""  # a transaction-mode pooler in front of the node, or "" (none)

    @property
    def app_dsn(self) -> str:
        """The application path: pool_dsn when the node has a pooler, else dsn."""
        return self.pool_dsn or self.dsn

    def path_dsn(self, direct: bool = False) -> str:
        """dsn with direct=True (the direct path), else app_dsn."""
        return self.dsn if direct else self.app_dsn

    def pooled(self, direct: bool = False) -> bool:
        """Whether that path goes through a transaction-mode pooler."""
        return not direct and bool(self.pool_dsn)

    def resolve_password(self) -> Optional[str]:
        """The password the node's reference names; None when it names none.

        Raises MapError naming the node and the reference when the variable
        is unset or the file cannot be read.
        """
        ref = self.password
        if not ref:
            return None
        if ref.startswith("env:"):
            try:
                return os.environ[ref[4:]]
            except KeyError:
                raise MapError(f"db node {self.id}: password reference {ref}: environment variable {ref[4:]} is not set") from None
        if ref.startswith("file:"):
            try:
                with open(ref[5:], encoding="utf-8") as f:
                    line = f.readline()
            except OSError as e:
                raise MapError(f"db node {self.id}: password reference {ref}: {e}") from None
            return line.rstrip("\n").rstrip("\r")
        raise MapError(f"db node {self.id}: password reference must be env:NAME or file:/path, not {ref!r}")


def redact_dsn(dsn: str) -> str:
    """dsn with any password in it replaced, for error messages."""
    try:
        u = urllib.parse.urlsplit(dsn)
    except ValueError:
        return "<unparseable dsn>"
    netloc, query = u.netloc, u.query
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        if ":" in user:
            netloc = user.split(":", 1)[0] + ":REDACTED@" + host
    q = urllib.parse.parse_qsl(u.query, keep_blank_values=True)
    if any(k == "password" for k, _ in q):
        query = urllib.parse.urlencode([(k, "REDACTED" if k == "password" else v) for k, v in q])
    if (netloc, query) == (u.netloc, u.query):
        return dsn
    return urllib.parse.urlunsplit((u.scheme, netloc, u.path, query, u.fragment))


def check_pool_dsn(node_id, dsn) -> None:
    """Checks a node's pool_dsn as bucketmap.ValidateDSN checks a dsn: a
    postgres:// URL with a host, no password (the node's password
    reference applies), hosts and ports in the authority, and
    target_session_attrs=read-write when it lists several hosts. Raises
    MapError naming the node."""
    what = f"node {node_id}: pool_dsn"
    if not isinstance(dsn, str):
        raise MapError(f"{what} is {type(dsn).__name__}, not a postgres:// URL")
    try:
        u = urllib.parse.urlsplit(dsn)
    except ValueError as e:
        raise MapError(f"{what} is not a URL: {e}") from None
    shown = redact_dsn(dsn)
    if u.scheme not in ("postgres", "postgresql"):
        raise MapError(f"{what} {shown!r} must be a postgres:// URL")
    netloc = u.netloc
    userinfo, _, hostlist = netloc.rpartition("@")
    if ":" in userinfo:
        raise MapError(f"{what} {shown!r} contains a password; the node's password reference applies to it")
    query = urllib.parse.parse_qs(u.query, keep_blank_values=True)
    if "password" in query:
        raise MapError(f"{what} {shown!r} has a password parameter; the node's password reference applies to it")
    for k in ("host", "hostaddr", "port"):
        if k in query:
            raise MapError(f"{what} {shown!r} has a {k} parameter; list hosts and ports in the URL's authority: "
                           "postgres://user@h1:p1,h2:p2/db")
    if not hostlist:
        raise MapError(f"{what} {shown!r} has no host")
    hosts = hostlist.split(",")
    for hp in hosts:
        if hp.startswith("["):
            h, _, rest = hp[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ("" if not rest else None)
        else:
            h, _, port = hp.partition(":")
        if not h:
            raise MapError(f"{what} {shown!r}: an empty host in the host list")
        if port is None or (port and not (port.isdigit() and 1 <= int(port) <= 65535)):
            raise MapError(f"{what} {shown!r}: host {hp!r}: the port is not 1..65535")
    if len(hosts) > 1 and (query.get("target_session_attrs") or [""])[-1] not in ("read-write", "primary"):
        raise MapError(f"{what} {shown!r} lists {len(hosts)} hosts but not target_session_attrs=read-write: "
                       "add it so that every client reaches the primary")


class Route(NamedTuple):
    """Where one user lives, as `shardctl route --json` says it."""

    uid: str
    bucket: int  # the bucket's number at its depth
    level: int  # the bucket's depth
    node: str
    dsn: str
    map_version: int
    state: str  # active, moving (a move of the bucket is under way), ...
    target: str  # the move's target while state is moving, else ""
    data_lost: bool  # the bucket's rows were lost with a node (shardctl node lost)
    group: str  # the node's Patroni scope when it is a group, else ""
    key: int  # the storage key (the bkey column), signed 64-bit

    def as_dict(self) -> dict:
        return self._asdict()


class RoutingTable:
    """One decoded map file: immutable, safe to share between threads."""

    def __init__(self, doc: dict, source: str = "map file"):
        try:
            self._load(doc)
        except MapError as e:
            raise MapError(f"{source}: {e}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise MapError(f"{source}: malformed: {type(e).__name__}: {e}") from None

    def _load(self, doc: dict) -> None:
        if not isinstance(doc, dict):
            raise MapError(f"not a JSON object but {type(doc).__name__}")
        if doc.get("version") not in MAP_FILE_FORMATS:
            raise MapError(f"map file format version {doc.get('version')!r} is not supported (this client reads {MAP_FILE_FORMATS})")
        m = doc["map"]
        if m.get("version") not in MAP_FORMATS:
            raise MapError(f"bucket map format version {m.get('version')!r} is not supported (this client reads {MAP_FORMATS})")
        self.cluster: str = doc["cluster"]
        self.seed: bytes = keystream.parse_seed(doc["seed"])
        self.keystream = keystream.Keystream(self.seed)
        level = m["level"]
        limit = MAX_DEPTH if m["version"] == 2 else MAX_LEVEL
        if not isinstance(level, int) or not 0 <= level <= limit:
            raise MapError(f"level {level!r} out of range [0, {limit}] (format {m['version']})")
        self.level: int = level
        self._shift = 64 - level
        self.map_version: int = m["map_version"]
        if not isinstance(self.map_version, int) or self.map_version < 1:
            raise MapError(f"map_version {self.map_version!r} is not a positive integer")
        nodes = []
        for n in m["nodes"]:
            pool_dsn = n.get("pool_dsn") or ""  # absent, null or "": no pooler
            if pool_dsn:
                check_pool_dsn(n["id"], pool_dsn)
            nodes.append(Node(n["id"], n.get("dsn", ""), n.get("password", ""), n.get("state", "active"),
                              n.get("weight", 1), n.get("patroni"), pool_dsn))
        if len({n.id for n in nodes}) != len(nodes):
            raise MapError("nodes: a node id appears twice")
        for n in nodes:
            if n.state not in NODE_STATES:
                raise MapError(f"node {n.id}: state {n.state!r} is not one of {', '.join(NODE_STATES)}")
        self.nodes: Dict[str, Node] = {n.id: n for n in nodes}
        raw = base64.b64decode(m["owners"], validate=True)
        if len(raw) % 2:
            raise MapError(f"owners: {len(raw)} bytes, not 2 per bucket")
        owners = [int.from_bytes(raw[i:i + 2], "big") for i in range(0, len(raw), 2)]
        if any(o >= len(nodes) for o in owners):
            raise MapError(f"owners: an index past the {len(nodes)} nodes")
        slots = 1 << level
        if m["version"] == 1:
            if "depths" in m:
                raise MapError("format version 1 lists depths (a map of mixed depths is format version 2)")
            if len(owners) != slots:
                raise MapError(f"owners: {len(owners)} buckets for level {level} (want {slots})")
            depths = None
        else:
            bdepths = base64.b64decode(m["depths"], validate=True)
            if len(owners) != len(bdepths):
                raise MapError(f"owners: {len(owners)} for {len(bdepths)} buckets")
            flat: List[int] = []
            depths = []
            for o, d in zip(owners, bdepths):
                if d > level or len(flat) % (1 << (level - d)):
                    raise MapError(f"depths: a bucket at depth {d} cannot start at slot {len(flat)}")
                run = 1 << (level - d)
                flat += [o] * run
                depths += [d] * run
            if len(flat) != slots:
                raise MapError(f"depths: the buckets cover {len(flat)} of {slots} slots")
            owners = flat
        self._depths: Optional[List[int]] = depths
        # One node id per slot (shared string references): node_for is
        # one index after the hash.
        ids = [n.id for n in nodes]
        self._slot_node: List[str] = [ids[o] for o in owners]
        owning = set(owners)
        for i, n in enumerate(nodes):
            if n.state == "removed" and i in owning:
                raise MapError(f"node {n.id} is removed but owns buckets")
        self._owning: List[str] = [n.id for i, n in enumerate(nodes) if i in owning]
        # State by (bucket, depth); "level" is absent when it is the map's.
        self._states: Dict[Tuple[int, int], dict] = {}
        for b in m.get("buckets") or []:
            d = b.get("level", level)
            if not isinstance(d, int) or not 0 <= d <= level or not 0 <= b["bucket"] < (1 << d):
                raise MapError(f"buckets: bucket {b['bucket']!r} at depth {d!r} does not exist at level {level}")
            start = b["bucket"] << (level - d)
            if (depths[start] if depths is not None else level) != d:
                raise MapError(f"buckets: bucket {b['bucket']} at depth {d} is not a bucket of this map")
            st = b.get("state") or "active"  # Go writes "" for a data-lost bucket: it is active
            if st not in BUCKET_STATES:
                raise MapError(f"buckets: bucket {b['bucket']}: state {st!r} is not one of {', '.join(BUCKET_STATES)}")
            if st == "moving" and b.get("target") not in self.nodes:
                raise MapError(f"buckets: bucket {b['bucket']} is moving to {b.get('target')!r}, which is not a node")
            self._states[(b["bucket"], d)] = b

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "map file") -> "RoutingTable":
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise MapError(f"{source}: not JSON: {e}") from None
        return cls(doc, source)

    @classmethod
    def from_file(cls, path: str) -> "RoutingTable":
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise MapError(f"map file {path}: {e}") from None
        return cls.from_bytes(data, f"map file {path}")

    def prefix64(self, uid: str) -> int:
        """The first 64 bits of uid's keystream."""
        return self.keystream.prefix64(uid)

    def node_for(self, uid: str) -> str:
        """The id of the db node that holds uid."""
        ks = self.keystream  # Keystream.prefix64, inlined: this is the hot path
        i = ks.inner.copy()
        i.update(uid.encode("utf-8") + b"\x01")
        o = ks.outer.copy()
        o.update(i.digest())
        return self._slot_node[int.from_bytes(o.digest()[:8], "big") >> self._shift]

    def key(self, uid: str) -> int:
        """uid's storage key (the value of a sharded table's key column)."""
        return keystream.key(self.prefix64(uid))

    def route(self, uid: str) -> Route:
        """Bucket, node, DSN and state of uid's bucket."""
        prefix = self.prefix64(uid)
        slot = prefix >> self._shift
        node = self.nodes[self._slot_node[slot]]
        bucket, level = slot, self.level
        if self._depths is not None:
            level = self._depths[slot]
            bucket = slot >> (self.level - level)
        st = self._states.get((bucket, level)) or {}
        return Route(uid, bucket, level, node.id, node.dsn, self.map_version, st.get("state") or "active",
                     st.get("target", ""), bool(st.get("data_lost")), (node.patroni or {}).get("scope", ""),
                     keystream.key(prefix))

    def owning_nodes(self) -> List[str]:
        """Ids of the nodes that own at least one bucket, in registry order."""
        return list(self._owning)


_env_routers: Dict[Tuple[str, bool], "Router"] = {}
_env_lock = threading.Lock()


class Router:
    """Answers "which db node holds this user", from a map file.

        r = Router.from_map_file("/path/map.json")   # or a saved GET /v1/map
        r.node_for("alice")                           # "pg2"
        r.route("alice")                              # Route(bucket=.., node="pg2", dsn=.., ...)

    Under the supervisor use Router.from_env(), one per process. In reload
    mode (SHARDVISOR_MAP_DELIVERY=reload) it follows the map file in place:
    a daemon thread stats it every 0.1 s (at once on SHARDVISOR_MAP_SIGNAL,
    when the process has no handler of its own for it), loads each new map,
    swaps it in with one reference assignment (a lookup sees the old map or
    the new, never a mix) and then acknowledges it with MAPVERSION=N on
    NOTIFY_SOCKET, so the worker is never restarted for a map change. A
    file that does not load (or carries an older version) is reported to
    on_error once, and the map in use is kept until the file changes.

    Forks. Every process forked from a following router follows on its own
    thread and acknowledges what it loads. A pre-forking server's parent
    (gunicorn's or uWSGI's arbiter: forks_workers, by default whether
    either is imported) serves no requests: after its first fork it keeps
    following, so a worker it forks later starts on the current map, but
    no longer acknowledges, so the supervisor hears MAPVERSION only from
    processes that route.
    """

    POLL = 0.1  # seconds; workerproto.MapPollInterval

    def __init__(self, table: RoutingTable, path: Optional[str] = None, follow: bool = False,
                 ack: bool = False, on_error: Optional[Callable[[Exception], None]] = None,
                 forks_workers: Optional[bool] = None):
        self._table = table
        self.path = path
        self._ack = ack
        self._acks_here = True  # False in a pre-forking server's parent after its first fork
        self._forks_workers = forks_workers
        self._listeners: List[Callable[[RoutingTable, RoutingTable], None]] = []
        self._lock = threading.Lock()
        self._fork_locked = False
        self.on_error = on_error or (lambda e: print(f"shardvisor: {e}", file=sys.stderr))
        self._stop: Optional[threading.Event] = None
        self._wake = threading.Event()
        self._closed = False
        self._follow = follow
        self._stamp = None
        if ack:
            self._notify(table.map_version)
        if follow:
            if not path:
                raise ValueError("follow needs a map file path")
            self._start()
            if hasattr(os, "register_at_fork"):
                # Hooks cannot be unregistered: hold the router weakly.
                ref = weakref.ref(self)

                def hook(name):
                    def call():
                        r = ref()
                        if r is not None:
                            getattr(r, name)()
                    return call

                os.register_at_fork(before=hook("_before_fork"), after_in_parent=hook("_after_fork_parent"),
                                    after_in_child=hook("_after_fork_child"))

    # -- construction

    @classmethod
    def from_map_file(cls, path: str, follow: bool = False, ack: bool = False, on_error=None,
                      forks_workers: Optional[bool] = None) -> "Router":
        """A router on one map file; follow=True re-reads it when it changes."""
        return cls(RoutingTable.from_file(path), path=path, follow=follow, ack=ack, on_error=on_error,
                   forks_workers=forks_workers)

    @classmethod
    def from_map(cls, doc, source: str = "map document") -> "Router":
        """A router on a map document: a dict, or the bytes of GET /v1/map."""
        if isinstance(doc, (bytes, bytearray, str)):
            return cls(RoutingTable.from_bytes(doc, source))
        return cls(RoutingTable(doc, source))

    @classmethod
    def from_env(cls, on_error=None) -> "Router":
        """The router of a supervisor's worker: the map file named by
        SHARDVISOR_MAP_FILE, followed and acknowledged in reload mode.

        One per process: every call returns the same router (the Django
        integration, shardvisor.db.run and the app share it), so the
        process acknowledges a map only once all of it routes by it."""
        path = os.environ.get(ENV_MAP_FILE)
        if not path:
            raise MapError(f"{ENV_MAP_FILE} is not set: this process was not started by a supervisor whose cluster has a map "
                           "(use Router.from_map_file or SidecarClient instead)")
        reload = os.environ.get(ENV_MAP_DELIVERY) == "reload"
        with _env_lock:
            r = _env_routers.get((path, reload))
            if r is None or r._closed:
                r = cls.from_map_file(path, follow=reload, ack=reload, on_error=on_error)
                if reload:
                    r._handle_map_signal(os.environ.get(ENV_MAP_SIGNAL, ""))
                _env_routers[(path, reload)] = r
            return r

    # -- lookups

    @property
    def table(self) -> RoutingTable:
        return self._table

    @property
    def map_version(self) -> int:
        return self._table.map_version

    @property
    def nodes(self) -> Dict[str, Node]:
        return self._table.nodes

    def node_for(self, uid: str) -> str:
        return self._table.node_for(uid)

    def route(self, uid: str) -> Route:
        return self._table.route(uid)

    def key(self, uid: str) -> int:
        return self._table.key(uid)

    def node(self, node_id: str) -> Node:
        try:
            return self._table.nodes[node_id]
        except KeyError:
            raise MapError(f"db node {node_id!r} is not in map version {self._table.map_version}") from None

    # -- following

    def on_change(self, fn: Callable[[RoutingTable, RoutingTable], None]) -> None:
        """Calls fn(old, new) after each new map, before it is acknowledged."""
        with self._lock:
            self._listeners.append(fn)

    def remove_listener(self, fn) -> None:
        with self._lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    def update(self, table: RoutingTable) -> bool:
        """Swaps in a newer map (older or equal versions are ignored), tells
        the listeners, then acknowledges it; True if it was taken."""
        with self._lock:
            old = self._table
            if table.map_version <= old.map_version:
                return False
            self._table = table
            listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn(old, table)
            except Exception as e:  # a listener's bug must not stop the following
                self.on_error(e)
        if self._ack and self._acks_here:
            self._notify(table.map_version)
        return True

    def reload(self) -> bool:
        """Re-reads the map file if it changed; True if a newer map was taken.
        A file that does not load is reported once, until it changes."""
        st = os.stat(self.path)
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        nxt = RoutingTable.from_file(self.path)
        if nxt.map_version < self._table.map_version:
            raise MapError(f"map file {self.path}: version {nxt.map_version} is older than the applied {self._table.map_version}")
        return self.update(nxt)

    def close(self) -> None:
        """Stops following."""
        self._closed = True
        if self._stop is not None:
            self._stop.set()
            self._wake.set()

    def _handle_map_signal(self, name: str) -> None:
        """With map_delivery.signal set, a new map is announced by a signal
        whose default action ends the process: wake the follower instead,
        unless the process handles the signal itself (gunicorn does: leave
        map_delivery.signal empty for it) or this is not the main thread."""
        if not name:
            return
        try:
            sig = getattr(signal, name if name.startswith("SIG") else "SIG" + name)
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, lambda *_: self._wake.set())
        except (AttributeError, ValueError) as e:  # an unknown name; not the main thread
            self.on_error(MapError(f"{ENV_MAP_SIGNAL}={name}: not handled ({e}); the map file is still polled"))

    def _notify(self, version: int) -> None:
        try:
            sd_notify(f"MAPVERSION={version}")
        except OSError as e:
            self.on_error(e)

    def _start(self) -> None:
        self._stop = threading.Event()
        t = threading.Thread(target=self._run, args=(self._stop,), name="shardvisor-map", daemon=True)
        t.start()

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._wake.wait(self.POLL)
            self._wake.clear()
            if stop.is_set():
                return
            try:
                self.reload()
            except (OSError, MapError) as e:
                self.on_error(e)
            except Exception as e:  # a bug must not end the following silently
                self.on_error(e)

    def _pre_forking_server(self) -> bool:
        if self._forks_workers is not None:
            return self._forks_workers
        return "gunicorn" in sys.modules or "uwsgi" in sys.modules

    def _before_fork(self) -> None:
        if self._closed:
            return
        self._lock.acquire()  # no listener list or map swap half done in the child
        self._fork_locked = True

    def _after_fork_parent(self) -> None:
        if self._fork_locked:
            self._fork_locked = False
            self._lock.release()
            if self._pre_forking_server():
                self._acks_here = False  # its forked workers route and acknowledge

    def _after_fork_child(self) -> None:
        if not self._fork_locked:
            return
        self._lock = threading.Lock()
        self._fork_locked = False
        self._acks_here = True
        self._stamp = None
        self._wake = threading.Event()
        if self._follow:
            self._start()
        if self._ack:
            self._notify(self._table.map_version)
