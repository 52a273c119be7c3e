"""A tailing reader's long polls, kept from one wait for the LAC to the next (issue 26).

A tail waits for the LAC, hands out the entries the answer brought, and waits again.
Asking afresh each time left no poll parked at the bookies while the reader handed the
entries out and its next request travelled: at 1,000 records/s about half the entries
were confirmed in that gap and reached the reader only after its next request arrived
(an answer's transit plus a request's, about 0.7 ms p50, on every such entry).

So the poll whose answer moved the LAC is asked again at once, from the answer's
callback, with the new LAC -- it is parked at its bookie again while the caller is
still busy -- and a poll still waiting when another answered first is not dropped but
kept for the next wait (its answer, whenever it comes, moves the LAC too). Only a wait
re-arms: a poll answered while nobody waits is taken in and not asked again, so a
reader that stops tailing leaves at most one poll per bookie behind, which the bookie
answers within its long-poll timeout.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable

from foundation.errors import BooklineError
from ledger.interfaces import LacAnswer

log = logging.getLogger(__name__)

__all__ = ["LongPolls"]

# ask(bookie, previous_lac): a READ_LAC long poll sent now.
Ask = Callable[[str, int], "asyncio.Future[LacAnswer]"]


class _Wait:
    """One :meth:`LongPolls.wait`: the LAC it waits past, the bookies it asked, those
    that ended without news (expired or failed) and ``wake``, resolved when it should
    look again (the LAC moved, a poll ended)."""

    __slots__ = ("asked", "ended", "errors", "previous", "source", "started", "wake")

    def __init__(self, previous: int, started: float) -> None:
        self.previous = previous
        self.started = started
        self.asked: set[str] = set()
        self.ended: set[str] = set()
        self.errors: list[BooklineError] = []
        self.source: str | None = None  # the bookie whose answer moved the LAC
        self.wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def poke(self) -> None:
        if not self.wake.done():
            self.wake.set_result(None)


class LongPolls:
    """The outstanding READ_LAC long polls of one ledger reader, at most one per bookie.
    ``answered(ans)`` takes an answer in (its entries, its LAC); ``lac()`` is the
    reader's LAC after it."""

    def __init__(
        self,
        ask: Ask,
        answered: Callable[[LacAnswer], None],
        lac: Callable[[], int],
        clock: Callable[[], float],
    ) -> None:
        self._ask = ask
        self._answered = answered
        self._lac = lac
        self._clock = clock
        # bookie -> (the LAC it was asked past, when it was sent, the answer)
        self._polls: dict[str, tuple[int, float, asyncio.Future[LacAnswer]]] = {}
        self._wait: _Wait | None = None

    async def wait(
        self, previous: int, first: Iterable[str], later: list[str], speculate_s: float
    ) -> str | None:
        """Until the LAC passes ``previous``: the bookie whose answer moved it. Asks
        ``first`` (a poll still waiting there from before counts), and ``later`` too
        once they stay silent for ``speculate_s`` or one fails. None when every asked
        bookie answered without news (its long poll expired); the first error when
        every one failed."""
        w = self._wait = _Wait(previous, self._clock())
        try:
            for bookie in first:
                self._ask_for(w, bookie)
            while w.source is None:
                if w.asked and w.ended >= w.asked:
                    if len(w.errors) == len(w.asked):
                        raise w.errors[0]
                    return None
                if w.wake.done():
                    w.wake.result()  # a bug's exception, from an answer's callback
                    w.wake = asyncio.get_running_loop().create_future()
                done, _ = await asyncio.wait((w.wake,), timeout=speculate_s if later else None)
                if later and (not done or w.errors):  # silent or failed: ask the others
                    for bookie in later:
                        self._ask_for(w, bookie)
                    later = []
            return w.source
        finally:
            self._wait = None

    def _ask_for(self, w: _Wait, bookie: str) -> None:
        w.asked.add(bookie)
        if bookie not in self._polls:
            self._send(bookie, w.previous)

    def _send(self, bookie: str, previous: int) -> None:
        fut = self._ask(bookie, previous)
        self._polls[bookie] = (previous, self._clock(), fut)
        fut.add_done_callback(functools.partial(self._done, bookie, previous))

    def _done(self, bookie: str, previous: int, fut: asyncio.Future[LacAnswer]) -> None:
        sent_at = 0.0
        mine = self._polls.get(bookie)
        if mine is not None and mine[2] is fut:
            sent_at = mine[1]
            del self._polls[bookie]
        w = self._wait
        if fut.cancelled():
            if w is not None and bookie in w.asked:
                w.ended.add(bookie)
                w.poke()
            return
        exc = fut.exception()
        if exc is not None:
            if not isinstance(exc, BooklineError):
                # Not an operating error: a bug; the wait raises it, else it is logged.
                if w is not None and not w.wake.done():
                    w.wake.set_exception(exc)
                else:
                    log.error("long poll of %s raised %r", bookie, exc)
                return
            if w is not None and bookie in w.asked:
                w.errors.append(exc)
                w.ended.add(bookie)
                w.poke()
            return
        self._answered(fut.result())
        if w is None or w.source is not None:
            return  # nobody waits: taken in, not asked again
        lac = self._lac()
        if lac > w.previous:
            w.source = bookie
            w.poke()
            # Parked again while the caller hands the entries out (pipelined).
            self._send(bookie, lac)
        elif bookie not in w.asked:
            return  # a poll kept from before, at a bookie this wait does not ask
        elif previous < w.previous or sent_at < w.started:
            self._send(bookie, w.previous)  # kept from an earlier wait: ask this one's
        else:
            w.ended.add(bookie)  # expired without news
            w.poke()
