"""What crosses the kazoo boundary: session states, znode stats, and kazoo's exceptions
translated into Bookline's error hierarchy (``__cause__`` keeps the kazoo original).

The session state the rest of the code sees: CONNECTED, SUSPENDED ("stop acting as
owner until reconnected") and LOST ("the session and its ephemeral nodes are gone").
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from dataclasses import dataclass

from kazoo import exceptions as kex
from kazoo.client import KazooState
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import ZnodeStat

from foundation.errors import (
    AlreadyExistsError,
    BadRequestError,
    BadVersionError,
    BooklineError,
    ClosedError,
    ForbiddenError,
    MetadataError,
    NotFoundError,
    SessionSuspendedError,
)

__all__ = ["FROM_KAZOO", "SessionState", "Stat", "translate", "translating"]


class SessionState(enum.Enum):
    """What the ZooKeeper session means to whoever acts on it."""

    CONNECTED = "CONNECTED"
    SUSPENDED = "SUSPENDED"  # connection lost, session may survive: stop acting as owner
    LOST = "LOST"  # session expired or closed: its ephemeral nodes are gone


FROM_KAZOO = {
    KazooState.CONNECTED: SessionState.CONNECTED,
    KazooState.SUSPENDED: SessionState.SUSPENDED,
    KazooState.LOST: SessionState.LOST,
}


@dataclass(frozen=True, slots=True)
class Stat:
    """The parts of a znode's stat Bookline uses."""

    version: int  # data version, the compare-and-set token
    cversion: int  # children version
    ephemeral_owner: int  # session id owning an ephemeral node, 0 for persistent ones
    num_children: int
    ctime_ms: int
    mtime_ms: int

    @classmethod
    def from_kazoo(cls, stat: ZnodeStat) -> Stat:
        return cls(
            version=stat.version,
            cversion=stat.cversion,
            ephemeral_owner=stat.ephemeralOwner,
            num_children=stat.numChildren,
            ctime_ms=stat.ctime,
            mtime_ms=stat.mtime,
        )


def translate(exc: BaseException, path: str = "") -> BooklineError:
    """Map a kazoo exception to the Bookline error that says who failed."""
    where = f" at {path}" if path else ""
    if isinstance(exc, BooklineError):
        return exc
    if isinstance(exc, kex.NoNodeError):
        err: BooklineError = NotFoundError(f"znode{where} does not exist")
    elif isinstance(exc, kex.NodeExistsError):
        err = AlreadyExistsError(f"znode{where} already exists")
    elif isinstance(exc, kex.BadVersionError):
        err = BadVersionError(f"znode{where} changed since it was read (stale version)")
    elif isinstance(exc, kex.NotEmptyError):
        err = BadRequestError(f"znode{where} still has children")
    elif isinstance(exc, kex.ConnectionClosedError | kex.ZookeeperStoppedError):
        err = ClosedError(f"the ZooKeeper client was closed{where}")
    elif isinstance(exc, kex.NoAuthError | kex.AuthFailedError):
        err = ForbiddenError(
            f"ZooKeeper refused{where}: the znode's ACL does not admit this session "
            "(metadata.digest_file)"
        )
    elif isinstance(exc, kex.SessionExpiredError):
        err = MetadataError(f"ZooKeeper session expired{where}")
    elif isinstance(exc, kex.ConnectionLoss | kex.OperationTimeoutError | KazooTimeoutError):
        err = SessionSuspendedError(f"connection to ZooKeeper lost{where}; outcome unknown")
    else:
        err = MetadataError(f"ZooKeeper failed{where}: {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err


@contextlib.contextmanager
def translating(path: str = "") -> Iterator[None]:
    """Translate kazoo exceptions raised inside the block (for synchronous kazoo calls)."""
    try:
        yield
    except (kex.KazooException, KazooTimeoutError) as exc:
        raise translate(exc, path) from exc
