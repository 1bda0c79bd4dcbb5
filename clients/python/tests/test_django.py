"""shardvisor.django with a real database per node: the example app's
models and views (examples/python/django_notes), the router, the
middleware, for_user, a node added at run time, and run() through a
fenced pause. test_supervisor.py runs the same app under the supervisor."""

import json
import os
import sys
import threading

import pytest

from conftest import REPO, TEST_FENCE, map_doc
from shardvisor import Router, RoutingTable

django = pytest.importorskip("django")

SCHEMA = open(os.path.join(REPO, "examples", "notes", "schema", "001-notes.sql")).read() + TEST_FENCE


class Env:
    pass


@pytest.fixture(scope="module")
def env(pg, node_dbs):
    from django.conf import settings

    if settings.configured:
        pytest.fail("Django settings were configured before this module (only test_django configures them)")
    for i in (0, 1):
        pg.exec(i, node_dbs, SCHEMA)
    third = node_dbs + "_3"
    pg.create_db(1, third)
    pg.exec(1, third, SCHEMA)
    e = Env()
    e.pg, e.db, e.third = pg, node_dbs, third
    pw = f"file:{pg.password_file}"
    e.specs = [("pg1", pg.dsn(0, node_dbs), pw), ("pg2", pg.dsn(1, node_dbs), pw)]
    e.router = Router.from_map(map_doc(e.specs, [0, 1], level=1))
    sys.path.insert(0, os.path.join(REPO, "examples", "python", "django_notes"))
    import shardvisor.django as svdj

    settings.configure(
        SECRET_KEY="test", DEBUG=False, ALLOWED_HOSTS=["*"], USE_TZ=True, ROOT_URLCONF="notesproject.urls",
        INSTALLED_APPS=["notes"], MIDDLEWARE=["shardvisor.django.UserMiddleware"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
                   **svdj.databases(router=e.router)},
        DATABASE_ROUTERS=["shardvisor.django.Router"], SHARDVISOR_SHARDED_APPS=["notes"],
        SHARDVISOR_USER_ID="notes.views.user_from_path")
    django.setup()
    e.svdj = svdj
    yield e
    from django.db import connections

    connections.close_all()
    pg.drop_db(1, third)


def rows(env, i, db=None):
    return env.pg.exec(i, db or env.db, "SELECT uid, body FROM app.notes ORDER BY uid, body")


@pytest.fixture(autouse=True)
def two_nodes(env):
    """Each test starts on the map of two nodes (bucket 0 on pg1, 1 on pg2),
    whatever an earlier one made of it."""
    if env.router.table.owning_nodes() != ["pg1", "pg2"] or env.router.node("pg1").dsn != env.specs[0][1]:
        env.router.update(RoutingTable(map_doc(env.specs, [0, 1], level=1, version=env.router.map_version + 1)))


def users_on(env, node, n=2, prefix="dj"):
    out, i = [], 0
    while len(out) < n:
        assert i < 10000, f"no user of {node} in the map"
        u = f"{prefix}{i}"
        if env.router.node_for(u) == node:
            out.append(u)
        i += 1
    return out


def test_models_go_to_the_current_users_node(env):
    from notes.models import Note

    a, b = users_on(env, "pg1", 1)[0], users_on(env, "pg2", 1)[0]
    for u in (a, b):
        with env.svdj.for_user(u):
            Note.objects.create(bkey=env.router.key(u), uid=u, id=1, body=f"hello {u}")
    assert rows(env, 0) == [(a, f"hello {a}")]
    assert rows(env, 1) == [(b, f"hello {b}")]
    with env.svdj.for_user(b):
        assert [n.body for n in Note.objects.filter(uid=b)] == [f"hello {b}"]
        n = Note.objects.get(uid=b, id=1)
        n.body = "changed"
        n.save()  # stays on the node it came from
        assert n._state.db == "pg2"
    assert rows(env, 1) == [(b, "changed")]


def test_no_current_user_is_a_clear_error(env):
    from notes.models import Note

    with pytest.raises(env.svdj.NoCurrentUser, match="notes.Note is in a sharded app .* no current user"):
        list(Note.objects.all())


def test_requests_through_the_middleware_and_views(env):
    from django.test import Client

    c = Client()
    u = users_on(env, "pg2", 1, "http")[0]
    r = c.post(f"/v1/users/{u}/notes", data=json.dumps({"body": "via http"}), content_type="application/json",
               HTTP_IDEMPOTENCY_KEY="k1")
    assert r.status_code == 201 and r["X-Shardvisor-Node"] == "pg2"
    # The same key again: no second note.
    r2 = c.post(f"/v1/users/{u}/notes", data=json.dumps({"body": "via http"}), content_type="application/json",
                HTTP_IDEMPOTENCY_KEY="k1")
    assert r2.status_code == 201 and r2.json()["id"] == r.json()["id"]
    got = c.get(f"/v1/users/{u}/notes")
    assert got.status_code == 200 and [n["body"] for n in got.json()] == ["via http"]
    assert (u, "via http") in rows(env, 1) and all(row[0] != u for row in rows(env, 0))


def test_migrations_only_where_the_app_lives(env):
    from django.db import router

    assert router.allow_migrate("pg1", "notes") and router.allow_migrate("pg2", "notes")
    assert not router.allow_migrate("default", "notes")
    assert router.allow_migrate("default", "auth") and not router.allow_migrate("pg1", "auth")


