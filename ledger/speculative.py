"""Speculative requests: ask one replica, and ask the next too when it is slow.

Replicas are tried in health order (recently failing last, then by latency). The
first request goes out at once; when no answer came within the speculative timeout, the
next replica is asked as well, the timeout doubling up to a maximum; an error answer
moves on to the next replica immediately. The first *valid* answer wins and the others
are cancelled. A hung replica therefore costs one speculative timeout, not a request
timeout.

The first timeout is never shorter than a few times the first replica's recent
latency: when a reader keeps many reads in flight (a catch-up), each one waits behind
the others at the bookie, and a fixed 50 ms timeout sent a second copy of 76 % of the
reads of a 1 M-record catch-up -- doubling the load it was waiting on. A stalled replica
stops answering, so its recent latency stays what it was and the timeout stays short.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from foundation.errors import BooklineError, NoEntryError, NoLedgerError, fresh
from ledger.metrics import PROCESS_LEDGER_METRICS, LedgerMetrics
from ledger.placement import BookieHealth
from ledger.tasks import abandon

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["speculative"]

# Answers that say "not here", not "this bookie is unhealthy".
_ABSENT = (NoEntryError, NoLedgerError)
# The first speculative timeout is at least this many times the first replica's recent
# latency (see the module docstring).
LATENCY_MULTIPLE = 4.0


async def speculative(
    replicas: Sequence[str],
    attempt: Callable[[str], Awaitable[T]],
    *,
    health: BookieHealth,
    clock: Callable[[], float],
    first_timeout_s: float,
    max_timeout_s: float,
    what: str,
    needed: asyncio.Future[None] | None = None,
    metrics: LedgerMetrics = PROCESS_LEDGER_METRICS,
) -> T:
    """The first successful ``attempt(replica)``; raise when every replica failed.

    ``needed``: for a read ahead, resolved once somebody waits for the answer. Until
    then no second replica is asked (a read ahead is slow because it waits behind the
    others, and a copy would only add to the queue); from then on the speculative
    timeout counts from the last request sent, so a read that already waited that long
    asks the next replica at once.

    When all replicas said NO_ENTRY/NO_LEDGER the error is :class:`NoEntryError`;
    otherwise the first other error is raised (with ``what`` in its message).
    """
    if not replicas:
        raise NoEntryError(f"{what}: no replica to ask")
    order = [replicas[i] for i in health.order(replicas)]
    running: dict[asyncio.Future[T], tuple[str, float]] = {}
    errors: list[tuple[str, BooklineError]] = []
    next_idx = 0
    recent = health.latency_s(order[0])
    timeout_s = min(max_timeout_s, max(first_timeout_s, LATENCY_MULTIPLE * (recent or 0.0)))

    last_launch = 0.0
    speculated: set[str] = set()  # replicas asked because the earlier ones were slow

    def launch() -> None:
        nonlocal next_idx, last_launch
        bookie = order[next_idx]
        next_idx += 1
        last_launch = clock()
        running[asyncio.ensure_future(attempt(bookie))] = (bookie, last_launch)

    try:
        launch()
        while running:
            done: set[asyncio.Future[T]]
            if needed is not None and not needed.done() and next_idx < len(order):
                waited: list[asyncio.Future[Any]] = [*running, needed]
                finished, _ = await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
                done = {fut for fut in running if fut in finished}
                if not done:
                    continue  # needed now: speculate from here on
            else:
                wait_s = None
                if next_idx < len(order):
                    wait_s = max(0.0, last_launch + timeout_s - clock())
                done, _ = await asyncio.wait(
                    list(running), timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    timeout_s = min(timeout_s * 2, max_timeout_s)
                    metrics.speculative_reads += 1
                    speculated.add(order[next_idx])
                    launch()  # the slow replica keeps running; the first answer wins
                    continue
            for fut in done:
                bookie, started = running.pop(fut)
                exc = fut.exception()
                if exc is None:
                    health.record_success(bookie, clock() - started)
                    if bookie in speculated:
                        metrics.speculative_reads_won += 1
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
        raise fresh(
            first,
            f"{what}: all replicas failed; {bookie}: {first.message}"
            + "".join(f"; {b}: {e.name}" for b, e in errors if e is not first),
        ) from first
    finally:
        now = clock()
        abandon(running)  # retrieve the outcome of every loser, finished or not
        for bookie, started in running.values():
            # Lost the race: it took at least this long, which demotes it next time.
            health.record_success(bookie, now - started)
