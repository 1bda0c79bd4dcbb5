"""shardvisor.sqlalchemy: ShardedSession choosers on Debian's SQLAlchemy
1.4, with a real database per node."""

import os

import pytest

from conftest import REPO, map_doc
from shardvisor import Router, for_user

sa = pytest.importorskip("sqlalchemy")
from sqlalchemy import BigInteger, Column, Text  # noqa: E402
from sqlalchemy.ext.horizontal_shard import ShardedSession  # noqa: E402
from sqlalchemy.orm import declarative_base  # noqa: E402

import shardvisor.sqlalchemy as svsa  # noqa: E402

Base = declarative_base()


class Note(Base):
    __tablename__ = "notes"
    __table_args__ = {"schema": "app"}
    bkey = Column(BigInteger, primary_key=True)
    uid = Column(Text, primary_key=True)
    id = Column(BigInteger, primary_key=True)
    body = Column(Text, nullable=False)


@pytest.fixture(scope="module")
def env(pg, node_dbs):
    schema = open(os.path.join(REPO, "examples", "notes", "schema", "001-notes.sql")).read()
    for i in (0, 1):
        pg.exec(i, node_dbs, schema)
    pw = f"file:{pg.password_file}"
    router = Router.from_map(map_doc([("pg1", pg.dsn(0, node_dbs), pw), ("pg2", pg.dsn(1, node_dbs), pw)], [0, 1], level=1))
    engines = svsa.engines(router)
    ch = svsa.Choosers(router, uid_attr="uid")
    sessions = []
    yield pg, node_dbs, router, engines, ch, sessions
    for s in sessions:
        s.close()
    for e in engines.values():
        e.dispose()


def session(env):
    _, _, _, engines, ch, sessions = env
    s = ShardedSession(shards=engines, **ch.session_kwargs())
    sessions.append(s)
    return s


def on_node(env, i):
    pg, db = env[0], env[1]
    return pg.exec(i, db, "SELECT uid FROM app.notes ORDER BY uid")


def test_rows_go_to_their_users_nodes_and_queries_follow(env):
    pg, db, router, _, ch, _ = env
    users = [f"sa{i}" for i in range(12)]
    s = session(env)
    for i, u in enumerate(users):
        s.add(Note(bkey=router.key(u), uid=u, id=i, body=f"note {i}"))
    s.commit()
    want = {0: sorted(u for u in users if router.node_for(u) == "pg1"), 1: sorted(u for u in users if router.node_for(u) == "pg2")}
    assert want[0] and want[1]
    assert [r[0] for r in on_node(env, 0)] == want[0] and [r[0] for r in on_node(env, 1)] == want[1]
    u = want[1][0]
    q = s.query(Note).filter(Note.uid == u)
    assert ch.query_chooser(q) == ["pg2"]
    assert [n.uid for n in q] == [u]
    assert ch.query_chooser(s.query(Note).filter(Note.uid.in_([want[0][0], want[1][0]]))) == ["pg1", "pg2"]
    # By primary key: the uid is part of it.
    i = users.index(u)
    s2 = session(env)
    assert s2.get(Note, (router.key(u), u, i)).body == f"note {i}"
    # Without a uid in the query and no current user: every owning node.
    assert sorted(n.uid for n in session(env).query(Note)) == sorted(users)
    with for_user(u):
        assert ch.query_chooser(session(env).query(Note)) == ["pg2"]


def test_or_and_not_pin_no_node(env):
    from sqlalchemy import and_, not_, or_

    _, _, router, _, ch, _ = env
    s = session(env)
    everywhere = router.table.owning_nodes()
    assert ch.query_chooser(s.query(Note).filter(or_(Note.uid == "a", Note.body == "public"))) == everywhere
    assert ch.query_chooser(s.query(Note).filter(not_(and_(Note.uid == "a", Note.body == "x")))) == everywhere
    assert ch.query_chooser(s.query(Note).filter(Note.uid != "a")) == everywhere
    pinned = ch.query_chooser(s.query(Note).filter(Note.body == "x", or_(Note.id == 1, Note.id == 2), Note.uid == "a"))
    assert pinned == [router.node_for("a")]


def test_a_row_without_user_and_no_current_user_is_refused(env):
    s = session(env)
    s.add(Note(bkey=1, uid=None, id=1, body="x"))
    with pytest.raises(LookupError, match="Note has no uid and there is no current user"):
        s.flush()
    s.rollback()


def test_session_kwargs_name_the_installed_versions_choosers(env):
    ch = env[4]
    kw = ch.session_kwargs()
    if svsa.SQLALCHEMY_2:
        assert set(kw) == {"shard_chooser", "identity_chooser", "execute_chooser"}
    else:
        assert set(kw) == {"shard_chooser", "id_chooser", "execute_chooser"}


def test_a_scatter_query_keeps_every_row_when_objects_are_collected(env):
    """SQLAlchemy's legacy Query uniques ORM rows by id(), and a scatter
    query's results arrive one node at a time: an object of the first node
    that the caller let go could be collected and its id reused by one of
    the next node's, which was then dropped as a duplicate. Rows went
    missing under load; collecting after every row makes it certain."""
    import gc

    _, _, router, _, _, _ = env
    users = [f"gc{i}" for i in range(40)]
    s = session(env)
    for i, u in enumerate(users):
        s.add(Note(bkey=router.key(u), uid=u, id=1000 + i, body="gc"))
    s.commit()
    assert len({router.node_for(u) for u in users}) == 2
    got = []
    for n in session(env).query(Note).filter(Note.body == "gc"):
        got.append(n.uid)
        del n
        gc.collect()
    assert sorted(got) == sorted(users)
