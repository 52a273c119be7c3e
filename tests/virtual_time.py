"""Virtual time for tests of in-process asyncio code (the in-memory fakes of
:mod:`ledger.testing`): sleeps, timeouts and deadlines take no wall-clock time, and
``loop.time()`` measures them exactly.

:class:`VirtualTimeLoop` never waits for a timer: whenever nothing is ready to run, its
clock jumps to the next timer (trio's ``MockClock(autojump_threshold=0)``). Code under
test that takes an injected clock should get ``loop.time`` (see :func:`loop_clock`),
so its notion of time is the same virtual one. Real I/O still works (the loop blocks on
it when no timer is pending), but wall-clock waits do not exist here: use it for tests
whose peers are in memory.

``@virtual_time`` runs an ``async def`` test on a fresh virtual-time loop (the test is a
plain function to pytest, so pytest-asyncio leaves it alone; fixtures still work).
"""

from __future__ import annotations

import asyncio
import functools
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

__all__ = ["VirtualTimeLoop", "loop_clock", "virtual_time"]

P = ParamSpec("P")
R = TypeVar("R")


class _JumpingSelector(selectors.DefaultSelector):
    """Polls instead of waiting for a timer; the time it would have waited is skipped."""

    def __init__(self, advance: Callable[[float], None]) -> None:
        super().__init__()
        self._advance = advance

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        if timeout is None:  # no timer pending: only I/O (or another thread) can wake us
            return list(super().select(None))
        ready = list(super().select(0))
        if not ready and timeout > 0:
            self._advance(timeout)
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(_JumpingSelector(self._advance))

    def _advance(self, seconds: float) -> None:
        self._virtual_now += seconds

    def time(self) -> float:
        return self._virtual_now


def loop_clock() -> Callable[[], float]:
    """The running loop's clock, to inject where code takes a ``clock``."""
    return asyncio.get_running_loop().time


def virtual_time(test: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, R]:
    """Run the ``async def`` test on a :class:`VirtualTimeLoop`."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
            return runner.run(test(*args, **kwargs))

    return run
