"""shardvisor.db through a Patroni failover (make test-faults: the Go test
TestFaultsPythonPoolsFollowFailover sets the group up and holds the
environment exclusively). Writers run on a node that is a Patroni group
(a multi-host DSN with target_session_attrs=read-write); its primary host
is SIGKILLed; run() rides out the failover on the promoted standby, and
every acknowledged write is there (synchronous replication)."""

import os
import subprocess
import time

import pytest

from conftest import REPO, Writers, map_doc, wait_for
from shardvisor import Router
from shardvisor import db as svdb

DSN = os.environ.get("SHARDVISOR_PY_GROUP_DSN")
NUM = os.environ.get("SHARDVISOR_PY_GROUP_NUM")
PWFILE = os.environ.get("SHARDVISOR_PY_GROUP_PASSWORD_FILE")


@pytest.mark.skipif(not DSN, reason="run by the Go test TestFaultsPythonPoolsFollowFailover (make test-faults)")
def test_run_follows_the_groups_new_primary():
    router = Router.from_map(map_doc([("g1", DSN, f"file:{PWFILE}")], [0], level=0))
    pools = svdb.Pools(router, retry_for=60, max_size=3)  # a connection per writer thread
    pools.run("setup", lambda c: c.cursor().execute(
        "CREATE TABLE IF NOT EXISTS pywrites (uid text, id bigint, PRIMARY KEY (uid, id))"))

    def write(k, i):
        key = (f"w{k}", i + 1)

        def fn(conn):
            with conn.cursor() as cur:
                # Idempotent by its key: a retry after a lost connection adds nothing.
                cur.execute("INSERT INTO pywrites VALUES (%s, %s) ON CONFLICT DO NOTHING", key)
        pools.run(key[0], fn, idempotent=True)
        return key

    writers = Writers(3, write)
    acked, stamps = writers.acked, writers.stamps
    wait_for(lambda: len(acked) > 200, 20, "writes before the failover")
    out = subprocess.run([os.path.join(REPO, "scripts", "devenv"), "pg-kill", NUM], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    killed_at, n_at_kill = time.monotonic(), len(acked)
    wait_for(lambda: len(acked) > n_at_kill + 200, 90, "writes on the new primary", every=0.2)
    writers.stop(70)
    assert writers.failed == []
    got = set(pools.run("check", lambda c: (lambda cur: (cur.execute("SELECT uid, id FROM pywrites"), cur.fetchall())[1])(c.cursor())))
    missing = set(acked) - got
    assert not missing, f"{len(missing)} acknowledged writes missing after the failover"
    gap = max(b - a for a, b in zip(stamps, stamps[1:]))
    first_after = next(s for s in stamps if s > killed_at)
    print(f"failover: {out.stdout.strip()}; writes stopped {first_after - killed_at:.1f} s; longest gap {gap:.1f} s; "
          f"{len(acked)} acknowledged, 0 lost, 0 failed; retries {pools.retries}")
    assert pools.retries["connect"] + pools.retries["lost"] >= 1
    pools.close()
