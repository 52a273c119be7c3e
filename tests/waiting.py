"""The one way tests wait: on a condition, polled until a deadline that scales with the
machine's load (issue 22, "The test suite under load"; issue 23).

A test asserts behaviour, never the machine's speed: it waits for what it expects to
happen, and the deadline only bounds how long a broken build takes to fail. On a
machine whose cores are shared (load average 6-10 on 2 cores), everything takes a few
times longer, so every deadline -- and pytest-timeout's per-test limit, in
``tests/conftest.py`` -- is multiplied by a time scale: ``BOOKLINE_TEST_TIME_SCALE``
when set (``1`` on a dedicated CI machine, ``3`` beside a CPU hog of every core), else
the one-minute load average per core, between 1 and :data:`AUTO_SCALE_MAX`:
:data:`TIME_SCALE` when pytest starts, and the larger of that and the load at the time
for each wait and each test's limit (a hog started with the run raises the load average
only over a minute).

Sleeps that are the behaviour under test (a token left to expire, records left to flow
for a measured while) stay ``asyncio.sleep``/``time.sleep``: they are not waits.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar, overload

__all__ = ["TIME_SCALE", "WAIT_S", "scaled", "time_scale", "wait_for", "wait_until"]

T = TypeVar("T")

#: The environment variable that sets :data:`TIME_SCALE` (a number >= 1).
SCALE_ENV: Final = "BOOKLINE_TEST_TIME_SCALE"
#: The most the load average alone scales deadlines (a hung build still fails in time).
AUTO_SCALE_MAX: Final = 4.0
#: Default deadline and poll interval of a wait, before scaling.
WAIT_S: Final = 20.0
POLL_S: Final = 0.05


def _fixed_scale() -> float | None:
    raw = os.environ.get(SCALE_ENV)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{SCALE_ENV} must be a number >= 1, got {raw!r}") from None
    if not value >= 1.0:
        raise ValueError(f"{SCALE_ENV} must be a number >= 1, got {raw!r}")
    return value


def _load_scale() -> float:
    per_core = os.getloadavg()[0] / (os.cpu_count() or 1) if hasattr(os, "getloadavg") else 1.0
    return round(min(AUTO_SCALE_MAX, max(1.0, per_core)), 2)


_FIXED: Final = _fixed_scale()
#: The time scale when the tests started (pytest-timeout's limits use it).
TIME_SCALE: Final = _FIXED if _FIXED is not None else _load_scale()


def time_scale() -> float:
    """The time scale now: fixed by the environment, else never below the start's."""
    return _FIXED if _FIXED is not None else max(TIME_SCALE, _load_scale())


def scaled(seconds: float) -> float:
    """``seconds`` of patience on a quiet machine, as much as this machine needs now."""
    return seconds * time_scale()


#: What a wait awaited: a description, or a function giving one when the wait fails
#: (e.g. with a log's tail as it is then).
What = str | Callable[[], str]


def _timeout_message(what: What, timeout_s: float, waited_s: float, last: object) -> str:
    what = what() if callable(what) else what
    seen = "" if last is None or isinstance(last, bool) else f" (last seen: {last!r:.300})"
    return (
        f"timed out after {waited_s:.1f}s ({timeout_s:g}s at time scale 1) waiting for {what}{seen}"
    )


@overload
async def wait_for(  # an async condition: the value it gives
    condition: Callable[[], Awaitable[T | None]],
    what: What = ...,
    *,
    timeout_s: float = ...,
    interval_s: float = ...,
) -> T: ...


@overload
async def wait_for(
    condition: Callable[[], T | None],
    what: What = ...,
    *,
    timeout_s: float = ...,
    interval_s: float = ...,
) -> T: ...


async def wait_for(
    condition: Callable[[], Any],
    what: What = "the condition",
    *,
    timeout_s: float = WAIT_S,
    interval_s: float = POLL_S,
) -> Any:
    """Poll ``condition()`` (a plain or async callable) every ``interval_s`` until it
    returns something truthy, and return that; after ``scaled(timeout_s)`` fail the
    test (AssertionError) naming ``what`` was awaited. An exception the condition
    raises ends the wait at once (a condition can fail fast, e.g. when a process it
    waits on died)."""
    start = time.monotonic()
    deadline = start + scaled(timeout_s)
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            waited = time.monotonic() - start
            raise AssertionError(_timeout_message(what, timeout_s, waited, value))
        await asyncio.sleep(interval_s)


def wait_until(
    condition: Callable[[], T | None],
    what: What = "the condition",
    *,
    timeout_s: float = WAIT_S,
    interval_s: float = POLL_S,
) -> T:
    """:func:`wait_for` for code without an event loop (blocks the calling thread)."""
    start = time.monotonic()
    deadline = start + scaled(timeout_s)
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            waited = time.monotonic() - start
            raise AssertionError(_timeout_message(what, timeout_s, waited, value))
        time.sleep(interval_s)
