"""The one way tests wait: on a condition, polled until a deadline that scales with the
machine's load (issue 22, "The test suite under load"; issue 23).

A test asserts behaviour, never the machine's speed: it waits for what it expects to
happen, and the deadline only bounds how long a broken build takes to fail. On a
machine whose cores are shared (load average 6-10 on 2 cores), everything takes a few
times longer, so every deadline -- and pytest-timeout's per-test limit, in
``tests/conftest.py`` -- is multiplied by :data:`TIME_SCALE`:
``BOOKLINE_TEST_TIME_SCALE`` when set (``1`` on a dedicated CI machine, ``4`` beside a
CPU hog), else the one-minute load average per core when pytest starts, between 1 and
:data:`AUTO_SCALE_MAX`. The value is exported, so processes a test starts agree.

Sleeps that are the behaviour under test (a token left to expire, records left to flow
for a measured while) stay ``asyncio.sleep``/``time.sleep``: they are not waits.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

__all__ = ["TIME_SCALE", "scaled", "wait_for", "wait_until"]

T = TypeVar("T")

#: The environment variable that sets :data:`TIME_SCALE` (a number >= 1).
SCALE_ENV: Final = "BOOKLINE_TEST_TIME_SCALE"
#: The most the load average alone scales deadlines (a hung build still fails in time).
AUTO_SCALE_MAX: Final = 4.0
#: Default deadline and poll interval of a wait, before scaling.
WAIT_S: Final = 20.0
POLL_S: Final = 0.05


def _time_scale() -> float:
    raw = os.environ.get(SCALE_ENV)
    if raw:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{SCALE_ENV} must be a number >= 1, got {raw!r}") from None
        if not value >= 1.0:
            raise ValueError(f"{SCALE_ENV} must be a number >= 1, got {raw!r}")
        return value
    per_core = os.getloadavg()[0] / (os.cpu_count() or 1) if hasattr(os, "getloadavg") else 1.0
    return round(min(AUTO_SCALE_MAX, max(1.0, per_core)), 2)


TIME_SCALE: Final = _time_scale()
os.environ[SCALE_ENV] = str(TIME_SCALE)


def scaled(seconds: float) -> float:
    """``seconds`` of patience on a quiet machine, as much as this machine needs."""
    return seconds * TIME_SCALE


def _timeout_message(what: str, timeout_s: float, last: object) -> str:
    seen = "" if last is None or isinstance(last, bool) else f" (last seen: {last!r:.300})"
    return (
        f"timed out after {scaled(timeout_s):.1f}s ({timeout_s:g}s x time scale "
        f"{TIME_SCALE:g}) waiting for {what}{seen}"
    )


async def wait_for(
    condition: Callable[[], T | Awaitable[T]],
    what: str = "the condition",
    *,
    timeout_s: float = WAIT_S,
    interval_s: float = POLL_S,
) -> T:
    """Poll ``condition()`` (a plain or async callable) every ``interval_s`` until it
    returns something truthy, and return that; after ``scaled(timeout_s)`` fail the
    test naming ``what`` was awaited. An exception the condition raises ends the wait
    at once (a condition can fail fast, e.g. when a process it waits on died)."""
    deadline = time.monotonic() + scaled(timeout_s)
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(_timeout_message(what, timeout_s, value))
        await asyncio.sleep(interval_s)


def wait_until(
    condition: Callable[[], T],
    what: str = "the condition",
    *,
    timeout_s: float = WAIT_S,
    interval_s: float = POLL_S,
) -> T:
    """:func:`wait_for` for code without an event loop (blocks the calling thread)."""
    deadline = time.monotonic() + scaled(timeout_s)
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(_timeout_message(what, timeout_s, value))
        time.sleep(interval_s)
