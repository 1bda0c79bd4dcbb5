"""The user a request acts for, shared by the framework integrations.

    with shardvisor.for_user("alice"):
        Note.objects.create(...)      # Django: on alice's node

A contextvar, so it is per thread and per asyncio task, and a nested
for_user restores the outer user when it ends.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

_user: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("shardvisor_user", default=None)


def current_user() -> Optional[str]:
    """The user id set by for_user or a middleware; None outside one."""
    return _user.get()


@contextlib.contextmanager
def for_user(uid) -> Iterator[str]:
    if uid is None or uid == "":
        raise ValueError("for_user needs a user id")
    token = _user.set(str(uid))
    try:
        yield str(uid)
    finally:
        _user.reset(token)


def set_user(uid: Optional[str]):
    """Sets the current user; returns the token to reset it with."""
    return _user.set(None if uid is None else str(uid))


def reset_user(token) -> None:
    _user.reset(token)
