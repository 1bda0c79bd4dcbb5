"""SidecarClient against a stand-in of the sidecar's HTTP API (the Go test
sidecar.TestPythonClientAgreesWithGo runs it against the real one)."""

import hashlib
import http.server
import json
import os
import shutil
import ssl
import subprocess
import threading
import time
import urllib.parse

import pytest

from conftest import map_doc, wait_for
from shardvisor import SidecarClient, SidecarError

NODES = [("pg1", "postgres://app@db1:5432/app", ""), ("pg2", "postgres://app@db2:5432/app", "")]


class Fake:
    def __init__(self, tls=None):
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
        self.tls = None  # an ssl.SSLContext: the sidecar with --tls-*
        if tls is not None:
            self.tls = tls
            inner = self.srv.get_request

            def get_request():
                sock, addr = inner()
                return self.tls.wrap_socket(sock, server_side=True), addr
            self.srv.get_request = get_request
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.srv.server_address[1]}"

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


def make_pki(d, name):
    """A CA, a server certificate for 127.0.0.1 and a client certificate,
    made with the openssl command, in directory d under name-*."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command")
    p = lambda f: os.path.join(d, f"{name}-{f}")

    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", p("ca.key"), "-out", p("ca.crt"),
        "-days", "1", "-subj", f"/CN={name}-ca")
    for who, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", p(f"{who}.key"), "-out", p(f"{who}.csr"),
            "-subj", f"/CN={name}-{who}")
        ext_file = p(f"{who}.ext")
        with open(ext_file, "w") as f:
            f.write(ext + "\n")
        run("x509", "-req", "-in", p(f"{who}.csr"), "-CA", p("ca.crt"), "-CAkey", p("ca.key"), "-CAcreateserial", "-days", "1",
            "-out", p(f"{who}.crt"), "-extfile", ext_file)
    return p


def server_context(p):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(p("server.crt"), p("server.key"))
    ctx.load_verify_locations(p("ca.crt"))
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def test_https_sidecar_with_client_certificates_and_rotation(tmp_path):
    """A sidecar started with --tls-*: the client checks its certificate
    against cafile and presents its own; files rotated on disk (renamed
    over the old) are used by the next request (issue 41)."""
    d = str(tmp_path)
    one = make_pki(d, "one")
    fake = Fake(tls=server_context(one))
    try:
        live = {f: os.path.join(d, f"live-{f}") for f in ("ca.crt", "client.crt", "client.key")}
        for f, dst in live.items():
            shutil.copy(one(f), dst)
        c = SidecarClient(fake.url, cafile=live["ca.crt"], certfile=live["client.crt"], keyfile=live["client.key"])
        assert c.route("alice")["node"] == "pg1"
        # Without a client certificate, or trusting another CA: refused.
        two = make_pki(d, "two")
        with pytest.raises(SidecarError) as e:
            SidecarClient(fake.url, cafile=one("ca.crt")).route("alice")
        assert e.value.status == 0
        with pytest.raises(SidecarError):
            SidecarClient(fake.url, cafile=two("ca.crt"), certfile=one("client.crt"), keyfile=one("client.key")).route("alice")
        # The rotation: the sidecar to CA two, then this host's files.
        fake.tls = server_context(two)
        with pytest.raises(SidecarError):
            c.route("alice")
        time.sleep(0.01)
        for f, dst in live.items():
            shutil.copy(two(f), dst + ".new")
            os.replace(dst + ".new", dst)
        assert c.route("alice")["node"] == "pg1"
    finally:
        fake.close()
    with pytest.raises(ValueError):
        SidecarClient("https://127.0.0.1:1")
    with pytest.raises(ValueError):
        SidecarClient("http://127.0.0.1:1", certfile="x")
