"""Map files: clear errors for bad ones, password references, and following
a map file in reload mode with MAPVERSION acknowledgements."""

import base64
import copy
import json
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from conftest import map_doc, wait_for, write_json
from shardvisor import MapError, Router, RoutingTable
from shardvisor.routing import Node

NODES = [("pg1", "postgres://app@db1:5432/app", ""), ("pg2", "postgres://app@db2:5432/app", "")]


def doc(version=1, owners=(0, 1, 0, 1)):
    return map_doc(NODES, list(owners), level=2, version=version)


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(version=2), "map file format version 2 is not supported"),
    (lambda d: d["map"].update(version=3), "bucket map format version 3 is not supported"),
    (lambda d: d.update(seed="abcd"), "seed is 2 bytes, want at least 16"),
    (lambda d: d.update(seed="zz" * 16), "seed is not valid hex"),
    (lambda d: d["map"].update(owners=base64.b64encode(b"\x00\x00\x00\x05\x00\x00\x00\x01").decode()), "an index past the 2 nodes"),
    (lambda d: d["map"].update(owners=base64.b64encode(b"\x00\x00").decode()), "owners: 1 buckets for level 2"),
    (lambda d: d["map"].update(owners="not base64!"), "malformed"),
    (lambda d: d["map"].update(level=40), "level 40 out of range"),
    (lambda d: d["map"].update(map_version=0), "map_version 0 is not a positive integer"),
    (lambda d: d["map"].pop("nodes"), "malformed: KeyError: 'nodes'"),
    (lambda d: d["map"]["nodes"].append(dict(d["map"]["nodes"][0])), "a node id appears twice"),
    (lambda d: d["map"].update(level=18), "level 18 out of range [0, 17] (format 1)"),
    (lambda d: d["map"].update(depths="AgI="), "format version 1 lists depths"),
    (lambda d: d["map"]["nodes"][1].update(state="removed"), "node pg2 is removed but owns buckets"),
    (lambda d: d["map"]["nodes"][1].update(state="sleepy"), "state 'sleepy' is not one of"),
    (lambda d: d["map"].update(buckets=[{"bucket": 9, "state": "moving", "target": "pg2"}]), "bucket 9 at depth 2 does not exist"),
    (lambda d: d["map"].update(buckets=[{"bucket": 1, "state": "frozen"}]), "state 'frozen' is not one of"),
    (lambda d: d["map"].update(buckets=[{"bucket": 1, "state": "moving", "target": "pg9"}]), "moving to 'pg9', which is not a node"),
    (lambda d: d["map"]["nodes"][1].update(pool_dsn="host=pgb2 port=6432"), "node pg2: pool_dsn 'host=pgb2 port=6432' must be a postgres:// URL"),
    (lambda d: d["map"]["nodes"][1].update(pool_dsn="mysql://app@pgb2/app"), "node pg2: pool_dsn 'mysql://app@pgb2/app' must be a postgres:// URL"),
    (lambda d: d["map"]["nodes"][1].update(pool_dsn="postgres://app:s3cret@pgb2:6432/app"),
     "node pg2: pool_dsn 'postgres://app:REDACTED@pgb2:6432/app' contains a password"),
    (lambda d: d["map"]["nodes"][1].update(pool_dsn="postgres://app@pgb2:6432/app?password=s3cret"),
     "node pg2: pool_dsn 'postgres://app@pgb2:6432/app?password=REDACTED' has a password parameter"),
    (lambda d: d["map"]["nodes"][1].update(pool_dsn="postgres:///app?host=/run/pgb"), "node pg2: pool_dsn 'postgres:///app?host=/run/pgb' has a host parameter"),
    (lambda d: d["map"]["nodes"][1].update(pool_dsn="postgres://app@pgb2:0/app"), "node pg2: pool_dsn 'postgres://app@pgb2:0/app': host 'pgb2:0': the port is not"),
    (lambda d: d["map"]["nodes"][1].update(pool_dsn="postgres://app@pgb2a,pgb2b/app"), "node pg2: pool_dsn 'postgres://app@pgb2a,pgb2b/app' lists 2 hosts but not target_session_attrs=read-write"),
    (lambda d: d["map"]["nodes"][1].update(pool_dsn=6432), "node pg2: pool_dsn is int, not a postgres:// URL"),
])
def test_bad_maps_are_refused_with_what_is_wrong(edit, message):
    d = doc()
    edit(d)
    with pytest.raises(MapError) as e:
        Router.from_map(d, "map file /x.json")
    assert message in str(e.value)
    assert str(e.value).startswith("map file /x.json: ")


