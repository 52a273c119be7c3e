"""Speculative requests: ask one replica, and ask the next too when it is slow.

Replicas are tried in health order (recently failing last, then by latency). The
first request goes out at once; when no answer came within the speculative timeout, the
next replica is asked as well, the timeout doubling up to a maximum; an error answer
moves on to the next replica immediately. The first *valid* answer wins and the others
are cancelled. A hung replica therefore costs one speculative timeout, not a request
timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from bookline.errors import BooklineError, NoEntryError, NoLedgerError
from ledger.placement import BookieHealth
from ledger.tasks import abandon

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["speculative"]

# Answers that say "not here", not "this bookie is unhealthy".
_ABSENT = (NoEntryError, NoLedgerError)


async def speculative(
    replicas: Sequence[str],
    attempt: Callable[[str], Awaitable[T]],
    *,
    health: BookieHealth,
    clock: Callable[[], float],
    first_timeout_s: float,
    max_timeout_s: float,
    what: str,
) -> T:
    """The first successful ``attempt(replica)``; raise when every replica failed.

    When all replicas said NO_ENTRY/NO_LEDGER the error is :class:`NoEntryError`;
    otherwise the first other error is raised (with ``what`` in its message).
    """
    if not replicas:
        raise NoEntryError(f"{what}: no replica to ask")
    order = [replicas[i] for i in health.order(replicas)]
    running: dict[asyncio.Future[T], tuple[str, float]] = {}
    errors: list[tuple[str, BooklineError]] = []
    next_idx = 0
    timeout_s = first_timeout_s

    def launch() -> None:
        nonlocal next_idx
        bookie = order[next_idx]
        next_idx += 1
        running[asyncio.ensure_future(attempt(bookie))] = (bookie, clock())

    try:
        launch()
        while running:
            wait_s = timeout_s if next_idx < len(order) else None
            done, _ = await asyncio.wait(
                list(running), timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                timeout_s = min(timeout_s * 2, max_timeout_s)
                launch()  # the slow replica keeps running; the first answer wins
                continue
            for fut in done:
                bookie, started = running.pop(fut)
                exc = fut.exception()
                if exc is None:
                    health.record_success(bookie, clock() - started)
                    return fut.result()
                if not isinstance(exc, BooklineError):
                    raise exc  # a bug, not an operating error
                errors.append((bookie, exc))
                if not isinstance(exc, _ABSENT):
                    health.record_failure(bookie)
            while len(running) < 1 and next_idx < len(order):
                launch()
        # Every replica answered with an error.
        others = [(b, e) for b, e in errors if not isinstance(e, _ABSENT)]
        if not others:
            raise NoEntryError(f"{what}: no replica of {list(order)} holds it")
        bookie, first = others[0]
        err = type(first).__new__(type(first))
        BooklineError.__init__(
            err,
            f"{what}: all replicas failed; {bookie}: {first.message}"
            + "".join(f"; {b}: {e.name}" for b, e in errors if e is not first),
        )
        raise err from first
    finally:
        now = clock()
        abandon(running)  # retrieve the outcome of every loser, finished or not
        for bookie, started in running.values():
            # Lost the race: it took at least this long, which demotes it next time.
            health.record_success(bookie, now - started)
