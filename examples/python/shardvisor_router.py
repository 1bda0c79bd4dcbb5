#!/usr/bin/env python3
"""Routing from Python, two ways, standard library only (Python 3.9+).

1. RouterClient asks the router sidecar over HTTP (cmd/router):

       client = RouterClient("http://127.0.0.1:8484")
       r = client.route("alice")            # {"node": "pg2", "dsn": ..., "map_version": 7, ...}
       rs = client.route_many(["a", "b"])   # one map version for the whole batch

   Pass the map version your last answer carried (map_version=) and the
   sidecar says "moved": true when the user's bucket changed owner since: redo
   the request at the new node. Answers also carry "stale" (the sidecar lost
   ZooKeeper; the map may be out of date) and "state" ("moving" while a move
   of the bucket finishes: keep writing to "node"; a write refused with
   SQLSTATE SV001 is in the move's short write pause: re-read the route and
   retry as soon as "node" changes).

2. LocalRouter routes with no network at all, from a map file: the file the
   supervisor hands its workers (SHARDVISOR_MAP_FILE) or a saved
   GET /v1/map. It uses the keystream reference in shardvisor_keystream.py.

       router = LocalRouter.from_env()      # reads SHARDVISOR_MAP_FILE
       node = router.route("alice")         # {"bucket": 4, "node": "pg2", "dsn": ...}

   Under a supervisor pool in reload mode (map_delivery.mode "reload", which
   sets SHARDVISOR_MAP_DELIVERY=reload) use FollowingRouter.from_env()
   instead: it re-reads the map file whenever the supervisor replaces it
   (a stat every 0.1 s on a daemon thread) and acknowledges each map with
   MAPVERSION=N on NOTIFY_SOCKET, so the worker is never restarted for a map
   change. Leave map_delivery.signal empty for Python pools: signal handlers
   belong to the server (gunicorn) and only run on the main thread.

Command line:

    shardvisor_router.py --sidecar http://127.0.0.1:8484 alice bob
    shardvisor_router.py --map-file /path/map-7.json alice bob

prints one JSON answer per line.
"""

import argparse
import base64
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shardvisor_keystream as keystream  # noqa: E402


class RouterError(Exception):
    """The sidecar refused a request (status 4xx/5xx) or could not be reached."""

    def __init__(self, status: int, message: str):
        super().__init__(f"router: {status}: {message}")
        self.status = status
        self.message = message


class RouterClient:
    """A client of the router sidecar's HTTP API (docs/router-api.md)."""

    def __init__(self, base_url: str = "http://127.0.0.1:8484", timeout: float = 2.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._map_etag: Optional[str] = None
        self._map: Optional[dict] = None

    def _call(self, path: str, body: Optional[dict] = None, headers: Optional[Dict[str, str]] = None):
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.base_url + path, data=data, headers=headers or {})
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as res:
                return res.status, res.headers, res.read()
        except urllib.error.HTTPError as e:
            if e.code == 304:
                return 304, e.headers, b""
            try:
                msg = json.loads(e.read()).get("error", "")
            except ValueError:
                msg = e.reason
            raise RouterError(e.code, msg) from None
        except urllib.error.URLError as e:
            raise RouterError(0, f"cannot reach {self.base_url}: {e.reason}") from None

    def route(self, uid: str, map_version: int = 0) -> dict:
        """The answer for one user id."""
        q = {"uid": uid}
        if map_version:
            q["map_version"] = str(map_version)
        _, _, body = self._call("/v1/route?" + urllib.parse.urlencode(q))
        return json.loads(body)

    def route_many(self, uids: List[str], map_version: int = 0) -> dict:
        """Answers for many user ids, all from one map version:
        {"map_version": N, "routes": [...]} in the order given."""
        req = {"uids": list(uids)}
        if map_version:
            req["map_version"] = map_version
        _, _, body = self._call("/v1/route", req)
        return json.loads(body)

    def map_file(self) -> dict:
        """The current map file; polled cheaply with If-None-Match."""
        headers = {"If-None-Match": self._map_etag} if self._map_etag else {}
        status, hdrs, body = self._call("/v1/map", headers=headers)
        if status != 304:
            self._map = json.loads(body)
            self._map_etag = hdrs.get("ETag")
        return self._map


