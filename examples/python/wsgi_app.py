"""A tiny WSGI app for running under gunicorn as a shardvisor worker.

    gunicorn --preload --workers 2 --chdir examples/python wsgi_app:application

Under the supervisor gunicorn needs nothing special: it takes the listen
sockets from LISTEN_FDS/LISTEN_PID (systemd socket activation) and sends
READY=1 to NOTIFY_SOCKET once its arbiter is up. With --preload the app is
imported before that, so READY=1 means "the app is loaded".

Environment:
  APP_STARTUP_DELAY  seconds to sleep at import, like a framework warming up
                     (default 1.5; the benchmark uses this)
  APP_TAG            echoed in every answer (tests tell generations apart)

In the supervisor's reload mode (SHARDVISOR_MAP_DELIVERY=reload) the app
follows the map file with shardvisor_router.FollowingRouter and answers
with the map version it routes by now.

The answer is JSON: pid, generation, tag, map version and the map file's
size, so a caller sees which worker and which bucket map served it.
"""

import json
import os
import sys
import time

time.sleep(float(os.environ.get("APP_STARTUP_DELAY", "1.5")))

_MAP_VERSION = os.environ.get("SHARDVISOR_MAP_VERSION", "")
_MAP_BYTES = 0
_ROUTER = None
if os.environ.get("SHARDVISOR_MAP_FILE"):
    with open(os.environ["SHARDVISOR_MAP_FILE"], "rb") as f:
        _MAP_BYTES = len(f.read())
    if os.environ.get("SHARDVISOR_MAP_DELIVERY") == "reload":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import shardvisor_router  # noqa: E402

        _ROUTER = shardvisor_router.FollowingRouter.from_env()


def application(environ, start_response):
    body = json.dumps({
        "pid": os.getpid(),
        "gen": os.environ.get("SHARDVISOR_GENERATION", ""),
        "tag": os.environ.get("APP_TAG", ""),
        "map_version": str(_ROUTER.map_version) if _ROUTER else _MAP_VERSION,
        "map_bytes": _MAP_BYTES,
    }).encode() + b"\n"
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
