"""Ending the tasks a ledger operation fanned out, without leaks.

A task whose exception nobody retrieves makes asyncio log "Task exception was never
retrieved" when it is garbage collected -- noise that looks like a bug exactly when a
bookie is dead. Code that starts tasks and returns on the first useful answer hands the
rest to :func:`abandon`; every outcome is then consumed, now or when the task ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["abandon", "cancel_and_wait", "consume"]


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
