"""A tiny WSGI app for running under gunicorn as a shardvisor worker, on the
shardvisor package (clients/python).

    pip install --no-build-isolation ./clients/python      # or run from the checkout, as below
    gunicorn --preload --workers 2 --chdir examples/python wsgi_app:application

Under the supervisor gunicorn needs nothing special: it takes the listen
sockets from LISTEN_FDS/LISTEN_PID (systemd socket activation) and sends
READY=1 to NOTIFY_SOCKET once its arbiter is up. With --preload the app is
imported before that, so READY=1 means "the app is loaded".

The map: shardvisor.Router.from_env() reads SHARDVISOR_MAP_FILE; in the
supervisor's reload mode (SHARDVISOR_MAP_DELIVERY=reload) it follows the
file in place and acknowledges each map (MAPVERSION=N) from the forked
worker that serves, so a map change restarts nothing.

Environment:
  APP_STARTUP_DELAY  seconds to sleep at import, like a framework warming up
                     (default 1.5; the benchmark uses this)
  APP_TAG            echoed in every answer (tests tell generations apart)

The answer is JSON: pid, generation, tag, the map version the app routes
by and the map file's size, and with ?uid=U the node that holds user U.
"""

import json
import os
import sys
import time
import urllib.parse

try:
    import shardvisor
except ImportError:  # running from the checkout, the package not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
    import shardvisor

time.sleep(float(os.environ.get("APP_STARTUP_DELAY", "1.5")))

_MAP_BYTES = 0
_ROUTER = None
if os.environ.get("SHARDVISOR_MAP_FILE"):
    with open(os.environ["SHARDVISOR_MAP_FILE"], "rb") as f:
        _MAP_BYTES = len(f.read())
    _ROUTER = shardvisor.Router.from_env()


def _app(environ, start_response):
    doc = {
        "pid": os.getpid(),
        "gen": os.environ.get("SHARDVISOR_GENERATION", ""),
        "tag": os.environ.get("APP_TAG", ""),
        "map_version": str(_ROUTER.map_version) if _ROUTER else "",
        "map_bytes": _MAP_BYTES,
    }
    uid = urllib.parse.parse_qs(environ.get("QUERY_STRING", "")).get("uid", [""])[0]
    if uid and _ROUTER:
        doc["node"] = _ROUTER.node_for(uid)
    body = json.dumps(doc).encode() + b"\n"
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


# REQUESTS=N for the pool's max_requests.
application = shardvisor.RequestCounter(_app)
