"""The worker side of the supervisor's notify protocol (sd_notify(3)).

The supervisor gives each worker NOTIFY_SOCKET, as systemd does, and reads
READY=1, STOPPING=1, WATCHDOG=1, MAPVERSION=N (reload mode) and REQUESTS=N
(max_requests) from it (docs/supervisor.md, "the worker contract").
"""

from __future__ import annotations

import os
import socket
import threading
import time


def sd_notify(state: str) -> bool:
    """Sends one datagram to NOTIFY_SOCKET; False when it is not set."""
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

        application = shardvisor.RequestCounter(application)

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
