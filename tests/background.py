"""A coroutine run beside a test's steps for as long as a block lasts (a load, a
heartbeat), ended when the block ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any


@contextlib.asynccontextmanager
async def in_background(work: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """Run ``work`` while the block runs; cancel it when the block ends and wait for it.
    An error ``work`` ended with meanwhile is raised then (not lost with the task)."""
    task = asyncio.ensure_future(work)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
