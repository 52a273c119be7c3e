"""A private asyncio event loop on a daemon thread, for blocking facades.

The core library's :class:`~streams.sync.SyncNamespace` and the thin client's
``SyncProxyClient`` run their asyncio objects on one of these, so threads (and Spark
executors) can call them without an event loop of their own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread"]

T = TypeVar("T")
# Stopping waits this long for the loop's thread to end before giving up on it (it is a
# daemon: the process can still exit).
STOP_JOIN_S = 10.0


class LoopThread:
    """``call(coro)`` runs ``coro`` on the private loop and returns its result."""

    def __init__(self, name: str = "bookline-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` on the loop; on ``timeout_s`` cancel it and raise TimeoutError.
        Calling from the loop's own thread would deadlock, so it raises RuntimeError."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a blocking facade was called from its own loop thread")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(STOP_JOIN_S)
        if not self._thread.is_alive():
            self.loop.close()
