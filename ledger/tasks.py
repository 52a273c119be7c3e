"""Fanning requests out to bookies, and ending the tasks without leaks.

* :func:`gather_answers` -- send one request per bookie at once and judge the answers as
  they arrive until a quorum decides (recovery's fence, read and re-add steps).
* :func:`run_bounded` -- run a function over many items, a bounded number at once.

A task whose exception nobody retrieves makes asyncio log "Task exception was never
retrieved" when it is garbage collected -- noise that looks like a bug exactly when a
bookie is dead. Code that starts tasks and returns on the first useful answer hands the
rest to :func:`abandon`; every outcome is then consumed, now or when the task ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from typing import Any, TypeVar

from foundation.errors import BooklineError

log = logging.getLogger(__name__)

__all__ = ["abandon", "cancel_and_wait", "consume", "gather_answers", "run_bounded"]

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


def consume(task: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a finished task (a done callback): its error was either
    already reported through another task of the same fan-out or no longer matters."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.debug("abandoned task ended with %r", exc)


def abandon(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel every task not done yet and consume the outcome of every one (at once
    when done, else when it ends). Does not wait: the caller may be being cancelled."""
    for task in tasks:
        if task.done():
            consume(task)
        else:
            task.cancel()
            task.add_done_callback(consume)


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """:func:`abandon` the tasks, then wait until every one has ended."""
    tasks = list(tasks)
    abandon(tasks)
    if tasks:
        await asyncio.wait(tasks)


async def gather_answers(
    requests: Mapping[K, Awaitable[T]],
    judge: Callable[[K, T | BooklineError], bool],
    *,
    leave_running: Callable[[asyncio.Future[T]], None] | None = None,
) -> bool:
    """Start every request at once and hand each outcome to ``judge(key, outcome)`` as
    it arrives -- the answer, or the operating error (:class:`BooklineError`) the
    request raised -- until ``judge`` returns True (decided: return True) or every
    request has answered (return False). Anything else a request raises is a bug and is
    raised here; so is whatever ``judge`` raises.

    Requests still running at the end are abandoned (cancelled, outcomes retrieved), or
    -- with ``leave_running`` -- left to finish, ``leave_running`` as their done
    callback (finished ones are consumed either way)."""
    tasks = {asyncio.ensure_future(request): key for key, request in requests.items()}
    pending = set(tasks)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            decided = False
            for task in done:
                exc = task.exception()
                if exc is not None and not isinstance(exc, BooklineError):
                    raise exc
                decided = judge(tasks[task], task.result() if exc is None else exc) or decided
            if decided:
                return True
        return False
    finally:
        if leave_running is None:
            abandon(tasks)
        else:
            for task in tasks:
                if task.done():
                    consume(task)
                else:
                    task.add_done_callback(leave_running)


async def run_bounded(
    items: Iterable[int], fn: Callable[[int], Awaitable[None]], limit: int
) -> None:
    """``fn(item)`` for every item, at most ``limit`` at once; the first error cancels
    the rest and is raised."""
    running: set[asyncio.Task[None]] = set()

    async def settle_one() -> None:
        nonlocal running
        done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        errors = [exc for task in done if (exc := task.exception()) is not None]
        if errors:
            raise errors[0]

    try:
        for item in items:
            if len(running) >= limit:
                await settle_one()
            running.add(asyncio.ensure_future(fn(item)))
        while running:
            await settle_one()
    finally:
        await cancel_and_wait(running)  # also the outcomes of siblings of a failure
