#!/usr/bin/env python3
"""How much a lookup costs: Router.node_for per call, on the shared vectors'
maps (level 16, and mixed depths down to 16), against one HMAC-SHA256 of
the id by hmac.digest (the keystream's definition, computed the obvious
way) and against one plain SHA-256 of it (less than any keyed hash can
cost), in the same run. Goal: under 5 µs.

    /usr/bin/python3 clients/python/bench/node_for.py [--calls N] [--repeat R]
"""

import argparse
import gzip
import hashlib
import hmac
import json
import os
import sys
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import shardvisor  # noqa: E402
from shardvisor import keystream  # noqa: E402


def best(stmt, number, repeat):
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number * 1e6  # µs per call


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    with gzip.open(os.path.join(os.path.dirname(HERE), "tests", "data", "routing_vectors.json.gz"), "rt", encoding="utf-8") as f:
        vectors = json.load(f)
    maps = {m["name"]: m["map_file"] for m in vectors["maps"]}
    uids = [f"user-{i}@example.com" for i in range(1000)]
    n = len(uids)
    print(f"python {sys.version.split()[0]}; {a.calls} calls, best of {a.repeat}")
    r16 = shardvisor.Router.from_map(maps["level 16"])
    prk = r16.table.keystream._prk
    encoded = [(u.encode("utf-8") + b"\x01") for u in uids]
    i = iter(range(10**12))
    base = best(lambda: hmac.digest(prk, encoded[next(i) % n], "sha256"), a.calls, a.repeat)
    print(f"  baseline: one HMAC-SHA256 of the id (hmac.digest)     {base:6.2f} µs")
    i = iter(range(10**12))
    sha = best(lambda: hashlib.sha256(encoded[next(i) % n]).digest(), a.calls, a.repeat)
    print(f"  floor: one SHA-256 of the id                          {sha:6.2f} µs   {sha / base:4.2f}x the baseline")
    for name in ("level 16", "mixed depths 2..16"):
        r = shardvisor.Router.from_map(maps[name])
        j = iter(range(10**12))
        t = best(lambda: r.node_for(uids[next(j) % n]), a.calls, a.repeat)
        print(f"  node_for, {name:<20}                       {t:6.2f} µs   {t / base:4.2f}x the baseline   (goal < 5 µs: {'met' if t < 5 else 'NOT met'})")
    k = iter(range(10**12))
    t = best(lambda: r16.route(uids[next(k) % n]), a.calls // 2, a.repeat)
    print(f"  route (bucket, node, DSN, state, key), level 16       {t:6.2f} µs   {t / base:4.2f}x the baseline")
    ks = keystream.Keystream(keystream.parse_seed(maps["level 16"]["seed"]))
    m = iter(range(10**12))
    t = best(lambda: int.from_bytes(ks.stream(uids[next(m) % n], 8), "big") >> 48, a.calls // 4, a.repeat)
    print(f"  the reference's generic HKDF-Expand path + shift     {t:6.2f} µs   {t / base:4.2f}x the baseline")


if __name__ == "__main__":
    main()