def test_a_bad_pool_dsn_never_shows_its_password():
    d = doc()
    d["map"]["nodes"][0]["pool_dsn"] = "postgres://app:s3cret@pgb1:6432/app?password=other"
    with pytest.raises(MapError) as e:
        Router.from_map(d)
    assert "node pg1: pool_dsn" in str(e.value) and "s3cret" not in str(e.value) and "other" not in str(e.value)


def test_pool_dsn_is_the_application_path_when_set():
    """A node record's pool_dsn (a transaction-mode pooler in front of the
    node) is its application path; absent, null or empty: dsn, as before."""
    d = doc()
    d["map"]["nodes"][0]["pool_dsn"] = "postgres://app@pgb1:6432/app"
    d["map"]["nodes"][1]["pool_dsn"] = ""
    r = Router.from_map(d)
    pg1, pg2 = r.node("pg1"), r.node("pg2")
    assert pg1.pool_dsn == "postgres://app@pgb1:6432/app" and pg1.dsn == "postgres://app@db1:5432/app"
    assert pg1.app_dsn == pg1.path_dsn() == "postgres://app@pgb1:6432/app" and pg1.pooled()
    assert pg1.path_dsn(direct=True) == pg1.dsn and not pg1.pooled(direct=True)
    assert pg2.pool_dsn == "" and pg2.app_dsn == pg2.dsn and not pg2.pooled()
    u = next(f"u{i}" for i in range(100) if r.node_for(f"u{i}") == "pg1")
    assert r.route(u).dsn == pg1.dsn  # a route names the node's dsn, as shardctl route --json does
    d["map"]["nodes"][0]["pool_dsn"] = None
    assert Router.from_map(d).node("pg1").app_dsn == "postgres://app@db1:5432/app"
    # A Patroni group's pooler: one per member, the primary found as for dsn.
    d["map"]["nodes"][0]["pool_dsn"] = "postgres://app@pgb1a:6432,pgb1b:6432/app?target_session_attrs=read-write"
    assert Router.from_map(d).node("pg1").pooled()
    # Nodes built by hand take it as a keyword, and default to none.
    assert Node("n", "postgres://h/d", "", "active", 1, None).pool_dsn == ""


def test_a_data_lost_bucket_is_active_as_in_go():
    d = doc()
    d["map"]["buckets"] = [{"bucket": 0, "state": "", "data_lost": True}]
    r = Router.from_map(d)
    u = next(f"u{i}" for i in range(100) if r.route(f"u{i}").bucket == 0)
    assert r.route(u).state == "active" and r.route(u).data_lost


def test_mixed_depths_that_do_not_tile_are_refused():
    d = doc()
    d["map"].update(version=2, level=2, owners=base64.b64encode(b"\x00\x00\x00\x01\x00\x00").decode(),
                    depths=base64.b64encode(bytes([2, 1, 2])).decode())
    with pytest.raises(MapError, match="a bucket at depth 1 cannot start at slot 1"):
        Router.from_map(d)


def test_not_json_and_missing_file(tmp_path):
    with pytest.raises(MapError, match="not JSON"):
        Router.from_map(b"{")
    with pytest.raises(MapError, match="No such file"):
        Router.from_map_file(str(tmp_path / "nope.json"))


def test_from_env_without_a_supervisor(monkeypatch):
    monkeypatch.delenv("SHARDVISOR_MAP_FILE", raising=False)
    with pytest.raises(MapError, match="SHARDVISOR_MAP_FILE is not set"):
        Router.from_env()


def test_password_references(tmp_path, monkeypatch):
    f = tmp_path / "pw"
    f.write_text("s3cret\r\nsecond line\n")
    monkeypatch.setenv("SV_PW", "from-env")
    assert Node("n", "", f"file:{f}", "active", 1, None).resolve_password() == "s3cret"
    assert Node("n", "", "env:SV_PW", "active", 1, None).resolve_password() == "from-env"
    assert Node("n", "", "", "active", 1, None).resolve_password() is None
    with pytest.raises(MapError, match="environment variable SV_NOPE is not set"):
        Node("n", "", "env:SV_NOPE", "active", 1, None).resolve_password()
    with pytest.raises(MapError, match="db node n: password reference file:/nonexistent"):
        Node("n", "", "file:/nonexistent", "active", 1, None).resolve_password()
    with pytest.raises(MapError, match="must be env:NAME or file:/path"):
        Node("n", "", "plain", "active", 1, None).resolve_password()


