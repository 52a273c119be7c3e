"""Explicit LAC: a writer tells the bookies its LastAddConfirmed without a later entry.

A LAC normally rides on the next entry, so a tailing reader sees an entry one add
later. :meth:`LacPusher.push` sends the current LAC to every bookie of the current
ensemble now (WRITE_LAC), so readers see an entry about one add round trip after it was
confirmed. At most one push per bookie is in flight; a push that returns to a LAC that
moved on sends again, so under load the pushes coalesce. Bookies without the op are
skipped (their LAC still rides on entries). Failures are only logged: a LAC is a hint,
and the adds report fencing and dead bookies.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Sequence

from foundation.errors import BooklineError
from ledger.interfaces import BookieTransport
from metadata.ledger_metadata import NO_ENTRY

log = logging.getLogger(__name__)

__all__ = ["LacPusher"]


class LacPusher:
    """The explicit-LAC state of one writer: per bookie, the LAC it acknowledged, the
    LAC of the push in flight, and bookies too old to serve the op."""

    def __init__(
        self,
        transport: BookieTransport,
        ledger_id: int,
        master_key: bytes,
        *,
        timeout_s: float,
        current_lac: Callable[[], int],
        repush: Callable[[], None],
        tasks: set[asyncio.Future[None]],
    ) -> None:
        self._transport = transport
        self._ledger_id = ledger_id
        self._master_key = master_key
        self._timeout_s = timeout_s
        # The writer's LAC now, and its push_lac (called when a push returns outdated).
        self._current_lac = current_lac
        self._repush = repush
        self._tasks = tasks  # the writer's tasks: cancelled when it fails or closes
        self._told: dict[str, int] = {}
        self._pushing: dict[str, int] = {}
        self._unserved: set[str] = set()

    def told(self, ensemble: Sequence[str]) -> int:
        """The LAC every bookie of ``ensemble`` acknowledged (NO_ENTRY when one has not,
        or cannot)."""
        told = self._told
        return min(told.get(b, NO_ENTRY) for b in ensemble)

    def sent(self, ensemble: Sequence[str]) -> int:
        """:meth:`told`, counting pushes still in flight as told."""
        told, pushing = self._told, self._pushing
        return min(max(told.get(b, NO_ENTRY), pushing.get(b, NO_ENTRY)) for b in ensemble)

    def carried(self, bookie: str, lac: int) -> None:
        """An add carrying ``lac`` is being sent to ``bookie``: bookies take the LAC an
        add carries as an explicit LAC on receipt, so no push is needed for it."""
        if lac > self._told.get(bookie, NO_ENTRY):
            self._told[bookie] = lac

    def push(self, lac: int, ensemble: Sequence[str], skip: Collection[str]) -> None:
        """Send ``lac`` to every bookie of ``ensemble`` not yet told it (bookies in
        ``skip``, e.g. failed ones, are left out)."""
        for bookie in ensemble:
            if (
                bookie in self._pushing
                or bookie in self._unserved
                or bookie in skip
                or self._told.get(bookie, NO_ENTRY) >= lac
            ):
                continue
            self._pushing[bookie] = lac
            task = asyncio.ensure_future(self._push_to(bookie, lac))
            self._tasks.add(task)
            task.add_done_callback(self._push_done)

    def _push_done(self, task: asyncio.Future[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # _push_to handles operating errors: this is a bug, but a LAC is a hint.
            log.error("ledger %d: explicit LAC push raised %r", self._ledger_id, exc)

    async def _push_to(self, bookie: str, lac: int) -> None:
        try:
            served = await self._transport.write_lac(
                bookie, self._ledger_id, lac, self._master_key, timeout_s=self._timeout_s
            )
        except BooklineError as exc:
            log.debug(
                "ledger %d: explicit LAC %d to %s failed: %s", self._ledger_id, lac, bookie, exc
            )
            return
        finally:
            self._pushing.pop(bookie, None)
        if not served:
            self._unserved.add(bookie)
            return
        if lac > self._told.get(bookie, NO_ENTRY):
            self._told[bookie] = lac
        if self._current_lac() > lac:
            self._repush()