class LocalRouter:
    """Routes from a map file, without talking to anything.

    It reads bucket map format versions 1 (every bucket at the map's
    level) and 2 (mixed depths: single-bucket splits). Either way it builds
    a directory of 2**level slots, each naming its bucket's owner and depth,
    so that a lookup is one index (docs/bucket-map.md, "Mixed depths"). A
    newer format is refused, never guessed at.
    """

    FORMATS = (1, 2)

    def __init__(self, doc: dict):
        if doc.get("version") != 1:
            raise ValueError(f"map file format version {doc.get('version')!r} is not supported")
        m = doc["map"]
        if m.get("version") not in self.FORMATS:
            raise ValueError(f"bucket map format version {m.get('version')!r} is not supported (this client reads {self.FORMATS})")
        self.cluster = doc["cluster"]
        self.keystream = keystream.Keystream(keystream.parse_seed(doc["seed"]))
        self.level = m["level"]
        self.map_version = m["map_version"]
        self.nodes = m["nodes"]
        raw = base64.b64decode(m["owners"])
        if len(raw) % 2:
            raise ValueError(f"owners: {len(raw)} bytes, not 2 per bucket")
        owners = [int.from_bytes(raw[i:i + 2], "big") for i in range(0, len(raw), 2)]
        if any(o >= len(self.nodes) for o in owners):
            raise ValueError(f"owners: an index past the {len(self.nodes)} nodes")
        slots = 1 << self.level
        if m["version"] == 1:
            if len(owners) != slots:
                raise ValueError(f"owners: {len(raw)} bytes for level {self.level}")
            self.owners, self.depths = owners, None
        else:
            depths = base64.b64decode(m["depths"])
            if len(owners) != len(depths):
                raise ValueError(f"owners: {len(owners)} for {len(depths)} buckets")
            self.owners, self.depths = [], []
            for o, d in zip(owners, depths):
                if d > self.level or len(self.owners) % (1 << (self.level - d)):
                    raise ValueError(f"depths: a bucket at depth {d} cannot start at slot {len(self.owners)}")
                run = 1 << (self.level - d)
                self.owners += [o] * run
                self.depths += [d] * run
            if len(self.owners) != slots:
                raise ValueError(f"depths: the buckets cover {len(self.owners)} of {slots} slots")
        # State by (bucket, depth): "level" is absent when it is the map's.
        self.states = {(b["bucket"], b.get("level", self.level)): b for b in m.get("buckets", [])}

    @classmethod
    def from_file(cls, path: str) -> "LocalRouter":
        with open(path, encoding="utf-8") as f:
            return cls(json.load(f))

    @classmethod
    def from_env(cls) -> "LocalRouter":
        path = os.environ.get("SHARDVISOR_MAP_FILE")
        if not path:
            raise RuntimeError("SHARDVISOR_MAP_FILE is not set (is this process a worker of the supervisor?)")
        return cls.from_file(path)

    def route(self, uid: str) -> dict:
        slot = self.keystream.bucket(uid, self.level)
        node = self.nodes[self.owners[slot]]
        bucket, level = slot, self.level
        if self.depths is not None:
            level = self.depths[slot]
            bucket = slot >> (self.level - level)
        st = self.states.get((bucket, level), {})
        return {
            "uid": uid,
            "bucket": bucket,
            "level": level,
            "node": node["id"],
            "dsn": node["dsn"],
            "map_version": self.map_version,
            "state": st.get("state", "active"),
        }