def test_a_node_added_later_gets_an_alias_at_run_time(env):
    from django.db import connections
    from notes.models import Note

    specs = env.specs + [("pg3", env.pg.dsn(1, env.third), f"file:{env.pg.password_file}")]
    env.router.update(RoutingTable(map_doc(specs, [0, 2], level=1, version=2)))
    u = users_on(env, "pg3", 1, "late")[0]
    assert "pg3" not in connections.databases
    with env.svdj.for_user(u):
        Note.objects.create(bkey=env.router.key(u), uid=u, id=7, body="on the new node")
    assert "pg3" in connections.databases
    assert rows(env, 1, env.third) == [(u, "on the new node")]


def test_run_retries_through_a_fenced_pause(env):
    from notes.models import Note

    u = users_on(env, "pg1", 1, "paused")[0]
    env.pg.exec(0, env.db, "INSERT INTO app.frozen VALUES (true)")
    out = {}

    def write():
        out["note"] = env.svdj.run(u, lambda: Note.objects.create(bkey=env.router.key(u), uid=u, id=9, body="paused"))

    t = threading.Thread(target=write)
    t.start()
    # The old owner was frozen before the first attempt, so every attempt
    # until the flip is refused; without retries run() would raise.
    threading.Event().wait(0.3)  # deliberate: a pause of some length
    # The flip: the map names the new owner (bucket 0 to pg2), the old owner stays frozen.
    v = env.router.map_version + 1
    specs = env.specs + [("pg3", env.pg.dsn(1, env.third), f"file:{env.pg.password_file}")]
    env.router.update(RoutingTable(map_doc(specs, [1, 2], level=1, version=v)))
    t.join(10)
    env.pg.exec(0, env.db, "DELETE FROM app.frozen")
    assert out["note"].body == "paused"
    assert (u, "paused") in rows(env, 1) and (u, "paused") not in rows(env, 0)


def test_run_retries_what_the_pooler_found_no_server_for(env):
    """PgBouncer's no-server errors reached no server: run() retries them
    as shardvisor.db's does; its error after a query was sent ("server
    conn crashed?") is raised. The server raises the same code and
    message here, as PgBouncer sends them."""
    from notes.models import Note

    env.pg.exec(0, env.db, "CREATE OR REPLACE FUNCTION public.fail_08p01(m text) RETURNS boolean LANGUAGE plpgsql "
                           "AS $$ BEGIN RAISE EXCEPTION USING ERRCODE = '08P01', MESSAGE = m; END $$")
    u, v = users_on(env, "pg1", 2, "poolerless")
    calls = []

    def fn_for(uid, message):
        def fn():
            calls.append(uid)
            if len(calls) == 1:
                list(Note.objects.raw("SELECT * FROM app.notes WHERE public.fail_08p01(%s)", [message]))
            return Note.objects.create(bkey=env.router.key(uid), uid=uid, id=5, body="after")
        return fn

    assert env.svdj.run(u, fn_for(u, "query_wait_timeout")).body == "after"
    assert calls == [u, u] and (u, "after") in rows(env, 0)
    calls.clear()
    with pytest.raises(Exception) as e:
        env.svdj.run(v, fn_for(v, "server conn crashed?"))
    assert "server conn crashed?" in str(e.value) and calls == [v]
    assert all(r[0] != v for r in rows(env, 0))


def test_a_row_is_saved_and_deleted_where_it_was_read(env):
    from notes.models import Note

    a = users_on(env, "pg1", 1, "keep")[0]
    b = users_on(env, "pg2", 1, "other")[0]
    with env.svdj.for_user(a):
        Note.objects.create(bkey=env.router.key(a), uid=a, id=11, body="v1")
        n = Note.objects.get(uid=a, id=11)
    with env.svdj.for_user(b):  # another user's request holds the row
        n.body = "v2"
        n.save()
    assert (a, "v2") in rows(env, 0) and all(r[0] != a for r in rows(env, 1))
    n.delete()  # no current user at all: the row knows its node
    assert all(r[0] != a for r in rows(env, 0))


def test_run_refuses_a_swallowed_error(env):
    from django.db import DatabaseError
    from notes.models import Note

    u = users_on(env, "pg1", 1, "swallow")[0]

    def fn():
        Note.objects.create(bkey=env.router.key(u), uid=u, id=1, body="first")
        try:
            Note.objects.create(bkey=env.router.key(u), uid=u, id=1, body="duplicate")
        except DatabaseError:
            pass  # the transaction is now marked for rollback

    with pytest.raises(Exception) as e:
        env.svdj.run(u, fn)
    assert "marked for rollback" in str(e.value) and type(e.value).__name__ == "TransactionAborted"
    assert all(r[0] != u for r in rows(env, 0))


def test_run_keeps_fn_on_the_node_it_started_on(env):
    """The map flips while fn runs: fn's later queries stay in its
    transaction on the first node (the fence, not the map, decides)."""
    from notes.models import Note

    u = users_on(env, "pg1", 1, "pin")[0]
    before = env.router.table

    def fn():
        Note.objects.create(bkey=env.router.key(u), uid=u, id=1, body="part 1")
        specs = env.specs + [("pg3", env.pg.dsn(1, env.third), f"file:{env.pg.password_file}")]
        env.router.update(RoutingTable(map_doc(specs, [1, 2], level=1, version=env.router.map_version + 1)))
        Note.objects.create(bkey=env.router.key(u), uid=u, id=2, body="part 2")

    env.svdj.run(u, fn)
    assert {r for r in rows(env, 0) if r[0] == u} == {(u, "part 1"), (u, "part 2")}
    assert all(r[0] != u for r in rows(env, 1))
    # Later queries follow the new map.
    with env.svdj.for_user(u):
        assert env.router.node_for(u) == "pg2" and before.node_for(u) == "pg1"