def test_update_takes_only_newer_maps():
    r = Router.from_map(doc(version=5))
    seen = []
    r.on_change(lambda old, new: seen.append((old.map_version, new.map_version)))
    assert not r.update(RoutingTable(doc(version=4)))
    assert not r.update(RoutingTable(doc(version=5)))
    assert r.update(RoutingTable(doc(version=6, owners=(1, 1, 1, 1))))
    assert seen == [(5, 6)] and r.map_version == 6
    assert {r.node_for(f"u{i}") for i in range(50)} == {"pg2"}
    with pytest.raises(MapError, match="'pg9' is not in map version 6"):
        r.node("pg9")


class NotifySocket:
    """A NOTIFY_SOCKET the test reads, as the supervisor's."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.05)
        self.got = []

    def read(self):
        while True:
            try:
                self.got.append(self.sock.recv(4096).decode())
            except (socket.timeout, BlockingIOError):
                return self.got

    def close(self):
        self.sock.close()


def live_map(tmp_path, monkeypatch):
    """A NOTIFY_SOCKET the test reads, and a map file at version 1."""
    ns = NotifySocket(tmp_path / "notify.sock")
    path = str(tmp_path / "live-map.json")
    write_json(path, doc(version=1))
    monkeypatch.setenv("NOTIFY_SOCKET", ns.path)
    return ns, path


def test_following_acknowledges_each_map(tmp_path, monkeypatch):
    ns, path = live_map(tmp_path, monkeypatch)
    monkeypatch.setenv("SHARDVISOR_MAP_FILE", path)
    monkeypatch.setenv("SHARDVISOR_MAP_DELIVERY", "reload")
    errors = []
    r = Router.from_env(on_error=errors.append)
    try:
        wait_for(lambda: "MAPVERSION=1" in ns.read(), 2, "MAPVERSION=1")
        write_json(path, doc(version=2, owners=(1, 1, 1, 1)))
        wait_for(lambda: "MAPVERSION=2" in ns.read(), 2, "MAPVERSION=2")
        assert r.map_version == 2 and r.node_for("alice") == "pg2"
        # A file that does not load: reported, and the map in use kept.
        with open(path + ".tmp", "w") as f:
            f.write("{not json")
        os.replace(path + ".tmp", path)
        wait_for(lambda: errors, 2, "the error to be reported")
        assert "not JSON" in str(errors[0]) and r.map_version == 2
        # An older map is refused too.
        write_json(path, doc(version=1))
        wait_for(lambda: any("older than the applied 2" in str(e) for e in errors), 2, "the older map to be refused")
        write_json(path, doc(version=3))
        wait_for(lambda: "MAPVERSION=3" in ns.read(), 2, "MAPVERSION=3")
        assert not any(m in ns.read() for m in ("MAPVERSION=4",))
    finally:
        r.close()
        ns.close()


def test_swap_mode_neither_follows_nor_acknowledges(tmp_path, monkeypatch):
    ns, path = live_map(tmp_path, monkeypatch)
    monkeypatch.setenv("SHARDVISOR_MAP_FILE", path)
    monkeypatch.setenv("SHARDVISOR_MAP_DELIVERY", "swap")
    r = Router.from_env()
    write_json(path, doc(version=2))
    time.sleep(0.3)  # deliberate: three poll periods in which nothing may happen
    assert r.map_version == 1 and ns.read() == []
    ns.close()


def _child_waits_for(r, version):
    """Forks a child that waits (up to 5 s) for r to reach version; returns
    (pid, read end of a pipe that gets the version it saw)."""
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rd)
        try:
            deadline = time.monotonic() + 5
            while r.map_version < version and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.2)  # deliberate: the follower acknowledges just after the swap this thread saw
            os.write(wr, str(r.map_version).encode())
        finally:
            os._exit(0)
    os.close(wr)
    return pid, rd


def test_a_pre_forking_parent_follows_and_only_its_children_acknowledge(tmp_path, monkeypatch):
    """gunicorn --preload: the arbiter loads the app (and the router) and
    forks; the children route, so only they acknowledge; the arbiter keeps
    following, so a child forked later to replace one starts on the
    current map, not on the one the arbiter had at its first fork."""
    ns, path = live_map(tmp_path, monkeypatch)
    r = Router.from_map_file(path, follow=True, ack=True, forks_workers=True)
    wait_for(lambda: "MAPVERSION=1" in ns.read(), 2, "the parent's MAPVERSION=1")
    for v in (2, 3):
        ns.got.clear()
        pid, rd = _child_waits_for(r, v)
        write_json(path, doc(version=v))
        seen = os.read(rd, 16).decode()
        os.close(rd)
        os.waitpid(pid, 0)
        assert seen == str(v)
        got = wait_for(lambda: [m for m in ns.read() if m == f"MAPVERSION={v}"], 2, f"the child's MAPVERSION={v}")
        wait_for(lambda: r.map_version == v, 2, f"the parent to follow to map {v}")
        time.sleep(0.3)  # deliberate: an acknowledgement by the parent would have come by now
        assert len(got) == 1, ns.got  # the child's, not the parent's
        # The child acknowledged first what it started on: the map current
        # at its fork (v-1), never an older one.
        assert ns.got[0] == f"MAPVERSION={v - 1}", ns.got
    ns.close()
    r.close()


def test_a_process_that_forks_for_other_reasons_keeps_acknowledging(tmp_path, monkeypatch):
    """multiprocessing, subprocess's preexec_fn: not a pre-forking server."""
    ns, path = live_map(tmp_path, monkeypatch)
    r = Router.from_map_file(path, follow=True, ack=True, forks_workers=False)
    subprocess.run(["true"], preexec_fn=lambda: None, check=True)  # runs the fork hooks
    ns.read()
    ns.got.clear()
    write_json(path, doc(version=2))
    wait_for(lambda: "MAPVERSION=2" in ns.read(), 2, "the parent's MAPVERSION=2")
    assert r.map_version == 2
    r.close()
    ns.close()