def sd_notify(state: str) -> bool:
    """Sends one sd_notify(3) datagram to NOTIFY_SOCKET; False if unset."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect(addr)
        s.send(state.encode())
    return True


class RequestCounter:
    """WSGI middleware that reports the process's request count to the
    supervisor (REQUESTS=N, cumulative) for the pool's max_requests.

        application = shardvisor_router.RequestCounter(application)

    It reports from the request path, at most every 0.1 s, so the count
    the supervisor sees may lag by the requests of the last 0.1 s. Counts
    are per process: under gunicorn run one worker per supervisor worker
    (--workers 1), where gunicorn's own --max-requests is not needed.
    """

    EVERY = 0.1

    def __init__(self, app):
        self._app = app
        self._lock = threading.Lock()
        self._n = 0
        self._sent_at = 0.0
        self._pid = os.getpid()

    def __call__(self, environ, start_response):
        with self._lock:
            if os.getpid() != self._pid:  # forked after wrapping: our own count
                self._pid, self._n, self._sent_at = os.getpid(), 0, 0.0
            self._n += 1
            now = time.monotonic()
            report = now - self._sent_at >= self.EVERY
            if report:
                self._sent_at, n = now, self._n
        if report:
            try:
                sd_notify(f"REQUESTS={n}")
            except OSError:
                pass
        return self._app(environ, start_response)


class FollowingRouter:
    """A LocalRouter that follows its map file in place (reload mode).

    A process that forks (a pre-forking server's master, gunicorn with
    --preload) stops following: its children, the processes that serve,
    each start their own follower, so the MAPVERSION the supervisor hears
    comes from the process that routes.
    """

    POLL = 0.1  # seconds; workerproto.MapPollInterval

    def __init__(self, path: str, on_error=None):
        self.path = path
        self.on_error = on_error or (lambda e: print(f"shardvisor_router: map file: {e}", file=sys.stderr))
        self._router = LocalRouter.from_file(path)
        self._stamp = None
        self._stop = threading.Event()
        self._thread = None
        self._start()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(before=self._stop.set, after_in_child=self._after_fork)

    @classmethod
    def from_env(cls) -> "FollowingRouter":
        path = os.environ.get("SHARDVISOR_MAP_FILE")
        if not path:
            raise RuntimeError("SHARDVISOR_MAP_FILE is not set (is this process a worker of the supervisor?)")
        return cls(path)

    @property
    def map_version(self) -> int:
        return self._router.map_version

    def route(self, uid: str) -> dict:
        return self._router.route(uid)

    def close(self):
        self._stop.set()

    def _after_fork(self):
        self._stop = threading.Event()
        self._stamp = None
        self._start()

    def _start(self):
        sd_notify(f"MAPVERSION={self._router.map_version}")
        self._thread = threading.Thread(target=self._run, args=(self._stop,), name="shardvisor-map", daemon=True)
        self._thread.start()

    def _run(self, stop: threading.Event):
        while not stop.wait(self.POLL):
            try:
                st = os.stat(self.path)
                stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
                if stamp == self._stamp:
                    continue
                self._stamp = stamp
                nxt = LocalRouter.from_file(self.path)
                if nxt.map_version < self._router.map_version:
                    raise ValueError(f"map version {nxt.map_version} is older than the applied {self._router.map_version}")
                self._router = nxt  # one reference swap: route() sees the old map or the new
                sd_notify(f"MAPVERSION={nxt.map_version}")
            except (OSError, ValueError, KeyError) as e:
                self.on_error(e)


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description="route user ids with the shardvisor router sidecar or a map file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--sidecar", help="router base URL, e.g. http://127.0.0.1:8484")
    src.add_argument("--map-file", help="a map file (SHARDVISOR_MAP_FILE or a saved GET /v1/map)")
    p.add_argument("--batch", action="store_true", help="with --sidecar: one POST for all user ids")
    p.add_argument("uids", nargs="+")
    args = p.parse_args(argv)
    try:
        if args.map_file:
            r = LocalRouter.from_file(args.map_file)
            for uid in args.uids:
                print(json.dumps(r.route(uid)))
        elif args.batch:
            for rt in RouterClient(args.sidecar).route_many(args.uids)["routes"]:
                print(json.dumps(rt))
        else:
            c = RouterClient(args.sidecar)
            for uid in args.uids:
                print(json.dumps(c.route(uid)))
    except (RouterError, OSError, ValueError) as e:
        print(f"shardvisor_router: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
