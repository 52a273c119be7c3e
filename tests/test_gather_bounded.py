"""foundation.gather.gather_bounded: never more than the limit at once, answers in the
items' order, the first error raised."""

from __future__ import annotations

import asyncio

import pytest

from foundation.gather import gather_bounded


async def test_at_most_the_limit_run_at_once_and_answers_keep_the_items_order() -> None:
    running, most = 0, 0
    gate = asyncio.Event()

    async def work(i: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        if running == 3:
            gate.set()  # the limit reached: let everyone finish
        await gate.wait()
        running -= 1
        return i * 10

    assert await gather_bounded(range(20), work, 3) == [i * 10 for i in range(20)]
    assert most == 3


async def test_the_first_error_propagates() -> None:
    async def work(i: int) -> int:
        if i == 4:
            raise ValueError("item 4")
        return i

    with pytest.raises(ValueError, match="item 4"):
        await gather_bounded(range(8), work, 2)
