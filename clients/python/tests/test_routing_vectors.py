"""The shared vectors: the Go router's answers (sidecar.TestRoutingVectorsFile
writes them, as `shardctl route --json` prints them) at every level 0..16,
at mixed depths, for ASCII and non-ASCII ids. Python must agree on each."""

import gzip
import json
import os

import pytest

from conftest import HERE, REPO
from shardvisor import Router, keystream

with gzip.open(os.path.join(HERE, "data", "routing_vectors.json.gz"), "rt", encoding="utf-8") as f:
    VECTORS = json.load(f)


@pytest.mark.parametrize("m", VECTORS["maps"], ids=[m["name"] for m in VECTORS["maps"]])
def test_python_routes_as_go(m):
    r = Router.from_map(m["map_file"], m["name"])
    assert len(m["routes"]) == len(VECTORS["uids"])
    for uid, want in zip(VECTORS["uids"], m["routes"]):
        assert want["uid"] == uid
        assert r.node_for(uid) == want["node"], uid
        got = r.route(uid)
        assert (got.bucket, got.level, got.node, got.dsn, got.map_version, got.state) == (
            want["bucket"], want["level"], want["node"], want["dsn"], want["map_version"], want["state"]), uid
        assert got.target == want.get("target", ""), uid
        assert got.group == want.get("group", ""), uid
        assert got.data_lost == want["data_lost"], uid


def test_vectors_cover_what_the_issue_asks():
    levels = {r["level"] for m in VECTORS["maps"] for r in m["routes"]}
    assert levels >= set(range(17))
    assert any(not u.isascii() for u in VECTORS["uids"])
    mixed = [m for m in VECTORS["maps"] if m["map_file"]["map"]["version"] == 2]
    assert mixed and all(len({r["level"] for r in m["routes"]}) >= 3 for m in mixed)
    assert any(r["state"] == "moving" for m in VECTORS["maps"] for r in m["routes"])
    assert any(r["data_lost"] for m in VECTORS["maps"] for r in m["routes"])


def test_keystream_vectors():
    """keystream/testdata/vectors.json: every derived field, bit for bit."""
    with open(os.path.join(REPO, "keystream", "testdata", "vectors.json"), encoding="utf-8") as f:
        doc = json.load(f)
    got = keystream.recompute_vectors(doc)
    for have, want in zip(got["vectors"], doc["vectors"]):
        for k in ("uid_utf8", "stream40", "prefix64", "key", "buckets"):
            assert have[k] == want[k], (want["uid"], k)
    for have, want in zip(got["ranges"], doc["ranges"]):
        assert have == want


def test_key_is_the_storage_key():
    m = VECTORS["maps"][5]
    r = Router.from_map(m["map_file"])
    ks = keystream.Keystream(keystream.parse_seed(m["map_file"]["seed"]))
    for uid in VECTORS["uids"][:50]:
        assert r.key(uid) == keystream.key(ks.prefix64(uid)) == r.route(uid).key
        lo, hi = keystream.bucket_range(r.route(uid).level, r.route(uid).bucket)
        assert lo <= r.key(uid) <= hi
