"""A client of the router sidecar's HTTP API (cmd/router, docs/router-api.md),
for apps that prefer asking over HTTP to routing in process.

    c = SidecarClient("http://127.0.0.1:8484")
    c.route("alice")                 # {"node": "pg2", "dsn": ..., "map_version": 7, ...}
    c.route_many(["a", "b"])         # one map version for the whole batch
    r = c.router(follow=True)        # a Router on the sidecar's map, kept current

Pass the map version your last answer carried (map_version=) and the sidecar
says "moved": true when the user's bucket changed owner since. Answers also
carry "stale" (the sidecar lost ZooKeeper; the map may be out of date) and
"state" ("moving" while a move of the bucket finishes).
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Dict, List, Optional

from .routing import Router, RoutingTable


class SidecarError(Exception):
    """The sidecar refused a request (status 4xx/5xx; status 0: unreachable)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"router sidecar: {status}: {message}")
        self.status = status
        self.message = message


class SidecarClient:
    """base_url is http://... for a sidecar on loopback, https://... for one
    started with --tls-ca/--tls-cert/--tls-key: then cafile is the CA that
    signed the sidecar's certificate (its name is checked) and certfile and
    keyfile this host's client certificate. The files are read again when
    they change on disk (a rotation needs no restart)."""

    def __init__(self, base_url: str = "http://127.0.0.1:8484", timeout: float = 2.0,
                 cafile: Optional[str] = None, certfile: Optional[str] = None, keyfile: Optional[str] = None):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._map_etag: Optional[str] = None
        self._map_bytes: Optional[bytes] = None
        if (certfile is None) != (keyfile is None):
            raise ValueError("certfile and keyfile go together")
        if self.base_url.startswith("https://") and cafile is None:
            raise ValueError("an https:// sidecar needs cafile (the CA of its certificate)")
        self._tls_files = (cafile, certfile, keyfile)
        self._tls: Optional[tuple] = None  # (stamp of the files, ssl.SSLContext)

    def _context(self) -> Optional[ssl.SSLContext]:
        """The TLS context, made again when a file changed."""
        if not self.base_url.startswith("https://"):
            return None
        stamp = tuple((os.stat(f).st_mtime_ns, os.stat(f).st_size) if f else None for f in self._tls_files)
        if self._tls is None or self._tls[0] != stamp:
            cafile, certfile, keyfile = self._tls_files
            ctx = ssl.create_default_context(cafile=cafile)
            if certfile:
                ctx.load_cert_chain(certfile, keyfile)
            self._tls = (stamp, ctx)
        return self._tls[1]

    def _call(self, path: str, body=None, headers: Optional[Dict[str, str]] = None):
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.base_url + path, data=data, headers=headers or {})
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._context()) as res:
                return res.status, res.headers, res.read()
        except urllib.error.HTTPError as e:
            if e.code == 304:
                return 304, e.headers, b""
            try:
                msg = json.loads(e.read()).get("error", "")
            except ValueError:
                msg = e.reason
            raise SidecarError(e.code, msg) from None
        except (urllib.error.URLError, OSError) as e:
            raise SidecarError(0, f"cannot reach {self.base_url}: {getattr(e, 'reason', e)}") from None
        except http.client.HTTPException as e:  # a cut or malformed answer (IncompleteRead, BadStatusLine)
            raise SidecarError(0, f"{self.base_url}{path}: broken answer: {type(e).__name__}: {e}") from None

    def route(self, uid: str, map_version: int = 0) -> dict:
        """The answer for one user id (GET /v1/route)."""
        q = {"uid": uid}
        if map_version:
            q["map_version"] = str(map_version)
        _, _, body = self._call("/v1/route?" + urllib.parse.urlencode(q))
        return json.loads(body)

    def route_many(self, uids: List[str], map_version: int = 0) -> dict:
        """Answers for many user ids from one map version (POST /v1/route):
        {"map_version": N, "routes": [...]} in the order given."""
        req = {"uids": list(uids)}
        if map_version:
            req["map_version"] = map_version
        _, _, body = self._call("/v1/route", req)
        return json.loads(body)

    def map_bytes(self) -> bytes:
        """The current map file (GET /v1/map), polled cheaply with If-None-Match."""
        headers = {"If-None-Match": self._map_etag} if self._map_etag else {}
        status, hdrs, body = self._call("/v1/map", headers=headers)
        if status != 304:
            self._map_bytes = body
            self._map_etag = hdrs.get("ETag")
        return self._map_bytes

    def map_file(self) -> dict:
        return json.loads(self.map_bytes())

    def router(self, follow: bool = False, every: float = 0.1, on_error=None) -> Router:
        """A Router on the sidecar's map. With follow=True a daemon thread
        asks every `every` seconds (a 304 when nothing changed) and swaps in
        each newer map; while the sidecar cannot be reached the map in use
        is kept and the error goes to on_error."""
        r = Router(RoutingTable.from_bytes(self.map_bytes(), f"GET {self.base_url}/v1/map"), on_error=on_error)
        if follow:
            stop = threading.Event()
            r.close = stop.set  # type: ignore[method-assign]

            def run():
                last = self._map_etag
                while not stop.wait(every):
                    try:
                        data = self.map_bytes()
                        if self._map_etag != last or last is None:
                            last = self._map_etag
                            r.update(RoutingTable.from_bytes(data, f"GET {self.base_url}/v1/map"))
                    except Exception as e:  # whatever it is, report it and keep following
                        r.on_error(e)

            threading.Thread(target=run, name="shardvisor-sidecar-map", daemon=True).start()
        return r

