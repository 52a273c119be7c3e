"""Running one coroutine function over many items with a bound on how many run at once.

``asyncio.gather`` over hundreds of partitions or groups would put as many ZooKeeper
reads or bookie reads in flight at once: a bound keeps one request from crowding out
everyone else's, and the answers still come back in the items' order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

__all__ = ["gather_bounded"]

T = TypeVar("T")
R = TypeVar("R")


async def gather_bounded(
    items: Iterable[T], fn: Callable[[T], Awaitable[R]], limit: int
) -> list[R]:
    """``fn`` over ``items``, at most ``limit`` at once; the results in the items' order
    (the first error propagates, as with ``asyncio.gather``)."""
    room = asyncio.Semaphore(limit)

    async def one(item: T) -> R:
        async with room:
            return await fn(item)

    return list(await asyncio.gather(*(one(item) for item in items)))
