"""run() through a real move: the router sidecar follows the cluster's map,
writers run flat out on the moved bucket's users, `shardctl move` moves
the bucket between two real PostgreSQL nodes with its write pause, and
every acknowledged write is on the new owner exactly once."""

import json
import os
import subprocess
import time

import pytest

from conftest import Writers, free_port, wait_for
from shardvisor import SidecarClient
from shardvisor import db as svdb


@pytest.mark.parametrize("driver", ["psycopg2"])
def test_run_through_a_real_moves_pause(zk_cluster, bins, driver):
    c = zk_cluster
    port = free_port()
    sidecar = subprocess.Popen([os.path.join(bins, "router"), *c.flags, "--listen", f"127.0.0.1:{port}",
                                "--log-level", "warn"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        client = SidecarClient(f"http://127.0.0.1:{port}")

        def up():
            try:
                return client.map_bytes()
            except Exception:
                return None

        wait_for(up, 15, "the router sidecar")
        router = client.router(follow=True, every=0.01)
        pools = svdb.Pools(router, driver=driver, max_size=4)  # a connection per writer thread
        # The bucket to move: one of pg1's; its users write, and others too.
        owned = {}
        for i in range(2000):
            rt = router.route(f"w{i}")
            owned.setdefault((rt.bucket, rt.node), []).append(f"w{i}")
        bucket = min(b for (b, n) in owned if n == "pg1")
        users = owned[(bucket, "pg1")][:6] + [u for (b, n), us in owned.items() if n == "pg2" for u in us[:2]]

        def write(k, i):
            uid = users[(k + i) % len(users)]
            nid = k * 1_000_000 + i

            def fn(conn):
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO app.notes (bkey, uid, id, body) VALUES (%s, %s, %s, 'w')",
                                (router.key(uid), uid, nid))
            pools.run(uid, fn)
            return uid, nid

        writers = Writers(4, write)  # a failed write is counted, and the test fails on any
        acked = writers.acked
        wait_for(lambda: len(acked) > 200, 10, "writes before the move")
        t0 = time.monotonic()
        c.ctl("move", str(bucket), "--to", "pg2", "--window", "0", timeout=120)
        moved_in = time.monotonic() - t0
        wait_for(lambda: router.route(users[0]).node == "pg2", 5, "the map to name pg2")
        n_at_flip = len(acked)
        wait_for(lambda: len(acked) > n_at_flip + 200, 10, "writes after the move")
        writers.stop(15)
        assert writers.failed == []
        by_user = {}
        for uid, nid in acked:
            by_user.setdefault(uid, set()).add(nid)
        for uid, ids in by_user.items():
            owner = 0 if router.node_for(uid) == "pg1" else 1
            rows = c.pg.exec(owner, c.db, "SELECT id FROM app.notes WHERE uid = %s", (uid,))
            got = [r[0] for r in rows]
            assert len(got) == len(set(got)), f"{uid}: duplicated rows"
            assert set(got) == ids, f"{uid}: {len(ids - set(got))} acknowledged writes missing, {len(set(got) - ids)} not acknowledged"
        print(f"move of bucket {bucket} in {moved_in:.2f} s: {len(acked)} writes acknowledged, 0 lost, 0 duplicated; "
              f"retries {pools.retries}")
        assert pools.retries["fence"] >= 1, "no write met the move's pause"
        # And node_for agrees with shardctl route on the live map, after the move.
        uids = users + ["alice", "ünïcødé", "用户-7", "😀", "e\u0301"] + [f"r{i}" for i in range(100)]
        lines = c.ctl("--json", "route", *uids).strip().splitlines()
        assert len(lines) == len(uids)
        for uid, line in zip(uids, lines):
            want = json.loads(line)
            got = router.route(uid)
            assert (want["uid"], want["node"], want["bucket"], want["level"], want["map_version"]) == \
                (uid, router.node_for(uid), got.bucket, got.level, router.map_version), uid
        pools.close()
        router.close()
    finally:
        sidecar.terminate()
        sidecar.wait(10)
