"""Waiting kept apart from serving: the time a request spends in a long poll, waiting
for data that does not exist yet, is not time spent serving it (issue 22, item 9: a
caught-up consumer's long polls made a read proxy's "read latency" 500 ms).

* :func:`request_waits` -- a fresh :class:`WaitClock` for the request the current task
  serves (the proxies' latency middleware opens one per request);
* :func:`waiting` -- around an await that waits for new data (a feed's next record):
  the time is added to the current request's clock; :func:`count_wait` adds a wait
  measured otherwise (the part of a reader's wait during which it was caught up).

Only the task that opened the clock adds to it: a task started while serving a request
(a feed's pump, a reader's fetch task) inherits the context variable but not the
request, and its waits are nobody's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["WaitClock", "count_wait", "request_waits", "waiting"]


class WaitClock:
    """Seconds one request's task spent waiting for new data."""

    __slots__ = ("seconds", "task")

    def __init__(self, task: asyncio.Task[object] | None) -> None:
        self.seconds = 0.0
        self.task = task


_current: ContextVar[WaitClock | None] = ContextVar("bookline_request_waits", default=None)


@contextlib.contextmanager
def request_waits() -> Iterator[WaitClock]:
    """A clock for the waits of the request the current task serves, until the block
    ends."""
    clock = WaitClock(asyncio.current_task())
    token = _current.set(clock)
    try:
        yield clock
    finally:
        _current.reset(token)


def _own_clock() -> WaitClock | None:
    """The current request's clock, if the current task is the request's own."""
    clock = _current.get()
    if clock is None or clock.task is not asyncio.current_task():
        return None
    return clock


def count_wait(seconds: float) -> None:
    """Add ``seconds`` to the current request's waiting (nothing outside a request, or
    in a task other than the request's own)."""
    clock = _own_clock()
    if clock is not None:
        clock.seconds += seconds


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """Count the block's time as the current request's waiting (as :func:`count_wait`)."""
    if _own_clock() is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        count_wait(time.perf_counter() - started)
