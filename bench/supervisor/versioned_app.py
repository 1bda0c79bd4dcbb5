"""The benchmark's app: examples/python/wsgi_app plus the code version it
was imported with.

The version is read from the file APP_VERSION_FILE names, once, at import
time, and sent back in every answer (X-App-Version), so the benchmark sees
which code serves: a process that did not re-import the app keeps answering
with the old version. wsgi_app sleeps APP_STARTUP_DELAY at import, which is
the start-up cost every reload has to pay, on both sides of the benchmark.
"""

import os
import sys

with open(os.environ["APP_VERSION_FILE"], encoding="ascii") as f:
    VERSION = f.read().strip()

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python"))
import wsgi_app  # noqa: E402  (sleeps APP_STARTUP_DELAY)


def application(environ, start_response):
    def versioned(status, headers, exc_info=None):
        return start_response(status, headers + [("X-App-Version", VERSION)], exc_info)

    return wsgi_app.application(environ, versioned)
