"""Keep the bookie registered in ZooKeeper, also across session expiry.

The registration is an ephemeral node, so it vanishes with an expired session while the
bookie itself keeps serving. :class:`Registration` listens to the session state: after
a LOST session, once a new session is CONNECTED it registers again -- writable or
read-only, whatever the bookie is *now* -- retrying until it succeeds or the bookie
stops. Read-only flips go through :meth:`set_read_only`, which the server calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from foundation.errors import BooklineError
from metadata.bookies import READONLY, BookieInfo
from metadata.client import MetadataClient
from metadata.zk import SessionState

log = logging.getLogger(__name__)

__all__ = ["Registration"]

# Pause between re-registration attempts while ZooKeeper is unreachable or slow.
RETRY_S: Final = 0.5

# Called with the state now registered (True = read-only), after a re-registration.
OnRegistered = Callable[[bool], None]


class Registration:
    """Re-registers after session loss. ``start()`` after the first registration;
    ``stop()`` before deregistering on shutdown."""

    def __init__(
        self,
        md: MetadataClient,
        current_info: Callable[[], BookieInfo],
        on_registered: OnRegistered,
        *,
        register: Callable[[BookieInfo], Awaitable[None]] | None = None,
    ) -> None:
        self._md = md
        self._current_info = current_info
        self._on_registered = on_registered
        self._register = register or md.bookies.register
        self._lost = False
        self._losses = 0  # sessions lost so far: a loss during an attempt voids it
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self.registrations = 0  # re-registrations done (tests, logs)

    def start(self) -> None:
        self._md.zk.add_state_listener(self._on_state)

    async def stop(self) -> None:
        self._stopped = True
        self._md.zk.remove_state_listener(self._on_state)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _on_state(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            if not self._lost:
                log.warning("ZooKeeper session lost: the bookie registration is gone")
            self._lost = True
            self._losses += 1
        elif (
            state is SessionState.CONNECTED
            and self._lost
            and not self._stopped
            and (self._task is None or self._task.done())
        ):
            self._task = asyncio.get_running_loop().create_task(
                self._reregister(), name="bookie-reregister"
            )

    async def _reregister(self) -> None:
        while not self._stopped:
            losses = self._losses
            info = self._current_info()
            try:
                await self._register(info)
            except BooklineError as exc:
                log.warning("bookie %s: re-registration failed (retrying): %s", info.bookie_id, exc)
                await asyncio.sleep(RETRY_S)
                continue
            if self._losses != losses:
                continue  # that session died meanwhile: register in the next one
            self._lost = False
            self.registrations += 1
            log.info(
                "bookie %s registered again as %s after session loss", info.bookie_id, info.state
            )
            self._on_registered(info.state == READONLY)
            return
