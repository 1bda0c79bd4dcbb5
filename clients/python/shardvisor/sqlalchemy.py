"""SQLAlchemy: choosers for sqlalchemy.ext.horizontal_shard.ShardedSession,
with one shard per db node (the shard id is the node id).

    from sqlalchemy.ext.horizontal_shard import ShardedSession
    import shardvisor, shardvisor.sqlalchemy as svsa

    router = shardvisor.Router.from_env()
    ch = svsa.Choosers(router, uid_attr="uid")          # the mapped attribute holding the user id
    session = ShardedSession(shards=svsa.engines(router), **ch.session_kwargs())

How each chooser decides:

- shard_chooser(mapper, instance, clause): a new or changed row goes to the
  node of its user id attribute; without one, the current user's
  (shardvisor.for_user).
- id_chooser(query, ident) (1.4; identity_chooser in 2.0): a get() by
  primary key goes to the node of the user id when the key holds it, else
  the current user's, else every node that owns buckets.
- query_chooser(query) (1.4's older name) and execute_chooser(context) (1.4
  and 2.0): a query whose WHERE says uid == X (or uid IN (...)) goes to
  those users' nodes; else the current user's; else every owning node (a
  scatter query, results concatenated). After its first scatter query a
  session holds every object it loads until its transaction ends (see
  _hold_loaded_objects): without that, rows of a scatter query can go
  missing.

session_kwargs() names the right ones for the installed version: 1.4 takes
shard_chooser, id_chooser and execute_chooser (query_chooser still works,
deprecated); 2.0 takes shard_chooser, identity_chooser and execute_chooser.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import sqlalchemy
from sqlalchemy import create_engine, event
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import BinaryExpression, BooleanClauseList, Grouping

from . import db as _db
from .context import current_user
from .routing import Router

SQLALCHEMY_2 = int(sqlalchemy.__version__.split(".")[0]) >= 2


def engines(router: Router, driver: str = "psycopg2", direct: bool = False,
            **engine_kw) -> Dict[str, "sqlalchemy.engine.Engine"]:
    """An Engine per node of the map that is not removed, keyed by node id.
    Connections are made with the node's libpq keywords (a Patroni group's
    multi-host DSN included, which SQLAlchemy's URL parser cannot read), on
    its application path: its pool_dsn when it has one (a PgBouncer in
    transaction mode; psycopg 3 then connects with prepare_threshold=None),
    else its dsn. direct=True: on its dsn, for session state."""
    out = {}
    for n in router.nodes.values():
        if n.state == "removed":
            continue

        def creator(node=n):
            return connect(node, driver, direct)

        url = "postgresql+psycopg://" if driver == "psycopg" else "postgresql+psycopg2://"
        out[n.id] = create_engine(url, creator=creator, **engine_kw)
    return out


def connect(node, driver: str = "psycopg2", direct: bool = False):
    """A DB-API connection to one node, as engines()' creator makes it:
    connection_kwargs(node, direct, driver), so psycopg 3 through a pooler
    gets prepare_threshold=None."""
    kw = _db.connection_kwargs(node, direct=direct, driver=driver)
    if driver == "psycopg":
        import psycopg

        return psycopg.connect(**kw)
    import psycopg2

    return psycopg2.connect(**kw)


_HOLD = "shardvisor.sqlalchemy.loaded"


def _hold_loaded_objects(session) -> None:
    """Keeps every object the session loads alive until its outermost
    transaction ends. The legacy Query uniques ORM rows by id(), and a
    scatter query's results arrive one node at a time: an object of the
    first node that the caller let go can be collected and its id reused
    by an object of the next node, which is then dropped as a duplicate.
    Rows went missing under load (SQLAlchemy 1.4's horizontal_shard)."""
    if _HOLD in session.info:
        return
    session.info[_HOLD] = []

    def loaded(sess, instance):
        sess.info[_HOLD].append(instance)

    def ended(sess, transaction):
        if transaction.parent is None:
            sess.info[_HOLD] = []

    event.listen(session, "loaded_as_persistent", loaded)
    event.listen(session, "after_transaction_end", ended)


class Choosers:
    def __init__(self, router: Router, uid_attr: str = "uid"):
        self.router = router
        self.uid_attr = uid_attr

    def _all(self) -> List[str]:
        return self.router.table.owning_nodes()

    def _current(self) -> Optional[List[str]]:
        uid = current_user()
        return None if uid is None else [self.router.node_for(uid)]

    def shard_chooser(self, mapper, instance, clause=None, **kw) -> str:
        uid = getattr(instance, self.uid_attr, None) if instance is not None else None
        if uid is None:
            uid = current_user()
        if uid is None:
            what = mapper.class_.__name__ if mapper is not None else "a statement"
            raise LookupError(f"shardvisor.sqlalchemy: {what} has no {self.uid_attr} and there is no current user "
                              "(shardvisor.for_user): cannot choose its node")
        return self.router.node_for(str(uid))

    def _ident_nodes(self, mapper, ident) -> List[str]:
        if mapper is not None:
            for col, val in zip(mapper.primary_key, ident):
                if col.key == self.uid_attr and val is not None:
                    return [self.router.node_for(str(val))]
        return self._current() or self._all()

    def id_chooser(self, query, ident) -> List[str]:
        """1.4: (query, ident) -> the nodes to look in, in order."""
        mapper = query._only_full_mapper_zero("id_chooser") if hasattr(query, "_only_full_mapper_zero") else None
        return self._ident_nodes(mapper, ident)

    def identity_chooser(self, mapper, primary_key, **kw) -> List[str]:
        """2.0's name and signature for id_chooser."""
        return self._ident_nodes(mapper, primary_key)

    def _statement_nodes(self, statement, params=None) -> List[str]:
        uids = self._uids_in(statement, params or {})
        if uids:
            return sorted({self.router.node_for(u) for u in uids})
        return self._current() or self._all()

    def query_chooser(self, query) -> List[str]:
        """1.4's older name: (query) -> the nodes to run it on."""
        return self._statement_nodes(getattr(query, "statement", query))

    def execute_chooser(self, context) -> List[str]:
        """1.4 and 2.0: (ORMExecuteState) -> the nodes to run it on."""
        params = context.parameters if isinstance(getattr(context, "parameters", None), dict) else {}
        nodes = self._statement_nodes(context.statement, params)
        if len(nodes) > 1 and getattr(context, "session", None) is not None:
            _hold_loaded_objects(context.session)
        return nodes

    def _uids_in(self, statement, params: dict) -> List[str]:
        """The user ids the WHERE clause pins: uid == X or uid IN (...), as
        the clause itself or as a term of its top-level AND. Under an OR or
        a NOT a comparison pins nothing (uid == X OR public matches rows of
        every node). The value of a parameter bound at execution (a get()
        by primary key) comes from params."""
        where = getattr(statement, "whereclause", None)
        return (self._pins(where, params) or []) if where is not None else []

    def _pins(self, c, params: dict) -> Optional[List[str]]:
        if isinstance(c, Grouping):
            return self._pins(c.element, params)
        if isinstance(c, BooleanClauseList):
            if c.operator is not operators.and_:
                return None
            for term in c.clauses:
                got = self._pins(term, params)
                if got is not None:
                    return got  # rows must match this term: its users' nodes hold them all
            return None
        if not isinstance(c, BinaryExpression):
            return None
        col, val = c.left, c.right
        if getattr(col, "key", None) != self.uid_attr:
            col, val = c.right, c.left
        if getattr(col, "key", None) != self.uid_attr or not hasattr(val, "effective_value"):
            return None
        v = val.effective_value
        if v is None and getattr(val, "key", None) in params:
            v = params[val.key]
        if v is None:
            return None
        if c.operator is operators.eq:
            return [str(v)]
        if c.operator is operators.in_op:
            return [str(x) for x in v]
        return None

    def session_kwargs(self) -> dict:
        """The chooser keyword arguments ShardedSession takes in the
        installed SQLAlchemy."""
        if SQLALCHEMY_2:
            return {"shard_chooser": self.shard_chooser, "identity_chooser": self.identity_chooser,
                    "execute_chooser": self.execute_chooser}
        return {"shard_chooser": self.shard_chooser, "id_chooser": self.id_chooser,
                "execute_chooser": self.execute_chooser}
