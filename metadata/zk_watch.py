"""A re-arming ZooKeeper watch (ZooKeeper's own watches fire once).

:meth:`metadata.zk.ZkClient.watch_data` and ``watch_children`` build one: it reads the
znode with a one-shot watch, delivers the snapshot into the event loop, and reads (and
re-arms) again on every event -- also after reconnecting from a lost session, whose
watches ZooKeeper forgets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, Protocol, TypeVar

from foundation.errors import BooklineError, ClosedError, MetadataError, SessionSuspendedError
from metadata.zk_boundary import SessionState

log = logging.getLogger(__name__)

__all__ = ["Watch"]

T = TypeVar("T")


class _Session(Protocol):
    """What a watch needs of the ZooKeeper client (:class:`metadata.zk.ZkClient`)."""

    def add_state_listener(self, listener: Callable[[SessionState], None]) -> None: ...

    def remove_state_listener(self, listener: Callable[[SessionState], None]) -> None: ...

    def call_in_loop(self, fn: Callable[..., object], *args: object) -> None: ...


class Watch(Generic[T]):
    """A re-arming ZooKeeper watch delivering the latest snapshot into the loop.

    Deliver to ``callback`` (called in the loop), or iterate ``async for snap in watch``:
    iteration yields the newest snapshot since the last one taken (intermediate ones are
    coalesced, which bounds memory). Re-reads after reconnecting from a lost session,
    whose watches ZooKeeper forgets.
    """

    def __init__(
        self,
        client: _Session,
        read: Callable[[Callable[[Any], None]], Any],
        callback: Callable[[T], None] | None,
    ) -> None:
        self._client = client
        self._read = read
        self._callback = callback
        self._cancelled = False
        self._rearm_pending = False
        self._latest: T | None = None
        self._has_new = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._lost_before = False
        self._unarmed = False  # a re-read failed while disconnected

    async def start(self) -> T:
        """Arm the watch; return (and deliver) the first snapshot."""
        self._client.add_state_listener(self._on_state)
        snapshot: T = await self._read(self._on_zk_event)
        self._deliver(snapshot)
        return snapshot

    def cancel(self) -> None:
        self._cancelled = True
        self._client.remove_state_listener(self._on_state)
        if self._task is not None:
            self._task.cancel()
        self._has_new.set()  # wake iterators so they can stop

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def _on_zk_event(self, _event: Any) -> None:
        # kazoo's callback thread.
        self._client.call_in_loop(self._schedule_rearm)

    def _on_state(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            self._lost_before = True
        elif state is SessionState.CONNECTED and (self._lost_before or self._unarmed):
            self._lost_before = self._unarmed = False
            self._schedule_rearm()

    def _schedule_rearm(self) -> None:
        if self._cancelled or self._rearm_pending:
            return
        self._rearm_pending = True
        self._task = asyncio.get_running_loop().create_task(self._rearm())

    async def _rearm(self) -> None:
        self._rearm_pending = False
        try:
            snapshot: T = await self._read(self._on_zk_event)
        except (SessionSuspendedError, MetadataError) as exc:
            # The read failed, so no watch is registered: re-read on the next CONNECTED.
            self._unarmed = True
            log.warning("watch re-read failed, will retry on reconnect: %s", exc)
            return
        except ClosedError:
            self.cancel()
            return
        except BooklineError as exc:
            self._error = exc
            self._has_new.set()
            log.error("watch stopped: %s", exc)
            return
        self._deliver(snapshot)

    def _deliver(self, snapshot: T) -> None:
        if self._cancelled:
            return
        self._latest = snapshot
        self._has_new.set()
        if self._callback is not None:
            try:
                self._callback(snapshot)
            except Exception:
                log.exception("watch callback %r failed", self._callback)

    def __aiter__(self) -> AsyncIterator[T]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[T]:
        while True:
            await self._has_new.wait()
            self._has_new.clear()
            if self._error is not None:
                raise self._error
            if self._cancelled:
                return
            yield self._latest  # type: ignore[misc]  # set before _has_new