def test_a_bad_file_is_reported_once_until_it_changes(tmp_path):
    path = str(tmp_path / "live-map.json")
    write_json(path, doc(version=1))
    errors = []
    r = Router.from_map_file(path, follow=True, on_error=errors.append)
    with open(path + ".tmp", "w") as f:
        f.write("{broken")
    os.replace(path + ".tmp", path)
    wait_for(lambda: errors, 2, "the error")
    time.sleep(0.5)  # deliberate: five polls of the same bad file
    assert len(errors) == 1
    write_json(path, doc(version=2))
    wait_for(lambda: r.map_version == 2, 2, "map 2")
    r.close()


def test_from_env_is_one_router_per_process(tmp_path, monkeypatch):
    path = str(tmp_path / "map.json")
    write_json(path, doc(version=1))
    monkeypatch.setenv("SHARDVISOR_MAP_FILE", path)
    monkeypatch.setenv("SHARDVISOR_MAP_DELIVERY", "swap")
    assert Router.from_env() is Router.from_env()


def test_the_map_signal_wakes_the_follower(tmp_path, monkeypatch):
    ns, path = live_map(tmp_path, monkeypatch)
    for k, v in {"SHARDVISOR_MAP_FILE": path, "SHARDVISOR_MAP_DELIVERY": "reload", "SHARDVISOR_MAP_SIGNAL": "SIGUSR2"}.items():
        monkeypatch.setenv(k, v)
    old = signal.getsignal(signal.SIGUSR2)
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    try:
        r = Router.from_env()
        assert signal.getsignal(signal.SIGUSR2) is not signal.SIG_DFL  # the default would end the process
        r.POLL = 30  # only the signal can wake it now
        time.sleep(0.2)  # deliberate: the follower is in its 0.1 s wait, then in the 30 s one
        write_json(path, doc(version=2))
        os.kill(os.getpid(), signal.SIGUSR2)
        wait_for(lambda: r.map_version == 2, 2, "map 2 on the signal")
        r.close()
    finally:
        signal.signal(signal.SIGUSR2, old)
        ns.close()
