"""SidecarClient against a stand-in of the sidecar's HTTP API (the Go test
sidecar.TestPythonClientAgreesWithGo runs it against the real one)."""

import hashlib
import http.server
import json
import threading
import urllib.parse

import pytest

from conftest import map_doc, wait_for
from shardvisor import SidecarClient, SidecarError

NODES = [("pg1", "postgres://app@db1:5432/app", ""), ("pg2", "postgres://app@db2:5432/app", "")]


class Fake:
    def __init__(self):
        self.doc = map_doc(NODES, [0, 1, 0, 1], level=2, version=1)
        self.map_gets = 0
        self.not_modified = 0
        self.truncate = 0  # answers of GET /v1/map to cut short
        fake = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                u = urllib.parse.urlsplit(self.path)
                if u.path == "/v1/map":
                    body = json.dumps(fake.doc).encode()
                    etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
                    fake.map_gets += 1
                    if fake.truncate:
                        fake.truncate -= 1
                        self.send_response(200)
                        self.send_header("Content-Length", str(len(body) + 100))
                        self.end_headers()
                        self.wfile.write(body[:10])
                        return
                    if self.headers.get("If-None-Match") == etag:
                        fake.not_modified += 1
                        self.send_response(304)
                        self.send_header("ETag", etag)
                        self.end_headers()
                        return
                    self.send_response(200)
                    self.send_header("ETag", etag)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if u.path == "/v1/route":
                    uid = urllib.parse.parse_qs(u.query).get("uid", [""])[0]
                    if not uid:
                        self.send_response(400)
                        body = b'{"error":"uid is required"}'
                    else:
                        self.send_response(200)
                        body = json.dumps({"uid": uid, "node": "pg1", "map_version": 1}).encode()
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def fake():
    f = Fake()
    yield f
    f.close()


def test_route_and_errors(fake):
    c = SidecarClient(fake.url)
    assert c.route("alice")["node"] == "pg1"
    with pytest.raises(SidecarError) as e:
        c.route("")
    assert e.value.status == 400 and "uid is required" in str(e.value)
    with pytest.raises(SidecarError) as e:
        SidecarClient("http://127.0.0.1:1", timeout=1).route("a")
    assert e.value.status == 0 and "cannot reach" in str(e.value)


def test_router_follows_the_sidecars_map(fake):
    errors = []
    r = SidecarClient(fake.url).router(follow=True, every=0.02, on_error=errors.append)
    try:
        assert r.map_version == 1
        wait_for(lambda: fake.not_modified >= 3, 2, "polls answered 304")
        fake.doc = map_doc(NODES, [1, 1, 1, 1], level=2, version=2)
        wait_for(lambda: r.map_version == 2, 2, "map 2")
        assert r.node_for("alice") == "pg2"
        fake.close()  # the sidecar goes away: the map in use is kept
        wait_for(lambda: errors, 2, "the error to be reported")
        assert r.map_version == 2 and isinstance(errors[0], SidecarError)
    finally:
        r.close()


def test_a_broken_answer_is_reported_and_following_goes_on(fake):
    errors = []
    r = SidecarClient(fake.url).router(follow=True, every=0.02, on_error=errors.append)
    try:
        fake.truncate = 2
        wait_for(lambda: len(errors) >= 2, 5, "the broken answers to be reported")
        assert all(isinstance(e, SidecarError) and "broken answer" in str(e) for e in errors), errors
        fake.doc = map_doc(NODES, [1, 1, 1, 1], level=2, version=2)
        wait_for(lambda: r.map_version == 2, 5, "map 2 after the broken answers")
    finally:
        r.close()
