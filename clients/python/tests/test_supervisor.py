"""The example Django app (examples/python/django_notes) under the real
supervisor with Debian's gunicorn, in reload mode: notes land on their
users' nodes, and each map change is followed in place and acknowledged
(MAPVERSION=N from the forked gunicorn worker), with no worker restarted."""

import json
import os
import shutil
import signal
import subprocess
import urllib.request

import pytest

from conftest import PKG, REPO, free_port, wait_for

GUNICORN = "/usr/bin/gunicorn"


def get(url, data=None, headers=None):
    req = urllib.request.Request(url, data=data, headers=headers or {})
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.status, dict(r.headers), json.loads(r.read())


def test_django_app_under_the_supervisor_follows_the_map(zk_cluster, bins, tmp_path):
    if not os.path.exists(GUNICORN):
        pytest.fail("gunicorn is not installed (scripts/install-deps installs it)")
    pytest.importorskip("django")
    c = zk_cluster
    port, admin = free_port(), free_port()
    pool = {
        "version": 1,
        "command": GUNICORN,
        "args": ["--preload", "--workers", "1", "--chdir", os.path.join(REPO, "examples", "python", "django_notes"),
                 "--graceful-timeout", "5", "--log-level", "warning", "notesproject.wsgi:application"],
        "env": {"PYTHONPATH": PKG, "DJANGO_SETTINGS_MODULE": "notesproject.settings"},
        "workers": 2,
        "listen": [{"name": "http", "addr": f"tcp://127.0.0.1:{port}"}],
        "graceful_timeout": "10s",
        # gunicorn's arbiter says READY=1 before it forks its worker.
        "readiness": {"mode": "notify", "timeout": "60s", "delay": "500ms"},
        "map_delivery": {"mode": "reload", "ack_timeout": "5s"},
    }
    (tmp_path / "pool.json").write_text(json.dumps(pool))
    c.ctl("pool", "set", "web", "--file", str(tmp_path / "pool.json"))
    log = open(tmp_path / "supervisor.log", "w")
    sv = subprocess.Popen([os.path.join(bins, "supervisor"), *c.flags, "--pool", "web",
                           "--member", "py1", "--admin", f"127.0.0.1:{admin}", "--state-dir", str(tmp_path / "state")],
                          stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        def healthy():
            try:
                return get(base + "/healthz")[2]
            except OSError:
                if sv.poll() is not None:
                    raise AssertionError("the supervisor exited:\n" + (tmp_path / "supervisor.log").read_text())
                return None

        h = wait_for(healthy, 60, "the Django app under the supervisor")
        v1 = h["map_version"]
        # A note per node, each on its user's node.
        placed = {}
        for uid in (f"sup{i}" for i in range(40)):
            node = None
            status, hdr, body = get(f"{base}/v1/users/{uid}/notes", json.dumps({"body": f"from {uid}"}).encode(),
                                    {"Content-Type": "application/json", "Idempotency-Key": uid})
            node = hdr["X-Shardvisor-Node"]
            assert status == 201
            placed.setdefault(node, uid)
            if len(placed) == 2:
                break
        assert set(placed) == {"pg1", "pg2"}
        for node, uid in placed.items():
            i = 0 if node == "pg1" else 1
            assert c.pg.exec(i, c.db, "SELECT body FROM app.notes WHERE uid = %s", (uid,)) == [(f"from {uid}",)]
        def on_map(v):
            """The member serves with both workers ready, each of which
            acknowledged map v (MAPVERSION=v, from the forked gunicorn worker)."""
            def check():
                members = c.ctl_json("pool", "status", "web").get("members") or []
                if len(members) != 1 or members[0]["state"] != "serving":
                    return None
                ws = [w for w in members[0]["workers"] if w["state"] == "ready"]
                return len(ws) == 2 and all(w.get("map_version") == v for w in ws) and {w["pid"] for w in ws}
            return check

        sv_pids = wait_for(on_map(v1), 30, f"both workers ready on map {v1}", every=0.2)
        pids = {get(base + "/healthz")[2]["pid"] for _ in range(20)}
        # Two map changes: each followed in place and acknowledged.
        for w in (2, 3):
            c.ctl("node", "set-weight", "pg2", str(w))
        want = v1 + 2
        assert wait_for(on_map(want), 20, f"both workers to acknowledge map {want}", every=0.2) == sv_pids, "a worker was replaced"
        for _ in range(10):
            h = get(base + "/healthz")[2]
            assert h["map_version"] == want, f"worker {h['pid']} answered map {h['map_version']}, not {want}; " \
                f"pool status {c.ctl('pool', 'status', 'web')}\nsupervisor log:\n{(tmp_path / 'supervisor.log').read_text()}"
        assert {get(base + "/healthz")[2]["pid"] for _ in range(20)} <= pids, "a worker was restarted for a map change"
        status, hdr, body = get(f"{base}/v1/users/{placed['pg2']}/notes")
        assert status == 200 and [n["body"] for n in body] == [f"from {placed['pg2']}"]
        assert hdr["X-Shardvisor-Map-Version"] == str(want)
    finally:
        sv.send_signal(signal.SIGTERM)
        try:
            sv.wait(30)
        except subprocess.TimeoutExpired:
            sv.kill()
        log.close()
