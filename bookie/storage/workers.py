"""Thread pools for the storage engine's blocking work (index gets, entry-log I/O,
checkpoints, compaction), so the event loop never blocks on a disk."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from foundation.errors import IOFailureError

_T = TypeVar("_T")


class Worker:
    """A named pool of ``threads`` threads. OSError from its work becomes
    IOFailureError here, at the boundary (the engine decides whether it is fatal)."""

    def __init__(self, threads: int, name: str) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=name)

    async def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on the pool, awaited from the event loop."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except OSError as exc:
            raise IOFailureError(f"{getattr(fn, '__name__', fn)}: {exc}") from exc

    def shutdown(self) -> None:
        """Blocking: wait for running work, then stop the threads."""
        self._pool.shutdown(wait=True)
