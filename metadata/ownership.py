"""Stream ownership: the exclusive ephemeral lock per stream, and its session semantics.

The lock is ZooKeeper's classic recipe: each contender creates an ephemeral sequential
child ``streams/<ns>/<s>/lock/member-<seq>`` carrying its identity; the lowest sequence
owns the stream, the others watch their predecessor. Because the nodes are ephemeral,
a crashed owner's claim vanishes when its session expires.

Session events reach the holder through :attr:`StreamLock.state` and listeners:

* SUSPENDED — connection lost, the session may still be alive: stop acting as owner
  (no writes) until reconnected and the lock node is confirmed to be ours;
* LOST — the session expired: the lock node is gone and someone else may own the
  stream; :attr:`StreamLock.lost` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable
from typing import Any

from foundation.errors import (
    LockOwnedError,
    NotFoundError,
    OwnershipLostError,
    SessionSuspendedError,
)
from metadata import serde
from metadata.layout import LOCK_PREFIX, Layout
from metadata.zk import SessionState, ZkClient

log = logging.getLogger(__name__)

KIND = "lock"
FORMAT_VERSION = 1
IDENTITY_CHARS_MAX = 1024  # an address or "proxy-id@host:port", not a document


class LockState(enum.Enum):
    UNLOCKED = "UNLOCKED"
    OWNED = "OWNED"
    SUSPENDED = "SUSPENDED"  # stop acting as owner until reconnected
    LOST = "LOST"  # ownership is gone


def _sequence(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


class StreamLock:
    """One contender's handle on one stream's lock. Use from one event loop."""

    def __init__(self, zk: ZkClient, layout: Layout, ns: str, stream: str, identity: str) -> None:
        if not identity or len(identity) > IDENTITY_CHARS_MAX:
            raise ValueError(f"lock identity must be 1..{IDENTITY_CHARS_MAX} characters")
        self._zk = zk
        self._dir = layout.lock(ns, stream)
        self._stream = f"{ns}/{stream}"
        self.identity = identity
        self._node: str | None = None
        self._state = LockState.UNLOCKED
        self._listeners: list[Callable[[LockState], None]] = []
        self.lost = asyncio.Event()
        self._verify_task: asyncio.Task[None] | None = None

    # -- state ---------------------------------------------------------------------

    @property
    def state(self) -> LockState:
        return self._state

    @property
    def node(self) -> str | None:
        return self._node

    def add_listener(self, listener: Callable[[LockState], None]) -> None:
        """Call ``listener(state)`` in the loop whenever the lock state changes."""
        self._listeners.append(listener)

    def check_owner(self) -> None:
        """Raise unless this handle may act as owner right now."""
        if self._state is LockState.SUSPENDED:
            raise SessionSuspendedError(f"lock on {self._stream} suspended: not acting as owner")
        if self._state is not LockState.OWNED:
            raise OwnershipLostError(f"this process does not own {self._stream}")

    def _set_state(self, state: LockState) -> None:
        if state is self._state:
            return
        log.info(
            "lock %s (%s): %s -> %s", self._stream, self.identity, self._state.value, state.value
        )
        self._state = state
        if state is LockState.LOST:
            self.lost.set()
        for listener in list(self._listeners):
            try:
                listener(state)
            except Exception:
                log.exception("lock listener %r failed", listener)

    def _on_session(self, state: SessionState) -> None:
        if self._state not in (LockState.OWNED, LockState.SUSPENDED):
            return
        if state is SessionState.SUSPENDED:
            self._set_state(LockState.SUSPENDED)
        elif state is SessionState.LOST:
            self._node = None
            self._zk.remove_state_listener(self._on_session)
            self._set_state(LockState.LOST)
        elif self._state is LockState.SUSPENDED:
            self._verify_task = asyncio.get_running_loop().create_task(self._verify())

    async def _verify(self) -> None:
        """After a reconnect: still ours only if our node exists in our session."""
        node = self._node
        try:
            stat = None if node is None else await self._zk.exists(node)
        except SessionSuspendedError:
            return  # disconnected again; the next CONNECTED verifies again
        if self._state is not LockState.SUSPENDED:
            return
        if stat is not None and stat.ephemeral_owner == self._zk.session_id:
            self._set_state(LockState.OWNED)
        else:
            self._node = None
            self._set_state(LockState.LOST)

    # -- acquiring -----------------------------------------------------------------

    async def _enter(self) -> str:
        if self._state in (LockState.OWNED, LockState.SUSPENDED):
            raise LockOwnedError(f"this handle already holds {self._stream}", owner=self.identity)
        self.lost.clear()
        data = serde.encode(
            KIND, FORMAT_VERSION, {"identity": self.identity, "ctime_ms": int(time.time() * 1000)}
        )
        node = await self._zk.create(
            f"{self._dir}/{LOCK_PREFIX}", data, ephemeral=True, sequence=True
        )
        self._node = node
        return node.rsplit("/", 1)[1]

    def _won(self) -> None:
        self._zk.add_state_listener(self._on_session)
        self._set_state(LockState.OWNED)

    async def _contenders(self) -> list[str]:
        names = await self._zk.get_children(self._dir)
        return sorted((n for n in names if n.startswith(LOCK_PREFIX)), key=_sequence)

    async def try_acquire(self) -> None:
        """Own the stream now, or raise LockOwnedError(owner=<holder identity>)."""
        name = await self._enter()
        won = False
        try:
            holders = await self._contenders()
            if holders and holders[0] == name:
                won = True
                self._won()
                return
            holder = await self.owner()
            raise LockOwnedError(f"{self._stream} is owned by {holder}", owner=holder)
        finally:
            if not won:
                await self._abandon()

    async def acquire(self, timeout_s: float | None = None) -> None:
        """Wait until we own the stream; LockOwnedError naming the holder on timeout."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        name = await self._enter()
        won = False
        try:
            while True:
                holders = await self._contenders()
                if name not in holders:
                    raise OwnershipLostError(f"lock node for {self._stream} vanished while waiting")
                index = holders.index(name)
                if index == 0:
                    won = True
                    self._won()
                    return
                gone = asyncio.Event()
                predecessor = f"{self._dir}/{holders[index - 1]}"

                def watcher(_event: Any, gone: asyncio.Event = gone) -> None:
                    self._zk.call_in_loop(gone.set)

                if await self._zk.exists(predecessor, watch=watcher) is None:
                    continue
                remaining = None if deadline is None else deadline - loop.time()
                try:
                    await asyncio.wait_for(gone.wait(), remaining)
                except TimeoutError:
                    holder = await self.owner()
                    raise LockOwnedError(
                        f"{self._stream} still owned by {holder} after {timeout_s} s",
                        owner=holder,
                    ) from None
        finally:
            if not won:
                await self._abandon()

    async def _abandon(self) -> None:
        node, self._node = self._node, None
        if node is not None:
            with contextlib.suppress(NotFoundError):  # gone with the session already
                await self._zk.delete(node)

    async def owner(self) -> str | None:
        """Identity of the current holder, or None if nobody holds the lock."""
        for name in await self._contenders():
            path = f"{self._dir}/{name}"
            try:
                data, _version = await self._zk.get(path)
            except NotFoundError:
                continue  # that contender just left; the next in line is the holder
            identity: str = serde.field(
                serde.decode(data, KIND, FORMAT_VERSION, path)[1], "identity", str, path
            )
            return identity
        return None

    async def release(self) -> None:
        """Give up ownership (a no-op when not held)."""
        self._zk.remove_state_listener(self._on_session)
        if self._verify_task is not None:
            self._verify_task.cancel()
        was_held = self._state in (LockState.OWNED, LockState.SUSPENDED)
        await self._abandon()
        if was_held:
            self._set_state(LockState.UNLOCKED)
